"""Question-level ECE of Table 1's cells with bootstrap intervals, and each beta's paired difference to beta = 0.

A cell's questions are those its trials scored on the task's reported split. With R trials (seeds) a cell is
an (N, R) matrix over the N questions every one of them scored, and its ECE is that of all N R (confidence,
correct) pairs (with R = 1, the trial's stored ECE). Intervals resample the N questions (rows) with
``calibration.bootstrap``. The paired difference Delta = ECE(beta) - ECE(0) resamples the questions both cells
scored, the same rows for both, so question difficulty shared by the two cancels out of its interval.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from calibration.bootstrap import bootstrap_ci
from calibration.metrics import expected_calibration_error
from sweeps.analysis.load import PAPER_TASKS

CellKey = tuple[str, str, float, str]  # (sft_dataset, family, beta, task)
INTERVAL_COLUMNS = ["sft_dataset", "family", "task", "label_smoothing", "ece", "low", "high", "n_questions",
                    "n_trials"]
PAIRED_COLUMNS = ["sft_dataset", "family", "task", "label_smoothing", "ece_beta", "ece_beta0", "delta_ece", "low",
                  "high", "n_questions"]


@dataclass(frozen=True)
class CellQuestions:
    question_ids: pd.Index  # (N,), sorted
    confidence: np.ndarray  # (N, R)
    correct: np.ndarray  # (N, R), 0/1


def cell_questions(table: pd.DataFrame, questions: pd.DataFrame, tasks: tuple[str, ...]
                   ) -> dict[CellKey, CellQuestions]:
    """The question matrix of every (Table 1 row, task) with stored questions."""
    cells = {}
    by_task = {task: rows for task, rows in questions.groupby("task")}
    for row in table.itertuples():
        for task in tasks:
            rows = by_task.get(task, questions.iloc[:0])
            rows = rows[rows["trial"].isin(row.trials.split(";"))]
            if rows.empty:
                continue
            repeated = rows.duplicated(["trial", "question_id"])
            if repeated.any():
                raise ValueError(f"expected one {task} row per question and trial, got repeated question ids in "
                                 f"{sorted(set(rows['trial'][repeated]))}")
            confidence = rows.pivot(index="question_id", columns="trial", values="confidence").dropna()
            correct = rows.pivot(index="question_id", columns="trial", values="correct").loc[confidence.index]
            if len(confidence):
                cells[(row.sft_dataset, row.family, row.label_smoothing, task)] = CellQuestions(
                    confidence.index, confidence.to_numpy(np.float64), correct.to_numpy(np.float64))
    return cells


def _in_order(cells: dict[CellKey, CellQuestions]) -> list[tuple[CellKey, CellQuestions]]:
    """By dataset, family, task in the paper's order, beta."""
    return sorted(cells.items(), key=lambda item: (*item[0][:2], PAPER_TASKS.index(item[0][3]), item[0][2]))


def ece_intervals(cells: dict[CellKey, CellQuestions], n_bins: int, n_boot: int, seed: int) -> pd.DataFrame:
    """INTERVAL_COLUMNS per cell: its question-level ECE with a percentile-bootstrap interval over questions."""
    rows = []
    for (dataset, family, beta, task), cell in _in_order(cells):
        interval = bootstrap_ci(lambda conf, corr: expected_calibration_error(conf.ravel(), corr.ravel(), n_bins),
                                cell.confidence, cell.correct, n_boot=n_boot, seed=seed)
        rows.append([dataset, family, task, beta, interval.estimate, interval.low, interval.high,
                     len(cell.question_ids), cell.confidence.shape[1]])
    return pd.DataFrame(rows, columns=INTERVAL_COLUMNS)


def paired_differences(cells: dict[CellKey, CellQuestions], n_bins: int, n_boot: int, seed: int,
                       notes: list[str]) -> pd.DataFrame:
    """PAIRED_COLUMNS per cell with beta > 0 whose beta = 0 cell shares questions with it."""
    rows = []
    for (dataset, family, beta, task), cell in _in_order(cells):
        base = cells.get((dataset, family, 0.0, task))
        if beta == 0.0 or base is None:
            continue
        shared = cell.question_ids.intersection(base.question_ids)
        if shared.empty:
            notes.append(f"{dataset}/{family}/{task}: beta = {beta:g} and beta = 0 share no question; no paired "
                         f"difference")
            continue
        at, at_base = cell.question_ids.get_indexer(shared), base.question_ids.get_indexer(shared)

        def delta(conf: np.ndarray, corr: np.ndarray, conf0: np.ndarray, corr0: np.ndarray) -> float:
            return (expected_calibration_error(conf.ravel(), corr.ravel(), n_bins)
                    - expected_calibration_error(conf0.ravel(), corr0.ravel(), n_bins))

        arrays = (cell.confidence[at], cell.correct[at], base.confidence[at_base], base.correct[at_base])
        interval = bootstrap_ci(delta, *arrays, n_boot=n_boot, seed=seed)
        ece_beta, ece_base = (expected_calibration_error(conf.ravel(), corr.ravel(), n_bins)
                              for conf, corr in (arrays[:2], arrays[2:]))
        rows.append([dataset, family, task, beta, ece_beta, ece_base, interval.estimate, interval.low,
                     interval.high, len(shared)])
    return pd.DataFrame(rows, columns=PAIRED_COLUMNS)
