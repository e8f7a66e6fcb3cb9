"""Percentile-bootstrap confidence intervals for any metric of per-question arrays.

Resample the N questions with replacement B times (rows of every array together), recompute the statistic
theta*_b, and report [q_{(1-level)/2}, q_{(1+level)/2}] of {theta*_b} around the full-sample estimate theta.
``seed_question_bootstrap`` also resamples the seeds (columns of (N, R) arrays), so the interval counts
seed-to-seed variance as well as question-to-question variance.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np


@dataclass(frozen=True)
class Interval:
    estimate: float
    low: float
    high: float


def bootstrap_ci(statistic: Callable[..., float], *arrays: np.ndarray, n_boot: int = 1000, level: float = 0.95,
                 seed: int = 0) -> Interval:
    """``statistic(*arrays)`` with its percentile-bootstrap interval; arrays are resampled along axis 0 together."""
    return bootstrap_many(lambda *a: {"value": statistic(*a)}, *arrays, n_boot=n_boot, level=level,
                          seed=seed)["value"]


def bootstrap_many(statistics: Callable[..., dict[str, float]], *arrays: np.ndarray, n_boot: int = 1000,
                   level: float = 0.95, seed: int = 0) -> dict[str, Interval]:
    """Like ``bootstrap_ci`` for a function returning several named statistics, from the same resamples."""
    _check(n_boot, level)
    arrays = tuple(np.asarray(a) for a in arrays)
    n = len(arrays[0])
    if n == 0 or any(len(a) != n for a in arrays):
        raise ValueError(f"expected non-empty arrays of one length, got lengths {[len(a) for a in arrays]}")
    estimate = statistics(*arrays)
    rng = np.random.default_rng(seed)
    draws: dict[str, list[float]] = {name: [] for name in estimate}
    for _ in range(n_boot):
        index = rng.integers(0, n, size=n)
        for name, value in statistics(*(a[index] for a in arrays)).items():
            draws[name].append(value)
    return {name: _interval(estimate[name], draws[name], level) for name in estimate}


def seed_question_bootstrap(statistic: Callable[..., float], *cells: Sequence[np.ndarray], n_boot: int = 1000,
                            level: float = 0.95, seed: int = 0) -> Interval:
    """``statistic(*cells)`` with a percentile interval over resampled seeds and questions.

    Each cell is a tuple of (N, R_c) arrays: rows are the N questions, shared by every cell; columns the cell's
    R_c seeds (trials). A resample draws N rows with replacement, the same rows in every cell (questions are
    crossed with seeds and shared across cells, so a difference of two cells stays paired), and R_c columns
    with replacement in each cell independently, and evaluates ``statistic`` on the resampled (N, R_c) arrays.
    Rows come from the generator ``bootstrap_ci`` uses, so with R_c = 1 (or identical columns) the interval is
    exactly ``bootstrap_ci``'s questions-only one. With few seeds the seed part is coarse (R_c = 2 draws the
    same seed twice half the time) and tends to be narrow.
    """
    _check(n_boot, level)
    cells = tuple(tuple(np.asarray(a) for a in cell) for cell in cells)
    shapes = [[a.shape for a in cell] for cell in cells]
    n = cells[0][0].shape[0] if cells and cells[0] else 0
    if n == 0 or any(len(set(cell)) != 1 or len(cell[0]) != 2 or cell[0][0] != n or cell[0][1] == 0
                     for cell in shapes):
        raise ValueError(f"expected cells of (N, R) arrays with one N > 0 in all and one R > 0 per cell, got "
                         f"shapes {shapes}")
    estimate = statistic(*cells)
    rows_rng, seeds_rng = np.random.default_rng(seed), np.random.default_rng([seed, 1])
    draws = []
    for _ in range(n_boot):
        rows = rows_rng.integers(0, n, size=n)
        columns = [seeds_rng.integers(0, cell[0].shape[1], size=cell[0].shape[1]) for cell in cells]
        draws.append(statistic(*(tuple(a[rows][:, cols] for a in cell) for cell, cols in zip(cells, columns))))
    return _interval(estimate, draws, level)


def _check(n_boot: int, level: float) -> None:
    if n_boot < 1 or not 0 < level < 1:
        raise ValueError(f"expected n_boot >= 1 and 0 < level < 1, got n_boot={n_boot}, level={level}")


def _interval(estimate: float, draws: Sequence[float], level: float) -> Interval:
    """[q_{(1-level)/2}, q_{(1+level)/2}] of the draws around the estimate."""
    tails = [(1 - level) / 2 * 100, (1 + level) / 2 * 100]
    return Interval(float(estimate), *map(float, np.percentile(draws, tails)))
