"""The per-question records table: its schema (defined here only), construction and Parquet round trip.

One row per scored question. ``loglik`` holds the summed log-likelihood of every choice, ``loglik_norm``
the same divided by the choice's character length (lm-eval's ``acc_norm``), so every metric, binning and
temperature can be recomputed later without the model. ``confidence``/``correct`` are at temperature 1.
Questions scored again with an ATS head (``calibration.ats``) are rows of their own whose split is the scored
split plus ``ATS_SUFFIX`` (``test+ats``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from calibration.probabilities import choice_probs, pad, top_label
from calibration.prompts import Prompt
from calibration.tasks import Question

SCHEMA_VERSION = 1
ATS_SUFFIX = "+ats"  # split of a question's row scored with ATS: ats_split("test") == "test+ats"
SCHEMA = pa.schema([
    ("task", pa.string()),
    ("split", pa.string()),
    ("question_id", pa.string()),
    ("subject", pa.string()),
    ("gold", pa.int32()),
    ("n_choices", pa.int32()),
    ("loglik", pa.list_(pa.float64())),
    ("loglik_norm", pa.list_(pa.float64())),
    ("confidence", pa.float64()),
    ("correct", pa.bool_()),
])


def ats_split(split: str) -> str:
    """The split name of ATS-scored rows of ``split``."""
    return split + ATS_SUFFIX


def build_records(task: str, split: str, questions: Sequence[Question], prompts: Sequence[Prompt],
                  loglik: Sequence[np.ndarray]) -> pa.Table:
    """The records of one task and split from its questions, prompts and scored log-likelihoods."""
    return records_table(task, split, [q.question_id for q in questions], [q.subject for q in questions],
                         [q.gold for q in questions], loglik, [p.choice_lengths for p in prompts])


def records_table(task: str, split: str, question_ids: Sequence[str], subjects: Sequence[str], gold: Sequence[int],
                  loglik: Sequence[Sequence[float]], choice_lengths: Sequence[Sequence[int]]) -> pa.Table:
    """The records of one task and split from per-question ids, subjects, gold indices, log-likelihoods per choice
    and the choices' character lengths (what ``loglik_norm`` divides by)."""
    norm = [np.asarray(ll, dtype=np.float64) / np.asarray(n, dtype=np.float64) for ll, n in zip(loglik, choice_lengths)]
    gold = np.array(gold, dtype=np.int64)
    confidence, correct = top_label(choice_probs(pad(loglik)), gold) if len(gold) else (np.zeros(0), np.zeros(0))
    return pa.table({
        "task": [task] * len(gold),
        "split": [split] * len(gold),
        "question_id": list(question_ids),
        "subject": list(subjects),
        "gold": gold.astype(np.int32),
        "n_choices": np.array([len(ll) for ll in loglik], dtype=np.int32),
        "loglik": [list(map(float, ll)) for ll in loglik],
        "loglik_norm": [list(map(float, ll)) for ll in norm],
        "confidence": np.asarray(confidence, dtype=np.float64),
        "correct": np.asarray(correct, dtype=bool),
    }, schema=SCHEMA)


def write_records(table: pa.Table, path: str | Path, metadata: dict[str, Any]) -> None:
    """Parquet with ``metadata`` (run config, git revision) and the schema version in the file's metadata."""
    meta = {b"calsweep.schema_version": str(SCHEMA_VERSION).encode(),
            b"calsweep.metadata": json.dumps(metadata, sort_keys=True).encode()}
    pq.write_table(table.replace_schema_metadata(meta), path)


def read_records(path: str | Path) -> tuple[pa.Table, dict[str, Any]]:
    """The records table and its metadata; a file of another schema version is an error."""
    table = pq.read_table(path)
    meta = table.schema.metadata or {}
    version = meta.get(b"calsweep.schema_version", b"?").decode()
    if version != str(SCHEMA_VERSION):
        raise ValueError(f"expected records schema version {SCHEMA_VERSION} in {path}, got {version}")
    return table.cast(SCHEMA), json.loads(meta.get(b"calsweep.metadata", b"{}"))


def read_store_questions(path: str | Path) -> tuple[pa.Table, dict[str, Any]]:
    """A sweep store's per-question file (``<results>/questions/<run>__<trial>.parquet``: these columns plus
    schema_version, run_name, trial_id) as a records table, with evaluate-style metadata: a trial scores tasks
    by name, so each task's report and held-out splits are its registered ``TaskConfig``'s."""
    from calibration.task_config import TASKS

    table = pq.read_table(path)
    missing = [name for name in SCHEMA.names if name not in table.column_names]
    if missing:
        raise ValueError(f"expected a per-question file with columns {SCHEMA.names} in {path}, missing {missing}")
    records = table.select(SCHEMA.names).cast(SCHEMA)
    present = set(zip(records["task"].to_pylist(), records["split"].to_pylist()))
    tasks = sorted({task for task, _ in present})
    report = {t: TASKS[t].split if t in TASKS else next(s for task, s in sorted(present) if task == t) for t in tasks}
    fit = {t: TASKS[t].fit_split for t in tasks if t in TASKS and (t, TASKS[t].fit_split) in present}
    trial = table["trial_id"][0].as_py() if "trial_id" in table.column_names and table.num_rows else ""
    return records, {"report_splits": report, "fit_splits": fit, "model": trial}


def task_arrays(table: pa.Table, task: str, split: str | None = None) -> dict[str, np.ndarray]:
    """NaN-padded ``loglik``/``loglik_norm`` (N, K) and ``gold`` (N,) of one task (and split) of a records table."""
    rows = [r for r in table.select(["task", "split", "gold", "loglik", "loglik_norm"]).to_pylist()
            if r["task"] == task and (split is None or r["split"] == split)]
    if not rows:
        raise ValueError(f"expected records of task {task!r}" + (f" split {split!r}" if split else "") + ", got none")
    return {"loglik": pad([r["loglik"] for r in rows]), "loglik_norm": pad([r["loglik_norm"] for r in rows]),
            "gold": np.array([r["gold"] for r in rows], dtype=np.int64)}
