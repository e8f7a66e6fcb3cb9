"""A trial's Ray Train run is continued only from checkpoints of its own config and number of workers."""

import dataclasses
import os
from pathlib import Path

from sweeps.checkpoints import discard_stale, latest, persist, run_name
from sweeps.config import load_sweep
from trainable.checkpointing import write_trial_record

TINY = Path(__file__).with_name("tiny_sweep.yaml")


def _run_with_checkpoint(storage: Path, trial, world_size: int = 1) -> Path:
    run = storage / run_name("tiny", trial.trial_id)
    (run / "checkpoint_2026-11-24_10-00-00.000000").mkdir(parents=True)
    write_trial_record(run / "checkpoint_2026-11-24_10-00-00.000000", trial.to_dict(), world_size)
    (run / "checkpoint_2026-11-24_11-00-00.000000").mkdir()  # one being written: no trial.json yet
    (run / "checkpoint_manager_snapshot.json").write_text("{}")
    return run


def test_checkpoints_of_the_same_config_are_kept(tmp_path):
    sweep = load_sweep(TINY, {"results_dir": str(tmp_path)})
    trial = sweep.trial(sweep.trial_points()[0])
    run = _run_with_checkpoint(tmp_path / "ray", trial)
    cadence = dataclasses.replace(trial.train, log_every=1, checkpoint_every_steps=5, checkpoints_to_keep=3)
    assert discard_stale(str(tmp_path / "ray"), run.name, dataclasses.replace(trial, train=cadence), 1) is None
    assert run.is_dir()
    assert discard_stale(str(tmp_path / "ray"), run_name("tiny", "absent"), trial, 1) is None


def test_checkpoints_of_another_config_or_world_size_are_deleted(tmp_path):
    sweep = load_sweep(TINY, {"results_dir": str(tmp_path)})
    trial = sweep.trial(sweep.trial_points()[0])
    run = _run_with_checkpoint(tmp_path / "ray", trial)
    longer = dataclasses.replace(trial, train=dataclasses.replace(trial.train, max_steps=8))
    assert discard_stale(str(tmp_path / "ray"), run.name, longer, 1) == "train.max_steps: stored 2, now 8"
    assert not run.exists()

    run = _run_with_checkpoint(tmp_path / "ray", trial, world_size=2)
    assert discard_stale(str(tmp_path / "ray"), run.name, trial, 1) == "workers: stored 2, now 1"
    assert not run.exists()


def _local_checkpoint(directory: Path, trial, step: int) -> Path:
    (directory / "deepspeed" / "trial").mkdir(parents=True)
    (directory / "deepspeed" / "trial" / "shard.pt").write_text(f"weights at step {step}")
    (directory / "loop.json").write_text(f'{{"step": {step}}}')
    write_trial_record(directory, trial.to_dict(), 1)
    return directory


def test_a_warm_trials_checkpoints_are_stored_whole_newest_kept_and_found(tmp_path):
    sweep = load_sweep(TINY, {"results_dir": str(tmp_path)})
    trial = sweep.trial(sweep.trial_points()[0])
    storage, name = str(tmp_path / "ray"), run_name("tiny", trial.trial_id)
    with latest(storage, name) as found:
        assert found is None
    first = persist(storage, name, _local_checkpoint(tmp_path / "a", trial, 2), keep=2)
    leftover = tmp_path / "ray" / name / "checkpoint_2026-11-24_11-00-00.000000"  # a dead attempt's, no trial.json
    leftover.mkdir()
    second = persist(storage, name, _local_checkpoint(tmp_path / "b", trial, 4), keep=2)
    assert not leftover.exists() and Path(first).is_dir()
    with latest(storage, name) as found:
        assert found == Path(second) and (found / "loop.json").read_text() == '{"step": 4}'
        assert (found / "deepspeed" / "trial" / "shard.pt").read_text() == "weights at step 4"
    third = persist(storage, name, _local_checkpoint(tmp_path / "c", trial, 6), keep=2)
    kept = sorted(p.name for p in (tmp_path / "ray" / name).iterdir())
    assert kept == sorted([Path(second).name, Path(third).name])
    assert discard_stale(storage, name, trial, 1) is None  # Ray Train's reader accepts them as this config's


def test_a_checkpoint_in_a_bucket_is_read_back_in_few_large_requests(s3_store, tmp_path):
    """pyarrow reads an object store's file with one ranged GET per read: a 20 MiB shard comes back in one GET
    (``COPY_CHUNK_BYTES``), not in the 20 of pyarrow's 1 MiB default (17,000 for a 1B trial's checkpoint)."""
    sweep = load_sweep(TINY, {"results_dir": str(tmp_path)})
    trial = sweep.trial(sweep.trial_points()[0])
    storage, name = f"s3://{s3_store.bucket}/ray", run_name("tiny", trial.trial_id)
    local = _local_checkpoint(tmp_path / "a", trial, 2)
    shard = os.urandom(20 << 20)
    (local / "deepspeed" / "trial" / "optim.pt").write_bytes(shard)
    persist(storage, name, local, keep=1)
    mark = len(s3_store.requests)
    with latest(storage, name) as found:
        assert (found / "deepspeed" / "trial" / "optim.pt").read_bytes() == shard
    reads = [r for r in s3_store.requests[mark:] if r.method == "GET" and r.path.split("?")[0].endswith("/optim.pt")]
    assert len(reads) == 1 and reads[0].bytes_out == len(shard)
