"""lm-evaluation-harness per-sample logs as a records table, so any multiple-choice task it has gets our metrics.

``lm_eval ... --output_path OUT --log_samples`` writes ``OUT/<model>/samples_<task>_<date>.jsonl``, one JSON line per
document and filter: ``doc_id``, ``doc``, ``target`` (the gold choice: an index, or the choice's text),
``arguments`` (one request per choice: context and target delimiter + choice), ``filtered_resps`` (one
``[loglik, is_greedy]`` per choice, as strings) and the per-sample metrics (``acc``, ``acc_norm``). A task's records
take ``loglik`` from ``filtered_resps`` and divide by the choice's character length (as lm-eval's ``acc_norm``)
for ``loglik_norm``; their split is ``lm_eval`` (the file does not name it).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pyarrow as pa

from calibration.records import SCHEMA, records_table

SAMPLES = re.compile(r"^samples_(?P<task>.+)_(?P<date>\d{4}-\d{2}-\d{2}T[\d.:-]+)\.jsonl$")
SPLIT = "lm_eval"
TARGET_DELIMITER = " "  # lm-eval's default between context and choice


def samples_files(source: Path) -> list[Path]:
    """``source`` itself if it is a samples file, else the samples files in the folder ``source``, sorted."""
    if source.is_file():
        return [source] if SAMPLES.match(source.name) else []
    return sorted(p for p in source.glob("samples_*.jsonl") if SAMPLES.match(p.name))


def read_samples(paths: list[Path]) -> tuple[pa.Table, dict[str, Any]]:
    """The records of every task in ``paths`` (one file per task) and evaluate-style metadata, with lm-eval's own
    accuracy per task (``lm_eval_acc``, ``lm_eval_acc_norm``: the mean of its per-sample values) for comparison."""
    tables, lm_eval = [], {}
    for path in paths:
        task = SAMPLES.match(path.name)["task"]
        lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        samples = _one_filter(lines, path)
        loglik = [_loglik(s, path) for s in samples]
        gold = [_gold(s, path) for s in samples]
        tables.append(records_table(task, SPLIT, [str(s["doc_id"]) for s in samples],
                                    [str(s["doc"].get("subject", "")) if isinstance(s["doc"], dict) else ""
                                     for s in samples], gold, loglik,
                                    [[len(c) for c in _choices(s, path)] for s in samples]))
        lm_eval[task] = {metric: sum(float(s[metric]) for s in samples) / len(samples)
                         for metric in ("acc", "acc_norm") if all(metric in s for s in samples)}
    model = paths[0].parent.name if paths else ""
    return pa.concat_tables(tables).cast(SCHEMA), {"report_splits": {task: SPLIT for task in lm_eval},
                                                   "fit_splits": {}, "model": model, "lm_eval": lm_eval}


def _one_filter(lines: list[dict[str, Any]], path: Path) -> list[dict[str, Any]]:
    """The samples of one filter (lm-eval logs each document once per filter): 'none' when there are several."""
    filters = sorted({line.get("filter", "none") for line in lines})
    if not lines:
        raise ValueError(f"{str(path)!r}: expected lm-eval samples, one JSON object per line, got an empty file")
    chosen = "none" if "none" in filters else filters[0]
    if len(filters) > 1 and chosen != "none":
        raise ValueError(f"{str(path)!r}: expected one filter or 'none' among the samples' filters, got {filters}")
    return sorted((line for line in lines if line.get("filter", "none") == chosen), key=lambda s: s["doc_id"])


def _loglik(sample: dict[str, Any], path: Path) -> list[float]:
    responses = sample.get("filtered_resps")
    try:
        return [float(response[0]) for response in responses]
    except (TypeError, ValueError, IndexError):
        raise ValueError(f"{str(path)!r} doc {sample.get('doc_id')}: expected a multiple-choice task's samples "
                         f"(filtered_resps: one [loglik, is_greedy] per choice), got {str(responses)[:80]!r}") from None


def _choices(sample: dict[str, Any], path: Path) -> list[str]:
    """The choices' texts from the requests' continuations (the target delimiter removed)."""
    arguments = sample.get("arguments")
    requests = list(arguments.values()) if isinstance(arguments, dict) else arguments or []
    continuations = [r.get("arg_1") if isinstance(r, dict) else r[1] if isinstance(r, list) and len(r) > 1 else None
                     for r in requests]
    if len(continuations) != len(sample.get("filtered_resps") or []) or not all(isinstance(c, str)
                                                                                for c in continuations):
        raise ValueError(f"{str(path)!r} doc {sample.get('doc_id')}: expected one (context, continuation) request "
                         f"per choice in 'arguments', got {str(arguments)[:80]!r}")
    return [c.removeprefix(TARGET_DELIMITER) for c in continuations]


def _gold(sample: dict[str, Any], path: Path) -> int:
    """The gold choice's index: ``target`` as an index, or the text of one of the choices."""
    target, choices = sample.get("target"), _choices(sample, path)
    if isinstance(target, str) and target.strip().isdigit():
        target = int(target)
    if isinstance(target, int) and not isinstance(target, bool) and 0 <= target < len(choices):
        return target
    if isinstance(target, str) and target.strip() in [c.strip() for c in choices]:
        return [c.strip() for c in choices].index(target.strip())
    raise ValueError(f"{str(path)!r} doc {sample.get('doc_id')}: expected target to be a choice index in "
                     f"[0, {len(choices)}) or one of the choices' texts, got {target!r}")
