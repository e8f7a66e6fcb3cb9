"""Percentile-bootstrap confidence intervals for any metric of per-question arrays.

Resample the N questions with replacement B times (rows of every array together), recompute the statistic
theta*_b, and report [q_{(1-level)/2}, q_{(1+level)/2}] of {theta*_b} around the full-sample estimate theta.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

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
    if n_boot < 1 or not 0 < level < 1:
        raise ValueError(f"expected n_boot >= 1 and 0 < level < 1, got n_boot={n_boot}, level={level}")
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
    tails = [(1 - level) / 2 * 100, (1 + level) / 2 * 100]
    return {name: Interval(float(estimate[name]), *map(float, np.percentile(draws[name], tails)))
            for name in estimate}
