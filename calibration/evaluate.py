"""Score a causal LM on multiple-choice tasks and measure its calibration; the trainable calls ``evaluate_model``.

    python -m calibration.evaluate --model smollm2-135m --tasks mmlu,arc_easy,hellaswag --limit 20 --out results/eval

writes ``records.parquet`` (one row per question, both the reported and the held-out split), ``summary.json``
and ``reliability_<task>.png``; ``python -m calibration.rescore DIR`` recomputes any metric from them.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import pyarrow as pa

from calibration.bootstrap import Interval
from calibration.records import SCHEMA, SCHEMA_VERSION, build_records
from calibration.scoring import score_prompts
from calibration.summary import fit_temperatures, summarize
from calibration.task_config import TaskConfig, load_prompts, resolve_task, with_split

DEFAULT_TASKS = ("mmlu", "arc_easy", "hellaswag")


@dataclass
class EvalResult:
    """``summary[task][metric]`` on each task's reported split, and ``records`` (one row per question)."""

    summary: dict[str, dict[str, float]]
    records: pa.Table
    intervals: dict[str, dict[str, Interval]] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)


def evaluate_model(model: Any, tokenizer: Any, tasks: Sequence[str | TaskConfig] = DEFAULT_TASKS, *,
                   data_dir: str | Path | None = None, limit: int | None = None, batch_size: int = 8,
                   progress: bool = True, heldout: bool = False, n_bins: int = 15, n_boot: int = 0,
                   share_prefix: bool = True) -> EvalResult:
    """Score ``tasks`` (the first ``limit`` questions of each) and summarise accuracy and calibration.

    The model is put in eval mode and restored afterwards. With ``heldout=True`` each task's ``fit_split`` is
    scored too (same ``limit``), a temperature is fitted on it and the ``*_ts`` metrics are reported.
    ``n_boot > 0`` adds percentile-bootstrap intervals.
    """
    configs = [resolve_task(t) for t in tasks]
    names = [c.name for c in configs]
    if len(set(names)) != len(names) or not names:
        raise ValueError(f"expected distinct task names, got {names}")
    tables, split_of, fit_split_of = [], {}, {}
    for config in configs:
        split_of[config.name] = config.split
        splits = [config]
        if heldout and config.fit_split is not None:
            fit_split_of[config.name] = config.fit_split
            splits.append(with_split(config, config.fit_split))
        for part in splits:
            questions, prompts = load_prompts(part, data_dir=data_dir, limit=limit)
            loglik = score_prompts(model, tokenizer, prompts, batch_size=batch_size, share_prefix=share_prefix,
                                   progress=progress, desc=f"{part.name}/{part.split}")
            tables.append(build_records(part.name, part.split, questions, prompts, loglik))
    records = pa.concat_tables(tables).cast(SCHEMA)
    temperatures = fit_temperatures(records, fit_split_of=fit_split_of) if fit_split_of else None
    summary, intervals = summarize(records, split_of=split_of, n_bins=n_bins, temperatures=temperatures,
                                   n_boot=n_boot)
    run_config = {"tasks": [c.__dict__ for c in configs], "limit": limit, "batch_size": batch_size,
                  "heldout": heldout, "n_bins": n_bins, "share_prefix": share_prefix,
                  "schema_version": SCHEMA_VERSION, "git_revision": git_revision()}
    return EvalResult(summary, records, intervals, run_config)


def git_revision() -> str:
    """The checkout's commit (with ``+dirty`` for uncommitted changes), or ``unknown`` outside git."""
    here = Path(__file__).parent
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True,
                                check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "."], cwd=here, capture_output=True,
                               text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return commit + ("+dirty" if dirty else "")
