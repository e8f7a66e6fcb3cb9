"""A trial's Ray Train run is continued only from checkpoints of its own config and number of workers."""

import dataclasses
from pathlib import Path

from sweeps.checkpoints import discard_stale, run_name
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
