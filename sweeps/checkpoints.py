"""A trial's Ray Train run in the results storage: ``<results_dir>/ray/<run>-<trial_id>/`` holds its checkpoints
(``trainable.checkpointing``) and Ray Train's list of them.

Ray Train continues a run of the same name and storage from its latest checkpoint: a retried trial
(``FailureConfig``), a ``--resume``d sweep and a re-run of a failed trial all do. A run whose checkpoints come from
another config (an edited sweep under the same name, ``--rerun-changed``) or another number of workers is deleted
before the trial runs, so that the trial starts afresh instead of continuing someone else's training.

A warm trial (``sweeps.warm_trial``: no Ray Train) keeps its checkpoints in the same folder, with the same names,
through ``persist`` and ``latest``, so that a retried, resumed or re-run warm trial continues the same way; the
ranks of a warm multi-worker trial (``sweeps.warm_group``) each add their part to one folder (``copy_part``), as Ray
Train merges its workers' folders into one checkpoint.

Every read and write here is retried through a passing outage of an object store (``sweeps.storage_retry``): the
files keep their names when written again, so a retried copy leaves the same folder.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import tempfile
from pathlib import Path
from typing import Any, Iterator

import pyarrow.fs as pafs

from sweeps import fingerprint
from sweeps.storage_retry import retried
from sweeps.store import filesystem, is_object_store
from trainable.checkpointing import TRIAL_FILE
from trainable.config import TrialConfig

# bytes per read of a checkpoint file copied to or from storage: pyarrow reads an object store's file with one
# ranged GET per read (its default, 1 MiB, made 17,000 requests of a 1B trial's ~17 GB checkpoint)
COPY_CHUNK_BYTES = 64 << 20


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
    for record in retried(f"read {name}'s checkpoints", lambda: _records(fs, run)):
        changed = fingerprint.differences(record["config"], trial.to_dict())
        if record["world_size"] != workers:
            changed["workers"] = (record["world_size"], workers)
        if changed:
            retried(f"delete {name}'s checkpoints", lambda: fs.delete_dir(run))
            return fingerprint.describe(changed)
    return None


def _checkpoint_folders(fs: pafs.FileSystem, run: str) -> list[str]:
    """The run's complete checkpoint folders (with a ``trial.json``), oldest first."""
    folders = [info.path for info in fs.get_file_info(pafs.FileSelector(run, allow_not_found=True))
               if info.type == pafs.FileType.Directory and info.base_name.startswith("checkpoint_")]
    return sorted(f for f in folders if fs.get_file_info(f"{f}/{TRIAL_FILE}").type == pafs.FileType.File)


def new_folder(storage_path: str, name: str) -> str:
    """The path (in the storage's filesystem) of a new checkpoint folder of the trial's run ``name``:
    ``checkpoint_<UTC time>``, the naming of Ray Train's; nothing is created."""
    _, base = filesystem(storage_path)
    return f"{base}/{name}/checkpoint_{dt.datetime.now(dt.timezone.utc):%Y-%m-%d_%H-%M-%S.%f}"


def copy_part(storage_path: str, directory: Path, target: str) -> None:
    """Copy a local folder's files into the stored checkpoint folder ``target`` (``new_folder``), ``trial.json``
    last: one rank's part of a checkpoint, as every rank of a trial adds its own to the same folder."""
    fs, _ = filesystem(storage_path)
    local = pafs.LocalFileSystem()
    files = sorted((p for p in directory.rglob("*") if p.is_file()), key=lambda p: p.name == TRIAL_FILE)
    for path in files:
        destination = f"{target}/{path.relative_to(directory).as_posix()}"

        def copy() -> None:
            if not is_object_store(fs):
                fs.create_dir(destination.rsplit("/", 1)[0], recursive=True)
            pafs.copy_files(str(path), destination, source_filesystem=local, destination_filesystem=fs,
                            chunk_size=COPY_CHUNK_BYTES)

        retried(f"write {destination.rsplit('/', 3)[-3]}/.../{path.name}", copy)


def persist(storage_path: str, name: str, directory: Path, keep: int, target: str | None = None) -> str:
    """Copy a local checkpoint folder into the trial's run ``name`` as ``target`` (default: a ``new_folder``, which
    other ranks may have written their parts into already), ``trial.json`` last: a folder without it is incomplete
    and never resumed; then delete all but the newest ``keep`` complete ones and any incomplete leftover. Returns
    the stored folder."""
    fs, base = filesystem(storage_path)
    run = f"{base}/{name}"
    target = target or new_folder(storage_path, name)
    copy_part(storage_path, directory, target)

    def prune() -> None:
        complete = _checkpoint_folders(fs, run)
        for info in fs.get_file_info(pafs.FileSelector(run, allow_not_found=True)):
            stale = info.path in complete[:-keep] or (info.path not in complete and info.path != target)
            if info.type == pafs.FileType.Directory and info.base_name.startswith("checkpoint_") and stale:
                fs.delete_dir(info.path)

    retried(f"prune {name}'s checkpoints", prune)
    return target


@contextlib.contextmanager
def latest(storage_path: str, name: str) -> Iterator[Path | None]:
    """The run's newest complete checkpoint as a local folder (a download of a remote one, removed on exit), or
    None when it has none."""
    fs, base = filesystem(storage_path)
    folders = retried(f"list {name}'s checkpoints", lambda: _checkpoint_folders(fs, f"{base}/{name}"))
    if not folders:
        yield None
    elif isinstance(fs, pafs.LocalFileSystem):
        yield Path(folders[-1])
    else:
        with tempfile.TemporaryDirectory(prefix="calsweep-resume-") as local:
            retried(f"read {name}'s checkpoint",
                    lambda: pafs.copy_files(folders[-1], local, source_filesystem=fs, chunk_size=COPY_CHUNK_BYTES))
            yield Path(local)
