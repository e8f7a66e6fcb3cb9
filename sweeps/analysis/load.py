"""Read the results store into pandas: the ok trials that pass ``--filter``, their reported-split questions,
(where temperature scaling scored one) their held-out-split questions and (where ATS scored them,
``eval.ats``) their reported-split questions with ATS (split ``<split>+ats``; none in older stores).

A trial is the pair (run_name, trial_id), written ``run/trial`` in the ``trial`` column of both frames.
Failed and early-stopped trials are left out and counted in the notes, so a store of an interrupted sweep
is read like a finished one.

``score`` picks the choice distribution everything is read through: "loglik" (softmax of summed
log-likelihoods, what trials report as accuracy / ece / rms_ce) or "loglik_norm" (softmax of length-normalised
ones, lm-eval's acc_norm; the trial columns *_norm and the questions' loglik_norm). Under "loglik_norm" the
trial frame's accuracy / ece / rms_ce columns hold the *_norm values, so every table and figure follows.
A question's ``scores`` are its choices' log-likelihoods under ``score``.

The trial frame always has the entropy-floor columns (``calibration.entropy.statistics.STATS``); they are null in
rows written before trials measured them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pandas as pd

from calibration.entropy.statistics import STATS as ENTROPY_STATS
from calibration.metrics import expected_calibration_error, rms_calibration_error
from calibration.probabilities import choice_probs, pad, top_label
from calibration.records import ats_split
from calibration.summary import SCORES
from calibration.task_config import TASKS as TASK_CONFIGS
from sweeps import store

FILTER_COLUMNS = {"run": "run_name", "dataset": "sft_dataset", "family": "family", "task": None}
QUESTION_COLUMNS = ["trial", "seed", "task", "question_id", "gold", "scores", "confidence", "correct"]
DEFAULT_N_BINS = 15  # EvalConfig.n_bins when a row has no config_json
SCORED_METRICS = ("accuracy", "ece", "rms_ce")  # the trial columns that have a length-normalised twin *_norm
SCORE_NAMES = {"loglik": "softmax over the choices' summed log-likelihoods",
               "loglik_norm": "softmax over the choices' length-normalised log-likelihoods (lm-eval's acc_norm)"}

LISTED = 10  # trials named in the note on left-out trials; the rest are counted


@dataclass
class Results:
    trials: pd.DataFrame  # one row per ok trial (store.trial_schema() columns + ``trial``)
    questions: pd.DataFrame  # QUESTION_COLUMNS, each task's reported split only
    heldout: pd.DataFrame  # QUESTION_COLUMNS, each task's held-out (temperature-fitting) split
    tasks: tuple[str, ...]  # in the registry's order (calibration.task_config.TASKS), the tables' order
    n_bins: int  # the sweep's eval.n_bins, for ECE recomputed from questions
    notes: list[str] = field(default_factory=list)  # what was left out and why
    score: str = "loglik"  # the choice distribution of every metric (SCORES)
    ats: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=QUESTION_COLUMNS))  # reported split, ATS


def parse_filter(text: str | None) -> dict[str, set[str]]:
    """``"family=a,family=b,dataset=alpaca"`` -> ``{"family": {"a", "b"}, "dataset": {"alpaca"}}`` (OR within a key)."""
    filters: dict[str, set[str]] = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        key, sep, value = (part.strip() for part in item.partition("="))
        if not sep or key not in FILTER_COLUMNS or not value:
            raise ValueError(f"expected KEY=VALUE with KEY in {sorted(FILTER_COLUMNS)}, got {item.strip()!r}")
        if key == "task" and value not in TASK_CONFIGS:
            raise ValueError(f"expected a task in {list(TASK_CONFIGS)}, got {value!r}")
        filters.setdefault(key, set()).add(value)
    return filters


def load_results(root: str, filters: dict[str, set[str]] | None = None, score: str = "loglik") -> Results:
    """The analysable part of the store at ``root`` read through ``score``; an empty selection is an error,
    anything partial a note."""
    if score not in SCORES:
        raise ValueError(f"expected a score in {list(SCORES)}, got {score!r}")
    filters = filters or {}
    trials = store.read_trials(root).to_pandas()
    if trials.empty:
        raise ValueError(f"expected trial rows under {root}/trials, got none")
    versions = sorted(set(trials["schema_version"]))
    if versions != [store.SCHEMA_VERSION]:
        raise ValueError(f"expected store schema version {store.SCHEMA_VERSION}, got {versions} in {root}")
    trials["trial"] = trials["run_name"] + "/" + trials["trial_id"]
    trials["sft_dataset"] = trials["sft_dataset"].fillna("unknown")
    for name in ENTROPY_STATS:  # absent from the store's schema until trials measure them
        if name not in trials:
            trials[name] = float("nan")
    notes: list[str] = []
    for key, values in filters.items():
        if FILTER_COLUMNS[key] is None:
            continue
        unmatched = values - set(trials[FILTER_COLUMNS[key]])
        if unmatched:
            notes.append(f"filter {key}={'|'.join(sorted(unmatched))} matched no trial")
        trials = trials[trials[FILTER_COLUMNS[key]].isin(values)]
    not_ok = trials[trials["status"] != "ok"]
    if len(not_ok):
        listed = ", ".join(f"{t} ({s})" for t, s in zip(not_ok["trial"][:LISTED], not_ok["status"][:LISTED]))
        more = f" and {len(not_ok) - LISTED} more" if len(not_ok) > LISTED else ""
        counts = ", ".join(f"{n} {status}" for status, n in not_ok["status"].value_counts().sort_index().items())
        notes.append(f"left out {len(not_ok)} trial(s) that did not finish ok ({counts}): {listed}{more}")
    trials = trials[trials["status"] == "ok"].reset_index(drop=True)
    if trials.empty:
        raise ValueError(f"expected ok trials matching {filters or 'the store'}, got none ({len(not_ok)} not ok)")
    tasks = tuple(t for t in TASK_CONFIGS if t in filters.get("task", TASK_CONFIGS)
                  and trials[f"{t}_accuracy"].notna().any())
    if not tasks:
        raise ValueError(f"expected scored tasks among {list(TASK_CONFIGS)}, got none in the selected trials")
    questions, heldout, ats = _questions(root, trials, tasks, notes, score)
    n_bins = _n_bins(trials)
    if score == "loglik_norm":
        trials = _length_normalised(trials, questions, tasks, n_bins, notes)
    return Results(trials, questions, heldout, tasks, n_bins, notes, score, ats)


def _length_normalised(trials: pd.DataFrame, questions: pd.DataFrame, tasks: tuple[str, ...], n_bins: int,
                       notes: list[str]) -> pd.DataFrame:
    """The trials with accuracy / ece / rms_ce of each task replaced by their *_norm columns; rows written before
    the store had ece_norm / rms_ce_norm get them from their stored questions (``questions``: already under the
    length-normalised distribution), or stay empty (noted)."""
    trials = trials.copy()
    by_trial_task = dict(iter(questions.groupby(["trial", "task"])))
    for task in tasks:
        for metric in SCORED_METRICS:
            trials[f"{task}_{metric}"] = trials[f"{task}_{metric}_norm"]
        filled, unscored = [], []
        for index in trials.index[trials[f"{task}_accuracy"].notna() & trials[f"{task}_ece"].isna()]:
            trial = trials.at[index, "trial"]
            rows = by_trial_task.get((trial, task))
            if rows is None:
                unscored.append(trial)
                continue
            confidence, correct = rows["confidence"].to_numpy(float), rows["correct"].to_numpy(float)
            trials.at[index, f"{task}_ece"] = expected_calibration_error(confidence, correct, n_bins)
            trials.at[index, f"{task}_rms_ce"] = rms_calibration_error(confidence, correct, n_bins)
            filled.append(trial)
        if filled:
            notes.append(f"{task}: length-normalised ECE and RMS of {len(filled)} trial(s) computed from their stored "
                         f"questions (their rows predate those columns): {', '.join(filled)}")
        if unscored:
            notes.append(f"{task}: no length-normalised ECE for {len(unscored)} trial(s) (rows written before the "
                         f"store had it, and no stored questions): {', '.join(unscored)}")
    return trials


def _questions(root: str, trials: pd.DataFrame, tasks: tuple[str, ...], notes: list[str],
               score: str) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """QUESTION_COLUMNS of the trials' reported and held-out splits and of the reported split with ATS;
    confidence and correct recomputed under ``score``."""
    columns = ["run_name", "trial_id", "task", "split", "question_id", "gold", score, "confidence", "correct"]
    questions = store.read_questions(root).select(columns).to_pandas().rename(columns={score: "scores"})
    if score != "loglik" and len(questions):
        confidence, correct = top_label(choice_probs(pad(questions["scores"].tolist())), questions["gold"].to_numpy())
        questions["confidence"], questions["correct"] = confidence, correct
    questions["trial"] = questions["run_name"] + "/" + questions["trial_id"]
    questions = questions.merge(trials[["trial", "seed"]], on="trial", how="inner")
    reported = questions["task"].map({t: TASK_CONFIGS[t].split for t in tasks})
    fitting = questions["task"].map({t: TASK_CONFIGS[t].fit_split for t in tasks})
    missing = sorted(set(trials["trial"]) - set(questions["trial"][questions["split"] == reported]))
    if missing:
        notes.append(f"no stored questions for {len(missing)} trial(s), left out of the question-level figures "
                     f"and intervals: {', '.join(missing)}")
    return tuple(questions[questions["split"] == split][QUESTION_COLUMNS].reset_index(drop=True)
                 for split in (reported, fitting, reported.map(ats_split, na_action="ignore")))


def _n_bins(trials: pd.DataFrame) -> int:
    found = {json.loads(c).get("eval", {}).get("n_bins", DEFAULT_N_BINS) if isinstance(c, str) else DEFAULT_N_BINS
             for c in trials["config_json"]}
    if len(found) != 1:
        raise ValueError(f"expected one eval.n_bins across the selected trials, got {sorted(found)}")
    return int(found.pop())
