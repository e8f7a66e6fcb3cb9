"""SFT throughput on N GPUs of one host: calsweep's trial loop vs the Hugging Face Trainer, same DeepSpeed stage,
model shape, batch, data and beta, in one run.

    python benchmarks/bench_sft_throughput.py --out throughput.json                  # the default rows below
    python benchmarks/bench_sft_throughput.py --rows 1b:1:0:4:random,1b:1:3:4:random --impls calsweep
    python benchmarks/bench_sft_throughput.py --rows 8b:2:auto:8:random,8b:4:auto:8:random,8b:8:auto:8:random \
        --impls calsweep,torchtitan_settings          # issue 47: scaling, torchtitan's settings beside each row
    python benchmarks/bench_sft_throughput.py --rows 14b:4:auto:2:random,32b@14L:2:auto:2:random --impls calsweep

A row is ``shape:gpus:zero_stage:batch_per_gpu:data``; the defaults are issue 35's rows: the 1B shape on one GPU
(ZeRO-0, ZeRO-3), on two (ZeRO-2, ZeRO-3, auto), the 8B shape on two (ZeRO-2, ZeRO-3, auto) and packed Alpaca.
``auto`` takes ``trainable.layout.plan_layout``'s choice for that many GPUs of this host's memory and the row's
sequences per step (batch x GPUs): stage, micro-batch x accumulation and recomputed layers, as a sweep trial
would; ``--recompute K`` recomputes the first K decoder layers of the other rows and ``--micro-batch M`` splits
their batch into micro-batches of M. Shapes: ``1b`` Llama-3.2-1B (1.24B params, vocab 128,256, tied), ``8b``
Llama-3.1-8B (8.03B, untied), ``tiny`` and ``small`` (2 and 4 layers of width 64 and 128, for the CPU), and the
shapes that need a node, as ``sweeps/configs/node_llama.yaml`` declares them: ``14b``, ``32b``, ``70b``;
``SHAPE@NL`` keeps the first N decoder layers (``32b@14L``: the 32B shape's states per GPU on 2 GPUs that the
whole shape has on 8, to check its memory model on fewer GPUs); random init in bf16 on the GPU, SDPA attention,
sequence ``--seq-len`` (2048).
``random``: one batch of random tokens, every token labelled. ``alpaca``: the project's SFT data path
(``trainable.sft_data.build_sft_examples`` on Alpaca under ``--data-dir`` with the ``--tokenizer`` family or
folder, loss on responses only) in packed rows of ``--seq-len`` tokens (``trainable.sequence_packing``), the same
rows for every implementation. A row that needs more GPUs than the host has is listed as skipped.

Each (row, implementation) runs under ``torchrun`` in its own processes (clean peak-memory counters):
``--warmup`` optimiser steps, then ``--steps`` timed ones; the fused head's Triton kernels compile ahead, as a
trial's do while it loads (``kernels.precompile``), so that no timed step waits on a first launch's compile (an 8B
row once lost 16% so). ``--memory-at-peak`` adds what rank 0's allocator peak holds (``memory_at_peak.py``).
Implementations:
- ``hf_trainer``: ``Trainer`` + DeepSpeed (its "auto" ZeRO buckets), ``label_smoothing_factor``, fused AdamW.
- ``calsweep_eager`` / ``calsweep``: the trial loop (``trainable.step_accounting.optimizer_step``: DeepSpeed
  engine from ``trainable.deepspeed_setup``, fused label-smoothed loss, torch's fused AdamW) without / with the
  trial's compilation (``trainable.compiled``, the CUDA default). On an ``auto`` row ``calsweep`` runs what a
  trial runs by default: a ZeRO-3 or one-GPU layout on FSDP2 (``trainable.layout.layout_engine``).
- ``torchtitan_settings``: torchtitan's Llama-3.1-8B row (docs/performance.md, Table 1: FSDP + torch.compile, 8
  H100s, local batch 2 x 8192 tokens, 6,667 tokens/s per GPU) as far as its settings carry over: FSDP2 (bf16
  compute, float32 reduce; ``trainable.fsdp2_engine``), each decoder layer compiled, fused AdamW, the same tokens
  per GPU per step as the row (8 x 2048 = 2 x 8192), the layout planned as ZeRO-3's on auto rows; and its loss,
  plain cross-entropy on float32 logits (``benchmarks/plain_cross_entropy.py``). What differs: 2048-token rows
  (less attention work than 8192), the planner's recomputed layers instead of torchtitan's per-op selective
  checkpointing, random tokens, this host's GPUs (torchtitan's: 96 GB H100s at 500 W); its logits count in its
  peak but not in the prediction. calsweep's rows run the fused label-smoothed loss that never forms the logits.
Tokens/s count real (non-padding) tokens over all ranks, per GPU; "vs fewest" is the per-GPU rate against the same
implementation's random row of the shape on the fewest GPUs in the run (the scaling; one GPU where it fits). For the Trainer they are counted as its data
collator hands rows out (its loader runs one batch ahead at both ends of the timed window, so the counts shift
and cancel). MFU = tokens/s * (6 N + 12 L d T) / 989e12 per GPU, N = non-embedding params + the LM head.
Peak memory is the largest over the ranks (PyTorch's allocator), beside ``trainable.layout``'s prediction for
the row's layout, with the peak reserved and the allocator's retries (cache freed to retry a cudaMalloc: a GPU at
the edge of its memory), under the allocator settings a sweep's workers get (``alloc_conf`` in each record:
``trainable.trial_memory.alloc_conf``, PyTorch's default unless PYTORCH_CUDA_ALLOC_CONF is set). Dynamo's graphs, graph breaks and recompiles of each run are counted. ``--ds`` merges JSON
into calsweep's DeepSpeed config (knob trials). ``calsweep_engine_compile`` is DeepSpeed's own compiler
(``compile: {deepcompile: true}`` and ``engine.compile()``) over the eager loop. ``calsweep_fsdp2`` (rows of stage 3,
or auto: its micro-batch, accumulation and recomputed layers) is the same compiled trial loop on the trials' FSDP2
engine (``trainable.fsdp2_engine``, ``train.engine: fsdp2``): ZeRO-3's layout under another engine.
FSDP2 runs build the whole float32 model on each GPU before sharding it, as trials do; ``--meta-init`` builds it on
the meta device and each rank allocates and initialises only its shards (``fsdp2_engine.init_sharded``): needed for
``32b`` and ``70b`` rows, whose float32 copies (121 and 263 GiB) fit no GPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import subprocess
import sys
import time
from pathlib import Path


IMPLS = ("hf_trainer", "calsweep_eager", "calsweep", "calsweep_engine_compile", "calsweep_fsdp2", "torchtitan_settings")
DEFAULT_ROWS = ("1b:1:0:4:random,1b:1:3:4:random,1b:2:2:4:random,1b:2:3:4:random,1b:2:auto:4:random,"
                "8b:2:2:2:random,8b:2:3:2:random,8b:2:auto:2:random,1b:1:auto:4:alpaca")
SHAPES = {
    "1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
               num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=True, rope_theta=500000.0,
               max_position_embeddings=8192, head_dim=64),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=49152, tie_word_embeddings=True, max_position_embeddings=512),
    "small": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=49152, tie_word_embeddings=True, max_position_embeddings=512),
    "8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
               num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=False, rope_theta=500000.0,
               max_position_embeddings=8192, head_dim=128),
}
NODE_SHAPES = Path(__file__).resolve().parent.parent / "sweeps" / "configs" / "node_llama.yaml"
DATA = ("random", "alpaca")


def _node_shapes() -> dict[str, dict]:
    """The shapes that need a node or more, as ``NODE_SHAPES`` declares them: family 'llama-14b' -> '14b'."""
    import yaml

    models = yaml.safe_load(NODE_SHAPES.read_text())["custom_models"]
    return {name.removeprefix("llama-"): model["config"] for name, model in models.items()}


SHAPES.update(_node_shapes())


def shape_config(name: str) -> dict:
    """A row's shape: a ``SHAPES`` key, or 'KEY@NL' for that shape with its first N decoder layers (a multi-GPU
    check of a large shape's memory model on fewer GPUs). Raises ValueError naming the bad shape."""
    key, _, layers = name.partition("@")
    if key not in SHAPES or layers and not (layers.endswith("L") and layers[:-1].isdigit() and int(layers[:-1]) >= 1):
        raise ValueError(f"expected shape in {sorted(SHAPES)}, optionally @<layers>L (e.g. 32b@12L), "
                         f"got {name!r}")
    return {**SHAPES[key], **({"num_hidden_layers": int(layers[:-1])} if layers else {})}


def parse_row(text: str) -> dict:
    """``shape:gpus:zero:batch:data`` -> a dict; a bad row raises ValueError naming it and the format."""
    parts = text.split(":")
    try:
        shape, gpus, zero, batch, data = parts
        row = dict(shape=shape, gpus=int(gpus), zero=zero if zero == "auto" else int(zero), batch=int(batch),
                   data=data)
    except ValueError:
        raise ValueError(f"expected a row like 1b:2:3:4:random (shape:gpus:zero_stage:batch_per_gpu:data), "
                         f"got {text!r}") from None
    if data not in DATA or row["zero"] not in (0, 1, 2, 3, "auto") or row["gpus"] < 1:
        raise ValueError(f"expected shape in {sorted(SHAPES)}, gpus >= 1, zero stage 0-3 or auto and data in "
                         f"{DATA}, got {text!r}")
    shape_config(shape)
    return row


def row_name(row: dict) -> str:
    return f"{row['shape']}:{row['gpus']}:{row['zero']}:{row['batch']}:{row['data']}"


# ---------------------------------------------------------------- inside torchrun: one rank of one measurement

def _device():
    """This rank's GPU, or the CPU where there is none (the CPU test of this script: gloo, float32)."""
    import torch

    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    return torch.device("cpu")


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)


def _model(shape: str, device, dtype=None):
    """The row's random-init model on ``device``: bf16 on a GPU, float32 on the CPU, unless ``dtype`` is given."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    config = AutoConfig.for_model("llama", **shape_config(shape), attn_implementation="sdpa")
    with torch.device(device):
        return AutoModelForCausalLM.from_config(
            config, dtype=dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32))


def _flops_per_token(model, seq_len: int) -> float:
    from trainable.layout import ModelShape

    return ModelShape.from_config(model.config, sum(p.numel() for p in model.parameters())).flops_per_token(seq_len)


def _rows_of_data(args, row: dict, rank: int, world: int, micro_batch: int | None = None):
    """An endless iterator of this rank's micro-batches of ``micro_batch`` rows (default the row's batch; dicts of
    CPU tensors with an attention_mask that marks real tokens) and, for the Trainer, every row of one epoch."""
    import itertools

    import torch

    micro_batch = micro_batch or row["batch"]
    if row["data"] == "random":
        g = torch.Generator().manual_seed(1 + rank)
        ids = torch.randint(0, shape_config(row["shape"])["vocab_size"], (row["batch"], args.seq_len), generator=g)
        batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}
        micro = [{k: v[i:i + micro_batch] for k, v in batch.items()} for i in range(0, row["batch"], micro_batch)]
        return itertools.cycle(micro), [{k: v[i] for k, v in batch.items()} for i in range(row["batch"])]
    from trainable.config import SFTConfig
    from common.models import load_tokenizer, resolve_model
    from trainable.sequence_packing import collate_packed, epoch_rows, iterate_packed_batches
    from trainable.sft_data import build_sft_examples

    tokenizer = load_tokenizer(resolve_model(args.tokenizer))
    examples = build_sft_examples(SFTConfig(dataset="alpaca", max_seq_len=args.seq_len), tokenizer, 0, args.data_dir)
    batches = iterate_packed_batches(examples, micro_batch, args.seq_len, tokenizer.pad_token_id, 0, rank, world)
    rows = epoch_rows(examples, args.seq_len, 0, 0)
    every_row = collate_packed(examples, rows, args.seq_len, tokenizer.pad_token_id)
    return batches, [{k: v[i] for k, v in every_row.items()} for i in range(len(rows))]


def _layout(args, row: dict, device, preferred: str, stage: int | None = None):
    """The row's ``trainable.layout.Layout``: planned for 'auto' (held to ZeRO ``stage`` if given), else the row's
    stage with ``--micro-batch`` (default the whole batch) and ``--recompute`` layers (its ``peak_bytes`` the memory
    model's prediction either way)."""
    import torch

    from trainable.layout import Layout, ModelShape, layout_engine, peak_bytes, plan_layout

    shape = ModelShape.from_config(shape_config(row["shape"]))
    memory = torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else 80 * 2**30
    if args.gpu_memory_gib:  # plan for, and cap PyTorch at, a smaller GPU's memory (an H100's on an H200)
        if device.type == "cuda":
            torch.cuda.set_per_process_memory_fraction(args.gpu_memory_gib * 2**30 / memory, device)
        memory = args.gpu_memory_gib * 2**30
    if row["zero"] == "auto":
        layout = plan_layout(shape, args.seq_len, row["batch"] * row["gpus"], row["batch"], memory,
                             workers=row["gpus"], stage=stage, preferred_engine=preferred)
        engine = layout_engine(layout.zero_stage, layout.workers, preferred, on_gpu=device.type == "cuda")
        return shape, dataclasses.replace(layout, engine=engine)  # as a trial on this device runs it
    micro = args.micro_batch or row["batch"]
    engine = layout_engine(row["zero"], row["gpus"], preferred, on_gpu=device.type == "cuda")
    peak = peak_bytes(shape, row["zero"], row["gpus"], micro, args.seq_len, args.recompute, engine=engine,
                      accumulation=row["batch"] // micro)
    return shape, Layout(row["gpus"], row["zero"], micro, row["batch"] // micro, args.recompute, peak, float("nan"),
                         engine=engine)


def _dynamo_counts() -> dict[str, int]:
    from torch._dynamo.utils import counters

    return {"graphs": counters["stats"]["unique_graphs"], "graph_breaks": sum(counters["graph_break"].values()),
            "recompiles": sum(counters["recompiles"].values()) if "recompiles" in counters else 0}


def run_calsweep(args, row: dict, impl: str) -> dict:
    import torch
    import torch.distributed as dist

    from trainable import deepspeed_setup, fsdp2_engine
    from trainable.compiled import compile_wanted, compiled_decoder_layers
    from trainable.config import TrainConfig, preferred_engine
    from trainable.layout import with_layout
    from trainable.deepspeed_setup import resolve_precision
    from trainable.lm_head import CausalLMWithFusedLoss, head_shape, precompile_fused_head
    from trainable.recompute import recomputed_layers
    from trainable.step_accounting import PendingLoss, optimizer_step

    import memory_at_peak  # this script's siblings (torchrun runs it from benchmarks/)
    from plain_cross_entropy import PlainCrossEntropyLM

    rank, world = dist.get_rank(), dist.get_world_size()
    device = _device()
    if args.memory_at_peak and rank == 0 and device.type == "cuda":
        memory_at_peak.start()
    ds = json.loads(args.ds) if args.ds else {}
    # the engine of ZeRO-3 and one-GPU layouts: FSDP2 for calsweep_fsdp2 and torchtitan's settings (held to ZeRO-3's
    # layout), a trial's default on auto rows
    titan = impl == "torchtitan_settings"
    preferred = "fsdp2" if impl in ("calsweep_fsdp2", "torchtitan_settings") else \
        preferred_engine(TrainConfig(deepspeed=ds)) if impl == "calsweep" and row["zero"] == "auto" else "deepspeed"
    shape, layout = _layout(args, row, device, preferred, stage=3 if titan else None)
    fsdp2 = layout.engine == "fsdp2"
    ds = {} if fsdp2 else ds
    meta = fsdp2 and args.meta_init  # each rank allocates only its shards (a float32 32B is 121 GiB a GPU otherwise)
    model = _model(row["shape"], torch.device("meta") if meta else device,
                   dtype=torch.float32 if fsdp2 else None)  # FSDP2 keeps fp32 master weights
    flops = _flops_per_token(model, args.seq_len)
    wrapped = PlainCrossEntropyLM(model) if titan else CausalLMWithFusedLoss(model, label_smoothing=args.beta)
    if impl == "calsweep_engine_compile":
        ds = {**ds, "compile": {"deepcompile": True}}
    compiled_impls = ("calsweep", "calsweep_fsdp2", "torchtitan_settings")
    train = with_layout(TrainConfig(max_steps=args.warmup + args.steps, precision="auto", warmup_ratio=0.0,
                                    compile=impl in compiled_impls, deepspeed=ds), layout, shape)
    # the head's kernels compile ahead as in a trial (trainable.worker), not inside the timed steps
    compiled_head = (lambda: None) if titan else precompile_fused_head(
        head_shape(model.config), device, resolve_precision(train.precision, device),
        layout.micro_batch_size * args.seq_len, args.beta, train.loss_impl, train.loss_filter)
    build_engine = fsdp2_engine.build_engine if fsdp2 else deepspeed_setup.build_engine
    engine, _ = build_engine(wrapped, train, 1e-5, args.warmup + args.steps, device, world,
                             **({"materialise": functools.partial(fsdp2_engine.init_sharded, device=device,
                                                                  std=model.config.initializer_range)}
                                if meta else {}))
    if impl == "calsweep_engine_compile":  # DeepSpeed's own torch.compile of the whole module (ZeRO-3 aware hooks)
        engine.compile()
    batches, _ = _rows_of_data(args, row, rank, world, layout.micro_batch_size)
    tokens = [0]

    def step() -> PendingLoss:
        micro = [next(batches) for _ in range(layout.gradient_accumulation_steps)]
        tokens[0] += sum(int(batch["attention_mask"].sum()) for batch in micro)
        return PendingLoss(optimizer_step(engine, micro, device, world), len(micro), world)

    compiled_head()
    torch._dynamo.reset()
    with recomputed_layers(model, layout.checkpointed), \
            compiled_decoder_layers(model, compile_wanted(train.compile, device)) as compiled:
        how = ", compiled layers" if compiled else ", deepcompile" if impl == "calsweep_engine_compile" else ""
        sharding = "FSDP2" if fsdp2 else f"ZeRO-{layout.zero_stage}"
        name = f"torchtitan settings (FSDP2, plain CE{how})" if titan else f"calsweep ({sharding}, fused LS-CE{how})"
        result, first_steps = _timed(args, row, step, device, flops, tokens, name)
        result.update(zero_stage=layout.zero_stage, micro_batch=layout.micro_batch_size,
                      accumulation=layout.gradient_accumulation_steps, recomputed_layers=int(layout.checkpointed),
                      layers=shape.layers, predicted_peak_gib=layout.peak_gib, warmup_step_s=first_steps,
                      wide_buckets=layout.wide_buckets, deepspeed_overrides=ds,
                      engine=layout.engine, **_dynamo_counts())
        if args.memory_at_peak and rank == 0 and device.type == "cuda":
            result["memory_at_peak"] = memory_at_peak.at_peak(torch.cuda.memory._snapshot(), device.index)
            torch.cuda.memory._record_memory_history(enabled=None)
            print(f"{row_name(row)} {name}: " + memory_at_peak.table(result["memory_at_peak"]), flush=True)
        if args.profile and rank == 0:
            _profile(step, args.profile, args.trace)
    return result


def _timed(args, row: dict, step, device, flops: float, tokens: list[int], name: str) -> tuple[dict, list[float]]:
    """``--warmup`` steps (the seconds from the start to the end of each), then ``--steps`` timed ones, each
    step's loss read after the next is queued, as the trial loop reads a quiet step's: the row's result (with the
    seconds from the timed start at which each loss was read, ``timed_loss_read_s``) and the warm-up times.
    ``tokens[0]`` is the count ``step`` adds its real tokens to."""
    started = time.perf_counter()
    first_steps = []
    for _ in range(args.warmup):
        step().value()
        _sync_end(device)
        first_steps.append(time.perf_counter() - started)
    _sync(device)
    started, tokens[0] = time.perf_counter(), 0
    previous, read = None, []
    for _ in range(args.steps):
        pending = step()
        if previous is not None:
            previous.value()
            read.append(time.perf_counter() - started)
        previous = pending
    loss = previous.value()
    _sync_end(device)
    seconds = time.perf_counter() - started
    return {**_result(name, args, row, seconds, flops, loss, tokens[0]), "timed_loss_read_s": read}, first_steps


def _sync_end(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _profile(step, steps: int, trace: str | None) -> None:
    """Print the CUDA-time table of ``steps`` more steps (after the timed ones); with ``trace`` write the trace."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=40, max_name_column_width=70))
    if trace:
        prof.export_chrome_trace(trace)


def run_hf_trainer(args, row: dict) -> dict:
    import torch
    import torch.distributed as dist
    from torch.utils.data import Dataset
    from transformers import Trainer, TrainerCallback, TrainingArguments

    rank, world = dist.get_rank(), dist.get_world_size()
    device = _device()
    total = args.warmup + args.steps
    _, every_row = _rows_of_data(args, row, rank, world)

    class Rows(Dataset):
        def __len__(self):
            return row["batch"] * world * (total + 2)

        def __getitem__(self, index):
            return every_row[index % len(every_row)]

    class CountingCollator:
        """Stacks rows for the model (packed rows: no attention mask, positions mark the examples) and counts
        the real tokens it has handed out."""
        tokens = 0

        def __call__(self, items):
            self.tokens += int(sum(int(item["attention_mask"].sum()) for item in items))
            keys = ("input_ids", "labels", "position_ids") if "position_ids" in items[0] else \
                ("input_ids", "labels", "attention_mask")
            return {k: torch.stack([item[k] for item in items]) for k in keys}

    class Clock(TrainerCallback):
        started = tokens_at_start = None

        def on_step_begin(self, targs, state, control, **kwargs):
            if state.global_step == args.warmup:
                _sync(device)
                self.started, self.tokens_at_start = time.perf_counter(), collator.tokens

    model = _model(row["shape"], device)
    flops = _flops_per_token(model, args.seq_len)
    collator, clock = CountingCollator(), Clock()
    ds_config = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
                 "train_batch_size": "auto", "gradient_clipping": "auto", "bf16": {"enabled": "auto"},
                 "zero_optimization": {"stage": row["zero"], "overlap_comm": True, "contiguous_gradients": True,
                                       "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
                                       "stage3_param_persistence_threshold": "auto"}}
    targs = TrainingArguments(output_dir="/tmp/hf_trainer_bench", per_device_train_batch_size=row["batch"],
                              max_steps=total, bf16=device.type == "cuda", label_smoothing_factor=args.beta,
                              optim="adamw_torch_fused" if device.type == "cuda" else "adamw_torch", use_cpu=device.type == "cpu",
                              learning_rate=1e-5, lr_scheduler_type="constant", logging_steps=10**6,
                              save_strategy="no", report_to=[], dataloader_num_workers=0, seed=0,
                              deepspeed=ds_config, remove_unused_columns=False)
    trainer = Trainer(model=model, args=targs, train_dataset=Rows(), data_collator=collator, callbacks=[clock])
    output = trainer.train()
    _sync_end(device)
    seconds = time.perf_counter() - clock.started
    return _result("Hugging Face Trainer + DeepSpeed (label_smoothing_factor)", args, row, seconds, flops,
                   float(output.training_loss), collator.tokens - clock.tokens_at_start)


def _result(name: str, args, row: dict, seconds: float, flops_per_token: float, loss: float, tokens: int) -> dict:
    import torch
    import torch.distributed as dist

    from trainable.layout import PEAK_FLOPS

    device = _device()
    stats = torch.cuda.memory_stats(device) if device.type == "cuda" else {}
    # largest over the ranks: allocated and reserved peaks (GiB), and the allocator's cudaFree-and-retry count
    peaks = [stats.get(k, 0) / 2**30 for k in ("allocated_bytes.all.peak", "reserved_bytes.all.peak")]
    totals = torch.tensor([float(tokens)], device=device)
    peak = torch.tensor([*peaks, float(stats.get("num_alloc_retries", 0))], device=device)
    dist.all_reduce(totals)
    dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    per_gpu = float(totals[0]) / seconds / row["gpus"]
    return {"impl": name, "row": row_name(row), **row, "tokens_per_s_per_gpu": per_gpu,
            "mfu": per_gpu * flops_per_token / PEAK_FLOPS, "peak_gib": float(peak[0]),
            "peak_reserved_gib": float(peak[1]), "alloc_retries": int(peak[2]),
            "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
            "step_ms": 1000 * seconds / args.steps, "last_loss": loss, "seq_len": args.seq_len, "beta": args.beta,
            "steps": args.steps, "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
            "date": time.strftime("%Y-%m-%d"),
            "versions": _versions()}


def _versions() -> dict[str, str]:
    import deepspeed
    import torch
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__, "deepspeed": deepspeed.__version__}


def worker(args) -> None:
    """One rank of one (row, implementation) under torchrun; rank 0 writes the JSON result."""
    import torch
    import torch.distributed as dist

    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    else:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    row = parse_row(args.row)
    result = run_hf_trainer(args, row) if args.impl == "hf_trainer" else run_calsweep(args, row, args.impl)
    if dist.get_rank() == 0:
        Path(args.out).write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


# ---------------------------------------------------------------- the driver: every row x implementation

def _launch(args, row: dict, impl: str, part: Path) -> dict:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={row['gpus']}",
               __file__, "--worker", "--impl", impl, "--row", row_name(row), "--out", str(part)] + \
        [f"--{k.replace('_', '-')}" + ("" if v is True else f"={v}") for k, v in vars(args).items()
         if k in ("seq_len", "beta", "steps", "warmup", "profile", "trace", "ds", "tokenizer", "data_dir", "recompute",
                  "micro_batch", "gpu_memory_gib", "meta_init", "memory_at_peak")
         and v]
    completed = subprocess.run(command, text=True)
    if completed.returncode == 0 and part.exists():
        return {**json.loads(part.read_text()), "impl_id": impl}
    return {"impl": impl, "impl_id": impl, "row": row_name(row), **row, "error": f"exit code {completed.returncode}"}


def table(results: list[dict]) -> str:
    """Rows x implementations: tokens/s per GPU, MFU, peak GiB, step ms, against the Trainer of the same row,
    against the same implementation's random row of the shape on the fewest GPUs (the scaling: one GPU where the
    shape fits one), and (real-data rows) against the same
    implementation's random row of the same shape, GPUs, stage and batch."""
    lines = [f"{'row':<22} {'implementation':<52} {'tok/s/GPU':>10} {'MFU':>6} {'peak GiB':>8} {'pred GiB':>8} "
             f"{'step ms':>8} {'vs Trainer':>10} {'vs fewest':>9} {'vs random':>9}  layout"]
    trainer = {r["row"]: r["tokens_per_s_per_gpu"] for r in results
               if "error" not in r and r["impl"].startswith("Hugging Face")}
    single = {}  # (shape, impl) -> (GPUs, rate) of its random row on the fewest GPUs (one where it fits)
    for r in sorted((r for r in results if "error" not in r and r["data"] == "random"), key=lambda r: -r["gpus"]):
        single[(r["shape"], r["impl"])] = (r["gpus"], r["tokens_per_s_per_gpu"])
    random_rows = {(r["shape"], r["gpus"], r["zero"], r["batch"], r["impl"]): r["tokens_per_s_per_gpu"]
                   for r in results if "error" not in r and r["data"] == "random"}
    for r in results:
        if "error" in r:
            lines.append(f"{r['row']:<22} {r['impl']:<52} {r['error']}")
            continue
        ratio = f"{r['tokens_per_s_per_gpu'] / trainer[r['row']]:.2f}x" if r["row"] in trainer else "-"
        fewest, own = single.get((r["shape"], r["impl"]), (r["gpus"], None))
        scaling = f"{r['tokens_per_s_per_gpu'] / own:.2f}x" if own and r["gpus"] > fewest else "-"
        same_random = random_rows.get((r["shape"], r["gpus"], r["zero"], r["batch"], r["impl"]))
        real = f"{r['tokens_per_s_per_gpu'] / same_random:.2f}x" if same_random and r["data"] != "random" else "-"
        predicted = f"{r['predicted_peak_gib']:>8.1f}" if "predicted_peak_gib" in r else f"{'-':>8}"
        layout = _layout_text(r) if "zero_stage" in r else ""
        lines.append(f"{r['row']:<22} {r['impl']:<52} {r['tokens_per_s_per_gpu']:>10,.0f} {100 * r['mfu']:>5.1f}% "
                     f"{r['peak_gib']:>8.1f} {predicted} {r['step_ms']:>8.1f} {ratio:>10} {scaling:>9} {real:>9}  "
                     f"{layout}")
    return "\n".join(lines)


def _layout_text(r: dict) -> str:
    """'ZeRO-3 1x2 recompute 8/32 peak/pred 0.97 graphs 1 breaks 0': a calsweep result's layout, its measured peak
    over the memory model's prediction, and Dynamo counts."""
    recompute = f" recompute {r['recomputed_layers']}/{r['layers']}" if r["recomputed_layers"] else ""
    buckets = "" if r.get("wide_buckets", True) or r.get("engine") == "fsdp2" else " layer buckets"
    engine = "FSDP2" if r.get("engine") == "fsdp2" else f"ZeRO-{r['zero_stage']}"
    measured, predicted = r["peak_gib"], r.get("predicted_peak_gib")
    against = f" peak/pred {measured / predicted:.2f}" if measured and predicted else ""
    return (f"{engine} {r['micro_batch']}x{r['accumulation']}{recompute}{buckets}{against} graphs {r['graphs']} "
            f"breaks {r['graph_breaks']} recompiles {r['recompiles']}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default=DEFAULT_ROWS, help="comma-separated shape:gpus:zero:batch:data")
    parser.add_argument("--impls", default=",".join(IMPLS), help=f"comma-separated, of {IMPLS}")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--beta", type=float, default=0.1)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--tokenizer", default="smollm2-135m", help="alpaca rows: a family name or tokenizer folder")
    parser.add_argument("--data-dir", default=os.environ.get("CALSWEEP_DATA_DIR"),
                        help="alpaca rows: data root holding alpaca/ (default $CALSWEEP_DATA_DIR, else the hub)")
    parser.add_argument("--ds", default=None, help="JSON merged into calsweep's DeepSpeed config")
    parser.add_argument("--gpu-memory-gib", type=float, default=None,
                        help="plan auto rows for GPUs of this memory and cap PyTorch's allocator there (79.6: H100)")
    parser.add_argument("--recompute", type=int, default=0,
                        help="calsweep rows with a stage: recompute the first K decoder layers in the backward")
    parser.add_argument("--micro-batch", type=int, default=0,
                        help="calsweep rows with a stage: micro-batch per GPU (accumulating to the row's batch)")
    parser.add_argument("--meta-init", action="store_true",
                        help="FSDP2 runs: build the model on the meta device and initialise each rank's shards (for "
                             "shapes whose float32 copy does not fit one GPU: 32b and 70b on a node)")
    parser.add_argument("--memory-at-peak", action="store_true",
                        help="calsweep on a GPU: record rank 0's allocator and report what its peak holds, by the code "
                             "that allocated it (benchmarks/memory_at_peak.py)")
    parser.add_argument("--profile", type=int, default=0, help="calsweep: profile this many extra steps on rank 0")
    parser.add_argument("--trace", default=None, help="with --profile: write the Chrome trace here")
    parser.add_argument("--out", default="sft_throughput.json")
    parser.add_argument("--resume", action="store_true",
                        help="keep --out's results (all but rows skipped for want of GPUs) and run only the other "
                             "(row, implementation)s: one run's JSON over several calls")
    parser.add_argument("--cpu", action="store_true", help="without GPUs, run one-rank rows on the CPU (a check)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--impl", help=argparse.SUPPRESS)
    parser.add_argument("--row", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args)
        return
    try:
        rows = [parse_row(text) for text in args.rows.split(",")]
    except ValueError as exc:
        parser.error(str(exc))
    uneven = [row_name(r) for r in rows if r["zero"] != "auto" and args.micro_batch and r["batch"] % args.micro_batch]
    if args.micro_batch < 0 or uneven:
        parser.error(f"expected --micro-batch to divide the batch per GPU of every row with a stage, got "
                     f"{args.micro_batch} for {uneven or 'a negative size'}")
    impls = args.impls.split(",")
    unknown = [impl for impl in impls if impl not in IMPLS]
    if unknown:
        parser.error(f"expected --impls from {IMPLS}, got {unknown}")
    import torch

    from trainable.trial_memory import ALLOC_CONF_ENV, alloc_conf

    os.environ[ALLOC_CONF_ENV] = alloc_conf()  # the rows' processes allocate as a sweep's workers do
    available = torch.cuda.device_count() or (1 if args.cpu else 0)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    results = [r for r in json.loads(Path(args.out).read_text()) if not r.get("error", "").startswith("skipped")] \
        if args.resume and Path(args.out).exists() else []
    done = {(r["row"], r.get("impl_id")) for r in results}
    for row in rows:
        for impl in impls:
            if (row_name(row), impl) in done:
                continue
            if impl == "hf_trainer" and row["zero"] == "auto":
                continue  # the Trainer has no layout planner: its rows are the stages it is given
            if impl == "calsweep_fsdp2" and row["zero"] != 3:
                continue  # FSDP2 shards parameters, gradients and states: ZeRO-3's layout (auto rows: calsweep)
            if impl == "torchtitan_settings" and row["zero"] not in (3, "auto"):
                continue  # FSDP2: ZeRO-3's layout, planned as such on auto rows
            if row["gpus"] > available:
                results.append({"impl": impl, "impl_id": impl, "row": row_name(row), **row,
                                "error": f"skipped: needs {row['gpus']} GPUs, this host has {available}"})
                continue
            part = Path(args.out).with_suffix(f".{row_name(row).replace(':', '_')}.{impl}.json")
            results.append(_launch(args, row, impl, part))
            Path(args.out).write_text(json.dumps(results, indent=1))  # partial results survive a later failure
    print("\n" + table(results))


if __name__ == "__main__":
    main()
