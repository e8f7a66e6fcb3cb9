"""Temperature scaling (Guo et al., 2017) fitted on stored log-likelihoods of a held-out split.

With beta = 1/T and per-choice scores l_ik, the held-out NLL is
    L(beta) = (1/N) sum_i [ -beta l_{i,y_i} + log sum_k exp(beta l_ik) ],
convex in beta, with L'(beta) = (1/N) sum_i (E_{p_i}[l_i] - l_{i,y_i}) and L''(beta) = (1/N) sum_i Var_{p_i}[l_i],
where p_i = softmax(beta l_i). Newton's method on beta (with bisection safeguarding) finds the minimum.
"""

from __future__ import annotations

import numpy as np

from calibration.probabilities import choice_probs

BETA_BOUNDS = (1e-4, 1e4)  # T between 1e-4 and 1e4


def fit_temperature(loglik: np.ndarray, gold: np.ndarray, *, tol: float = 1e-10, max_iter: int = 100) -> float:
    """The temperature T minimising the NLL of softmax(l / T) on a NaN-padded (N, K) ``loglik`` and ``gold``."""
    loglik = np.asarray(loglik, dtype=np.float64)
    gold = np.asarray(gold)
    if loglik.ndim != 2 or gold.shape != (len(loglik),) or len(loglik) == 0:
        raise ValueError(f"expected loglik (N, K) and gold (N,) with N > 0, got {loglik.shape} and {gold.shape}")
    centred = loglik - np.nanmax(loglik, axis=1, keepdims=True)  # shift-invariant per row, avoids overflow
    gold_score = centred[np.arange(len(gold)), gold]
    low, high = BETA_BOUNDS
    beta = 1.0
    for _ in range(max_iter):
        p = choice_probs(centred, 1.0 / beta)
        mean = np.nansum(p * centred, axis=1)
        grad = np.mean(mean - gold_score)
        hess = np.mean(np.nansum(p * (centred - mean[:, None]) ** 2, axis=1))
        if grad > 0:
            high = beta
        else:
            low = beta
        step = beta - grad / hess if hess > 0 else np.nan
        beta = step if low < step < high else (np.sqrt(low * high))
        if abs(grad) < tol or high / low < 1 + 1e-12:
            break
    return float(1.0 / beta)
