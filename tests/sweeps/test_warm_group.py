"""Warm trials of two workers in real sweeps (`python sweeps/launch.py`: Ray Tune, DeepSpeed on CPU with gloo):
rank 0 in the Tune actor, rank 1 in a helper actor of its placement group (``sweeps.warm_group``). Three trials
one at a time run with one helper process, started as the first trial's driver began (before the trial's own
start), whose group the second and third trials reuse; the third gives the losses
and scores of the same trial run cold (a Ray Train worker group of its own, about 30 s on two CPUs) bit for bit. A
helper killed after the trial's first checkpoint: the trial is retried once and ends ok, resumed from that
checkpoint, with the numbers of the same trial run through. Both ranks score (ZeRO-2: each its share of the
questions) and rank 0 stores every question."""

import math
import os
import signal
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sweeps import store
from sweeps.driver import process_started
from sweeps.overhead import summary, trial_overheads

REPO = Path(__file__).resolve().parents[2]
CONFIG = Path(__file__).with_name("tiny_sweep.yaml")
TWO = ["resources.workers_per_trial=2", "resources.max_concurrent_trials=1", "eval.tasks=[arc_easy]"]
ONE_STEP = ["train.max_steps=1", "train.dropout=0.1", "train.gradient_accumulation_steps=1"]
THREE, THIRD = "label_smoothing=[0.0,0.1,0.2]", "label_smoothing=[0.2]"  # run in this order
WARM_BOUND_S = 10.0  # Must: <= 10 s per multi-GPU trial outside its own work, after the first of a shape
SAME = ("train_loss", "train_loss_plain", "train_loss_first", "arc_easy_nll", "arc_easy_ece", "arc_easy_accuracy")
KILL = ["label_smoothing=[0.1]", "train.max_steps=8", "train.checkpoint_every_steps=2", "train.log_every=1",
        "train.dropout=0.1", "resources.max_failures=1"]
REL_TOL = 1e-5  # fp32 on the CPU, the same operations in the same order (as tests/sweeps/test_trial_recovery.py)
HELPER = b"ray::WarmRank"  # a helper rank's process title


def _helpers(session: int) -> set[int]:
    """The helper ranks' processes in the session of the launcher we started. A child a helper forks (a subprocess
    before its exec, as DeepSpeed's op checks start) has its title until then: not counted."""
    parents = {}
    for entry in Path("/proc").iterdir():
        try:
            stat, cmdline = (entry / "stat").read_text(), (entry / "cmdline").read_bytes()
        except (OSError, ValueError):  # not a process, or one that has ended
            continue
        fields = stat.rsplit(")", 1)[1].split()  # state, ppid, pgrp, session, ...
        if int(fields[3]) == session and cmdline.startswith(HELPER):
            parents[int(entry.name)] = int(fields[1])
    return {pid for pid, parent in parents.items() if parent not in parents}


def _launch(results: Path, data_dir: str, name: str, *settings: str,
            watch=None) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """Run a sweep; ``watch(session, stop)`` runs on a thread meanwhile. The sweep's output and stored rows (in start
    order)."""
    command = [sys.executable, str(REPO / "sweeps" / "launch.py"), "--config", str(CONFIG), "--results-dir",
               str(results), "--name", name, *TWO, *settings]
    env = {**os.environ, "CALSWEEP_DATA_DIR": data_dir, "RAY_USAGE_STATS_ENABLED": "0"}
    launcher = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                start_new_session=True)
    stop = threading.Event()
    watcher = threading.Thread(target=watch, args=(launcher.pid, stop), daemon=True) if watch else None
    if watcher:
        watcher.start()
    try:
        stdout, stderr = launcher.communicate(timeout=1200)
    finally:
        stop.set()
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
    if watcher:
        watcher.join(timeout=30)
    out = subprocess.CompletedProcess(command, launcher.returncode, stdout, stderr)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out, sorted(store.read_trials(str(results), name).to_pylist(), key=lambda row: row["started_at"])


@pytest.mark.slow
def test_two_worker_trials_reuse_one_helper_and_match_cold_ones_bit_for_bit(tmp_path, data_dir):
    seen: dict[int, float] = {}  # helper process -> its start

    def watch(session: int, stop: threading.Event) -> None:
        while not stop.wait(0.2):
            seen.update({pid: process_started(pid).timestamp() for pid in _helpers(session) - set(seen)})

    with ThreadPoolExecutor(1) as pool:  # the cold twin meanwhile, by a launch and Ray of its own
        twin_run = pool.submit(_launch, tmp_path / "results", data_dir, "cold", *ONE_STEP, THIRD,
                               "resources.warm_trials=false")
        _, warm = _launch(tmp_path / "results", data_dir, "warm", *ONE_STEP, THREE, watch=watch)
        _, cold = twin_run.result()
    assert len(seen) == 1, seen  # one helper rank served the three trials
    # it started while rank 0 prepared the first trial (sweeps.warm_group.start_helpers), not after the trial began
    assert next(iter(seen.values())) < min(row["started_at"] for row in warm).timestamp(), seen
    for rows, count in ((warm, 3), (cold, 1)):
        assert len(rows) == count and all(row["status"] == "ok" and row["world_size"] == 2 for row in rows), rows
    figures = summary(trial_overheads(warm))
    print(f"warm: per trial after the first, outside load/train/score: mean {figures['overhead_s_mean']:.2f} s, "
          f"max {figures['overhead_s_max']:.2f} s; first trial framework {figures['first_framework_s']} s; cold: "
          f"framework {summary(trial_overheads(cold))['first_framework_s']} s")
    assert figures["slots"] == 1 and figures["overhead_s_mean"] <= WARM_BOUND_S, figures

    # ZeRO-2: each rank scored its share (trainable.scoring_shard), rank 0 stored all four questions of each trial
    questions = store.read_questions(str(tmp_path / "results"), "warm").to_pylist()
    for row in warm:
        ids = [q["question_id"] for q in questions if q["trial_id"] == row["trial_id"]]
        assert len(ids) == len(set(ids)) == 4, (row["trial_id"], ids)

    (twin,) = cold
    assert warm[2]["trial_id"] == twin["trial_id"]  # warm, the third in one group
    for key in SAME:
        assert warm[2][key] == twin[key], (twin["trial_id"], key, warm[2][key], twin[key])
    assert len({row["train_loss"] for row in warm}) == 3  # the trials differ, so a leftover would show


@pytest.mark.slow
def test_a_killed_helper_rank_fails_the_trial_whose_retry_resumes_from_its_checkpoint(tmp_path, data_dir):
    results, killed = tmp_path / "results", []

    def kill_after_first_checkpoint(session: int, stop: threading.Event) -> None:
        while not stop.wait(0.1):
            runs = (results / "ray").glob("kill-*/checkpoint_*/trial.json")
            helpers = _helpers(session)
            if next(runs, None) is not None and helpers:
                os.kill(min(helpers), signal.SIGKILL)
                killed.append(min(helpers))
                return

    with ThreadPoolExecutor(1) as pool:  # the same trial run through meanwhile, by a launch and Ray of its own
        uninterrupted = pool.submit(_launch, results, data_dir, "through", *KILL)
        out, rows = _launch(results, data_dir, "kill", *KILL, watch=kill_after_first_checkpoint)
        _, (through,) = uninterrupted.result()
    print(out.stdout)
    assert killed, out.stdout[-3000:]
    (row,) = rows
    assert row["status"] == "ok" and row["world_size"] == 2 and row["train_steps"] == 8, row
    assert row["resumed_from_step"] > 0, row
    assert f"resumed from its checkpoint at step {row['resumed_from_step']}/8" in out.stdout, out.stdout[-3000:]
    assert out.stdout.count(f"retrying {row['trial_id']}") == 1, out.stdout[-3000:]
    kept = [path for path in (results / "ray" / f"kill-{row['trial_id']}").iterdir() if path.is_dir()]
    assert len(kept) == 1 and (kept[0] / "final_metrics.json").exists()  # checkpoints_to_keep: 1 pruned the others

    assert through["resumed_from_step"] == 0
    for key in ("train_loss", "train_loss_first", "arc_easy_nll", "arc_easy_ece"):  # every rank resumed its state
        assert math.isclose(row[key], through[key], rel_tol=REL_TOL), (key, row[key], through[key])
