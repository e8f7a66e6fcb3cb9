"""The tiny sweep with its results in a bucket: `--results-dir s3://calsweep-test/...` against a local S3 server over
HTTP (moto's, ``s3_store``), the endpoint given as AWS users give it (AWS_ENDPOINT_URL). Trial rows, question records,
the run's sweep.yaml and the checkpoints of warm one-worker trials and of two-worker Ray Train trials land in the
bucket and nowhere on the local disk; a launch killed after its first trial is resumed from the bucket (the server
stopped for 20 s while the resumed trial runs: its reads and writes wait and retry); `calsweep analyze s3://...`
reads it back. A store the launcher cannot use (an unreachable endpoint, a missing bucket, refused credentials) is
refused in one line before Ray starts, as is an s3:// URI with a query (pyarrow's ``?endpoint_override=``)."""

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from sweeps import store
from sweeps.analyze import main as analyze_main
from sweeps.launch import main as launch_main

REPO = Path(__file__).resolve().parents[2]
CONFIG = Path(__file__).with_name("tiny_sweep.yaml")
OUTAGE_S = 20.0
# a step's state stays in the bucket beside the final checkpoint; one task keeps the trials short
SHORT = ["train.checkpoint_every_steps=1", "train.checkpoints_to_keep=3", "eval.tasks=[arc_easy]"]


def _command(root: str, *args: str) -> list[str]:
    return [sys.executable, str(REPO / "sweeps" / "launch.py"), "--results-dir", root, *args]


def _env(data_dir: str) -> dict:
    return {**os.environ, "CALSWEEP_DATA_DIR": data_dir, "RAY_USAGE_STATS_ENABLED": "0"}


def _launch(root: str, cwd: Path, data_dir: str, *args: str, kill_after: str | None = None,
            on_line: tuple[str, callable] | None = None) -> tuple[int, str]:
    """Run the launcher in ``cwd``; with ``kill_after``, kill it (and its Ray) once a line starts with that; with
    ``on_line`` (prefix, action), call the action when such a line first comes. Its exit status and output."""
    process = subprocess.Popen(_command(root, *args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env=_env(data_dir), cwd=cwd, start_new_session=True)
    seen = []
    try:
        for line in process.stdout:
            seen.append(line)
            if on_line and line.startswith(on_line[0]):
                on_line[1]()
                on_line = None
            if kill_after and line.startswith(kill_after):
                os.killpg(process.pid, signal.SIGKILL)  # the driver and the Ray processes it started
                break
        return process.wait(timeout=900), "".join(seen)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=60)


def _local_files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def test_a_sweep_into_a_bucket_survives_a_kill_and_an_outage_and_is_analysed(s3_store, tmp_path, data_dir, capsys):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    root = f"s3://{s3_store.bucket}/sweeps"
    code, first = _launch(root, cwd, data_dir, "--config", str(CONFIG), *SHORT,
                          kill_after="[calsweep 1/2] done")
    assert "[calsweep 1/2] done" in first, first[-3000:]
    before = {row["trial_id"]: row for row in store.read_trials(root, "tiny").to_pylist()}
    assert [row["status"] for row in before.values()] == ["ok"]

    outage = threading.Timer(0.0, lambda: None)

    def stop_for_a_while() -> None:  # the trial's driver, its checkpoints and rows meet a dead endpoint
        nonlocal outage
        s3_store.stop()
        outage = threading.Timer(OUTAGE_S, s3_store.start)
        outage.start()

    code, out = _launch(root, cwd, data_dir, "--resume", "tiny", "--verbose",  # the trials' retry lines shown
                        on_line=("[calsweep 1/2] start", stop_for_a_while))
    outage.join()
    assert code == 0, out[-4000:]
    assert re.search(r"\[calsweep\] storage: .+ failed \(.*NETWORK_CONNECTION.*\); retry 1 in 1 s", out), out[-6000:]

    rows = store.read_trials(root, "tiny").to_pylist()
    assert sorted(row["label_smoothing"] for row in rows) == [0.0, 0.1]  # one row per trial: none lost, none twice
    assert all(row["status"] == "ok" and row["train_steps"] == 2 for row in rows), rows
    for trial_id, row in before.items():  # the finished trial was not run again
        assert next(r for r in rows if r["trial_id"] == trial_id)["finished_at"] == row["finished_at"]
    assert store.read_questions(root, "tiny").num_rows == 2 * 4

    keys = s3_store.keys("sweeps/")
    ids = sorted(row["trial_id"] for row in rows)
    assert [k for k in keys if k.startswith("sweeps/trials/")] == [f"sweeps/trials/tiny__{i}.parquet" for i in ids]
    assert [k for k in keys if k.startswith("sweeps/questions/")] == [
        f"sweeps/questions/tiny__{i}.parquet" for i in ids]
    assert "sweeps/runs/tiny/sweep.yaml" in keys and "sweeps/ray/tiny/tuner.pkl" in keys
    for trial_id in ids:  # warm trials' checkpoints: a step's DeepSpeed state (model + optimizer) and the final one
        folder = f"sweeps/ray/tiny-{trial_id}/checkpoint_"
        assert any(k.startswith(folder) and k.endswith("/deepspeed/trial/mp_rank_00_model_states.pt") for k in keys)
        assert any(k.startswith(folder) and "optim_states.pt" in k for k in keys), keys
        assert any(k.startswith(folder) and k.endswith("/final_metrics.json") for k in keys)
    assert not [k for k in keys if ".tmp" in k or "write-check" in k], keys  # no temporaries left behind

    analysis = tmp_path / "analysis"
    capsys.readouterr()
    analyze_main([root, "--out", str(analysis), "--n-boot", "20"], prog="calsweep analyze")  # reads the bucket
    notes = capsys.readouterr().out
    assert f"store: `{root}`" in notes and "2 ok trials" in notes and any(analysis.iterdir())
    assert _local_files(cwd) == []  # no results/ folder, no checkpoint, nothing written locally instead


def test_two_worker_ray_train_trials_checkpoint_into_the_bucket(s3_store, tmp_path, data_dir):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    root = f"s3://{s3_store.bucket}/train"
    code, out = _launch(root, cwd, data_dir, "--config", str(CONFIG), "--name", "ddp", "label_smoothing=[0.1]",
                        "resources.warm_trials=false", "resources.workers_per_trial=2", *SHORT)
    assert code == 0, out[-4000:]
    [row] = store.read_trials(root, "ddp").to_pylist()
    assert row["status"] == "ok" and row["world_size"] == 2 and row["train_steps"] == 2
    keys = s3_store.keys("train/")
    run = f"train/ray/ddp-{row['trial_id']}/"
    assert f"{run}checkpoint_manager_snapshot.json" in keys  # Ray Train's own record, in the bucket
    for rank in (0, 1):  # each rank's shard of the step's checkpoint, merged into one folder by Ray Train
        assert any(k.startswith(f"{run}checkpoint_") and k.endswith(f"rng_rank{rank}.pt") for k in keys), keys
    assert _local_files(cwd) == []


@pytest.mark.parametrize("case", ["unreachable endpoint", "missing bucket", "refused credentials", "query"])
def test_a_store_the_launcher_cannot_use_is_refused_in_one_line_before_ray_starts(s3_store, monkeypatch, capsys,
                                                                                  case, data_dir):
    import ray

    root = f"s3://{s3_store.bucket}/refused"
    expected = {"unreachable endpoint": "cannot be reached", "missing bucket": "bucket 'no-such-bucket' does not exist",
                "refused credentials": "refused this machine's credentials (INVALID_ACCESS_KEY_ID)",
                "query": "has a query; expected a plain URI such as s3://bucket/prefix"}[case]
    if case == "unreachable endpoint":
        s3_store.stop()
    elif case == "missing bucket":
        root = "s3://no-such-bucket/refused"
    elif case == "query":  # pyarrow would take the endpoint so, but folder names joined onto it would split it
        root = f"{root}?endpoint_override={s3_store.endpoint.removeprefix('http://')}&scheme=http"
    else:
        s3_store.check_credentials()  # moto's IAM holds no key: the test keys are refused, as wrong ones are
    try:
        code = launch_main(["--config", str(CONFIG), "--results-dir", root])
    finally:
        s3_store.check_credentials(False)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and expected in err[0] and root in err[0], err
    assert not ray.is_initialized()
