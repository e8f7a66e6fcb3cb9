"""End to end: `python sweeps/launch.py` on a tiny random-init model, 2 trials, through Ray Tune, Ray Train and
DeepSpeed on CPU, into the Parquet store. The driver is killed (with its local Ray) once the first trial is done;
`--resume` (with the Ray dashboard started) finishes the sweep without re-running that trial, and the store holds
exactly one row per trial. The model's tokenizer is a folder named relative to the launch's working directory (Ray's
workers run elsewhere: the launcher makes it absolute)."""

import dataclasses
import math
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sweeps import store

REPO = Path(__file__).resolve().parents[2]
CONFIG = Path(__file__).with_name("tiny_sweep.yaml")


def _command(results: Path, *args: str) -> list[str]:
    return [sys.executable, str(REPO / "sweeps" / "launch.py"), "--results-dir", str(results), *args]


def _env(data_dir: str) -> dict:
    return {**os.environ, "CALSWEEP_DATA_DIR": data_dir, "RAY_USAGE_STATS_ENABLED": "0"}


def _run_until_first_trial_done_then_kill(results: Path, data_dir: str, config: Path) -> str:
    process = subprocess.Popen(_command(results, "--config", str(config)), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, env=_env(data_dir), start_new_session=True,
                               cwd=config.parent)
    seen = []
    try:
        for line in process.stdout:
            seen.append(line)
            if line.startswith("[calsweep 1/2] done"):
                break
    finally:
        os.killpg(process.pid, signal.SIGKILL)  # the driver and the Ray processes it started
        process.wait(timeout=60)
    return "".join(seen)


def test_local_paths_are_made_absolute_and_names_kept(tmp_path, monkeypatch):
    from sweeps.config import load_sweep, with_absolute_local_paths

    (tmp_path / "tok").mkdir()
    (tmp_path / "model").mkdir()
    monkeypatch.chdir(tmp_path)
    sweep = load_sweep(CONFIG, {"families": ["tiny-llama", "smollm2-135m", "model"]})
    sweep = dataclasses.replace(sweep, custom_models={
        "tiny-llama": dataclasses.replace(sweep.custom_models["tiny-llama"], tokenizer="tok")})
    absolute = with_absolute_local_paths(sweep)
    assert absolute.families == ("tiny-llama", "smollm2-135m", str(tmp_path / "model"))
    assert absolute.custom_models["tiny-llama"].tokenizer == str(tmp_path / "tok")
    assert with_absolute_local_paths(load_sweep(CONFIG)) == load_sweep(CONFIG)  # registry names stay names


@pytest.mark.slow
def test_tiny_sweep_end_to_end_killed_and_resumed(tmp_path, data_dir, smollm2_tokenizer):
    smollm2_tokenizer.save_pretrained(tmp_path / "tok")
    config = tmp_path / CONFIG.name
    config.write_text(CONFIG.read_text().replace("tokenizer: smollm2-135m", "tokenizer: tok"))
    first = _run_until_first_trial_done_then_kill(tmp_path, data_dir, config)
    assert "[calsweep 1/2] done" in first, first[-3000:]
    assert "TrainingReport(" not in first and "row/s]" not in first  # workers' output only with --verbose
    if not torch.cuda.is_available():  # layouts planned as before detection; the run's sweep.yaml keeps the value
        assert "no GPUs detected: planned for 80 GiB GPUs" in first, first[-3000:]
    before = {r["trial_id"]: r for r in store.read_trials(str(tmp_path), "tiny").to_pylist() if r["status"] == "ok"}
    assert len(before) >= 1

    out = subprocess.run(_command(tmp_path, "--resume", "tiny", "--dashboard"), capture_output=True, text=True,
                         timeout=900, env=_env(data_dir))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert re.search(r"^Ray dashboard: http://127\.0\.0\.1:\d+$", out.stdout, re.M), out.stdout[:2000]
    if not torch.cuda.is_available():  # a CPU sweep has no GPU-hours to report
        assert "planned for 80 GiB (resources.gpu_memory_gb)" in out.stdout and "GPU-hours" not in out.stdout
    rows = store.read_trials(str(tmp_path), "tiny").to_pylist()
    for row in rows:  # finished trials were not run again
        if row["trial_id"] in before:
            assert row["finished_at"] == before[row["trial_id"]]["finished_at"]
    assert len(rows) == 2 and {r["label_smoothing"] for r in rows} == {0.0, 0.1}
    for row in rows:
        assert row["status"] == "ok" and row["error"] is None
        assert row["vocab_size"] == 49152 and row["hidden_size"] == 64 and row["n_params"] > 0
        assert math.isfinite(row["train_loss"]) and row["train_steps"] == 2 and row["attention"] == "default"
        if row["label_smoothing"] == 0:  # without smoothing the plain loss is the objective itself
            assert row["train_loss_plain"] == pytest.approx(row["train_loss"], rel=1e-5)
        assert row["train_loss_plain"] > 0
        assert row["git_rev"] and "torch" in row["package_versions"]
        assert all(row[name] > 0 for name in store.ENTROPY_COLUMNS)  # measured on the trial's evaluation prompts
        assert row["entropy_floor"] <= row["mean_entropy"] and row["rho"] == row["sigma_c"] * row["sigma_h_max"]
        for task in ("mmlu", "arc_easy", "hellaswag"):
            assert 0 <= row[f"{task}_accuracy"] <= 1 and row[f"{task}_n_questions"] == 4
            for metric in ("ece", "rms_ce", "mce", "ace", "sce", "ece_norm", "rms_ce_norm", "mean_confidence_norm"):
                assert 0 <= row[f"{task}_{metric}"] <= 1, (task, metric)
            assert row[f"{task}_ece"] <= row[f"{task}_rms_ce"] + 1e-12 <= row[f"{task}_mce"] + 2e-12
            assert math.isfinite(row[f"{task}_nll"]) and 0 <= row[f"{task}_brier"] <= 2
    trial_dirs = [tmp_path / "ray" / "tiny" / row["trial_id"] for row in rows]  # tracking is off by default
    assert all((d / "result.json").is_file() for d in trial_dirs) and not list(tmp_path.rglob("events.out.tfevents*"))
    questions = store.read_questions(str(tmp_path), "tiny")
    assert questions.num_rows == 2 * 3 * 4
    table = out.stdout[out.stdout.index("family"):]
    assert "tiny-llama" in table and "hellaswag_rms" in table
