"""Compare two results stores of the same sweep, run at two commits: every column of every trial row, the per-question
records, and the analysis outputs (``python sweeps/analyze.py``'s files, run separately into <store>/analysis).

    python docs/measurements/2026-11-26-structure/compare_rows.py BEFORE_STORE AFTER_STORE OUT.json

Columns that measure time, place or the code's revision differ by nature and are listed, not compared; columns only
one side has are listed with the other side's values.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
from pathlib import Path

import pyarrow.parquet as pq

NOT_COMPARED = {"started_at", "finished_at", "wall_load_s", "wall_train_s", "wall_eval_s", "wall_total_s",
                "wall_warmup_s", "tokens_per_s", "tokens_per_s_steady", "hostname", "git_rev", "mfu",
                "compile_fx_hits", "compile_fx_misses", "compile_autograd_hits", "compile_autograd_misses"}


def rows(root: Path) -> dict[str, dict]:
    table = pq.ParquetDataset(root / "trials").read()
    return {r["trial_id"]: r for r in table.to_pylist()}


def same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main(before: Path, after: Path, out: Path) -> None:
    old, new = rows(before), rows(after)
    report: dict = {"trials_before": sorted(old), "trials_after": sorted(new), "trials": {}}
    for trial in sorted(set(old) & set(new)):
        a, b = old[trial], new[trial]
        shared = sorted(set(a) & set(b))
        compared = [c for c in shared if c not in NOT_COMPARED]
        report["trials"][trial] = {
            "columns_compared": len(compared),
            "differing": {c: [a[c], b[c]] for c in compared if not same(a[c], b[c])},
            "not_compared": {c: [str(a[c]), str(b[c])] for c in shared if c in NOT_COMPARED},
            "only_after": {c: b[c] for c in sorted(set(b) - set(a))},
            "only_before": {c: a[c] for c in sorted(set(a) - set(b))},
        }
    questions = {}
    for path in sorted((before / "questions").glob("*.parquet")):
        other = after / "questions" / path.name
        questions[path.name] = other.is_file() and pq.read_table(path).equals(pq.read_table(other))
    report["questions_identical"] = questions
    analysis = {}
    for path in sorted((before / "analysis").rglob("*")) if (before / "analysis").is_dir() else ():
        if path.is_file():
            other = after / "analysis" / path.relative_to(before / "analysis")
            analysis[str(path.relative_to(before / "analysis"))] = other.is_file() and digest(path) == digest(other)
    report["analysis_files_identical"] = analysis
    out.write_text(json.dumps(report, indent=1, default=str) + "\n")
    differing = {t: list(r["differing"]) for t, r in report["trials"].items() if r["differing"]}
    print(json.dumps({"trials": len(report["trials"]), "differing": differing,
                      "questions_identical": all(questions.values()) if questions else None,
                      "analysis_differs": [k for k, v in analysis.items() if not v]}, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]))
