"""The results store: two Parquet datasets under one root (a local path or any pyarrow.fs URI, e.g. s3://).

    <root>/trials/<run>__<trial_id>.parquet      one row per trial (trial_schema())
    <root>/questions/<run>__<trial_id>.parquet   one row per scored question (QUESTION_SCHEMA)
    <root>/models/<run>__<trial_id>/             the trained model as a Hugging Face folder (train.save_model)

A trial's files are named by its deterministic id, so a retry or a resumed sweep replaces them and the
store keeps exactly one row per trial, and one trial's row is read from its own file. On a local or NFS disk each
file is written under a hidden temporary name and then moved into place (a rename), so a killed writer never leaves
a half file where readers look; readers skip hidden files. An object store (S3, GCS) publishes an object whole when
its upload completes, so a file is written straight to its key there (a "move" would be a copy and a delete). Reads
and writes are retried through a passing outage of the store (``sweeps.storage_retry``). Both tables are plain
Parquet, readable by pandas and DuckDB.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import urllib.parse
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute  # noqa: F401 - pa.compute
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from calibration import records as calibration_records
from sweeps.storage_retry import retried, transient
from calibration import summary
from calibration.task_config import TASKS
from trainable.result import ENTROPY_STATS as ENTROPY_COLUMNS, column_types

SCHEMA_VERSION = 1

_ARROW_TYPES = {int: pa.int64(), float: pa.float64(), str: pa.string(), bool: pa.bool_()}

_IDENTITY_FIELDS: list[pa.Field] = [  # who ran what, with which config and code
    pa.field("schema_version", pa.int32()),
    pa.field("run_name", pa.string()),
    pa.field("trial_id", pa.string()),
    pa.field("status", pa.string()),  # ok | failed | stopped (early-stopped by the scheduler)
    pa.field("error", pa.string()),
    pa.field("family", pa.string()),
    pa.field("sft_dataset", pa.string()),
    pa.field("learning_rate", pa.float64()),
    pa.field("label_smoothing", pa.float64()),
    pa.field("seed", pa.int64()),
    pa.field("config_json", pa.string()),
    pa.field("started_at", pa.timestamp("us", tz="UTC")),
    pa.field("finished_at", pa.timestamp("us", tz="UTC")),
    # when the process that ran the trial's driver started: its Tune actor's (a reused actor's before an earlier trial)
    pa.field("actor_started_at", pa.timestamp("us", tz="UTC")),
    pa.field("package_versions", pa.string()),  # JSON object: package -> version
    pa.field("git_rev", pa.string()),
    pa.field("hostname", pa.string()),
]


def result_fields() -> list[pa.Field]:
    """A column per scalar field of ``trainable.result.TrialResult`` (its documentation says what each holds)."""
    return [pa.field(name, _ARROW_TYPES[kind]) for name, kind in column_types().items()]


def metric_columns() -> tuple[str, ...]:
    """``<task>_<metric>`` of every registered task (``calibration.task_config.TASKS``) and metric
    (``calibration.summary.TASK_METRICS``). Columns of a task or metric added after schema version 1 was first
    written (the *_norm and *_ats metrics, arc_easy_lettered) read as null in older files."""
    return summary.metric_columns(TASKS)


def trial_schema() -> pa.Schema:
    """One row per trial: its identity and config, its ``TrialResult`` (``result_fields``, then the metric columns
    ``metric_columns`` and the eq. 14 floor's inputs). Built from the registries when called, so a task registered
    at run time has its columns. Columns added after schema version 1 was first written read as null in older
    files."""
    fields = _IDENTITY_FIELDS + result_fields() + [pa.field(name, pa.float64())
                                                   for name in metric_columns() + ENTROPY_COLUMNS]
    return pa.schema(fields, metadata={"calsweep_schema_version": str(SCHEMA_VERSION)})


QUESTION_SCHEMA = pa.schema([
    pa.field("schema_version", pa.int32()),
    pa.field("run_name", pa.string()),
    pa.field("trial_id", pa.string()),
    *calibration_records.SCHEMA,  # task, split, question_id, subject, gold, n_choices, loglik, ..., correct
], metadata={"calsweep_schema_version": str(SCHEMA_VERSION)})


def filesystem(root: str) -> tuple[pafs.FileSystem, str]:
    """The pyarrow filesystem of a local path or URI, and the path on it."""
    if "://" in root:
        return pafs.FileSystem.from_uri(root)
    return pafs.LocalFileSystem(), os.path.abspath(os.path.expanduser(root))


OBJECT_STORES = ("s3", "gcs")  # pyarrow filesystems whose objects appear whole when their upload completes


def is_object_store(fs: pafs.FileSystem) -> bool:
    """Whether ``fs`` is an object store: no directories to create, no rename (a move is a copy and a delete)."""
    return fs.type_name in OBJECT_STORES


class StoreWriteError(OSError):
    """A file of the store could not be written; the message names the store's folder and why, not the hidden
    temporary file the write went through."""


def write_file(fs: pafs.FileSystem, path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` whole or not at all: on an object store straight to its key, elsewhere under a
    hidden temporary name in the same folder, then moved into place (removed again on a failure)."""
    directory = path.rsplit("/", 1)[0]
    if is_object_store(fs):
        with fs.open_output_stream(path) as sink:
            sink.write(data)
        return
    temporary = f"{directory}/.{path.rsplit('/', 1)[1]}.{uuid.uuid4().hex}.tmp"
    try:
        fs.create_dir(directory, recursive=True)
        with fs.open_output_stream(temporary) as sink:
            sink.write(data)
        fs.move(temporary, path)
    except OSError:
        with contextlib.suppress(OSError):
            fs.delete_file(temporary)
        raise


def _atomic_write(table: pa.Table, root: str, table_name: str, file_stem: str) -> str:
    """Write ``table`` to <root>/<table_name>/<file_stem>.parquet whole (``write_file``), retried through an
    outage; a failure is a ``StoreWriteError``."""
    fs, base = filesystem(root)
    directory = f"{base}/{table_name}"
    final = f"{directory}/{file_stem}.parquet"
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    data = sink.getvalue().to_pybytes()
    try:
        retried(f"write {table_name}/{file_stem}.parquet", lambda: write_file(fs, final, data))
    except OSError as exc:
        reason = os.strerror(exc.errno) if exc.errno else " ".join(str(exc).split())[:200]
        raise StoreWriteError(f"results store {directory}: could not write {file_stem}.parquet "
                              f"({reason}); expected a writable folder") from exc
    return final


def file_stem(run_name: str, trial_id: str) -> str:
    return f"{run_name}__{trial_id}"


def write_trial(root: str, row: dict[str, Any]) -> str:
    """Write one trial row (missing columns become null; unknown keys are an error)."""
    schema = trial_schema()
    unknown = sorted(set(row) - set(schema.names))
    if unknown:
        raise ValueError(f"expected trial columns from trial_schema(), got unknown {unknown}")
    full = {name: [row.get(name)] for name in schema.names}
    full["schema_version"] = [SCHEMA_VERSION]
    table = pa.Table.from_pydict(full, schema=schema)
    return _atomic_write(table, root, "trials", file_stem(row["run_name"], row["trial_id"]))


def write_model(root: str, run_name: str, trial_id: str, local_dir: str | Path) -> str:
    """Copy a local folder (the trained model) to <root>/models/<run>__<trial_id>/, replacing an older one (retried
    through an outage): on a disk copied under a hidden name, then moved into place; on an object store (no rename)
    the older one is deleted and the files are uploaded to their keys. Returns the final path (or URI)."""
    fs, base = filesystem(root)
    stem = file_stem(run_name, trial_id)
    directory = f"{base}/models"
    final, source = f"{directory}/{stem}", str(Path(local_dir).resolve())

    def copy() -> None:
        if is_object_store(fs):
            _remove_model(fs, final)
            pafs.copy_files(source, final, source_filesystem=pafs.LocalFileSystem(), destination_filesystem=fs)
            return
        temporary = f"{directory}/.{stem}.{uuid.uuid4().hex}.tmp"
        fs.create_dir(temporary, recursive=True)
        pafs.copy_files(source, temporary, source_filesystem=pafs.LocalFileSystem(), destination_filesystem=fs)
        _remove_model(fs, final)
        fs.move(temporary, final)

    retried(f"write models/{stem}", copy)
    return final if "://" not in root else f"{root.rstrip('/')}/models/{stem}"


def _remove_model(fs: pafs.FileSystem, path: str) -> None:
    if fs.get_file_info(path).type != pafs.FileType.NotFound:
        fs.delete_dir(path)


def write_questions(root: str, run_name: str, trial_id: str, records: pa.Table) -> str:
    """Write a trial's per-question records (``calibration.records.SCHEMA``) keyed by run and trial."""
    n = records.num_rows
    columns = {"schema_version": pa.array([SCHEMA_VERSION] * n, pa.int32()),
               "run_name": pa.array([run_name] * n, pa.string()),
               "trial_id": pa.array([trial_id] * n, pa.string())}
    arrays = [columns[f.name] if f.name in columns else records.column(f.name).cast(f.type)
              for f in QUESTION_SCHEMA]
    table = pa.Table.from_arrays(arrays, schema=QUESTION_SCHEMA)
    return _atomic_write(table, root, "questions", file_stem(run_name, trial_id))


class DamagedFileError(ValueError):
    """A file of the store cannot be read as Parquet (e.g. a disk or copy damaged it); the message names it."""


def _read(root: str, table_name: str, schema: pa.Schema, run_name: str | None,
          columns: list[str] | None = None) -> pa.Table:
    fs, base = filesystem(root)
    directory = f"{base}/{table_name}"

    def read() -> pa.Table:
        if fs.get_file_info(directory).type == pafs.FileType.NotFound:
            return schema.empty_table() if columns is None else schema.empty_table().select(columns)
        dataset = ds.dataset(directory, format="parquet", filesystem=fs, schema=schema,
                             ignore_prefixes=[".", "_"])
        try:
            return dataset.to_table(columns=columns,
                                    filter=(ds.field("run_name") == run_name) if run_name else None)
        except (OSError, pa.ArrowException) as exc:
            if transient(exc):  # the store, not a file: tried again
                raise
            raise _damaged(dataset, fs, exc) from None

    return retried(f"read {table_name}", read)


def _damaged(dataset: ds.FileSystemDataset, fs: pafs.FileSystem, exc: BaseException) -> BaseException:
    """The ``DamagedFileError`` naming the first of ``dataset``'s files that does not read on its own, else ``exc``
    (the failure was not one file's)."""
    for path in dataset.files:
        try:
            pq.read_table(path, filesystem=fs)
        except (OSError, pa.ArrowException) as error:
            return _damaged_file(path, error)
    return exc


def _damaged_file(path: str, error: BaseException) -> DamagedFileError:
    return DamagedFileError(f"{path}: damaged Parquet file, it cannot be read ({' '.join(str(error).split())[:200]}); "
                            f"expected a whole file: move it out of the store (`--resume` re-runs its trial) or "
                            f"restore it from a copy")


def read_trials(root: str, run_name: str | None = None) -> pa.Table:
    """All trial rows under ``root`` (optionally of one run)."""
    return _read(root, "trials", trial_schema(), run_name)


def read_questions(root: str, run_name: str | None = None) -> pa.Table:
    """All per-question rows under ``root`` (optionally of one run)."""
    return _read(root, "questions", QUESTION_SCHEMA, run_name)


def trial_statuses(root: str, run_name: str) -> dict[str, str]:
    """trial_id -> status (ok | failed | stopped) of the run's stored trials (two columns of every file read)."""
    table = _read(root, "trials", trial_schema(), run_name, columns=["trial_id", "status"])
    return dict(zip(table.column("trial_id").to_pylist(), table.column("status").to_pylist()))


def stored_trial(root: str, run_name: str, trial_id: str) -> dict[str, Any] | None:
    """The stored row of one trial (its own file, ``file_stem``: no listing, no other trial's file), or None."""
    fs, base = filesystem(root)
    path = f"{base}/trials/{file_stem(run_name, trial_id)}.parquet"

    def read() -> list[dict[str, Any]]:
        if fs.get_file_info(path).type != pafs.FileType.File:
            return []
        try:  # columns added after the file was written read as null
            return ds.dataset([path], format="parquet", filesystem=fs, schema=trial_schema()).to_table().to_pylist()
        except FileNotFoundError:  # removed since
            return []
        except (OSError, pa.ArrowException) as exc:
            if isinstance(exc, OSError) and transient(exc):
                raise
            raise _damaged_file(path, exc) from None

    rows = retried(f"read trials/{file_stem(run_name, trial_id)}.parquet", read)
    return rows[0] if rows else None


def remove_trial(root: str, run_name: str, trial_id: str) -> None:
    """Delete a trial's row, per-question file and saved model (each file a single atomic delete; absent files are
    fine), retried through an outage."""
    fs, base = filesystem(root)
    stem = file_stem(run_name, trial_id)

    def remove() -> None:
        for table_name in ("trials", "questions"):
            path = f"{base}/{table_name}/{stem}.parquet"
            if fs.get_file_info(path).type != pafs.FileType.NotFound:
                fs.delete_file(path)
        _remove_model(fs, f"{base}/models/{stem}")

    retried(f"remove {stem}", remove)


def writable_problem(root: str) -> str | None:
    """Why the store cannot be written at ``root`` (one line), or None. A local root that does not exist yet is
    checked at its nearest existing parent, so checking creates nothing."""
    if "://" not in root:
        path = Path(os.path.abspath(os.path.expanduser(root)))
        if path.exists() and not path.is_dir():
            return f"results_dir: {root!r} is a file; expected a directory (or a path to create) for the store"
        existing = next(parent for parent in (path, *path.parents) if parent.exists())
        if not existing.is_dir():
            return f"results_dir: {root!r} lies under the file {str(existing)!r}; expected a directory path"
        try:
            with tempfile.TemporaryFile(dir=existing):
                pass
        except OSError as exc:
            return f"results_dir: {root!r} is not writable ({exc.strerror or exc} in {str(existing)!r})"
        return None
    if urllib.parse.urlsplit(root).query:  # the store and Ray join folder names onto the URI: a query would split it
        return (f"results_dir: {root!r} has a query; expected a plain URI such as s3://bucket/prefix, with the "
                f"endpoint in AWS_ENDPOINT_URL (and the options in the AWS_* variables)")
    try:
        fs, base = filesystem(root)
        probe = f"{base}/.calsweep-write-check-{uuid.uuid4().hex}"
        with fs.open_output_stream(probe) as sink:
            sink.write(b"ok")
        fs.delete_file(probe)
    except Exception as exc:  # noqa: BLE001 - any storage failure is the one line
        return _remote_problem(root, " ".join(str(exc).split()))
    return None


_REFUSED_CREDENTIALS = ("INVALID_ACCESS_KEY_ID", "SIGNATURE_DOES_NOT_MATCH", "ACCESS_DENIED", "EXPIRED_TOKEN",
                        "InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "HTTP status 403")


def _remote_problem(root: str, error: str) -> str:
    """The one line for a remote store that could not be written: an unreachable endpoint, a missing bucket, refused
    credentials, else the storage's own words."""
    where = urllib.parse.urlsplit(root)
    endpoint = os.environ.get("AWS_ENDPOINT_URL") or "the default endpoint"
    if "NETWORK_CONNECTION" in error or "Could not connect" in error or "Couldn't connect" in error:
        return (f"results_dir: {root!r}: the object store at {endpoint} cannot be reached; expected a reachable "
                f"endpoint (AWS_ENDPOINT_URL; unset for AWS itself)")
    if "NO_SUCH_BUCKET" in error or "NoSuchBucket" in error:
        return (f"results_dir: {root!r}: bucket {where.netloc!r} does not exist at {endpoint}; expected an existing "
                f"bucket (create it, e.g. `aws s3 mb s3://{where.netloc}`)")
    refused = next((code for code in _REFUSED_CREDENTIALS if code in error), None)
    if refused:
        return (f"results_dir: {root!r}: the object store at {endpoint} refused this machine's credentials "
                f"({refused}); expected keys allowed to write the bucket (AWS_ACCESS_KEY_ID and "
                f"AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or the node's instance profile)")
    return f"results_dir: {root!r} is not writable ({error[:200]})"


def config_json(config: dict[str, Any]) -> str:
    """The trial config as canonical JSON (sorted keys) for the ``config_json`` column."""
    return json.dumps(config, sort_keys=True, default=str)


def trial_writers() -> Any:
    """This store's writers as a trial's workers take them (``trainable.worker.TrialWriters``)."""
    from trainable.worker import TrialWriters

    return TrialWriters(write_questions=write_questions, write_model=write_model)
