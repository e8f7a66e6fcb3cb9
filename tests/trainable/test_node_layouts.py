"""Plans of the Llama shapes that need a node or more (sweeps/configs/node_llama.yaml: 14B, 32B, 70B on 4 nodes of
8 H100s), their states per GPU against bytes counted by hand, HSDP where a replica group fits, and the dry run."""

from pathlib import Path

import pytest

from sweeps.config import load_sweep
from trainable.config import TrainConfig
from sweeps.launch import main
from trainable.layout import (FSDP2_HEAD_BYTES, GIB, NCCL_BUFFER_BYTES, ModelShape, budget_bytes, fitting_layouts,
                              fsdp2_state_bytes, gpu_hours, hsdp_replicas, phase_peaks, plan_layout,
                              with_layout)

NODE = Path(__file__).parents[2] / "sweeps" / "configs" / "node_llama.yaml"
H100 = 79.6 * GIB
SEQ, SEQUENCES, MICRO = 2048, 128, 2  # node_llama.yaml's step: 128 sequences of 2048 tokens, micro-batch <= 2
VOCAB = 128_256


def _llama_params(hidden: int, intermediate: int, layers: int, heads: int, kv_heads: int) -> int:
    """Counted by hand: per layer q and o (hidden x heads x 128), k and v (hidden x kv_heads x 128), the gated MLP
    (3 hidden x intermediate) and two norms; untied embedding and head; the final norm."""
    per_layer = 2 * hidden * heads * 128 + 2 * hidden * kv_heads * 128 + 3 * hidden * intermediate + 2 * hidden
    return layers * per_layer + 2 * VOCAB * hidden + hidden


@pytest.fixture(scope="module")
def node():
    return load_sweep(NODE)


def _plan(shape, **kwargs):
    return plan_layout(shape, SEQ, SEQUENCES, MICRO, H100, max_workers=32, preferred_engine="fsdp2",
                       gpus_per_node=8, **kwargs)


def test_the_shapes_count_what_their_dimensions_hold(node):
    assert node.shape("llama-14b").params == _llama_params(5120, 13824, 48, 40, 8) == 14_525_895_680
    assert node.shape("llama-32b").params == _llama_params(5120, 27648, 64, 40, 8) == 32_519_623_680
    assert node.shape("llama-70b").params == _llama_params(8192, 28672, 80, 64, 8) == 70_553_706_496  # Llama-3.1-70B


def test_70b_is_a_full_fsdp2_shard_over_4_nodes_because_no_hsdp_replica_group_fits(node):
    shape = node.shape("llama-70b")
    layout = _plan(shape)
    assert (layout.workers, layout.engine, layout.replicas) == (32, "fsdp2", 1)
    assert 0 < layout.checkpointed < shape.layers  # recomputes some of its 80 layers to fit
    # weights, gradients and AdamW moments in float32 (16 bytes a parameter) over 32 GPUs: 32.9 GiB each
    states = 16 * 70_553_706_496 / 32
    assert fsdp2_state_bytes(shape, 32) == states + NCCL_BUFFER_BYTES + FSDP2_HEAD_BYTES * VOCAB * 8192
    assert states / GIB == pytest.approx(32.85, abs=0.01)
    assert layout.peak_bytes <= budget_bytes(H100, "fsdp2") and layout.peak_bytes > states
    # HSDP: 4 replicas of one node (16 x 70.6e9 / 8 = 131 GiB of states a GPU) or 2 of two nodes (65.7 GiB) do not
    # fit even at micro-batch 1 with every layer recomputed
    assert hsdp_replicas(32, 8) == [1, 2, 4]
    for replicas, shards in ((4, 8), (2, 16)):
        assert 16 * shape.params / shards > 65 * GIB
        peak = max(phase_peaks(shape, 3, 32, 1, SEQ, True, engine="fsdp2", accumulation=4,
                               replicas=replicas).values())
        assert peak > budget_bytes(H100, "fsdp2")
    assert gpu_hours(shape, layout, 1e9, SEQ) > 0


def test_hsdp_is_chosen_where_a_replica_group_fits():
    """The 8B shape held to 16 GPUs (two nodes): one node's shard holds its states, so 2 replicas x 8 shards."""
    from common.models import REGISTRY
    from trainable.layout import model_shape

    shape = model_shape(REGISTRY["llama-3.1-8b"])
    layout = _plan(shape, workers=16, stage=3)
    assert (layout.workers, layout.replicas, layout.checkpointed) == (16, 2, 0)
    assert "FSDP2 HSDP (2 replicas x 8 shards)" in layout.describe(shape.layers)
    assert with_layout(TrainConfig(engine="fsdp2"), layout, shape).fsdp_replicas == 2  # what the engine's mesh reads
    assert fsdp2_state_bytes(shape, 16, 2) == 16 * 8_030_261_248 / 8 + NCCL_BUFFER_BYTES + \
        FSDP2_HEAD_BYTES * VOCAB * 4096
    # within one node there is no HSDP: 8 GPUs shard fully
    assert hsdp_replicas(8, 8) == [1] and _plan(shape, workers=8, stage=3).replicas == 1


def test_14b_on_4_gpus_with_recomputation_or_8_without(node):
    shape = node.shape("llama-14b")
    layouts = fitting_layouts(shape, SEQ, SEQUENCES, MICRO, H100, max_workers=32, preferred_engine="fsdp2")
    planned = layouts[0]
    assert (planned.workers, planned.engine) == (4, "fsdp2") and 0 < planned.checkpointed < shape.layers
    assert 16 * shape.params / 4 / GIB == pytest.approx(54.1, abs=0.1)  # states alone: 54.1 of 71.5 GiB
    on_8 = next(c for c in layouts if c.workers == 8)
    assert on_8.checkpointed == 0 and on_8.cost > planned.cost  # the planner's cost: GPUs / (MFU x recompute)
    # the current choice, stated: the planner ranks by its cost, which picks 4 GPUs, though the GPU-hours a sweep
    # pays are fewer on 8 (no recomputation); which should rank is the lead's (docs/results.md). ZeRO-2 on 8 no longer
    # fits: DeepSpeed loads the whole float32 model and its bf16 copy on every GPU, 6 x 14.5e9 bytes
    tokens = SEQUENCES * SEQ * 100
    assert gpu_hours(shape, on_8, tokens, SEQ) < gpu_hours(shape, planned, tokens, SEQ)
    assert not [c for c in layouts if c.workers < 4]  # 16 x 14.5e9 bytes do not fit 1 or 2 GPUs
    assert node.layout("llama-14b") == planned
    assert node.layout_with_less_recompute("llama-14b") == on_8


def test_32b_fits_one_node_with_recomputation_and_no_fewer_gpus(node):
    shape = node.shape("llama-32b")
    layout = node.layout("llama-32b")
    assert (layout.workers, layout.engine) == (8, "fsdp2") and layout.checkpointed > shape.layers // 2
    assert 16 * shape.params / 8 / GIB == pytest.approx(60.6, abs=0.1)
    with pytest.raises(ValueError, match="got none"):
        plan_layout(shape, SEQ, SEQUENCES, MICRO, H100, max_workers=4, preferred_engine="fsdp2")
    # the next larger Llama shape, CodeLlama-34B's decoder with Llama-3's vocabulary (35.3B), fits no node of 8
    larger = ModelShape.from_config({"hidden_size": 8192, "intermediate_size": 22016, "num_hidden_layers": 48,
                                     "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128,
                                     "vocab_size": VOCAB, "tie_word_embeddings": False})
    assert larger.params == _llama_params(8192, 22016, 48, 64, 8)
    with pytest.raises(ValueError, match="got none"):
        plan_layout(larger, SEQ, SEQUENCES, MICRO, H100, max_workers=8, preferred_engine="fsdp2")


def test_the_dry_run_prints_the_plans_their_gpu_hours_and_why_not_hsdp(data_dir, tmp_path, capsys):
    assert main(["--config", str(NODE), "--dry-run", "--data-dir", data_dir, "--results-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    # FSDP2 across GPUs keeps its micro-batch and recomputes layers rather than gather every weight per micro-batch
    assert "  llama-70b: 32 GPUs, FSDP2 (ZeRO-3 layout), micro-batch 2 x 2, " in out
    assert "  llama-14b: 4 GPUs, FSDP2 (ZeRO-3 layout), micro-batch 2 x 16, " in out
    assert "  llama-32b: 8 GPUs, FSDP2 (ZeRO-3 layout), " in out
    assert "or 8 GPUs, FSDP2 (ZeRO-3 layout), micro-batch 2 x 8; peak " in out
    assert "llama-70b: not HSDP: 2 replicas x 16 shards would peak at " in out
    assert out.count("GPU-hours") >= 6


def test_the_load_is_planned_fsdp2_shards_on_meta_deepspeed_the_whole_model(node):
    """The load phase (``load_bytes``): FSDP2 builds on the meta device (``trainable.sharded_load``), so a 32B over
    8 GPUs loads its float32 shards, one shard in flight and one whole embedding broadcast; DeepSpeed builds the
    whole float32 model on every GPU and casts it to bf16 (182 GiB): no ZeRO-3 layout of it on DeepSpeed fits, though
    its states do."""
    from trainable.layout import load_bytes

    shape = node.shape("llama-32b")
    embedding = 4 * VOCAB * 5120
    assert load_bytes(shape, 8, "fsdp2") == 4 * shape.params / 8 + embedding / 8 + embedding + NCCL_BUFFER_BYTES
    assert load_bytes(shape, 8, "fsdp2") / GIB == pytest.approx(15.14 + 0.31 + 2.45 + 1.5, abs=0.01)
    layout = node.layout("llama-32b")
    peaks = phase_peaks(shape, 3, 8, layout.micro_batch_size, SEQ, layout.checkpointed, engine="fsdp2",
                        accumulation=layout.gradient_accumulation_steps)
    assert list(peaks)[0] == "load" and peaks["load"] < peaks["train"]
    assert load_bytes(shape, 32, "deepspeed") / GIB == pytest.approx(181.7, abs=0.1)  # 6 bytes a parameter
    assert 18 * shape.params / 32 < 20 * GIB  # ZeRO-3's states over 4 nodes would fit
    with pytest.raises(ValueError, match="got none"):
        plan_layout(shape, SEQ, SEQUENCES, MICRO, H100, workers=32, stage=3, preferred_engine="deepspeed")
    assert _plan(shape, workers=32, stage=3).engine == "fsdp2"  # on FSDP2 it does


@pytest.mark.parametrize("hidden, intermediate, layers, heads, head_dim, tied, measured_gib", [
    (4096, 14336, 32, 32, 128, False, 33.829),  # Llama-3.1-8B: the embedding and the untied head copied at once
    (2048, 8192, 16, 32, 64, True, 5.645),  # Llama-3.2-1B: one tensor, embedding and head
])
def test_a_one_gpu_fsdp2_load_holds_the_root_modules_copy(hidden, intermediate, layers, heads, head_dim, tied,
                                                          measured_gib):
    """The load phase of a one-GPU FSDP2 trial against the peak each of these shapes' first trials measured on an
    H200 (docs/measurements/2026-11-28e-h200x4: the store's ``gpu_phase_peaks``), within 1.5% (before, 8B's was
    predicted 5.8% under; the 1B's load holds 63 MiB besides its tensors and states, 1.1% of it)."""
    from trainable.layout import load_bytes

    per_layer = 2 * hidden * heads * head_dim + 2 * hidden * 8 * head_dim + 3 * hidden * intermediate + 2 * hidden
    params = layers * per_layer + VOCAB * hidden * (1 if tied else 2) + hidden
    assert params == (1_235_814_400 if tied else 8_030_261_248)
    shape = ModelShape(params, layers, hidden, intermediate, VOCAB, 8 * head_dim, tied, heads)
    assert load_bytes(shape, 1, "fsdp2") / GIB == pytest.approx(measured_gib, rel=0.015)
