"""The layout planner: its memory model against the peaks measured on GPUs, and the layouts it chooses."""

import dataclasses
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from common.models import REGISTRY
from trainable import trial_memory
from trainable.config import TrainConfig, TrialConfig
from trainable.layout import (GIB, SCORING_TOKENS_MAX, ModelShape, budget_bytes, entropy_stats_bytes, gpu_hours,
                              model_shape, peak_bytes, phase_peaks, plan_layout, planned_scoring_tokens, planned_stage,
                              scoring_activation_bytes, with_layout, zero_buckets)

MEASUREMENTS = Path(__file__).parents[2] / "docs" / "measurements"
RECORDS = (MEASUREMENTS / "2026-11-26-layout" / "sft_throughput_h200x2.json",
           MEASUREMENTS / "2026-11-27-h100x2" / "sft_throughput_h100x2.json",
           MEASUREMENTS / "2026-11-27-loop-fsdp2" / "sft_throughput_h200x2.json",
           MEASUREMENTS / "2026-11-27-must6-h200x2" / "sft_throughput_h200x2.json",
           MEASUREMENTS / "2026-11-27-must6-h200x2" / "8b_at_h100_memory_h200x2.json",
           MEASUREMENTS / "2026-11-27-one-gpu-fsdp2" / "one_gpu_alpaca_h200.json",
           MEASUREMENTS / "2026-11-27-one-gpu-fsdp2" / "8b_one_gpu_h200.json",
           MEASUREMENTS / "2026-11-27-fsdp2-accumulation" / "fsdp2_accumulation_h200x2.json",
           MEASUREMENTS / "2026-11-27-h100x4-mixed" / "bench_rows_h100x4.json",
           MEASUREMENTS / "2026-11-27-h100x4-mixed" / "bench_rows_after_h100x4.json",
           MEASUREMENTS / "2026-11-29-h200" / "bench_row_8b_h200.json",
           MEASUREMENTS / "2026-11-29-h200" / "bench_8b_accum_h200.json",
           MEASUREMENTS / "2026-11-29c-h200x2" / "memory_at_peak_1b_mb4_h200.json",
           MEASUREMENTS / "2026-11-29c-h200x2" / "memory_at_peak_1b_mb8_h200.json",
           MEASUREMENTS / "2026-11-29c-h200x2" / "row_8b_zero2_40_steps_h200x2.json",
           MEASUREMENTS / "2026-11-29c-h200x2" / "bench_rows_mb8_h200x2.json",
           MEASUREMENTS / "2026-11-29d-h200x2" / "bench_rows_mb8_h200x2.json",
           MEASUREMENTS / "2026-11-29e-h200x4" / "bench_rows_h200x4.json",
           MEASUREMENTS / "2026-11-29e-h200x4" / "bench_rows_mb8_h200x4.json",
           MEASUREMENTS / "2026-11-29f-h200x2" / "bench_rows_mb8_h200x2.json",
           MEASUREMENTS / "2026-11-29d-h200" / "bench_row_1b_h200.json")
SHAPES = {"1b": model_shape(REGISTRY["llama-3.2-1b"]), "8b": model_shape(REGISTRY["llama-3.1-8b"])}
H100, H200 = 79.6 * GIB, 139.8 * GIB


def _records(data: dict | list) -> list[dict]:
    """A curated file's ``records``, or a ``bench_sft_throughput.py`` JSON's list."""
    return data["records"] if isinstance(data, dict) else data


def _measured() -> list[dict]:
    """The compiled-layer runs of every recorded benchmark JSON, DeepSpeed's and FSDP2's; not those run without
    DeepSpeed's memory-efficient linear (a knob the model does not read: 8B measured 66.0 GiB, 11% under)."""
    records = [{"file": path.name, **r} for path in RECORDS for r in _records(json.loads(path.read_text()))]
    return [r for r in records if "zero_stage" in r and "compiled layers" in r["impl"]
            and "memory_efficient_linear" not in (r.get("zero_optimization") or {})]


def test_registry_shapes_count_the_registry_params():
    for name in ("llama-3.2-1b", "llama-3.1-8b", "qwen2.5-7b", "gemma-2-2b"):
        spec = REGISTRY[name]
        counted = ModelShape.from_config({**spec.dimensions, "hidden_size": spec.hidden_size,
                                          "vocab_size": spec.vocab_size})
        assert counted.params == pytest.approx(spec.params, rel=0.01), name


@pytest.mark.parametrize("record", _measured(), ids=lambda r: f"{r['device'][7:11]}:{r['file']}:{r['row']}")
def test_memory_model_bounds_the_measured_peaks(record):
    """Every compiled-layer run of the H200 and H100 benchmarks (docs/results.md), with the engine and ZeRO buckets
    it ran with: the prediction at or above the measured peak and within 15% of it (an upper bound that plans
    trials, issue 45), FSDP2's and DeepSpeed's ZeRO-0/1/2; DeepSpeed's ZeRO-3 (not a default: ZeRO-3 runs on FSDP2)
    within 10%."""
    shape = SHAPES[record["shape"]]
    predicted = peak_bytes(shape, record["zero_stage"], record["gpus"], record["micro_batch"], record["seq_len"],
                           record["recomputed_layers"], record.get("zero_optimization"),
                           record.get("engine", "deepspeed"), record["accumulation"]) / GIB
    if record.get("engine") == "fsdp2" or record["zero_stage"] < 3:
        assert 0.85 * predicted <= record["peak_gib"] <= predicted
    else:
        assert predicted == pytest.approx(record["peak_gib"], rel=0.10)


TRIAL_ROWS = sorted([*(MEASUREMENTS / "2026-11-28e-h200x4" / "trials_250").glob("*.parquet"),
                     *(MEASUREMENTS / "2026-11-29c-h200x2" / "trials_mb8").glob("*.parquet"),
                     *(MEASUREMENTS / "2026-11-29d-h200x2" / "trials_mb8").glob("*.parquet"),
                     *(MEASUREMENTS / "2026-11-29f-h200x2" / "trials_mb8").glob("*.parquet"),
                     *(MEASUREMENTS / "2026-11-29d-h200" / "trials_defaults").glob("*.parquet"),
                     *(MEASUREMENTS / "2026-11-29e-h200x4" / "trials_250").glob("*.parquet"),
                     *(MEASUREMENTS / "2026-11-29e-h200x4" / "trials_mb8").glob("*.parquet")])


def _stored_trial(path: Path) -> tuple[dict, dict, ModelShape]:
    (row,) = pq.read_table(path).to_pylist()
    config = json.loads(row["config_json"])
    return row, config, ModelShape.from_config(config["custom_models"][row["family"]]["config"])


@pytest.mark.parametrize("path", TRIAL_ROWS, ids=lambda p: f"{p.parent.parent.name}/{p.parent.name}:{p.stem[-30:]}")
def test_memory_model_bounds_the_stored_trials_training_peaks(path):
    """The training phase of the stored mixed-grid trials, re-predicted from each row's layout: at or above the
    measured peak and within 15%. 4 x H200: 8B alone on a GPU at micro-batch 1 x 4 with 22 layers recomputed (the
    model of their day predicted its 127.55 GiB as 126.07), 1B at 4 x 1; 2 x H200: 8B on both under ZeRO-2 at 4 x 1,
    1B at 8 x 1 (36.64 GiB, predicted 32.63 before FSDP2's backward start was counted)."""
    row, config, shape = _stored_trial(path)
    predicted = peak_bytes(shape, row["zero_stage"], row["world_size"], row["micro_batch_size"],
                           config["sft"]["max_seq_len"], row["activation_checkpointing"], engine=row["engine"],
                           accumulation=row["gradient_accumulation_steps"]) / GIB
    measured = json.loads(row["gpu_phase_peaks"])["train"][0]
    assert 0.85 * predicted <= measured <= predicted, (measured, predicted)


@pytest.mark.parametrize("path", TRIAL_ROWS, ids=lambda p: f"{p.parent.parent.name}/{p.parent.name}:{p.stem[-30:]}")
def test_memory_model_bounds_the_stored_trials_loads(path):
    """The load phase (``phase_peaks``' first: the model's load and the head's kernels compiled beside it) at or
    above each stored trial's measured load and within 25% of it; DeepSpeed's 8B trials on two H200s loaded
    44.97-45.31 GiB, where the whole float32 model alone (4P) said 30.7."""
    row, config, shape = _stored_trial(path)
    predicted = phase_peaks(shape, row["zero_stage"], row["world_size"], row["micro_batch_size"],
                            config["sft"]["max_seq_len"], row["activation_checkpointing"], engine=row["engine"],
                            accumulation=row["gradient_accumulation_steps"])["load"] / GIB
    measured = json.loads(row["gpu_phase_peaks"])["load"][0]
    assert 0.75 * predicted <= measured <= predicted, (measured, predicted)


@pytest.mark.parametrize("path", TRIAL_ROWS, ids=lambda p: f"{p.parent.parent.name}/{p.parent.name}:{p.stem[-30:]}")
def test_memory_model_bounds_the_stored_trials_scoring(path):
    """The scoring phase (forwards of ``trial_memory.scoring_tokens``: a GPU's rows of ``max_seq_len`` where a trial
    set no token cap, the planned cap under ``auto``; then the entropy statistics) at or above each
    stored trial's measured scoring peak: the 1B trials at a batch of 8 measured 8.22 GiB where their forwards alone
    said 8.16 (the statistics' float32 head, 0.98 GiB, since counted); at the defaults 8.47 against 8.66."""
    row, config, shape = _stored_trial(path)
    trial = TrialConfig.from_dict(config)
    seq_len = config["sft"]["max_seq_len"]
    tokens = trial_memory.scoring_tokens(shape, trial, row["engine"], row["zero_stage"], row["world_size"], seq_len,
                                         row["activation_checkpointing"])
    predicted = phase_peaks(shape, row["zero_stage"], row["world_size"], row["micro_batch_size"], seq_len,
                            row["activation_checkpointing"], engine=row["engine"],
                            accumulation=row["gradient_accumulation_steps"], scoring_tokens=tokens)["score"] / GIB
    assert json.loads(row["gpu_phase_peaks"])["score"][0] <= predicted


SCORING_RECORDS = sorted((MEASUREMENTS / "2026-11-29d-h200").glob("scoring_*.json"))


@pytest.mark.parametrize("path", SCORING_RECORDS, ids=lambda p: p.stem)
def test_scoring_model_bounds_the_scoring_benchmarks_passes(path):
    """``bench_scoring_batch.py`` on an H200 (ARC-Easy, MMLU 5-shot and HellaSwag, 400 questions each; 1B and 8B):
    each pass's peak above the model at or below its prediction, the forwards' at a token cap of at most
    ``SCORING_TOKENS_MAX`` within 2x (keys and values counted twice: the chunk's prefix and the rows' gathered
    copies), the entropy statistics' within 20% (ARC-Easy's 64 short contexts hold fewer than ``MAX_TOKENS`` tokens;
    entries at a cap above ``SCORING_TOKENS_MAX`` ran before the statistics' forwards were held to ``MAX_TOKENS``)."""
    report = json.loads(path.read_text())
    shape = SHAPES[report["model"].removeprefix("random-init ")]
    entries = [e for e in report["entries"] if (e["batch_tokens"] or 0) <= SCORING_TOKENS_MAX]
    assert entries
    for entry in entries:
        if entry["batch_tokens"] is not None:
            predicted = scoring_activation_bytes(shape, entry["batch_tokens"]) / GIB
            assert 0.5 * predicted <= entry["score_peak_gib"] <= predicted, entry
        predicted = entropy_stats_bytes(shape) / GIB
        assert 0.8 * predicted <= entry["entropy_peak_gib"] <= predicted, entry


@pytest.mark.parametrize("shape, layout, tokens", [
    ("1b", (3, 1, 4, 2048, 0, None, "fsdp2"), SCORING_TOKENS_MAX),  # room for far more: the cap
    ("1b", (0, 1, 1, 512, 16, None, "deepspeed"), 15523),  # room for 15,523 tokens under the training step
    ("8b", (3, 2, 1, 2048, 32, None, "deepspeed"), 8037),  # ZeRO-3 keeps its states: the entropy statistics' room
])
def test_auto_scoring_tokens_fill_the_room_under_the_trials_other_phases(shape, layout, tokens):
    shape = SHAPES[shape]
    planned = planned_scoring_tokens(shape, *layout)
    assert planned == tokens
    peaks = phase_peaks(shape, *layout, scoring_tokens=planned)
    score = peaks.pop("score")
    fixed = score - max(scoring_activation_bytes(shape, planned), entropy_stats_bytes(shape))
    assert score <= max(*peaks.values(), fixed + entropy_stats_bytes(shape))
    if planned < SCORING_TOKENS_MAX:  # one more token would not fit
        assert fixed + scoring_activation_bytes(shape, planned + 1) > max(*peaks.values(),
                                                                         fixed + entropy_stats_bytes(shape))


def test_records_cover_every_stage_and_recompute():
    measured = _measured()
    assert {r["zero_stage"] for r in measured} == {0, 2, 3} and {r["gpus"] for r in measured} == {1, 2}
    assert any(r["recomputed_layers"] for r in measured) and {r["shape"] for r in measured} == {"1b", "8b"}
    fsdp2 = [r for r in measured if r.get("engine") == "fsdp2"]
    assert {(r["shape"], r["gpus"]) for r in fsdp2} == {("1b", 1), ("1b", 2), ("8b", 1), ("8b", 2)}
    assert {r["micro_batch"] for r in fsdp2} == {1, 2, 4, 8} and any(r["recomputed_layers"] for r in fsdp2)
    assert {(1, False), (2, True)} <= {(r["gpus"], r["recomputed_layers"] > 0) for r in fsdp2 if r["accumulation"] > 1}


def test_cheapest_layouts():
    one_b, eight_b = SHAPES["1b"], SHAPES["8b"]
    # fits one GPU: one GPU, ZeRO-0, nothing recomputed, the config's micro-batch
    layout = plan_layout(one_b, 2048, 16, 2, H100)
    assert (layout.workers, layout.zero_stage, layout.checkpointed, layout.micro_batch_size,
            layout.gradient_accumulation_steps) == (1, 0, 0, 2, 8)
    assert layout.engine == "deepspeed"
    # the default's preferred engine trains one GPU on FSDP2 too (the same layout, FSDP2's memory model)
    fsdp2 = plan_layout(one_b, 2048, 16, 2, H100, preferred_engine="fsdp2")
    assert (fsdp2.workers, fsdp2.zero_stage, fsdp2.engine, fsdp2.micro_batch_size) == (1, 0, "fsdp2", 2)
    assert fsdp2.peak_bytes == peak_bytes(one_b, 0, 1, 2, 2048, 0, engine="fsdp2", accumulation=8)
    # states fit two H200s but weights and states not one: ZeRO-2 across two, the step's sequences split
    layout = plan_layout(eight_b, 2048, 4, 2, H200)
    assert (layout.workers, layout.zero_stage, layout.micro_batch_size, layout.gradient_accumulation_steps,
            layout.checkpointed) == (2, 2, 2, 1, 0)
    # two H100s: ZeRO-2 does not fit; ZeRO-3 on FSDP2 (the default's engine) at the whole micro-batch with 11 layers
    # recomputed (nothing recomputed peaked at 68.6 GiB, 77.5 reserved: the allocator retried every step); on
    # DeepSpeed's ZeRO-3 (18 bytes a parameter) only a micro-batch of 1 with recomputed layers fits
    layout = plan_layout(eight_b, 2048, 4, 2, H100, workers=2, preferred_engine="fsdp2")
    assert (layout.zero_stage, layout.engine, layout.micro_batch_size, layout.checkpointed) == (3, "fsdp2", 2, 11)
    assert layout.peak_bytes <= budget_bytes(H100, "fsdp2")
    layout = plan_layout(eight_b, 2048, 4, 2, H100, workers=2)
    assert (layout.zero_stage, layout.engine, layout.micro_batch_size) == (3, "deepspeed", 1)
    assert layout.checkpointed > 0 and layout.peak_bytes <= H100
    # where ZeRO-2 fits it stays cheaper than ZeRO-3 on either engine (recorded MFU 45% against 40% and 37%)
    assert plan_layout(eight_b, 2048, 4, 2, H200, workers=2, preferred_engine="fsdp2").zero_stage == 2
    # 8B alone on an H200 under FSDP2: 16 sequences a step at micro-batch 2 ran out of memory (137.4 GiB), and 2
    # sequences nothing recomputed peaked at 123.6 GiB with 138.9 reserved (the GPU's edge): 2 sequences are planned
    # with recomputed layers
    assert peak_bytes(eight_b, 0, 1, 2, 2048, 0, engine="fsdp2", accumulation=8) > budget_bytes(H200, "fsdp2")
    # with accumulation not at all: 1 x 16 and 1 x 8 with 30 of 32 layers recomputed peaked at 127.55 GiB (the root's
    # backward), as 1 x 4 with 22 did, over the 126.2 the plan may allocate: two GPUs, ZeRO-2
    assert peak_bytes(eight_b, 3, 1, 1, 2048, 30, engine="fsdp2", accumulation=16) > budget_bytes(H200, "fsdp2")
    many = plan_layout(eight_b, 2048, 16, 2, H200, preferred_engine="fsdp2")
    assert (many.workers, many.zero_stage, many.micro_batch_size, many.gradient_accumulation_steps) == (2, 2, 2, 4)
    alone = plan_layout(eight_b, 2048, 2, 2, H200, preferred_engine="fsdp2")
    assert (alone.workers, alone.engine, alone.micro_batch_size, alone.checkpointed) == (1, "fsdp2", 2, 21)


def test_explicit_settings_win_and_nothing_fitting_is_one_line():
    layout = plan_layout(SHAPES["1b"], 2048, 8, 4, H100, workers=2, stage=3, checkpointing=True)
    assert (layout.workers, layout.zero_stage, layout.checkpointed) == (2, 3, 16)
    with pytest.raises(ValueError, match=r"8.03B-parameter model .* within 20.0 GiB GPUs on 1 GPUs, got none: "
                       r"the smallest, 1 GPU, ZeRO-0, micro-batch 1 x 4, 32/32 layers checkpointed, peaks at 145.0 GiB "
                       r"per GPU against the 17.9 GiB PyTorch may allocate"):
        plan_layout(SHAPES["8b"], 2048, 4, 2, 20 * GIB, workers=1)


def test_with_layout_resolves_the_train_section():
    layout = plan_layout(SHAPES["8b"], 2048, 4, 2, H100, workers=2)
    train = with_layout(TrainConfig(deepspeed={"zero_optimization": {"reduce_bucket_size": 7}}), layout, SHAPES["8b"])
    assert train.zero_stage == 3 and train.activation_checkpointing == layout.checkpointed
    assert train.deepspeed == {"zero_optimization": {"reduce_bucket_size": 7}}  # default buckets: nothing added
    wide = with_layout(TrainConfig(deepspeed={"zero_optimization": {"reduce_bucket_size": 7}}),
                       dataclasses.replace(layout, wide_buckets=True), SHAPES["8b"])
    zero = wide.deepspeed["zero_optimization"]
    assert zero["reduce_bucket_size"] == 7  # the researcher's own entry wins over the layout's
    assert zero["stage3_max_live_parameters"] == zero_buckets(3, SHAPES["8b"].layer_params, True)[
        "stage3_max_live_parameters"]


def test_fsdp2_trials_are_planned_as_zero3():
    from sweeps.config import load_sweep

    assert planned_stage("fsdp2", "auto") == planned_stage("fsdp2", 3) == 3
    assert planned_stage("deepspeed", "auto") is None and planned_stage("deepspeed", 2) == 2
    sweep = load_sweep(None, None, ["train.engine=fsdp2"])  # SmolLM2-135M: ZeRO-0 on one GPU under DeepSpeed
    assert load_sweep().layout("smollm2-135m").zero_stage == 0
    layout = sweep.layout("smollm2-135m")
    train = sweep.trial(sweep.trial_points()[0]).train
    assert (layout.workers, layout.zero_stage) == (1, 3) and (train.engine, train.zero_stage) == ("fsdp2", 3)
    assert train.deepspeed == {}


def test_gpu_hours_follow_tokens_and_recorded_mfu():
    layout = plan_layout(SHAPES["1b"], 2048, 4, 4, H100)
    one = gpu_hours(SHAPES["1b"], layout, 1e9, 2048)
    assert gpu_hours(SHAPES["1b"], layout, 2e9, 2048) == pytest.approx(2 * one)
    # 1e9 tokens x ~7.9 GFLOP per token at 40% of 989 TFLOP/s: about 5.5 GPU-hours
    assert 4 < one < 7
