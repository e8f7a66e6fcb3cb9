"""Post-hoc temperature scaling (TS) beside label smoothing (LS), as the paper's Section 4 discusses.

Per family and task, four read-outs: none (beta = 0), LS (beta > 0), TS (beta = 0 after TS) and LS + TS (beta > 0
after TS), each at its Table 1 lr. A trial's temperature T for a task is, in this order:

- stored: its ``{task}_temperature`` column (trials run with ``eval.temperature_scaling``: T fitted on the task's
  held-out split, on summed log-likelihoods, so used under ``--score loglik`` only), with its ``{task}_ece_ts``;
- fitted: ``calibration.temperature.fit_temperature`` on the trial's stored held-out questions, under the
  analysis' score, the ECE after TS then computed from its reported questions;
- unavailable: no held-out split was scored (HellaSwag has none; trials without TS stored none); n/a in the
  tables.

The scaled confidence of a reported question is max_k softmax(l_i / T)_k (T > 0 keeps the argmax, so accuracy
does not move). TS intervals come from the same seed-and-question bootstrap as the others, with each trial's T
held fixed (the fit's own noise is not in them).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from calibration.metrics import expected_calibration_error
from calibration.probabilities import choice_probs, pad, top_label
from calibration.temperature import fit_temperature
from sweeps.analysis.load import Results

TEMPERATURE_COLUMNS = ["trial", "task", "temperature", "ece_ts", "source"]
LS_TS_COLUMNS = ["sft_dataset", "family", "task", "label_smoothing", "learning_rate", "n_trials", "n_seeds", "ece",
                 "ece_low", "ece_high", "ece_ts", "ece_ts_low", "ece_ts_high", "temperature", "ts_trials",
                 "ts_source"]


def scaled_questions(results: Results) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(TEMPERATURE_COLUMNS per trial and task, the reported questions with confidence and correct after TS)."""
    heldout = dict(iter(results.heldout.groupby(["trial", "task"])))
    reported = dict(iter(results.questions.groupby(["trial", "task"])))
    rows, scaled = [], []
    for trial in results.trials.to_dict("records"):
        for task in results.tasks:
            key = (trial["trial"], task)
            temperature, ece_ts, source = trial[f"{task}_temperature"], trial[f"{task}_ece_ts"], "stored"
            if results.score != "loglik" or pd.isna(temperature):
                temperature, ece_ts, source = np.nan, np.nan, "unavailable"
                if key in heldout:
                    fit = heldout[key]
                    temperature, source = fit_temperature(pad(fit["scores"].tolist()), fit["gold"].to_numpy()), "fitted"
            if source != "unavailable" and key in reported:
                questions = reported[key].copy()
                confidence, correct = top_label(choice_probs(pad(questions["scores"].tolist()), temperature),
                                                questions["gold"].to_numpy())
                questions["confidence"], questions["correct"] = confidence, correct
                scaled.append(questions)
                if pd.isna(ece_ts):
                    ece_ts = expected_calibration_error(confidence, correct, results.n_bins)
            rows.append([*key, temperature, ece_ts, source])
    frame = pd.DataFrame(rows, columns=TEMPERATURE_COLUMNS)
    return frame, pd.concat(scaled, ignore_index=True) if scaled else results.questions.iloc[:0]


def cell_trials(by_trial: pd.DataFrame, row: dict, task: str, column: str, notes: list[str], method: str,
                absent: str) -> tuple[tuple, pd.DataFrame]:
    """(cell key, the rows of ``by_trial`` (indexed by trial and task) of the Table 1 ``row``'s trials on ``task``
    that have ``column``); a note when only some of the cell's trials have it."""
    cell = (row["sft_dataset"], row["family"], row["label_smoothing"], task)
    scaled = by_trial.reindex([(t, task) for t in row["trials"].split(";")])
    done = scaled[scaled[column].notna()]
    if 0 < len(done) < len(scaled):
        notes.append(f"{'/'.join(map(str, cell))}: ECE after {method} is the mean of {len(done)} of the cell's "
                     f"{len(scaled)} trials ({absent})")
    return cell, done


def ls_ts_table(table: pd.DataFrame, temperatures: pd.DataFrame, intervals: pd.DataFrame,
                ts_intervals: pd.DataFrame, tasks: tuple[str, ...], notes: list[str]) -> pd.DataFrame:
    """LS_TS_COLUMNS per Table 1 row and task: ECE and ECE after TS (means over the cell's trials that have it),
    their intervals where questions are stored (``questions.INTERVAL_COLUMNS`` frames), the mean T."""
    by_trial = temperatures.set_index(["trial", "task"])
    found = {name: frame.set_index(["sft_dataset", "family", "label_smoothing", "task"])
             for name, frame in (("ece", intervals), ("ece_ts", ts_intervals))}
    rows = []
    for row in table.to_dict("records"):
        for task in tasks:
            cell, done = cell_trials(by_trial, row, task, "ece_ts", notes, "TS", "the others have no temperature")
            bounds = [found[name].at[cell, side] if cell in found[name].index else np.nan
                      for name in ("ece", "ece_ts") for side in ("low", "high")]
            rows.append([row["sft_dataset"], row["family"], task, row["label_smoothing"], row["learning_rate"],
                         row["n_trials"], row["n_seeds"], row[f"{task}_ece"], *bounds[:2], done["ece_ts"].mean(),
                         *bounds[2:], done["temperature"].mean(), len(done),
                         "+".join(sorted(set(done["source"]))) or "unavailable"])
    return pd.DataFrame(rows, columns=LS_TS_COLUMNS)


def describe_sources(temperatures: pd.DataFrame, score: str) -> str:
    """One line for the notes: how many trial-tasks have a stored, a fitted or no (unavailable) temperature."""
    counts = temperatures.groupby(["task", "source"]).size()
    listed = "; ".join(f"{task}: " + ", ".join(f"{n} {source}" for source, n in group.droplevel(0).items())
                       for task, group in counts.groupby(level=0))
    stored = ("stored T and ECE after TS (fitted on the held-out split's summed log-likelihoods) where trials have "
              "them, else " if score == "loglik" else "stored temperatures unused (fitted on summed "
              "log-likelihoods); ")
    return (f"temperature scaling: {stored}T fitted here on stored held-out questions, else unavailable (trial-tasks: "
            f"{listed or 'none'})")
