"""A trial's layout: how many GPUs, which ZeRO stage, which micro-batch and how many checkpointed layers.

``plan_layout`` picks the cheapest layout that fits: every candidate (GPUs N in 1, 2, 4, ...; ZeRO stage 0-3;
micro-batch a divisor of the step's sequences per GPU; the fewest checkpointed decoder layers that fit) whose
predicted peak (the largest of ``phase_peaks``) is within the GPU's budget, ranked by GPU-seconds per token
(when the stage is chosen too: ZeRO-0 on one GPU, ZeRO-2 or 3 across GPUs, since ZeRO-1 partitions less than
ZeRO-2 for the same traffic):
    cost = N x m / (MFU(stage, N) x recompute(k)),   recompute(k) = 1 / (1 + k / (3 L))
(re-running k of L layers' forwards adds k/L of a forward, a third of a step's FLOPs; m > 1 for a micro-batch below
the largest allowed, ``SMALLER_MICRO_BATCH_COST``). MFU per stage is the
recorded one (``RECORDED_MFU``). Ties go to fewer GPUs, then the lower stage. The tokens of an optimiser step
(sequences x length) stay what the config says, however many GPUs share them.

Memory model, bytes per GPU for P parameters, N ranks, bf16 weights with fp32 master weights and AdamW moments
(DeepSpeed 0.19 accumulates bf16 gradients in fp32; ZeRO-0 with bf16 runs its BF16_Optimizer, which keeps fp32
gradients of every parameter and partitions the fp32 state like ZeRO-1):
    stage 0:  2P + 4P + 12P/N         (bf16 weights, fp32 gradients, fp32 master weights + AdamW moments)
    stage 1:  2P + 2P + 16P/N         (bf16 gradients of every parameter, reduced into fp32 partitions)
    stage 2:  2P + 16P/N + two bf16 reduce buckets
    stage 3:  18P/N + the live parameters, the reduce bucket and the head (gathered), all in bf16
and across GPUs 1.5 GiB of NCCL's and ZeRO's communication buffers (fitted: the 2-GPU peaks of the 1B shape sit
1.5-1.8 GiB above the model without them),
plus the activations: per token and decoder layer ``ACTIVATION_BYTES`` (bf16, compiled layers, SDPA) for the
layers that are not checkpointed, 2 h for those that are, one layer's worth during its recompute, and the fused
loss's workspace (its float32 hidden-state gradient, the bf16 hidden states, and its 136 MiB chunk).
DeepSpeed's ZeRO-0/1/2 peaks are scaled by ``DEEPSPEED_PEAK_SCALE`` to bound the recorded ones. Checked against the
peaks measured on GPUs (tests/trainable/test_layout.py reads their JSON).

A ZeRO-3 layout, and a one-GPU one, runs on the engine ``trainable.config.preferred_engine`` names (FSDP2 by
default; ``layout_engine``), planned with that engine's memory model and MFU. FSDP2 keeps float32 weights,
gradients and AdamW moments sharded and gathers bf16 copies per layer:
    FSDP2:    16P/N + 1.5 bytes per LM-head parameter + s x the activations above
(N the ranks a parameter is sharded over: every rank, or under HSDP a node's, below) with s the largest ratio over
every recorded FSDP2 peak (``FSDP2_ACTIVATION_SCALE``), so the prediction bounds
them all: 1.08 with one micro-batch a step (the 1B shape's packed Alpaca rows set it; the 8B shape peaks well
below, as its float32 gradients appear while its backward frees the activations), 1.5 with accumulation (a later
micro-batch runs with every gradient held). With one micro-batch a step the peak can come instead at the start of
the backward, before any gradient exists but with every saved tensor live: 12P/N + what compiled layers save
(``fsdp2_backward_start_bytes``, counted in the allocator's history); it sets 1B's peak from micro-batch 4 on
(36.64 GiB at 8 x 1, 1.12x the first model alone). With accumulation the root module's gradient (embedding and an
untied head, 2VD for 8B) also arrives as a new float32 shard, 4 x root / N bytes, while the accumulated one is held:
    FSDP2, accumulating:  16P/N + 1.5 VD + max(1.5 x activations, 4 root) + 4 root / N,   root = VD or 2VD
(8B at micro-batch 1 x 2 to 1 x 16, 0-30 layers recomputed, one and two GPUs: 0.985-0.999x; 2.25 x the activations
alone predicted 0.965-1.012x: a mixed-grid trial at 1 x 4 with 22 recomputed peaked above it; at 2 x 8 one H200 ran
out of memory at 137.4 GiB: docs/measurements/2026-11-27-one-gpu-fsdp2). Where few activations are kept, the root's
own backward sets the peak: its gathered bf16 weights and gradients, 4 bytes a root parameter
(``FSDP2_ROOT_BYTES``): 8B on one H200 at 1 x 8 and 1 x 16 with 30 of 32 layers recomputed peaked at 127.55 GiB
both, as at 1 x 4 with 22 (1.5 x the activations alone predicted 126.1: docs/measurements/2026-11-29-h200).
FSDP2's caching allocator reserves 13-15% over its allocated peak near a GPU's edge (8B on two H100s at micro-batch
2: 77.5 GiB reserved for 68.6 allocated, 30 cudaMalloc retries in 13 steps and half the rate), so its plans keep
``ALLOCATOR_SLACK["fsdp2"]`` free. Under ``train.engine: fsdp2`` the layout is ZeRO-3's (``planned_stage``).

Across nodes (more GPUs than ``gpus_per_node``) an FSDP2 layout may be HSDP: R replica groups, each sharding the
model over N / R ranks (a whole number of nodes), gradients all-reduced across the groups once a step instead of
every gather and reduce-scatter crossing nodes. Its states are those of N / R ranks; its cost is the same GPUs at
the same recorded MFU (no multi-node MFU is recorded), so among equal costs the most replicas win: HSDP where its
memory allows, else a full shard over every rank.

A layout fits when every phase of a trial does (``phase_peaks``): the load (``load_bytes``), the attention check
before step 1 (one row, every layer recomputed), the training steps, and (planned per trial,
``trainable.trial_memory``) the export and scoring.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Iterable

from kernels.precompile import precompile_bytes
from trainable.throughput import PEAK_BF16_FLOPS, training_flops_per_token

GIB = 2**30
PEAK_FLOPS = PEAK_BF16_FLOPS["NVIDIA H100 80GB HBM3"]  # the MFU denominator of RECORDED_MFU (H100 = H200 SXM)
NCCL_BUFFER_BYTES = 1.5 * GIB  # communication buffers of a multi-GPU trial (module docstring)
CUDA_CONTEXT_BYTES = 1.0 * GIB  # CUDA context, NCCL and cuBLAS workspaces outside PyTorch's allocator
# fragmentation of the caching allocator, reserved memory over the peak allocated: per engine (module docstring)
ALLOCATOR_SLACK = {"deepspeed": 0.06, "fsdp2": 0.10}
LOSS_CHUNK_BYTES = 136 * 2**20  # kernels/backward.py: the dedicated dZ chunk at most
# Per token and decoder layer, bytes saved for the backward with compiled layers in bf16: c_h h + c_kv (kv width)
# + c_i I; fitted to the 1B shape's peaks at micro-batch 2 and 4 on an H200 (1.6 GiB per 2048-token sequence).
ACTIVATION_BYTES = {"hidden": 10, "kv": 4, "intermediate": 3.5}
# padded tokens a scoring forward takes under eval.batch_tokens: auto, at most: ARC-Easy, MMLU and HellaSwag scored as
# fast at 16,384 as at 32,768 and 65,536 on an H200, 1B and 8B (bench_scoring_batch.py, docs/results.md)
SCORING_TOKENS_MAX = 16384
# MFU of the trial loop (compiled layers) per layout, measured on H200s (docs/results.md): (stage, GPUs > 1) -> MFU.
# ZeRO-0: 1B on one GPU 41.0%; ZeRO-2: 1B 45.3%, 8B 45.3% on two; ZeRO-3: 1B 34.5%, 8B 40.1% on two (their mean),
# 37.5% on one. ZeRO-1 is not measured: ZeRO-2's.
RECORDED_MFU = {(0, False): 0.41, (0, True): 0.41, (1, True): 0.45, (2, True): 0.45, (3, False): 0.375,
                (3, True): 0.37}
# FSDP2's, the same way: (GPUs > 1) -> MFU. 1B on one GPU 46.4% (H200), 42.7% (H100); on two 41.0% (H100); 8B on
# two 39.6-40.1% (H200).
RECORDED_MFU_FSDP2 = {False: 0.44, True: 0.40}
FSDP2_HEAD_BYTES = 1.5  # per LM-head parameter: its gathered bf16 copy and gradient (fitted)
# of ``activation_bytes``, by accumulation (> 1 micro-batch a step): the bound of the recorded peaks (docstring)
FSDP2_ACTIVATION_SCALE = {False: 1.08, True: 1.5}
# with accumulation, the root module's gathered bf16 weights and gradients per root parameter: the floor of the
# accumulating peak where few activations are kept (docstring)
FSDP2_ROOT_BYTES = 4
# FSDP2's backward start, one micro-batch a step (``fsdp2_backward_start_bytes``): per token and decoder layer, the
# bf16 tensors a compiled layer saves on packed rows, counted in the allocator's history at the peak
# (benchmarks/memory_at_peak.py, 1B on an H200 at micro-batch 4 and 8: 3 of intermediate width, 8 of hidden width,
# 4 of key/value width, 2.62 GiB a 2048-token sequence), and per token the root's beyond the fused loss's 6 bytes a
# hidden unit that ``activation_bytes`` counts (embedding output, the loss's gradients: 26 bytes a hidden unit
# measured in all, 32 counted)
FSDP2_SAVED_BYTES = {"hidden": 16, "kv": 8, "intermediate": 6}
FSDP2_ROOT_TOKEN_BYTES = 26
# DeepSpeed's ZeRO-0/1/2 training peak over the model above: the largest ratio of the recorded runs (the 8B shape's
# ZeRO-2 row on two H200s at micro-batch 4, 1.066; a 1B ZeRO-2 trial's first step on two H100s, 1.059; the rest
# 0.94-1.06), so the prediction bounds them all within 15%. ZeRO-3
# runs on FSDP2 unless asked; DeepSpeed's ZeRO-3 stays unscaled, within 10% either way (0.92-1.09: no one factor
# bounds both the 1B and the 8B shape's and still fits 8B on two H100s, where it peaked at 69.1 GiB)
DEEPSPEED_PEAK_SCALE = {0: 1.07, 1: 1.07, 2: 1.07, 3: 1.0}
STAGES = (0, 1, 2, 3)
# the cost of a micro-batch below the largest allowed, by (FSDP2 across GPUs): smaller products and more steps of
# the loop (3%); across GPUs FSDP2 also gathers and reduce-scatters every weight once a micro-batch: 8B on two H200s
# at micro-batch 1 x 2, nothing recomputed, ran 6,819 tokens/s per GPU against 8,226 at 2 x 1 with 12 of 32 layers
# recomputed (one call: docs/measurements/2026-11-27-loop-fsdp2): 1.21 x 1.125 recompute = 1.36; on one GPU 1 x 4
# ran as fast as 2 x 1 (7,291 and 7,129)
SMALLER_MICRO_BATCH_COST = {False: 1.03, True: 1.36}
ENGINE_NAMES = {"deepspeed": "ZeRO-{stage}", "fsdp2": "FSDP2 (ZeRO-3 layout)"}  # FSDP2 on one GPU: "FSDP2"


@dataclass(frozen=True)
class ModelShape:
    """What the memory model needs of a decoder-only transformer."""

    params: int
    layers: int
    hidden: int
    intermediate: int
    vocab: int
    kv_width: int  # key/value heads x head dim
    tied: bool
    heads: int = 1  # query heads (the attention check's math kernel holds heads x T^2 weights)

    @classmethod
    def from_config(cls, config: Any, params: int | None = None) -> "ModelShape":
        """From a Hugging Face config (object or dict of its fields); ``params`` counted from it when not given."""
        get = (lambda key, default=None: config.get(key, default)) if isinstance(config, dict) else \
            (lambda key, default=None: getattr(config, key, default))
        hidden, layers, vocab = get("hidden_size"), get("num_hidden_layers"), get("vocab_size")
        intermediate = get("intermediate_size") or 4 * hidden
        heads = get("num_attention_heads")
        head_dim = get("head_dim") or hidden // heads
        kv_width = (get("num_key_value_heads") or heads) * head_dim
        tied = bool(get("tie_word_embeddings", True))
        if params is None:  # attention (q, o: heads x head_dim; k, v) + gated MLP + two norms per layer
            per_layer = 2 * hidden * heads * head_dim + 2 * hidden * kv_width + 3 * hidden * intermediate + 2 * hidden
            params = layers * per_layer + vocab * hidden * (1 if tied else 2) + hidden
        return cls(int(params), int(layers), int(hidden), int(intermediate), int(vocab), int(kv_width), tied,
                   int(heads))

    @property
    def embedding_params(self) -> int:
        """The embedding's and an untied LM head's: V x D, or 2 V x D untied (FSDP2's root module holds them)."""
        return self.vocab * self.hidden * (1 if self.tied else 2)

    @property
    def layer_params(self) -> int:
        return (self.params - self.embedding_params) // self.layers

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token (``trainable.throughput``) of the weights that multiply: all but an untied
        input embedding (a lookup)."""
        return training_flops_per_token(self.params - (0 if self.tied else self.vocab * self.hidden), self.layers,
                                        self.hidden, seq_len)


@dataclass(frozen=True)
class Layout:
    """One trial's layout; ``checkpointed`` of the decoder layers recompute their activations in the backward."""

    workers: int
    zero_stage: int
    micro_batch_size: int
    gradient_accumulation_steps: int
    checkpointed: int | bool  # decoder layers recomputed (the first k); True: all of them
    peak_bytes: float  # predicted, per GPU, of its largest phase (PyTorch's allocator, no CUDA context)
    cost: float  # GPU-seconds per token relative units: workers / (MFU x recompute factor)
    wide_buckets: bool = False  # ZeRO-3: ``zero_buckets``' wide buckets (else layer-sized, the default)
    engine: str = "deepspeed"  # the engine that runs it: deepspeed, or fsdp2 (ZeRO-3 layouts only)
    replicas: int = 1  # FSDP2 across nodes: HSDP's replica groups, each sharding over workers / replicas ranks

    @property
    def peak_gib(self) -> float:
        return self.peak_bytes / GIB

    def describe(self, layers: int | None = None) -> str:
        """'2 GPUs, ZeRO-2, micro-batch 2 x 1, 8/32 layers checkpointed' style summary; under FSDP2
        'FSDP2 (ZeRO-3 layout)' stands for the stage, 'FSDP2' on one GPU (nothing to shard)."""
        gpus = f"{self.workers} GPU{'s' if self.workers > 1 else ''}"
        ac = f", {self.checkpointed}/{layers} layers checkpointed" if self.checkpointed and layers else \
            (f", {self.checkpointed} layers checkpointed" if self.checkpointed else "")
        batch = f"micro-batch {self.micro_batch_size} x {self.gradient_accumulation_steps}"
        stage = "FSDP2" if self.engine == "fsdp2" and self.workers == 1 else \
            ENGINE_NAMES[self.engine].format(stage=self.zero_stage)
        if self.replicas > 1:
            stage = f"FSDP2 HSDP ({self.replicas} replicas x {self.workers // self.replicas} shards)"
        return f"{gpus}, {stage}, {batch}{ac}"


def zero_buckets(stage: int, layer_params: int, wide: bool = False) -> dict[str, Any]:
    """ZeRO's buckets (elements) for decoder layers of ``layer_params`` parameters; ``deepspeed_setup`` applies them.

    ZeRO-2 reduces (and gathers) a layer's gradients (parameters) per bucket. ZeRO-3 gathers each decoder layer
    whole (a leaf module), prefetches two layers ahead, keeps up to max(7 layers, 1e9) parameters live, reduces
    gradients in 5e8-element buckets and keeps parameters under 1e6 elements (norms) whole on every rank,
    communication overlapped with compute. Measured on 2 H200s (docs/results.md): the 8B shape's ZeRO-3 at 7,715
    tokens/s per GPU against 7,397 with layer-sized buckets, the 1B shape's at 41,475 against 38,256. But with tied
    embeddings on the CPU the wide reduce bucket trips DeepSpeed 0.19.8's ZeRO-3 assertion that a bucket holds each
    parameter once (tests/trainable/test_worker.py), so the default is not ``wide``: one layer prefetched, three
    live, layer-sized reduce buckets, norms whole; ``wide=True`` (or ``train.deepspeed``) opts in.
    """
    if stage == 2:
        return {"reduce_bucket_size": layer_params, "allgather_bucket_size": layer_params, "overlap_comm": True,
                "contiguous_gradients": True}
    if stage == 3 and not wide:
        return {"reduce_bucket_size": layer_params, "stage3_prefetch_bucket_size": layer_params,
                "stage3_max_live_parameters": 3 * layer_params, "stage3_param_persistence_threshold": 100_000,
                "overlap_comm": True, "contiguous_gradients": True}
    if stage == 3:
        return {"reduce_bucket_size": int(5e8), "stage3_prefetch_bucket_size": 2 * layer_params,
                "stage3_max_live_parameters": max(7 * layer_params, int(1e9)),
                "stage3_param_persistence_threshold": int(1e6), "overlap_comm": True, "contiguous_gradients": True}
    return {}


def state_bytes(shape: ModelShape, stage: int, workers: int, zero: dict[str, Any] | None = None) -> float:
    """Weights, gradients, optimizer states and ZeRO's buffers per GPU (module docstring); ``zero`` the
    ``zero_optimization`` settings in force (default ``zero_buckets``)."""
    p, n = shape.params, workers
    zero = zero_buckets(stage, shape.layer_params) if zero is None else zero
    comm = NCCL_BUFFER_BYTES if n > 1 else 0.0
    if stage == 0:
        return 2 * p + 4 * p + 12 * p / n + comm
    if stage == 1:
        return 2 * p + 2 * p + 16 * p / n + comm
    if stage == 2:
        return 2 * p + 16 * p / n + 2 * 2 * zero.get("reduce_bucket_size", 5e8) + comm
    live = zero.get("stage3_max_live_parameters", 1e9)
    return 2 * p / n + 16 * p / n + 2 * live + 2 * zero.get("reduce_bucket_size", 5e8) \
        + 2 * shape.vocab * shape.hidden + comm


def activation_bytes(shape: ModelShape, tokens: int, checkpointed: int | bool,
                     saved: dict[str, float] = ACTIVATION_BYTES) -> float:
    """Activations kept for the backward of ``tokens`` tokens per GPU with ``checkpointed`` layers recomputed, a
    kept layer saving ``saved`` bytes per token and unit of each width."""
    k = shape.layers if checkpointed is True else min(int(checkpointed), shape.layers)
    per_layer = (saved["hidden"] * shape.hidden + saved["kv"] * shape.kv_width
                 + saved["intermediate"] * shape.intermediate) * tokens
    kept = (shape.layers - k) * per_layer + k * 2 * shape.hidden * tokens
    recompute = per_layer if k else 0
    loss = 4 * shape.hidden * tokens + 2 * shape.hidden * tokens + LOSS_CHUNK_BYTES
    return kept + recompute + loss


def peak_bytes(shape: ModelShape, stage: int, workers: int, micro_batch: int, seq_len: int,
               checkpointed: int | bool = 0, zero: dict[str, Any] | None = None, engine: str = "deepspeed",
               accumulation: int = 1, replicas: int = 1) -> float:
    """Predicted peak of PyTorch's allocator per GPU: the states plus the backward's activations (module
    docstring; ``engine`` fsdp2 for a layout on FSDP2, ``accumulation`` its micro-batches a step, ``replicas``
    its HSDP replica groups)."""
    activations = activation_bytes(shape, micro_batch * seq_len, checkpointed)
    if engine == "fsdp2":
        states = fsdp2_state_bytes(shape, workers, replicas)
        if accumulation == 1:
            return max(states + FSDP2_ACTIVATION_SCALE[False] * activations,
                       fsdp2_backward_start_bytes(shape, workers, micro_batch * seq_len, checkpointed, replicas))
        root_gradient = 4 * shape.embedding_params / (workers // replicas)
        return states + root_gradient + max(FSDP2_ACTIVATION_SCALE[True] * activations,
                                            FSDP2_ROOT_BYTES * shape.embedding_params)
    return DEEPSPEED_PEAK_SCALE[stage] * (state_bytes(shape, stage, workers, zero) + activations)


def fsdp2_state_bytes(shape: ModelShape, workers: int, replicas: int = 1) -> float:
    """FSDP2's states per GPU: float32 weights, gradients and AdamW moments sharded (16P/N over the N = workers /
    replicas ranks of a replica group), its communication buffers across GPUs and the LM head's gathered copy and
    gradient (module docstring)."""
    comm = NCCL_BUFFER_BYTES if workers > 1 else 0.0
    return 16 * shape.params / (workers // replicas) + comm + FSDP2_HEAD_BYTES * shape.vocab * shape.hidden


def fsdp2_backward_start_bytes(shape: ModelShape, workers: int, tokens: int, checkpointed: int | bool,
                               replicas: int = 1) -> float:
    """FSDP2's allocator at the start of a backward of one micro-batch of ``tokens`` tokens a GPU, where no gradient
    exists yet but every activation does: float32 weights and AdamW moments (12P/N), the root's gathered bf16 copy
    and the head gradient's bf16 storage (2 bytes per root and per head parameter), every kept layer's saved tensors
    (``activation_bytes`` with ``FSDP2_SAVED_BYTES``: checkpointed layers' inputs, one layer recomputed, the fused
    loss's workspace) and the root's other per-token tensors (``FSDP2_ROOT_TOKEN_BYTES``). 1B on an H200, packed
    Alpaca at micro-batch 4 and 8: 0.99x the measured 25.75 and 36.64 GiB, where 16P/N + 1.08 x ``activation_bytes`` said 25.8 and 32.6."""
    comm = NCCL_BUFFER_BYTES if workers > 1 else 0.0
    root = 2 * shape.embedding_params + 2 * shape.vocab * shape.hidden
    return (12 * shape.params / (workers // replicas) + comm + root
            + activation_bytes(shape, tokens, checkpointed, FSDP2_SAVED_BYTES)
            + FSDP2_ROOT_TOKEN_BYTES * shape.hidden * tokens)


def check_activation_bytes(shape: ModelShape, seq_len: int) -> float:
    """The attention check's activations (``trainable.attention_check``): one row of ``seq_len`` tokens with every
    layer recomputed, plus the math kernel's weights of the layer being recomputed (scores, probabilities and their
    gradients: 4 x heads x T^2 in bf16)."""
    return activation_bytes(shape, seq_len, True) + 4 * 2 * shape.heads * seq_len ** 2


def scoring_activation_bytes(shape: ModelShape, tokens: int) -> float:
    """A scoring forward's memory (no grad) under a cap of ``tokens`` padded tokens (``calibration.scoring``): the
    chunk's prefix cache and a row batch's own cache (its rows' prefixes gathered, and its rows), every layer's keys
    and values, each at most ``tokens``; and one layer's working set over the batch (``ACTIVATION_BYTES``, bf16)."""
    cache = 2 * 2 * shape.kv_width * shape.layers
    return (2 * cache + _working_bytes(shape)) * tokens


def _working_bytes(shape: ModelShape) -> float:
    """One decoder layer's working set per token of a forward without gradients (``ACTIVATION_BYTES``, bf16)."""
    return ACTIVATION_BYTES["hidden"] * shape.hidden + ACTIVATION_BYTES["intermediate"] * shape.intermediate


def entropy_stats_bytes(shape: ModelShape) -> float:
    """The entropy floor's statistics after scoring (``calibration.entropy.evaluation_entropy_stats``, once the
    scoring forwards are done) over ``MAX_TOKENS`` prompt tokens: their bf16 hidden states, the per-row copies they
    are joined from and their float32 magnitudes (2 + 2 + 4 bytes a dimension), beside the larger of its forwards
    (at most ``MAX_TOKENS`` padded tokens, ``ACTIVATION_BYTES`` working set) and the head in float32 (4VD) with
    three float32 chunks of logits (``CHUNK_ELEMENTS`` each)."""
    from calibration.entropy.prompt_states import MAX_TOKENS
    from calibration.entropy.statistics import CHUNK_ELEMENTS

    return 8 * MAX_TOKENS * shape.hidden + max(_working_bytes(shape) * MAX_TOKENS,
                                              4 * shape.vocab * shape.hidden + 3 * 4 * CHUNK_ELEMENTS)


def load_bytes(shape: ModelShape, workers: int, engine: str, replicas: int = 1) -> float:
    """What loading the model holds per GPU before training. DeepSpeed: the whole float32 model (4P) on every GPU
    and, as its engine casts and flattens it, its bf16 weights (2P): 6P (8B on two H200s under ZeRO-2: 44.97-45.31
    GiB measured with the head's kernels compiling beside it, 6P = 44.87; docs/measurements/2026-11-29c-h200x2).
    FSDP2 on one GPU: the whole float32 model, and a copy of the root module's tensors in flight as FSDP2 takes them
    at once: the embedding, and an untied LM head (8B on an H200: 4P + 2 x 4VD measured to the MiB; tied 1B: 4P +
    4VD). FSDP2 across GPUs (``trainable.sharded_load``): built on the meta
    device, a rank allocates its float32 shards (4P/N over a replica group's N ranks), a copy of one shard in flight
    (FSDP2 copies each new shard into its own storage) and, for stored weights broadcast from rank 0, one whole
    float32 tensor at a time: the embedding (a random init draws in place; counted all the same)."""
    largest = 4 * shape.vocab * shape.hidden
    if engine != "fsdp2":
        return 6 * shape.params
    if workers == 1:
        return 4 * shape.params + 4 * shape.embedding_params
    shards = workers // replicas
    return 4 * shape.params / shards + largest / shards + largest + NCCL_BUFFER_BYTES


def phase_peaks(shape: ModelShape, stage: int, workers: int, micro_batch: int, seq_len: int,
                checkpointed: int | bool = 0, zero: dict[str, Any] | None = None, engine: str = "deepspeed",
                accumulation: int = 1, scoring_tokens: int = 0, export: bool = False, replicas: int = 1
                ) -> dict[str, float]:
    """Predicted allocator peak per GPU of each phase of a trial, in the order they run (``max`` of them is the
    trial's): the load (``load_bytes`` and, beside it, the head's kernels compiled ahead on a stand-in head:
    ``kernels.precompile.precompile_bytes``), the attention check (the states and ``check_activation_bytes``), the
    training steps (``peak_bytes``), the export (``train.save_model``: FSDP2 and ZeRO-3 gather a bf16 copy, 2P, on
    rank 0; FSDP2 once its optimizer states are freed, 4P/N left) and scoring: forwards over ``scoring_tokens`` padded
    tokens, then the entropy floor's statistics (``entropy_stats_bytes``), FSDP2 on each rank's gathered copy,
    DeepSpeed in place (``zero3_scoring`` gathers a ZeRO-3 copy only where it fits); ``replicas``: an FSDP2 layout's
    HSDP replica groups."""
    fsdp2 = engine == "fsdp2"
    states = fsdp2_state_bytes(shape, workers, replicas) if fsdp2 else state_bytes(shape, stage, workers, zero)
    kept = 4 * shape.params / (workers // replicas) + (NCCL_BUFFER_BYTES if workers > 1 else 0.0) if fsdp2 \
        else states
    peaks = {"load": load_bytes(shape, workers, engine, replicas) + precompile_bytes(shape.vocab, shape.hidden, 2),
             "attention_check": states + check_activation_bytes(shape, seq_len),
             "train": peak_bytes(shape, stage, workers, micro_batch, seq_len, checkpointed, zero, engine, accumulation,
                                 replicas)}
    if export:
        peaks["export"] = kept + (2 * shape.params if fsdp2 or stage == 3 else 0.0)
    if scoring_tokens:
        forwards = max(scoring_activation_bytes(shape, scoring_tokens), entropy_stats_bytes(shape))
        peaks["score"] = kept + (2 * shape.params if fsdp2 else 0.0) + forwards
    return peaks


def planned_scoring_tokens(shape: ModelShape, stage: int, workers: int, micro_batch: int, seq_len: int,
                           checkpointed: int | bool = 0, zero: dict[str, Any] | None = None,
                           engine: str = "deepspeed", accumulation: int = 1, export: bool = False,
                           replicas: int = 1) -> int:
    """``eval.batch_tokens: auto``: the most padded tokens a scoring forward may take with the scoring phase's peak
    (``phase_peaks``' "score") at or below the larger of the trial's other phases and the entropy statistics that
    scoring runs anyway (``entropy_stats_bytes``), so that the forwards never set a trial's peak; at least one row
    of ``seq_len``, at most ``SCORING_TOKENS_MAX``."""
    peaks = phase_peaks(shape, stage, workers, micro_batch, seq_len, checkpointed, zero, engine, accumulation, 1,
                        export, replicas)
    per_token, entropy = scoring_activation_bytes(shape, 1), entropy_stats_bytes(shape)
    room = max(max(peaks.values()) - (peaks.pop("score") - max(per_token, entropy)), entropy)
    return int(min(SCORING_TOKENS_MAX, max(seq_len, room // per_token)))


def layout_engine(stage: int, workers: int, preferred_engine: str, on_gpu: bool = True) -> str:
    """The engine that runs a layout of ZeRO ``stage`` on ``workers`` ranks: ``preferred_engine`` (FSDP2 under
    ``engine: auto``) for stage 3 and for one GPU, DeepSpeed for the rest. On one GPU FSDP2 shards nothing: it trains
    bf16 over float32 master weights without DeepSpeed's bf16 optimizer wrapper, whose overflow check reads one value
    per parameter back on the host every step (docs/results.md, "Warm trials"). One CPU rank (``on_gpu`` False) has
    no GPU to wait on and stays on DeepSpeed."""
    return preferred_engine if stage == 3 or (workers == 1 and on_gpu) else "deepspeed"


def recorded_mfu(engine: str, stage: int, workers: int) -> float:
    """The MFU recorded for a layout (``RECORDED_MFU``, ``RECORDED_MFU_FSDP2``; ZeRO-1 takes ZeRO-2's)."""
    if engine == "fsdp2":
        return RECORDED_MFU_FSDP2[workers > 1]
    return RECORDED_MFU.get((stage, workers > 1), RECORDED_MFU[(2, True)])


def budget_bytes(gpu_memory_bytes: float, engine: str = "deepspeed") -> float:
    """What PyTorch may allocate on a GPU of ``gpu_memory_bytes``: less the CUDA context and allocator slack."""
    return (gpu_memory_bytes - CUDA_CONTEXT_BYTES) / (1 + ALLOCATOR_SLACK[engine])


def _divisors(n: int) -> list[int]:
    return [d for d in range(n, 0, -1) if n % d == 0]


def candidates(shape: ModelShape, seq_len: int, sequences_per_step: int, micro_batch: int,
               gpu_memory_bytes: float, workers: Iterable[int], stages: tuple[int, ...],
               checkpointing: bool | int | None, preferred_engine: str = "deepspeed",
               gpus_per_node: int | None = None) -> list[Layout]:
    """Every layout that fits: per (GPUs, stage, HSDP replicas, micro-batch up to ``micro_batch`` dividing the GPU's
    share of the step) the fewest checkpointed layers that fit (``checkpointing``: None to choose, False for none,
    True for all, or a count), with ``zero_buckets``' default buckets; ZeRO-3 on ``preferred_engine``; FSDP2 over
    more GPUs than ``gpus_per_node`` also as HSDP (``hsdp_replicas``). A micro-batch below the largest the config and
    the GPU's share allow costs ``SMALLER_MICRO_BATCH_COST``."""
    fitting = []
    for n in workers:
        if sequences_per_step % n:
            continue
        share = sequences_per_step // n
        micros = [d for d in _divisors(share) if d <= micro_batch]
        for stage in stages:
            if len(stages) > 1 and (stage > 0) != (n > 1) or len(stages) > 1 and stage == 1:
                continue  # choosing: ZeRO-0 on one GPU (nothing to partition), ZeRO-2 or 3 across GPUs
            engine = layout_engine(stage, n, preferred_engine)
            mfu = recorded_mfu(engine, stage, n)
            for micro, replicas in ((d, r) for d in micros
                                    for r in hsdp_replicas(n, gpus_per_node if engine == "fsdp2" else None)):
                wide = False  # zero_buckets' default (see there)
                zero = zero_buckets(stage, shape.layer_params, wide)
                layers = _checkpoint_choices(shape.layers, checkpointing)
                peaks = {k: max(phase_peaks(shape, stage, n, micro, seq_len, k, zero, engine, share // micro,
                                            replicas=replicas).values()) for k in layers}
                k = next((k for k in layers if peaks[k] <= budget_bytes(gpu_memory_bytes, engine)), None)
                if k is None:
                    continue
                slower = SMALLER_MICRO_BATCH_COST[engine == "fsdp2" and n > 1] if micro < max(micros) else 1.0
                cost = n / (mfu / (1 + k / (3 * shape.layers))) * slower
                fitting.append(Layout(n, stage, micro, share // micro, k, peaks[k], cost, wide, engine, replicas))
    return fitting


def hsdp_replicas(workers: int, gpus_per_node: int | None) -> list[int]:
    """The HSDP replica groups an FSDP2 layout of ``workers`` ranks may have: 1 (a full shard), and across nodes
    (``workers`` > ``gpus_per_node``) every R dividing them whose groups are whole nodes (workers / R a multiple
    of ``gpus_per_node``)."""
    if not gpus_per_node or workers <= gpus_per_node:
        return [1]
    return [r for r in range(1, workers // gpus_per_node + 1)
            if workers % r == 0 and (workers // r) % gpus_per_node == 0]


def _checkpoint_choices(layers: int, checkpointing: bool | int | None) -> list[int]:
    if checkpointing is None:
        return list(range(layers + 1))
    if checkpointing is True:
        return [layers]
    return [min(int(checkpointing), layers)]


def plan_layout(shape: ModelShape, seq_len: int, sequences_per_step: int, micro_batch: int,
                gpu_memory_bytes: float, workers: int | None = None, max_workers: int = 8,
                stage: int | None = None, checkpointing: bool | int | None = None,
                preferred_engine: str = "deepspeed", gpus_per_node: int = 8) -> Layout:
    """The cheapest fitting layout (module docstring); given ``workers``/``stage``/``checkpointing`` are kept,
    ZeRO-3 runs on ``preferred_engine``, FSDP2 across nodes of ``gpus_per_node`` GPUs as HSDP where that fits.
    Raises ValueError naming the model, memory and what was tried when nothing fits."""
    return fitting_layouts(shape, seq_len, sequences_per_step, micro_batch, gpu_memory_bytes, workers, max_workers,
                           stage, checkpointing, preferred_engine, gpus_per_node)[0]


def fitting_layouts(shape: ModelShape, seq_len: int, sequences_per_step: int, micro_batch: int,
                    gpu_memory_bytes: float, workers: int | None = None, max_workers: int = 8,
                    stage: int | None = None, checkpointing: bool | int | None = None,
                    preferred_engine: str = "deepspeed", gpus_per_node: int = 8) -> list[Layout]:
    """Every fitting layout of ``plan_layout``'s, the cheapest (its choice) first: by cost, then fewer GPUs, more
    HSDP replicas, the lower stage, fewer checkpointed layers. Raises ValueError as ``plan_layout``."""
    counts = [workers] if workers else [1 << i for i in range(int(math.log2(max_workers)) + 1)]
    fitting = candidates(shape, seq_len, sequences_per_step, micro_batch, gpu_memory_bytes, counts,
                         (stage,) if stage is not None else STAGES, checkpointing, preferred_engine, gpus_per_node)
    if not fitting:
        tried = candidates(shape, seq_len, sequences_per_step, 1, math.inf, counts,
                           (stage,) if stage is not None else STAGES,
                           True if checkpointing is None else checkpointing, preferred_engine)
        smallest = min(tried, key=lambda c: c.peak_bytes, default=None)
        closest = "" if smallest is None else (f": the smallest, {smallest.describe(shape.layers)}, peaks at "
                                               f"{smallest.peak_gib:.1f} GiB per GPU against the "
                                               f"{budget_bytes(gpu_memory_bytes, smallest.engine) / GIB:.1f} GiB PyTorch may allocate")
        raise ValueError(f"expected a layout of a {shape.params / 1e9:.2f}B-parameter model ({sequences_per_step} "
                         f"sequences of {seq_len} tokens a step) within {gpu_memory_bytes / GIB:.1f} GiB GPUs on "
                         f"{'/'.join(map(str, counts))} GPUs, got none{closest}; "
                         f"raise resources.max_workers_per_trial or lower sft.max_seq_len")
    return sorted(fitting, key=lambda c: (round(c.cost, 6), c.workers, -c.replicas, c.zero_stage, c.checkpointed))


def gpu_hours(shape: ModelShape, layout: Layout, tokens: float, seq_len: int) -> float:
    """Predicted GPU-hours to train ``tokens`` tokens: tokens x FLOPs per token / (MFU x peak) x recompute."""
    mfu = recorded_mfu(layout.engine, layout.zero_stage, layout.workers)
    recompute = 1 + layout.checkpointed / (3 * shape.layers)
    return tokens * shape.flops_per_token(seq_len) * recompute / (mfu * PEAK_FLOPS) / 3600


def planned_stage(engine: str, zero_stage: int | str) -> int | None:
    """The ZeRO stage ``plan_layout`` is held to: 3 under ``engine: fsdp2`` (it shards as ZeRO-3 does), else the
    config's explicit stage, or None ('auto') to choose."""
    if engine == "fsdp2":
        return 3
    return None if zero_stage == "auto" else int(zero_stage)


def with_layout(train: Any, layout: Layout, shape: ModelShape | None = None) -> Any:
    """A ``TrainConfig`` with the layout's stage, micro-batch, accumulation, checkpointed layers and HSDP replica
    groups (``fsdp_replicas``); wide ZeRO-3
    buckets go under ``train.deepspeed`` (its own entries still win). ``train.engine`` stays: the worker derives the
    layout's engine from it (``trainable.config.engine_for``)."""
    deepspeed = train.deepspeed
    if layout.wide_buckets and shape is not None:
        ours = zero_buckets(layout.zero_stage, shape.layer_params, wide=True)
        deepspeed = {**deepspeed, "zero_optimization": {**ours, **deepspeed.get("zero_optimization", {})}}
    return dataclasses.replace(train, zero_stage=layout.zero_stage,
                               micro_batch_size=layout.micro_batch_size,
                               gradient_accumulation_steps=layout.gradient_accumulation_steps,
                               activation_checkpointing=layout.checkpointed, deepspeed=deepspeed,
                               fsdp_replicas=layout.replicas)


def model_shape(spec: Any) -> ModelShape | None:
    """The shape of a ``common.models.ModelSpec``: its architecture config (random init), the registry's
    dimensions, or the Hugging Face config at its location; None when none can be read (offline, unknown)."""
    from transformers import AutoConfig

    if spec.source == "random_init":
        config = AutoConfig.for_model(spec.location, **spec.architecture_config)
        return ModelShape.from_config(config.get_text_config())
    if spec.dimensions and spec.hidden_size and spec.vocab_size:
        return ModelShape.from_config({**spec.dimensions, "hidden_size": spec.hidden_size,
                                       "vocab_size": spec.vocab_size}, spec.params)
    try:
        config = AutoConfig.from_pretrained(spec.location)
    except Exception:  # noqa: BLE001 - no readable config: the layout falls back to the config's own settings
        return None
    return ModelShape.from_config(config.get_text_config())
