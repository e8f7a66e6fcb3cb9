"""End to end: `python sweeps/launch.py` on a tiny random-init model, 2 trials, through Ray Tune, Ray Train and
DeepSpeed on CPU, into the Parquet store; then a rerun that finds both trials finished and adds no rows."""

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sweeps import store

REPO = Path(__file__).resolve().parents[2]
CONFIG = Path(__file__).with_name("tiny_sweep.yaml")


def _launch(results: Path, data_dir: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "CALSWEEP_DATA_DIR": data_dir, "RAY_USAGE_STATS_ENABLED": "0"}
    return subprocess.run([sys.executable, str(REPO / "sweeps" / "launch.py"), "--config", str(CONFIG),
                           "--results-dir", str(results)], capture_output=True, text=True, timeout=900, env=env)


@pytest.mark.slow
def test_tiny_sweep_end_to_end(tmp_path, data_dir):
    out = _launch(tmp_path, data_dir)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "[calsweep 2/2] done" in out.stdout
    rows = store.read_trials(str(tmp_path), "tiny").to_pylist()
    assert len(rows) == 2 and {r["label_smoothing"] for r in rows} == {0.0, 0.1}
    for row in rows:
        assert row["status"] == "ok" and row["error"] is None
        assert row["vocab_size"] == 49152 and row["hidden_size"] == 64 and row["n_params"] > 0
        assert math.isfinite(row["train_loss"]) and row["train_steps"] == 2
        assert row["git_rev"] and "torch" in row["package_versions"]
        for task in ("mmlu", "arc_easy", "hellaswag"):
            assert 0 <= row[f"{task}_accuracy"] <= 1 and row[f"{task}_n_questions"] == 4
            for metric in ("ece", "rms_ce", "mce", "ace", "sce"):
                assert 0 <= row[f"{task}_{metric}"] <= 1, (task, metric)
            assert row[f"{task}_ece"] <= row[f"{task}_rms_ce"] + 1e-12 <= row[f"{task}_mce"] + 2e-12
            assert math.isfinite(row[f"{task}_nll"]) and 0 <= row[f"{task}_brier"] <= 2
    questions = store.read_questions(str(tmp_path), "tiny")
    assert questions.num_rows == 2 * 3 * 4
    table = out.stdout[out.stdout.index("family"):]
    assert "tiny-llama" in table and "hellaswag_rms" in table

    again = _launch(tmp_path, data_dir)  # resume: both trials are finished in the store, none re-runs
    assert again.returncode == 0, again.stderr[-3000:]
    assert store.read_trials(str(tmp_path), "tiny").num_rows == 2
    assert [r["finished_at"] for r in store.read_trials(str(tmp_path), "tiny").to_pylist()] == \
        [r["finished_at"] for r in rows]
