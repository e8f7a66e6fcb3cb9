"""What the launcher says of layouts: the dry run's table (GPU-hours from tokens), the GPU probe's check, and the
end of a sweep's predicted and measured GPU-hours (from a store written by hand)."""

import datetime as dt
from pathlib import Path

import pytest

from sweeps import store
from sweeps.config import load_sweep
from sweeps.launch import main
from sweeps.layout_report import (family_gpu_hours, gpu_hours_line, layout_table, scored_questions, sweep_gpus,
                                  trial_tokens)
from sweeps.gpu_sharing import layout_check
from sweeps.trial_cost import started_processes

TINY = Path(__file__).with_name("tiny_sweep.yaml")
ROOT = Path(__file__).resolve().parents[2]
PAPER = Path(__file__).resolve().parents[2] / "sweeps" / "configs" / "paper_alpaca.yaml"


def test_table_lists_each_family_and_sums_gpu_hours():
    sweep = load_sweep(PAPER)
    text = layout_table(sweep, sft_rows=52_002)
    # FSDP2 across GPUs at micro-batch 1 gathers every weight twice as often: micro-batch 2, 22 layers recomputed
    assert "llama-3.1-8b: 2 GPUs, FSDP2 (ZeRO-3 layout), micro-batch 2 x 32, 22/32 layers checkpointed" in text
    assert "llama-3.2-1b: 1 GPU, FSDP2, micro-batch 2 x 64" in text  # the default: one GPU on FSDP2
    hours = [float(line.split("trial(s), ")[1].split(" GPU-hours")[0]) for line in text.splitlines()[1:-1]]
    total = float(text.splitlines()[-1].split("sweep: ")[1].split()[0])
    assert total == pytest.approx(sum(hours), rel=0.005)  # each printed to 3 digits
    assert trial_tokens(sweep, "llama-3.2-1b", 52_002) == 52_002 * 2048  # one epoch of full rows
    steps = load_sweep(PAPER, {}, ["train.max_steps=10"])
    assert trial_tokens(steps, "llama-3.1-8b", None) == 10 * 128 * 2048  # 10 steps of 128 sequences on 2 GPUs
    fsdp2 = layout_table(load_sweep(PAPER, {}, ["train.engine=fsdp2"]), sft_rows=52_002)
    assert "llama-3.2-1b: 1 GPU, FSDP2, micro-batch 2 x 64" in fsdp2
    deepspeed = layout_table(load_sweep(PAPER, {}, ["train.engine=deepspeed"]), sft_rows=52_002)
    assert "llama-3.2-1b: 1 GPU, ZeRO-0, micro-batch 2 x 64" in deepspeed
    assert "llama-3.1-8b: 2 GPUs, ZeRO-3, micro-batch 1 x 64, 21/32 layers checkpointed" in deepspeed


def test_probe_peak_is_checked_against_the_layout():
    sweep = load_sweep(PAPER)
    predicted = sweep.layout("llama-3.2-1b").peak_bytes
    assert layout_check(sweep, "llama-3.2-1b", 0.95 * predicted).endswith("(-5%)")
    assert layout_check(sweep, "llama-3.2-1b", 1.2 * predicted).endswith("by more than 10%")
    assert "not one GPU's" in layout_check(sweep, "llama-3.1-8b", 1.0)


def test_the_end_of_a_sweep_puts_measured_gpu_hours_beside_the_predicted(tmp_path):
    sweep = load_sweep(TINY, {"results_dir": str(tmp_path)}, ["resources.gpus_per_worker=0.5"])
    start = dt.datetime(2026, 11, 27, 12, tzinfo=dt.timezone.utc)
    first, second = (sweep.trial(point) for point in sweep.trial_points())
    # an ok trial of 2 workers for 45 minutes, a failed one (no world size: its layout's 1 worker) for an hour
    for trial, status, world_size, minutes in ((first, "ok", 2, 45), (second, "failed", None, 60)):
        store.write_trial(str(tmp_path), {"run_name": sweep.name, "trial_id": trial.trial_id, "status": status,
                                          "family": trial.family, "world_size": world_size, "started_at": start,
                                          "finished_at": start + dt.timedelta(minutes=minutes)})
    rows = store.read_trials(str(tmp_path), sweep.name).to_pylist()
    predicted = layout_table(sweep).splitlines()[-1].split("sweep: ")[1].split()[0]  # what the dry run said
    assert gpu_hours_line(sweep, rows, None) == (
        f"GPU-hours: {predicted} predicted (training, load, start, compile, scoring and export, every planned "
        f"trial to its end), 1.25 "
        f"measured (2 stored trial(s): wall time x GPUs held)")  # (0.75 h x 2 + 1 h x 1) x 0.5 GPU
    cpu = load_sweep(TINY, {"results_dir": str(tmp_path)}, ["resources.gpus_per_worker=0"])
    assert gpu_hours_line(cpu, rows, None) is None


def _mixed_grid(tmp_path: Path, benchmark_script, gpu_memory_gb: float = 79.6, steps: int = 40,
                micro_batch: int | None = None) -> Path:
    """A recorded mixed grid's sweep (benchmarks/sweep_gpu_utilization.py's config: 4 trials each of llama-8b and
    llama-1b, ARC-Easy 400, warm, scoring at the default batch) planned for the recorded GPUs' memory."""
    import argparse

    import yaml

    sweep_config = benchmark_script("sweep_gpu_utilization").sweep_config
    args = argparse.Namespace(shapes=["8b", "1b"], trials=4, steps=steps, eval_limit=400, tokenizer="smollm2-135m",
                              engine="auto", micro_batch=micro_batch)
    config = sweep_config(args, tmp_path / "results", warm=True)
    config["resources"].update(gpu_memory_gb=gpu_memory_gb)
    path = tmp_path / "mixed.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


# the 4 x H200 grids whose trials the fixed costs are fitted to (sweeps/trial_cost.py): JSON, steps, sequences a
# step, the layouts the trials ran with
H200X4 = ROOT / "docs" / "measurements" / "2026-11-29e-h200x4"
RECORDED_GRIDS = [
    (H200X4 / "mixed_grid_250_h200x4.json", 250, None,
     {"llama-8b": "1 GPU, FSDP2, micro-batch 4 x 1, 29/32 layers checkpointed",
      "llama-1b": "1 GPU, FSDP2, micro-batch 4 x 1"}),
    (H200X4 / "sharded_grid_h200x4.json", 40, 8,
     {"llama-8b": "2 GPUs, ZeRO-2, micro-batch 4 x 1", "llama-1b": "1 GPU, FSDP2, micro-batch 8 x 1"}),
]


@pytest.mark.parametrize("record, steps, micro_batch, layouts", RECORDED_GRIDS, ids=["250_steps", "sharded"])
def test_predicted_gpu_hours_of_the_recorded_mixed_grids_are_within_20_percent_of_their_trials(
        tmp_path, benchmark_script, record, steps, micro_batch, layouts):
    import json

    config = _mixed_grid(tmp_path, benchmark_script, 139.8, steps, micro_batch)
    sweep = load_sweep(config, {}, ["resources.gpus_per_worker=1", "resources.max_concurrent_trials=4"])
    assert sweep_gpus(sweep) == 4  # what the launcher planned on 4 GPUs
    assert {f: sweep.layout(f).describe(32 if f == "llama-8b" else 16) for f in sweep.families} == layouts
    summary = json.loads(record.read_text())["paths"]["warm"]
    assert summary["ok"] == 8
    measured = sum((t["end_s"] - t["start_s"]) * t["gpus"] for t in summary["by_trial"]) / 3600  # wall x GPUs
    assert measured == pytest.approx(summary["gpu_hours_measured"], rel=0.01)
    predicted = sum(family_gpu_hours(sweep, family, None, sweep_gpus(sweep)) for family in sweep.families)
    assert abs(predicted / measured - 1) <= 0.2, (predicted, measured)


def test_warm_actors_of_one_width_are_started_once_across_families():
    # the 250-step grid: the 1B trials ran in the 8B trials' warm one-GPU actors (load 0.4-1.7 s, no actor start)
    assert started_processes([("8b", 1, 4), ("1b", 1, 4)], gpus=4, warm=True) == {"8b": 4, "1b": 0}
    # the sharded grid: two 2-GPU actors for the 8B, then four new one-GPU actors for the 1B
    assert started_processes([("8b", 2, 4), ("1b", 1, 4)], gpus=4, warm=True) == {"8b": 2, "1b": 4}
    # a smaller family after a larger one of the same width starts what the first left unstarted
    assert started_processes([("8b", 1, 2), ("1b", 1, 4)], gpus=4, warm=True) == {"8b": 2, "1b": 2}
    assert started_processes([("8b", 1, 4), ("1b", 1, 4)], gpus=4, warm=False) == {"8b": 4, "1b": 4}
    assert started_processes([("8b", 1, 4), ("1b", 1, 4)], gpus=None, warm=True) == {"8b": 1, "1b": 0}


def test_the_dry_run_prints_the_gpu_hours_with_fixed_costs(tmp_path, capsys, benchmark_script):
    assert main(["--config", str(_mixed_grid(tmp_path, benchmark_script)), "--results-dir", str(tmp_path / "r"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "plus load, start, compile, scoring and export, sweeps/trial_cost.py" in out
    assert "llama-8b: 2 GPUs, FSDP2 (ZeRO-3 layout)" in out and "sweep: " in out


def test_scoring_is_planned_for_the_tasks_at_their_limits_a_k_shot_question_k_plus_1_times():
    every = load_sweep(PAPER)  # MMLU 5-shot, ARC-Easy and HellaSwag, every question
    assert scored_questions(every) == 14042 * 6 + 2376 + 10042
    assert scored_questions(load_sweep(PAPER, {}, ["eval.limit=400"])) == 400 * 6 + 400 + 400
    assert scored_questions(load_sweep(PAPER, {}, ["eval.limit=5000"])) == 5000 * 6 + 2376 + 5000


def test_the_registry_s_question_counts_are_the_local_data_s(data_dir):
    from calibration.task_config import TASKS
    from calibration.tasks import LOADERS

    for task in TASKS.values():
        assert len(LOADERS[task.dataset](task.split, data_dir=data_dir)) == task.questions, task.name
