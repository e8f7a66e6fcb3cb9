"""Adaptive temperature scaling (ATS, ``eval.ats``) beside LS and TS: two more read-outs per family and task, ATS
(beta = 0 scored with its ATS head) and LS + ATS (beta > 0 with its own head), each at its Table 1 lr.

A trial's ECE after ATS for a task comes, in this order, from its stored ATS questions (split ``<split>+ats``,
under the analysis' score; these also give the intervals), else from its ``{task}_ece_ats`` column (under
``--score loglik`` only), else it is unavailable: trials run without ``eval.ats`` and stores written before it.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from calibration.metrics import expected_calibration_error
from sweeps.analysis.load import Results
from sweeps.analysis.temperature import cell_trials

ATS_COLUMNS = ["trial", "task", "ece_ats", "ats_source"]
ADDED_COLUMNS = ["ece_ats", "ece_ats_low", "ece_ats_high", "ats_trials"]


def ats_trials(results: Results) -> pd.DataFrame:
    """ATS_COLUMNS per trial and task: the ECE after ATS and where it came from (questions, stored, unavailable)."""
    scored = dict(iter(results.ats.groupby(["trial", "task"])))
    rows = []
    for trial in results.trials.to_dict("records"):
        for task in results.tasks:
            key = (trial["trial"], task)
            stored = trial.get(f"{task}_ece_ats", np.nan)
            if key in scored:
                questions = scored[key]
                rows.append([*key, expected_calibration_error(questions["confidence"].to_numpy(float),
                                                              questions["correct"].to_numpy(float), results.n_bins),
                             "questions"])
            elif results.score == "loglik" and not pd.isna(stored):
                rows.append([*key, float(stored), "stored"])
            else:
                rows.append([*key, np.nan, "unavailable"])
    return pd.DataFrame(rows, columns=ATS_COLUMNS)


def with_ats(ls_ts: pd.DataFrame, table: pd.DataFrame, by_trial: pd.DataFrame, intervals: pd.DataFrame,
             tasks: tuple[str, ...], notes: list[str]) -> pd.DataFrame:
    """``ls_ts`` (``temperature.ls_ts_table``) with ADDED_COLUMNS: the mean ECE after ATS over the cell's trials that
    have one, its interval where ATS questions are stored (a ``questions.INTERVAL_COLUMNS`` frame) and how many
    trials it averages."""
    by_trial = by_trial.set_index(["trial", "task"])
    found = intervals.set_index(["sft_dataset", "family", "label_smoothing", "task"])
    added = []
    for row in table.to_dict("records"):
        for task in tasks:
            cell, done = cell_trials(by_trial, row, task, "ece_ats", notes, "ATS", "the others ran without eval.ats")
            bounds = [found.at[cell, side] if cell in found.index else np.nan for side in ("low", "high")]
            added.append([done["ece_ats"].mean(), *bounds, len(done)])
    return pd.concat([ls_ts.reset_index(drop=True), pd.DataFrame(added, columns=ADDED_COLUMNS)], axis=1)


def describe_ats(by_trial: pd.DataFrame) -> str:
    """One line for the notes: how many trial-tasks have an ECE after ATS, and from where."""
    counts = by_trial.groupby(["task", "ats_source"]).size()
    listed = "; ".join(f"{task}: " + ", ".join(f"{n} {source}" for source, n in group.droplevel(0).items())
                       for task, group in counts.groupby(level=0))
    return (f"adaptive temperature scaling: ECE after ATS from stored ATS questions, else the trial's {{task}}_ece_ats "
            f"(under --score loglik), else unavailable (trial-tasks: {listed or 'none'})")
