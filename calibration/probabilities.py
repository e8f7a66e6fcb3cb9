"""From per-choice log-likelihoods to the choice distribution, its confidence and its prediction.

p_ik = exp(l_ik / T) / sum_j exp(l_ij / T) over question i's own choices (T = 1: the model's distribution;
T fitted: temperature scaling). confidence c_i = max_k p_ik, correct a_i = 1[argmax_k p_ik = y_i] (ties go to
the first choice, as in lm-eval's ``np.argmax``).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


def pad(loglik: Sequence[Sequence[float]]) -> np.ndarray:
    """Ragged per-question log-likelihoods as an (N, K_max) float64 array, NaN where a question has no choice."""
    width = max(len(row) for row in loglik)
    out = np.full((len(loglik), width), np.nan)
    for i, row in enumerate(loglik):
        out[i, : len(row)] = row
    return out


def choice_probs(loglik: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """softmax(l / T) per row of a NaN-padded (N, K) array; padding stays NaN."""
    if not temperature > 0:
        raise ValueError(f"expected temperature > 0, got {temperature}")
    scaled = loglik / temperature
    shifted = scaled - np.nanmax(scaled, axis=1, keepdims=True)
    weights = np.exp(shifted)
    return weights / np.nansum(weights, axis=1, keepdims=True)


def top_label(probs: np.ndarray, gold: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(confidence c_i = max_k p_ik, correct a_i = 1[argmax_k p_ik = y_i]) of a NaN-padded (N, K) array."""
    filled = np.nan_to_num(probs, nan=-1.0)
    return filled.max(axis=1), filled.argmax(axis=1) == np.asarray(gold)
