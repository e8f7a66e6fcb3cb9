"""Per-task metric summaries of a records table, at temperature 1 and (optionally) a fitted temperature.

``task_metrics`` is the single definition of what a summary holds; both CLIs and ``evaluate_model`` use it.
The choice distribution comes from ``loglik`` (or ``loglik_norm`` with ``score="loglik_norm"``);
``accuracy_norm`` is always lm-eval's ``acc_norm`` (argmax of ``loglik_norm``), and ``ece_norm``, ``rms_ce_norm``
and ``mean_confidence_norm`` are always those of softmax(``loglik_norm``).
"""

from __future__ import annotations

from typing import Iterable

import numpy as np
import pyarrow as pa

from calibration import metrics
from calibration.bootstrap import Interval, bootstrap_many
from calibration.probabilities import choice_probs, top_label
from calibration.records import ats_split, task_arrays
from calibration.temperature import fit_temperature

SCORES = ("loglik", "loglik_norm")
# task_metrics entries that temperature scaling and ATS change: each has a *_ts and a *_ats twin
SCALED = ("accuracy", "ece", "rms_ce", "mce", "ace", "sce", "brier", "nll", "mean_confidence")
# task_metrics entries that temperature scaling leaves alone (no *_ts twin)
NOT_SCALED = ("accuracy_norm", "ece_norm", "rms_ce_norm", "mean_confidence_norm", "n_questions")
# every metric a task's summary can hold (T: the fitted temperature): the one list that the store's columns, the
# sweep config's objectives and the trial row builder read; a metric is added here and in task_metrics
TASK_METRICS = (SCALED + NOT_SCALED + ("temperature",) + tuple(f"{m}_ts" for m in SCALED)
                + tuple(f"{m}_ats" for m in SCALED))


def metric_columns(tasks: Iterable[str]) -> tuple[str, ...]:
    """``<task>_<metric>`` of each task and each of ``TASK_METRICS``: what a trial reports and the store keeps."""
    return tuple(f"{task}_{metric}" for task in tasks for metric in TASK_METRICS)


def flat_metrics(summary: dict[str, dict[str, float]]) -> dict[str, float]:
    """``{task: {metric: value}}`` as ``{<task>_<metric>: value}``; a metric outside ``TASK_METRICS`` is a ValueError
    (the store has no column for it)."""
    unknown = sorted({name for metrics in summary.values() for name in metrics} - set(TASK_METRICS))
    if unknown:
        raise ValueError(f"expected task metrics in calibration.summary.TASK_METRICS, got unknown {unknown}")
    return {f"{task}_{name}": float(value) for task, metrics in summary.items() for name, value in metrics.items()}


def task_metrics(loglik: np.ndarray, loglik_norm: np.ndarray, gold: np.ndarray, *, n_bins: int = 15,
                 temperature: float = 1.0) -> dict[str, float]:
    """accuracy, ece, rms_ce, mce, ace, sce, brier, nll, mean_confidence, n_questions of p = softmax(loglik / T);
    accuracy_norm, ece_norm, rms_ce_norm, mean_confidence_norm of the length-normalised p' = softmax(loglik_norm)
    (lm-eval's acc_norm distribution; where summed log-likelihoods of long continuations saturate p, as on
    HellaSwag, p' is the calibration read that still says something)."""
    probs = choice_probs(loglik, temperature)
    confidence, correct = top_label(probs, gold)
    confidence_norm, correct_norm = top_label(choice_probs(loglik_norm), gold)
    return {
        "accuracy": metrics.accuracy(correct),
        "accuracy_norm": metrics.accuracy(correct_norm),
        "ece": metrics.expected_calibration_error(confidence, correct, n_bins),
        "rms_ce": metrics.rms_calibration_error(confidence, correct, n_bins),
        "mce": metrics.max_calibration_error(confidence, correct, n_bins),
        "ace": metrics.adaptive_calibration_error(confidence, correct, n_bins),
        "sce": metrics.static_calibration_error(probs, gold, n_bins),
        "brier": metrics.brier_score(probs, gold),
        "nll": metrics.negative_log_likelihood(probs, gold),
        "mean_confidence": float(np.mean(confidence)),
        "ece_norm": metrics.expected_calibration_error(confidence_norm, correct_norm, n_bins),
        "rms_ce_norm": metrics.rms_calibration_error(confidence_norm, correct_norm, n_bins),
        "mean_confidence_norm": float(np.mean(confidence_norm)),
        "n_questions": float(len(gold)),
    }


def summarize(records: pa.Table, *, split_of: dict[str, str], n_bins: int = 15, score: str = "loglik",
              temperatures: dict[str, float] | None = None, n_boot: int = 0, seed: int = 0
              ) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, Interval]]]:
    """``({task: metrics}, {task: bootstrap intervals})`` for each task on its reported split.

    With ``temperatures[task]`` the metrics are also reported after scaling, with the suffix ``_ts``, and
    ``temperature`` holds T. Intervals are computed only with ``n_boot > 0``.
    """
    if score not in SCORES:
        raise ValueError(f"expected score in {SCORES}, got {score!r}")
    summary, intervals = {}, {}
    for task, split in split_of.items():
        arrays = task_arrays(records, task, split)
        scored = arrays[score]

        def statistics(ll: np.ndarray, norm: np.ndarray, gold: np.ndarray, task: str = task) -> dict[str, float]:
            out = task_metrics(ll, norm, gold, n_bins=n_bins)
            if temperatures and task in temperatures:
                scaled = task_metrics(ll, norm, gold, n_bins=n_bins, temperature=temperatures[task])
                out |= {f"{name}_ts": value for name, value in scaled.items()
                        if name not in NOT_SCALED}
            return out

        summary[task] = statistics(scored, arrays["loglik_norm"], arrays["gold"])
        if temperatures and task in temperatures:
            summary[task]["temperature"] = temperatures[task]
        if n_boot > 0:
            intervals[task] = bootstrap_many(statistics, scored, arrays["loglik_norm"], arrays["gold"],
                                             n_boot=n_boot, seed=seed)
    return summary, intervals


def ats_metrics(records: pa.Table, *, split_of: dict[str, str], n_bins: int = 15,
                score: str = "loglik") -> dict[str, dict[str, float]]:
    """``{task: {metric_ats: value}}`` of each task's ATS-scored rows (split ``ats_split(split)``), for the metrics
    temperature scaling also reports (``NOT_SCALED`` left out); tasks without such rows are absent."""
    out = {}
    present = set(zip(records["task"].to_pylist(), records["split"].to_pylist()))
    for task, split in split_of.items():
        if (task, ats_split(split)) in present:
            arrays = task_arrays(records, task, ats_split(split))
            scaled = task_metrics(arrays[score], arrays["loglik_norm"], arrays["gold"], n_bins=n_bins)
            out[task] = {f"{name}_ats": value for name, value in scaled.items() if name not in NOT_SCALED}
    return out


def fit_temperatures(records: pa.Table, *, fit_split_of: dict[str, str], score: str = "loglik") -> dict[str, float]:
    """T per task, fitted on the records of its held-out split."""
    fitted = {}
    for task, split in fit_split_of.items():
        arrays = task_arrays(records, task, split)
        fitted[task] = fit_temperature(arrays[score], arrays["gold"])
    return fitted
