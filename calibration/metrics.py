"""Accuracy and calibration metrics of a multiple-choice model, each with its formula.

Notation: N questions; question i has the choice distribution p_i (over its K_i choices), gold label y_i,
confidence c_i = max_k p_ik and correctness a_i = 1[argmax_k p_ik = y_i].

Equal-width binning (ECE, RMS-CE, MCE, reliability diagrams): bin b = [e_b, e_{b+1}) for b < M-1 and the
last bin [e_{M-1}, 1] is closed, with edges e = torch.linspace(0, 1, M + 1) in float64 (torch's linspace, whose
values differ from b/M in the last bit for some b, so confidences lying on an edge fall where torchmetrics puts
them). In a bin B_b with n_b questions, acc(B_b) = mean a_i and conf(B_b) = mean c_i. torchmetrics'
CalibrationError uses the same bins but puts c = 1.0 exactly into an extra (M+1)-th bin of its own; the two
agree exactly whenever no confidence equals 1.0 (tests/calibration/test_metrics.py checks both).

Distributions with fewer choices than the widest question are NaN-padded (``probabilities.choice_probs``).
"""

from __future__ import annotations

import numpy as np
import torch

ArrayLike = np.ndarray | list


def accuracy(correct: ArrayLike) -> float:
    """acc = (1/N) sum_i a_i."""
    return float(np.mean(_correct(correct)))


def expected_calibration_error(confidence: ArrayLike, correct: ArrayLike, n_bins: int = 15) -> float:
    """ECE = sum_b (n_b / N) |acc(B_b) - conf(B_b)|, equal-width bins, top label (L1)."""
    count, acc, conf = reliability_bins(confidence, correct, n_bins)
    return float(np.sum(count / count.sum() * np.abs(acc - conf)))


def rms_calibration_error(confidence: ArrayLike, correct: ArrayLike, n_bins: int = 15) -> float:
    """RMS-CE = sqrt(sum_b (n_b / N) (acc(B_b) - conf(B_b))^2), equal-width bins, top label (L2)."""
    count, acc, conf = reliability_bins(confidence, correct, n_bins)
    return float(np.sqrt(np.sum(count / count.sum() * (acc - conf) ** 2)))


def max_calibration_error(confidence: ArrayLike, correct: ArrayLike, n_bins: int = 15) -> float:
    """MCE = max_{b: n_b > 0} |acc(B_b) - conf(B_b)|, equal-width bins, top label (L-infinity)."""
    count, acc, conf = reliability_bins(confidence, correct, n_bins)
    return float(np.max(np.abs(acc - conf)[count > 0]))


def adaptive_calibration_error(confidence: ArrayLike, correct: ArrayLike, n_bins: int = 15) -> float:
    """ACE = sum_b (n_b / N) |acc(B_b) - conf(B_b)| over equal-mass bins, top label.

    Questions sorted by confidence (stable) are cut into ``n_bins`` contiguous bins whose sizes differ by at
    most one (``np.array_split``); with N < n_bins there are N bins of one question.
    """
    confidence, correct = _top_label(confidence, correct)
    order = np.argsort(confidence, kind="stable")
    total = 0.0
    for chunk in np.array_split(order, min(n_bins, len(order))):
        total += len(chunk) * abs(correct[chunk].mean() - confidence[chunk].mean())
    return float(total / len(order))


def static_calibration_error(probs: ArrayLike, gold: ArrayLike, n_bins: int = 15) -> float:
    """SCE = (1/K) sum_k sum_b (n_bk / N_k) |acc(B_bk) - conf(B_bk)|, classwise over the full distribution.

    For choice position k, the N_k questions that have a k-th choice are binned by p_ik into equal-width bins
    B_bk; acc(B_bk) = mean 1[y_i = k] and conf(B_bk) = mean p_ik over the bin; K counts the positions with
    N_k > 0. With every question having K choices this is Nixon et al.'s (2019) SCE.
    """
    probs, gold = _distribution(probs, gold)
    per_class = []
    for k in range(probs.shape[1]):
        present = ~np.isnan(probs[:, k])
        if present.any():
            count, acc, conf = _bins(probs[present, k], (gold[present] == k).astype(float), n_bins)
            per_class.append(np.sum(count / count.sum() * np.abs(acc - conf)))
    return float(np.mean(per_class))


def brier_score(probs: ArrayLike, gold: ArrayLike) -> float:
    """Brier = (1/N) sum_i sum_k (p_ik - 1[k = y_i])^2, over each question's own choices."""
    probs, gold = _distribution(probs, gold)
    onehot = np.zeros_like(probs)
    onehot[np.arange(len(gold)), gold] = 1.0
    return float(np.mean(np.nansum((probs - onehot) ** 2, axis=1)))


def negative_log_likelihood(probs: ArrayLike, gold: ArrayLike) -> float:
    """NLL = -(1/N) sum_i log p_{i, y_i}; p is floored at the smallest positive float64 so NLL stays finite."""
    probs, gold = _distribution(probs, gold)
    gold_prob = probs[np.arange(len(gold)), gold]
    return float(-np.mean(np.log(np.maximum(gold_prob, np.finfo(np.float64).tiny))))


def reliability_bins(confidence: ArrayLike, correct: ArrayLike, n_bins: int = 15
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(n_b, acc(B_b), conf(B_b)) of the M equal-width bins; empty bins have acc = conf = 0."""
    return _bins(*_top_label(confidence, correct), n_bins)


def bin_edges(n_bins: int) -> np.ndarray:
    """The M + 1 equal-width bin edges, bit for bit those of torchmetrics (``torch.linspace`` in float64)."""
    return torch.linspace(0.0, 1.0, n_bins + 1, dtype=torch.float64).numpy()


def _bins(confidence: np.ndarray, correct: np.ndarray, n_bins: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    if not isinstance(n_bins, (int, np.integer)) or n_bins < 1:
        raise ValueError(f"expected n_bins an integer >= 1, got {n_bins!r}")
    edges = bin_edges(n_bins)
    index = np.clip(np.searchsorted(edges, confidence, side="right") - 1, 0, n_bins - 1)
    count = np.bincount(index, minlength=n_bins).astype(float)
    with np.errstate(invalid="ignore", divide="ignore"):
        acc = np.nan_to_num(np.bincount(index, weights=correct, minlength=n_bins) / count)
        conf = np.nan_to_num(np.bincount(index, weights=confidence, minlength=n_bins) / count)
    return count, acc, conf


def _top_label(confidence: ArrayLike, correct: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    confidence = np.asarray(confidence, dtype=np.float64)
    correct = _correct(correct)
    if confidence.ndim != 1 or confidence.shape != correct.shape:
        raise ValueError(f"expected confidence and correct of one equal length, got shapes "
                         f"{confidence.shape} and {correct.shape}")
    if np.any(~((confidence >= 0) & (confidence <= 1))):
        raise ValueError(f"expected confidences in [0, 1], got values from {np.nanmin(confidence)} "
                         f"to {np.nanmax(confidence)} (or NaN)")
    return confidence, correct


def _correct(correct: ArrayLike) -> np.ndarray:
    correct = np.asarray(correct)
    if correct.ndim != 1 or len(correct) == 0:
        raise ValueError(f"expected a non-empty 1-d array of correctness, got shape {correct.shape}")
    if not np.all((correct == 0) | (correct == 1)):
        raise ValueError("expected correctness values of 0/1 or bool, got other values")
    return correct.astype(np.float64)


def _distribution(probs: ArrayLike, gold: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    probs = np.asarray(probs, dtype=np.float64)
    gold = np.asarray(gold)
    if probs.ndim != 2 or gold.shape != (len(probs),) or len(probs) == 0:
        raise ValueError(f"expected probs (N, K) and gold (N,) with N > 0, got shapes {probs.shape} and {gold.shape}")
    if not np.issubdtype(gold.dtype, np.integer) or np.any((gold < 0) | (gold >= probs.shape[1])):
        raise ValueError(f"expected integer gold labels in [0, {probs.shape[1]}), got {gold[:5]}...")
    if np.any(np.isnan(probs[np.arange(len(gold)), gold])):
        raise ValueError("expected every gold label to index a present (non-NaN) choice, got a NaN gold probability")
    return probs, gold
