"""The driver's trial row: it keeps every metric a trial reports and refuses one the store has no column for; a row
without the trial's final report (failed, stopped) keeps the layout the trial ran, or was to run, with; it records when
the process that ran the driver started, to the moment."""

import datetime as dt
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sweeps.config import load_sweep
from sweeps.driver import trial_row

TINY = Path(__file__).with_name("tiny_sweep.yaml")


def test_trial_row_keeps_every_task_metric_and_refuses_an_unknown_one(tmp_path):
    sweep = load_sweep(TINY, {"results_dir": str(tmp_path)}, ["eval.tasks=[arc_easy,arc_easy_lettered]"])
    params, now = sweep.trial_points()[0]._asdict(), dt.datetime.now(dt.timezone.utc)
    metrics = {"arc_easy_ece": 0.1, "arc_easy_lettered_ece": 0.2, "arc_easy_lettered_ece_ats": 0.3, "train_loss": 2.0}
    row = trial_row(sweep, params, metrics, "ok", None, now, {})
    assert (row["arc_easy_ece"], row["arc_easy_lettered_ece"], row["arc_easy_lettered_ece_ats"]) == (0.1, 0.2, 0.3)
    with pytest.raises(ValueError, match=r"TASK_METRICS, got \['arc_easy_ece_bootstrap'\]"):
        trial_row(sweep, params, metrics | {"arc_easy_ece_bootstrap": 0.4}, "ok", None, now, {})


@pytest.mark.parametrize("gpus, predicted", [(0, False), (1, True)], ids=["cpu", "gpu"])
def test_a_failed_row_keeps_the_layout_it_was_to_run_with(tmp_path, gpus, predicted):
    settings = ["resources.workers_per_trial=2", f"resources.gpus_per_worker={gpus}", "resources.gpu_memory_gb=80",
                "train.pack=false", "train.precision=auto"]
    sweep = load_sweep(TINY, {"results_dir": str(tmp_path)}, settings)
    params, now = sweep.trial_points()[0]._asdict(), dt.datetime.now(dt.timezone.utc)
    row = trial_row(sweep, params, {}, "failed", "ValueError: bad", now, {})
    layout = sweep.layout("tiny-llama")
    assert (row["world_size"], row["engine"], row["zero_stage"], row["micro_batch_size"],
            row["gradient_accumulation_steps"], row["activation_checkpointing"]) == (
        2, "deepspeed", layout.zero_stage, layout.micro_batch_size, layout.gradient_accumulation_steps, 0)
    if predicted:  # bf16 on CUDA: the planner's own prediction for the layout
        assert row["gpu_peak_predicted_gib"] == pytest.approx(layout.peak_gib, rel=1e-12)
    else:  # as an ok row on the CPU: no prediction
        assert row["gpu_peak_predicted_gib"] is None
    assert row["gpu_peak_gib"] is None  # measured: only what the trial reported
    reported = trial_row(sweep, params, {"world_size": 1, "engine": "fsdp2", "zero_stage": 3}, "ok", None, now, {})
    assert (reported["world_size"], reported["engine"], reported["micro_batch_size"]) == (1, "fsdp2", None)


def test_the_row_says_when_the_drivers_process_started_to_the_moment(tmp_path):
    """``actor_started_at`` is the process's own start to the clock tick (10 ms; a new process's import of the driver
    comes a second or more later), not a start time off by the host's boot time rounded to whole seconds."""
    sweep = load_sweep(TINY, {"results_dir": str(tmp_path)})
    code = ("import sys, time; from sweeps.config import load_sweep; from sweeps.driver import trial_row; "
            f"sweep = load_sweep({str(TINY)!r}, {{'results_dir': {str(tmp_path)!r}}}); "
            "params = sweep.trial_points()[0]._asdict(); imported = time.time(); "
            "row = trial_row(sweep, params, {}, 'failed', 'x', None, {}); "
            "print(row['actor_started_at'].timestamp(), imported)")
    launched = time.time()
    started, imported = map(float, subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                                  check=True).stdout.split())
    assert launched - 0.02 <= started <= launched + 0.3 < imported, (launched, started, imported)
    row = trial_row(sweep, sweep.trial_points()[0]._asdict(), {}, "failed", "x", None, {})
    assert row["actor_started_at"] <= dt.datetime.now(dt.timezone.utc)  # this test's own process
