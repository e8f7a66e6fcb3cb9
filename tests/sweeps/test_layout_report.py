"""What the launcher says of layouts: the dry run's table (GPU-hours from tokens), the GPU probe's check, and the
end of a sweep's predicted and measured GPU-hours (from a store written by hand)."""

import datetime as dt
from pathlib import Path

import pytest

from sweeps import store
from sweeps.config import load_sweep
from sweeps.layout_report import gpu_hours_line, layout_table, trial_tokens
from sweeps.gpu_sharing import layout_check

TINY = Path(__file__).with_name("tiny_sweep.yaml")
PAPER = Path(__file__).resolve().parents[2] / "sweeps" / "configs" / "paper_alpaca.yaml"


def test_table_lists_each_family_and_sums_gpu_hours():
    sweep = load_sweep(PAPER)
    text = layout_table(sweep, sft_rows=52_002)
    # FSDP2 with accumulation keeps 10% of an H100 free (no peak recorded yet): micro-batch 1, 5 layers recomputed
    assert "llama-3.1-8b: 2 GPUs, FSDP2 (ZeRO-3 layout), micro-batch 1 x 64, 13/32 layers checkpointed" in text
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
        f"GPU-hours: {predicted} predicted (trainable.layout.gpu_hours, every planned trial to its end), 1.25 "
        f"measured (2 stored trial(s): wall time x GPUs held)")  # (0.75 h x 2 + 1 h x 1) x 0.5 GPU
    cpu = load_sweep(TINY, {"results_dir": str(tmp_path)}, ["resources.gpus_per_worker=0"])
    assert gpu_hours_line(cpu, rows, None) is None
