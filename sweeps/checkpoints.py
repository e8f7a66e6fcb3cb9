"""A trial's Ray Train run in the results storage: ``<results_dir>/ray/<run>-<trial_id>/`` holds its checkpoints
(``trainable.checkpointing``) and Ray Train's list of them.

Ray Train continues a run of the same name and storage from its latest checkpoint: a retried trial
(``FailureConfig``), a ``--resume``d sweep and a re-run of a failed trial all do. A run whose checkpoints come from
another config (an edited sweep under the same name, ``--rerun-changed``) or another number of workers is deleted
before the trial runs, so that the trial starts afresh instead of continuing someone else's training.
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow.fs as pafs

from sweeps import fingerprint
from sweeps.store import filesystem
from trainable.checkpointing import TRIAL_FILE
from trainable.config import TrialConfig


def run_name(sweep_name: str, trial_id: str) -> str:
    """The Ray Train run name of a trial (its folder under the storage path)."""
    return f"{sweep_name}-{trial_id}"


def _records(fs: pafs.FileSystem, run: str) -> list[dict[str, Any]]:
    """The ``trial.json`` of each checkpoint folder of the run (a folder still being written may lack one)."""
    records = []
    for info in fs.get_file_info(pafs.FileSelector(run, allow_not_found=True)):
        path = f"{info.path}/{TRIAL_FILE}"
        if info.type == pafs.FileType.Directory and fs.get_file_info(path).type == pafs.FileType.File:
            with fs.open_input_stream(path) as handle:
                records.append(json.loads(handle.read()))
    return records


def discard_stale(storage_path: str, name: str, trial: TrialConfig, workers: int) -> str | None:
    """Delete the trial's Ray Train run ``name`` if a checkpoint of it comes from another config or number of
    workers; return what differed (one line), or None when the run is absent or can be continued."""
    fs, base = filesystem(storage_path)
    run = f"{base}/{name}"
    for record in _records(fs, run):
        changed = fingerprint.differences(record["config"], trial.to_dict())
        if record["world_size"] != workers:
            changed["workers"] = (record["world_size"], workers)
        if changed:
            fs.delete_dir(run)
            return fingerprint.describe(changed)
    return None
