"""Warm trials in real sweeps (`python sweeps/launch.py`: Ray Tune, DeepSpeed on CPU): six one-step trials one at a
time, warm (one reused Tune actor) and cold (a Ray Train worker group per trial). The warm sweep's time per trial
outside the trials' own load, training and scoring is printed and bounded; every trial's losses and scores are the
same bit for bit in both, though each warm trial after the first runs in a process a different trial has used."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sweeps import store
from sweeps.overhead import summary, trial_overheads

REPO = Path(__file__).resolve().parents[2]
CONFIG = Path(__file__).with_name("tiny_sweep.yaml")
SIX = ["learning_rates=[1.0e-3,3.0e-3]", "label_smoothing=[0.0,0.1,0.2]", "train.max_steps=1", "train.dropout=0.1",
       "train.gradient_accumulation_steps=1", "eval.tasks=[arc_easy]", "resources.max_concurrent_trials=1"]
WARM_BOUND_S = 10.0  # Must: <= 10 s per trial outside its own work
SAME = ("train_loss", "train_loss_plain", "train_loss_first", "arc_easy_nll", "arc_easy_ece", "arc_easy_accuracy",
        "tokens_per_s")  # tokens_per_s is a rate: excluded below, listed to say so


def _sweep(results: Path, data_dir: str, name: str, *extra: str) -> list[dict]:
    out = subprocess.run([sys.executable, str(REPO / "sweeps" / "launch.py"), "--config", str(CONFIG),
                          "--results-dir", str(results), "--name", name, *SIX, *extra], capture_output=True,
                         text=True, timeout=1200,
                         env={**os.environ, "CALSWEEP_DATA_DIR": data_dir, "RAY_USAGE_STATS_ENABLED": "0"})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = store.read_trials(str(results), name).to_pylist()
    assert len(rows) == 6 and all(row["status"] == "ok" for row in rows), rows
    return rows


@pytest.mark.slow
def test_warm_trials_cost_little_outside_their_work_and_match_cold_ones_bit_for_bit(tmp_path, data_dir):
    warm = _sweep(tmp_path / "results", data_dir, "warm")
    cold = _sweep(tmp_path / "results", data_dir, "cold", "resources.warm_trials=false")
    figures = {name: summary(trial_overheads(rows)) for name, rows in (("warm", warm), ("cold", cold))}
    for name, figure in figures.items():
        print(f"{name}: per trial after the first, outside load/train/score: mean {figure['overhead_s_mean']:.2f} s, "
              f"max {figure['overhead_s_max']:.2f} s; with loading: mean {figure['idle_s_mean']:.2f} s; first trial "
              f"framework {figure['first_framework_s']} s, load {figure['first_load_s']} s")
    assert figures["warm"]["slots"] == figures["cold"]["slots"] == 1  # one trial at a time
    assert figures["warm"]["overhead_s_mean"] <= WARM_BOUND_S
    # a return to a worker group per trial costs its start and stop again: the warm path saves most of it
    assert figures["warm"]["overhead_s_mean"] < 0.5 * figures["cold"]["overhead_s_mean"], figures

    cold_by_id = {row["trial_id"]: row for row in cold}
    for row in warm:
        other = cold_by_id[row["trial_id"]]
        for key in SAME[:-1]:
            assert row[key] == other[key], (row["trial_id"], key, row[key], other[key])
    assert len({row["train_loss"] for row in warm}) > 1  # the trials differ, so a leftover would show
