"""Question-level ECE of Table 1's cells with bootstrap intervals, and each beta's paired difference to beta = 0.

A cell's questions are those its trials scored on the task's reported split. With R trials (seeds) a cell is
an (N, R) matrix over the N questions every one of them scored, and its ECE is the mean over its R trials of
each trial's ECE, ECE = (1/R) sum_r ECE(c_.r, a_.r): Table 1's mean (with R = 1, the trial's stored ECE).
Intervals come from ``calibration.bootstrap.seed_question_bootstrap``: each resample draws R of the cell's trials
with replacement, then N of the questions, so they carry seed-to-seed variance too; with R = 1 they are over
questions only (``n_seeds`` says which). The paired difference Delta = ECE(beta) - ECE(0) draws each cell's
trials on its own and the questions both cells scored once for both, so question difficulty shared by the two
cancels out of its interval.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from calibration.bootstrap import seed_question_bootstrap
from calibration.metrics import expected_calibration_error
from calibration.task_config import TASKS

CellKey = tuple[str, str, float, str]  # (sft_dataset, family, beta, task)
INTERVAL_COLUMNS = ["sft_dataset", "family", "task", "label_smoothing", "ece", "low", "high", "n_questions",
                    "n_trials", "n_seeds"]
PAIRED_COLUMNS = ["sft_dataset", "family", "task", "label_smoothing", "ece_beta", "ece_beta0", "delta_ece", "low",
                  "high", "n_questions", "n_seeds", "n_seeds_beta0"]


@dataclass(frozen=True)
class CellQuestions:
    question_ids: pd.Index  # (N,), sorted
    confidence: np.ndarray  # (N, R)
    correct: np.ndarray  # (N, R), 0/1
    n_seeds: int  # distinct seeds among the R trials (a missing seed counts as one)


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
                seeds = rows.drop_duplicates("trial")["seed"].nunique(dropna=False)
                cells[(row.sft_dataset, row.family, row.label_smoothing, task)] = CellQuestions(
                    confidence.index, confidence.to_numpy(np.float64), correct.to_numpy(np.float64), seeds)
    return cells


def mean_ece(confidence: np.ndarray, correct: np.ndarray, n_bins: int) -> float:
    """(1/R) sum_r ECE(confidence[:, r], correct[:, r]) of (N, R) arrays: the mean of the trials' ECEs."""
    return float(np.mean([expected_calibration_error(confidence[:, r], correct[:, r], n_bins)
                          for r in range(confidence.shape[1])]))


def _in_order(cells: dict[CellKey, CellQuestions]) -> list[tuple[CellKey, CellQuestions]]:
    """By dataset, family, task in the registry's order (the paper's for its tasks), beta."""
    order = list(TASKS)
    return sorted(cells.items(), key=lambda item: (*item[0][:2], order.index(item[0][3]), item[0][2]))


def ece_intervals(cells: dict[CellKey, CellQuestions], n_bins: int, n_boot: int, seed: int) -> pd.DataFrame:
    """INTERVAL_COLUMNS per cell: its question-level ECE with a percentile interval over seeds and questions."""
    rows = []
    for (dataset, family, beta, task), cell in _in_order(cells):
        interval = seed_question_bootstrap(lambda arrays: mean_ece(*arrays, n_bins), (cell.confidence, cell.correct),
                                           n_boot=n_boot, seed=seed)
        rows.append([dataset, family, task, beta, interval.estimate, interval.low, interval.high,
                     len(cell.question_ids), cell.confidence.shape[1], cell.n_seeds])
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
        smoothed = (cell.confidence[at], cell.correct[at])
        unsmoothed = (base.confidence[at_base], base.correct[at_base])
        interval = seed_question_bootstrap(lambda a, b: mean_ece(*a, n_bins) - mean_ece(*b, n_bins), smoothed,
                                           unsmoothed, n_boot=n_boot, seed=seed)
        rows.append([dataset, family, task, beta, mean_ece(*smoothed, n_bins), mean_ece(*unsmoothed, n_bins),
                     interval.estimate, interval.low, interval.high, len(shared), cell.n_seeds, base.n_seeds])
    return pd.DataFrame(rows, columns=PAIRED_COLUMNS)
