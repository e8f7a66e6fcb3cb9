"""A worker process dies mid-trial (``CALSWEEP_FAULT_AT_STEP``: os._exit after step 3 on its first attempt) in a
real sweep (`python sweeps/launch.py`, Ray Tune, Ray Train, DeepSpeed on CPU): Ray Train's retry continues from the
step-2 checkpoint and ends with the final loss and scores of the same trial run through without a death."""

import dataclasses
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sweeps import store
from sweeps.config import load_sweep
from trainable.fault_injection import FAULT_ENV
from trainable.worker import run_trial

REPO = Path(__file__).resolve().parents[2]
CONFIG = Path(__file__).with_name("tiny_sweep.yaml")
SETTINGS = ["label_smoothing=[0.1]", "train.max_steps=4", "train.checkpoint_every_steps=2", "train.log_every=1",
            "train.dropout=0.1", "eval.tasks=[arc_easy]", "resources.max_failures=1"]
# fp32 on the CPU: the same operations in the same order; only the worker's thread count may differ from pytest's
REL_TOL = 1e-5


def uninterrupted_run(sweep, results_dir: Path) -> dict:
    """The sweep's one trial run through in this process (no Ray, no death): the reference."""
    trial = dataclasses.replace(sweep.trial(sweep.trial_points()[0]), results_dir=str(results_dir))
    return run_trial(trial, torch.device("cpu"), 0, 1, lambda metrics: None)


@pytest.mark.slow
def test_a_killed_worker_resumes_from_its_checkpoint(tmp_path, data_dir, one_rank_process_group):
    results = tmp_path / "results"
    env = {**os.environ, "CALSWEEP_DATA_DIR": data_dir, "RAY_USAGE_STATS_ENABLED": "0", FAULT_ENV: "3"}
    out = subprocess.run([sys.executable, str(REPO / "sweeps" / "launch.py"), "--config", str(CONFIG),
                          "--results-dir", str(results), *SETTINGS], capture_output=True, text=True, timeout=600,
                         env=env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "resumed from its checkpoint at step 2/4" in out.stdout, out.stdout[-3000:]
    (row,) = store.read_trials(str(results), "tiny").to_pylist()
    assert row["status"] == "ok" and row["resumed_from_step"] == 2 and row["train_steps"] == 4
    assert (results / "faults" / f"tiny__{row['trial_id']}.step3").exists()  # the first attempt did die at step 3

    run_dir = results / "ray" / f"tiny-{row['trial_id']}"
    kept = [path for path in run_dir.iterdir() if path.is_dir() and path.name.startswith("checkpoint_")]
    assert len(kept) == 1 and (kept[0] / "final_metrics.json").exists()  # checkpoints_to_keep: 1 pruned the others

    sweep = load_sweep(CONFIG, {"results_dir": str(results)}, SETTINGS)
    reference = uninterrupted_run(sweep, tmp_path / "reference")
    assert reference["resumed_from_step"] == 0
    for key in ("train_loss", "train_loss_first", "arc_easy_nll", "arc_easy_ece", "arc_easy_accuracy"):
        assert math.isclose(row[key], reference[key], rel_tol=REL_TOL), (key, row[key], reference[key])
