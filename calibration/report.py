"""What both CLIs write and print: summary JSON, reliability diagrams and a plain-text metrics table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa

from calibration.bootstrap import Interval
from calibration.probabilities import choice_probs, top_label
from calibration.records import task_arrays
from calibration.reliability import reliability_diagram
from calibration.summary import NOT_SCALED

TABLE_METRICS = ("accuracy", "accuracy_norm", "ece", "ece_norm", "rms_ce", "mce", "ace", "sce", "brier", "nll")


def write_summary(path: str | Path, summary: dict[str, dict[str, float]], intervals: dict[str, dict[str, Interval]],
                  settings: dict[str, Any]) -> Path:
    """JSON: ``settings`` (run config, binning, temperatures...), ``summary`` and ``intervals`` [low, high]."""
    payload = {**settings, "summary": summary,
               "intervals": {task: {name: [i.low, i.high] for name, i in by_name.items()}
                             for task, by_name in intervals.items()}}
    path = Path(path)
    path.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")
    return path


def write_diagrams(out_dir: str | Path, records: pa.Table, *, split_of: dict[str, str], n_bins: int,
                   score: str = "loglik", temperatures: dict[str, float] | None = None,
                   label: str = "") -> list[Path]:
    """``reliability_<task>.png`` per task (and ``reliability_<task>_ts.png`` after temperature scaling)."""
    paths = []
    for task, split in split_of.items():
        arrays = task_arrays(records, task, split)
        variants = {"": 1.0}
        if temperatures and task in temperatures:
            variants["_ts"] = temperatures[task]
        for suffix, temperature in variants.items():
            confidence, correct = top_label(choice_probs(arrays[score], temperature), arrays["gold"])
            title = f"{label} {task}/{split}" + (f" T={temperature:.2f}" if suffix else "")
            paths.append(reliability_diagram(confidence, correct, Path(out_dir) / f"reliability_{task}{suffix}.png",
                                             n_bins=n_bins, title=title.strip()))
    return paths


def format_table(summary: dict[str, dict[str, float]], intervals: dict[str, dict[str, Interval]]) -> str:
    """One line per task (and per task after temperature scaling), metrics in percent, intervals in brackets."""
    lines = [f"{'task':<24}{'n':>7} " + " ".join(f"{m:>19}" for m in TABLE_METRICS)]
    for task, values in summary.items():
        for suffix in ("", "_ts"):
            if f"accuracy{suffix}" not in values:
                continue
            cells = []
            for metric in TABLE_METRICS:
                name = metric if metric in NOT_SCALED else metric + suffix
                scale = 1.0 if metric == "nll" else 100.0
                cell = f"{scale * values[name]:.2f}"
                if name in intervals.get(task, {}):
                    interval = intervals[task][name]
                    cell += f" [{scale * interval.low:.1f},{scale * interval.high:.1f}]"
                cells.append(f"{cell:>19}")
            label = task + (f" T={values['temperature']:.3f}" if suffix else "")
            lines.append(f"{label:<24}{int(values['n_questions']):>7} " + " ".join(cells))
    return "\n".join(lines)
