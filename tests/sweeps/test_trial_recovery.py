"""Trials that survive deaths, in real sweeps (`python sweeps/launch.py`: Ray Tune, Ray Train, DeepSpeed on CPU).

A trial's process dies mid-trial (``CALSWEEP_FAULT_AT_STEP``: os._exit after step 3 on its first attempt), a warm
trial's Tune actor or a Ray Train worker: the trial's retry (Ray Tune's ``FailureConfig``) continues from the step-2
checkpoint and ends with the final loss and scores of the same trial run through without a death. Chaos: a two-trial
sweep under SIGKILLs of random trial processes at random times and a SIGKILL of
the driver (with its Ray) mid-sweep, then ``--resume``: one ok row per trial with the uninterrupted runs' numbers,
their questions, and an analysis of the store. Out of memory (``CALSWEEP_FAULT_OOM``), warm or in a two-worker Ray
Train trial: said as such with its layout, and run again alone. An error that recurs: stored once, not retried.
"""

import dataclasses
import math
import os
import random
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from sweeps import fingerprint, store
from sweeps.analysis.load import parse_filter
from sweeps.analyze import analyze
from sweeps.config import load_sweep
from trainable.fault_injection import FAULT_ENV, OOM_ENV
from trainable.worker import run_trial

REPO = Path(__file__).resolve().parents[2]
CONFIG = Path(__file__).with_name("tiny_sweep.yaml")
SETTINGS = ["label_smoothing=[0.1]", "train.max_steps=4", "train.checkpoint_every_steps=2", "train.log_every=1",
            "train.dropout=0.1", "eval.tasks=[arc_easy]", "resources.max_failures=1"]
# fp32 on the CPU: the same operations in the same order; only the worker's thread count may differ from pytest's
REL_TOL = 1e-5


def uninterrupted_run(sweep, point, results_dir: Path) -> dict:
    """A trial of the sweep run through in this process (no Ray, no death): the reference."""
    trial = dataclasses.replace(sweep.trial(point), results_dir=str(results_dir))
    return run_trial(trial, torch.device("cpu"), 0, 1, lambda metrics: None, writers=store.trial_writers())


def _launch(results: Path, *args: str) -> list[str]:
    return [sys.executable, str(REPO / "sweeps" / "launch.py"), "--results-dir", str(results), *args]


def _env(data_dir: str, **extra: str) -> dict[str, str]:
    return {**os.environ, "CALSWEEP_DATA_DIR": data_dir, "RAY_USAGE_STATS_ENABLED": "0", **extra}


def _warm_trials(warm: bool) -> list[str]:
    return [f"resources.warm_trials={str(warm).lower()}"]


@pytest.fixture(scope="module")
def killed_sweeps(tmp_path_factory, data_dir) -> dict[bool, tuple[subprocess.CompletedProcess, Path]]:
    """SETTINGS' sweep warm and through Ray Train, its trial's rank 0 dying after step 3 on its first attempt
    (``CALSWEEP_FAULT_AT_STEP``); the two launched at once, each with a Ray of its own. warm -> (its launch, its
    results folder)."""
    folders = {warm: tmp_path_factory.mktemp("killed") / "results" for warm in (True, False)}

    def launch(warm: bool) -> subprocess.CompletedProcess:
        return subprocess.run(_launch(folders[warm], "--config", str(CONFIG), *SETTINGS, *_warm_trials(warm)),
                              capture_output=True, text=True, timeout=600, env=_env(data_dir, **{FAULT_ENV: "3"}))

    with ThreadPoolExecutor(2) as pool:
        runs = {warm: pool.submit(launch, warm) for warm in folders}
        return {warm: (run.result(), folders[warm]) for warm, run in runs.items()}


@pytest.mark.slow
@pytest.mark.parametrize("warm", [True, False], ids=["warm", "ray_train"])
def test_a_killed_worker_resumes_from_its_checkpoint(tmp_path, killed_sweeps, one_rank_process_group, warm):
    out, results = killed_sweeps[warm]
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "resumed from its checkpoint at step 2/4" in out.stdout, out.stdout[-3000:]
    (row,) = store.read_trials(str(results), "tiny").to_pylist()
    assert row["status"] == "ok" and row["resumed_from_step"] == 2 and row["train_steps"] == 4
    assert (results / "faults" / f"tiny__{row['trial_id']}.step3").exists()  # the first attempt did die at step 3

    run_dir = results / "ray" / f"tiny-{row['trial_id']}"
    kept = [path for path in run_dir.iterdir() if path.is_dir() and path.name.startswith("checkpoint_")]
    assert len(kept) == 1 and (kept[0] / "final_metrics.json").exists()  # checkpoints_to_keep: 1 pruned the others

    sweep = load_sweep(CONFIG, {"results_dir": str(results)}, [*SETTINGS, *_warm_trials(warm)])
    reference = uninterrupted_run(sweep, sweep.trial_points()[0], tmp_path / "reference")
    assert reference["resumed_from_step"] == 0
    for key in ("train_loss", "train_loss_first", "arc_easy_nll", "arc_easy_ece", "arc_easy_accuracy"):
        assert math.isclose(row[key], reference[key], rel_tol=REL_TOL), (key, row[key], reference[key])


OUT_OF_MEMORY = {"warm": (1, True), "warm_2_workers": (2, True), "ray_train_2_workers": (2, False)}  # workers, warm


def _out_of_memory_settings(workers: int, warm: bool) -> list[str]:
    return ["label_smoothing=[0.1]", "eval.tasks=[]", "resources.max_failures=0",  # no Tune retry
            f"resources.workers_per_trial={workers}", *_warm_trials(warm)]


@pytest.fixture(scope="module")
def out_of_memory_sweeps(tmp_path_factory, data_dir) -> dict[str, tuple[subprocess.CompletedProcess, Path]]:
    """A one-trial sweep of each layout of OUT_OF_MEMORY, its trial's rank 0 out of memory on its first attempt
    (``CALSWEEP_FAULT_OOM``); the three launched at once, each with a Ray of its own. Layout -> (its launch, its
    results folder)."""
    folders = {layout: tmp_path_factory.mktemp("out_of_memory") / "results" for layout in OUT_OF_MEMORY}

    def launch(layout: str) -> subprocess.CompletedProcess:
        return subprocess.run(_launch(folders[layout], "--config", str(CONFIG),
                                      *_out_of_memory_settings(*OUT_OF_MEMORY[layout])),
                              capture_output=True, text=True, timeout=600, env=_env(data_dir, **{OOM_ENV: "1"}))

    with ThreadPoolExecutor(len(folders)) as pool:
        runs = {layout: pool.submit(launch, layout) for layout in folders}
        return {layout: (run.result(), folders[layout]) for layout, run in runs.items()}


@pytest.mark.slow
@pytest.mark.parametrize("layout", list(OUT_OF_MEMORY))
def test_an_out_of_memory_trial_is_retried_alone(out_of_memory_sweeps, data_dir, layout):
    """Warm, the error is rank 0's own; through Ray Train, its rank 0's inside the WorkerGroupError, whose text
    Ray cuts short. Either way the FAILED line says out of memory with the layout the trial ran (no peaks on the
    CPU), and the launcher runs it again alone."""
    (workers, warm), (out, results) = OUT_OF_MEMORY[layout], out_of_memory_sweeps[layout]
    settings = _out_of_memory_settings(workers, warm)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    (row,) = store.read_trials(str(results), "tiny").to_pylist()
    assert (results / "faults" / f"tiny__{row['trial_id']}.oom").exists()  # the first attempt did run out of memory
    failed = (f"FAILED {row['trial_id']}: out of GPU memory on {workers} worker{'s' if workers > 1 else ''}, "
              f"ZeRO-2 (deepspeed), micro-batch 2 x 2, 0 layers recomputed; peak planned n/a, measured n/a: "
              f"torch.OutOfMemoryError: CUDA out of memory. ({OOM_ENV}=1: trial {row['trial_id']}'s first attempt")
    assert failed in out.stdout, out.stdout[-3000:]
    retry = [line for line in out.stdout.splitlines() if line.startswith("Retrying ")]
    assert retry == [f"Retrying 1 trial(s) that ran out of GPU memory while sharing, alone (0 GPU per worker, one "
                     f"trial at a time): {row['trial_id']}"], out.stdout
    assert row["status"] == "ok" and row["error"] is None and row["train_steps"] == 2
    assert row["world_size"] == workers
    sweep = load_sweep(CONFIG, {"results_dir": str(results), "data_dir": data_dir}, settings)
    assert fingerprint.row_differences(row, sweep.trial(sweep.trial_points()[0]), workers) == {}  # a later run keeps it


@pytest.mark.slow
def test_an_error_that_recurs_is_stored_once_and_not_retried(tmp_path, data_dir):
    """Too few packed rows for two ranks' micro-batches: a ValueError in both workers of the Ray Train trial, which
    every retry would raise again. The trial is stored failed once, with its layout, and the sweep fails."""
    results = tmp_path / "results"
    settings = ["label_smoothing=[0.1]", "eval.tasks=[]", "resources.max_failures=2", "resources.workers_per_trial=2",
                "train.pack=true", "train.pack_length=512"]
    out = subprocess.run(_launch(results, "--config", str(CONFIG), *settings), capture_output=True,
                         text=True, timeout=600, env=_env(data_dir))
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    (row,) = store.read_trials(str(results), "tiny").to_pylist()
    assert row["status"] == "failed", row
    assert row["error"].startswith("ValueError: expected at least micro_batch_size=2 packed rows per rank, got 1")
    assert (row["world_size"], row["engine"], row["zero_stage"], row["micro_batch_size"],
            row["gradient_accumulation_steps"], row["activation_checkpointing"]) == (2, "deepspeed", 2, 2, 2, 0)
    events = [line for line in out.stdout.splitlines() if line.startswith("[calsweep ")]
    assert [line.split("] ")[1].split(" ")[0] for line in events] == ["start", "FAILED"], out.stdout[-3000:]
    assert events[1] == (f"[calsweep 1/1] FAILED {row['trial_id']}: {row['error']} (not retried: the same input "
                         f"fails the same way)")


CHAOS = ["--name", "chaos", "train.max_steps=4", "train.checkpoint_every_steps=2", "train.log_every=1",
         "resources.max_failures=1"]  # a trial killed twice is stored failed, then --resume'd


def _train_workers(session: int) -> list[int]:
    """Processes that run trials in the session of the driver we started (each Ray worker leads its own group): Ray
    Train workers, and the Tune actors that run warm trials themselves (``sweeps.warm_trial``)."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            stat, cmdline = (entry / "stat").read_text(), (entry / "cmdline").read_bytes()
        except (OSError, ValueError):  # not a process, or one that has ended
            continue
        if int(stat.rsplit(")", 1)[1].split()[3]) == session and (b"RayTrainWorker" in cmdline
                                                                  or b"ray::ImplicitFunc" in cmdline):
            pids.append(int(entry.name))
    return pids


def _kill_workers_at_random(session: int, rng: random.Random, stop: threading.Event, killed: list[str]) -> None:
    """Two SIGKILLs, each of a random trial process 0-6 s after one is found running (a warm CPU trial takes about
    9 s): in loading, training, checkpointing or scoring, wherever it falls."""
    while len(killed) < 2 and not stop.wait(0.5):
        workers = _train_workers(session)
        if workers and not stop.wait(rng.uniform(0, 6)):
            pid = rng.choice(workers)
            if pid in _train_workers(session):
                os.kill(pid, signal.SIGKILL)
                killed.append(f"{time.strftime('%H:%M:%S')} SIGKILL worker {pid}")


@pytest.mark.slow
def test_chaos_sweep_ends_with_one_ok_row_per_trial(tmp_path, data_dir, one_rank_process_group):
    seed = int(os.environ.get("CALSWEEP_CHAOS_SEED", time.time_ns() % 2**32))
    print(f"CALSWEEP_CHAOS_SEED={seed}")  # shown with a failure: set it to replay the same kill delays
    rng, results = random.Random(seed), tmp_path / "results"
    driver = subprocess.Popen(_launch(results, "--config", str(CONFIG), *CHAOS), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, env=_env(data_dir), start_new_session=True)
    lines, first_over, stop, killed = [], threading.Event(), threading.Event(), []

    def read() -> None:
        for line in driver.stdout:
            lines.append(line)
            if line.startswith("[calsweep 1/2] "):  # the first trial ended: done, or failed after two kills
                first_over.set()

    threads = [threading.Thread(target=read, daemon=True),
               threading.Thread(target=_kill_workers_at_random, args=(driver.pid, rng, stop, killed), daemon=True)]
    for thread in threads:
        thread.start()
    try:
        assert first_over.wait(timeout=400), "".join(lines)[-3000:]
        deadline = time.time() + 60  # a first trial quicker than the first kill: the kill lands in the second
        while not killed and driver.poll() is None and time.time() < deadline:
            time.sleep(0.2)
        time.sleep(rng.uniform(0, 5))
        assert driver.poll() is None, "the sweep ended before the driver kill: " + "".join(lines)[-3000:]
    finally:
        stop.set()
        os.killpg(driver.pid, signal.SIGKILL)  # the driver and the Ray processes it started
        driver.wait(timeout=60)
    print("".join(lines) + "\n".join(killed))
    assert killed, "no trial process was found to kill"

    out = subprocess.run(_launch(results, "--resume", "chaos"), capture_output=True, text=True,
                         timeout=600, env=_env(data_dir))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    sweep = load_sweep(CONFIG, {"results_dir": str(results)}, CHAOS[2:] + ["name=chaos"])
    expected = {sweep.trial(point).trial_id: point for point in sweep.trial_points()}
    rows = store.read_trials(str(results), "chaos").to_pylist()
    assert sorted(row["trial_id"] for row in rows) == sorted(expected)  # exactly one row per trial
    questions = store.read_questions(str(results), "chaos").to_pandas()
    assert set(questions["trial_id"]) == set(expected)
    print({row["trial_id"]: row["resumed_from_step"] for row in rows})
    for row in rows:
        assert row["status"] == "ok" and row["error"] is None, row
        assert row["resumed_from_step"] in (0, 2, 4), row  # from scratch, or from a checkpoint
        mine = questions[questions["trial_id"] == row["trial_id"]]
        for task in sweep.eval.tasks:
            assert (mine["task"] == task).sum() == row[f"{task}_n_questions"] == 4
        reference = uninterrupted_run(sweep, expected[row["trial_id"]], tmp_path / "reference")
        for key in ("train_loss", "train_loss_first", "mmlu_nll", "arc_easy_ece", "hellaswag_accuracy"):
            assert math.isclose(row[key], reference[key], rel_tol=REL_TOL), (key, row[key], reference[key])

    written = analyze(str(results), parse_filter("run=chaos"), tmp_path / "analysis", n_boot=20)
    table = (tmp_path / "analysis" / "table1.csv").read_text()
    assert written and "tiny-llama" in table


@pytest.mark.slow
def test_a_store_that_cannot_be_written_is_said_as_such(tmp_path, data_dir):
    """The trial trains, but its row's place in the store is taken (a folder: a chmod would not stop root): its
    retry and its FAILED line say the store could not be written, naming the store's folder, and the sweep fails."""
    results = tmp_path / "results"
    settings = ["label_smoothing=[0.1]", "eval.tasks=[]", "resources.max_failures=1"]
    sweep = load_sweep(CONFIG, {"results_dir": str(results), "data_dir": data_dir}, settings)
    trial_id = sweep.trial(sweep.trial_points()[0]).trial_id
    blocker = results / "trials" / f"{store.file_stem('tiny', trial_id)}.parquet"
    blocker.mkdir(parents=True)
    (blocker / ".keep").write_text("")
    out = subprocess.run(_launch(results, "--config", str(CONFIG), *settings), capture_output=True,
                         text=True, timeout=600, env=_env(data_dir))
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    said = f"StoreWriteError: results store {results}/trials: could not write {blocker.name} (Is a directory)"
    assert f"retrying {trial_id} (its row could not be written: sweeps.store.{said}" in out.stdout, out.stdout[-3000:]
    assert f"FAILED {trial_id}: sweeps.store.{said}" in out.stdout, out.stdout[-3000:]
    assert "ended by Tune before it ran" not in out.stdout and ".tmp" not in out.stdout, out.stdout[-3000:]
