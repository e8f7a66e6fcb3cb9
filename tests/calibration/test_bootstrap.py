from __future__ import annotations

import numpy as np
import pytest

from calibration import metrics
from calibration.bootstrap import bootstrap_ci, bootstrap_many, seed_question_bootstrap


def test_interval_of_a_mean_matches_the_normal_approximation():
    correct = np.arange(400) % 2 == 0  # p = 0.5, standard error 0.025
    interval = bootstrap_ci(metrics.accuracy, correct, n_boot=2000, seed=0)
    assert interval.estimate == 0.5
    assert interval.low == pytest.approx(0.5 - 1.96 * 0.025, abs=0.006)
    assert interval.high == pytest.approx(0.5 + 1.96 * 0.025, abs=0.006)


def test_rows_resample_together_and_seed_is_deterministic():
    rng = np.random.default_rng(0)
    confidence = rng.uniform(size=200)
    correct = rng.uniform(size=200) < confidence
    first = bootstrap_ci(metrics.expected_calibration_error, confidence, correct, n_boot=200, seed=5)
    again = bootstrap_ci(metrics.expected_calibration_error, confidence, correct, n_boot=200, seed=5)
    assert first == again and first.low <= first.estimate <= first.high
    many = bootstrap_many(lambda c, a: {"ece": metrics.expected_calibration_error(c, a),
                                        "acc": metrics.accuracy(a)}, confidence, correct, n_boot=200, seed=5)
    assert many["ece"] == first


def test_rejects_bad_arguments():
    with pytest.raises(ValueError, match="one length"):
        bootstrap_ci(metrics.expected_calibration_error, np.ones(3), np.ones(2))
    with pytest.raises(ValueError, match="n_boot >= 1"):
        bootstrap_ci(metrics.accuracy, np.ones(3), n_boot=0)


def _mean_ece(confidence: np.ndarray, correct: np.ndarray) -> float:
    """Mean over seeds (columns) of each seed's ECE."""
    return float(np.mean([metrics.expected_calibration_error(confidence[:, j], correct[:, j])
                          for j in range(confidence.shape[1])]))


def _seeds(spread: float, n_seeds: int = 3, n: int = 300) -> tuple[np.ndarray, np.ndarray]:
    """(N, R) confidences and correctness; seed j is over-confident by spread * j on every question."""
    rng = np.random.default_rng(1)
    confidence = rng.uniform(0.3, 0.7, size=n)
    correct = rng.uniform(size=n) < confidence
    offsets = spread * np.arange(n_seeds)
    return (np.clip(confidence[:, None] + offsets, 0, 1), np.repeat(correct[:, None], n_seeds, axis=1))


def test_one_seed_or_identical_seeds_give_the_questions_only_interval():
    confidence, correct = _seeds(0.0, n_seeds=1)
    questions_only = bootstrap_ci(_mean_ece, confidence, correct, n_boot=200, seed=3)
    assert seed_question_bootstrap(lambda cell: _mean_ece(*cell), (confidence, correct), n_boot=200,
                                   seed=3) == questions_only
    identical = _seeds(0.0, n_seeds=4)
    assert seed_question_bootstrap(lambda cell: _mean_ece(*cell), identical, n_boot=200, seed=3) == questions_only


def test_intervals_widen_with_seed_spread():
    widths = []
    for spread in (0.0, 0.03, 0.1):
        interval = seed_question_bootstrap(lambda cell: _mean_ece(*cell), _seeds(spread), n_boot=400, seed=0)
        widths.append(interval.high - interval.low)
    assert widths[0] < widths[1] < widths[2] and widths[2] > 2 * widths[0]


def test_cells_share_their_question_resamples_and_bad_shapes_are_errors():
    ones = (np.ones((5, 1)),)
    paired = seed_question_bootstrap(lambda a, b: float(a[0].mean() - b[0].mean()),
                                     (np.arange(5.0)[:, None],), (np.arange(5.0)[:, None],), n_boot=50)
    assert (paired.low, paired.high) == (0.0, 0.0)  # the same rows in both cells: the difference never moves
    with pytest.raises(ValueError, match="one N > 0"):
        seed_question_bootstrap(lambda a, b: 0.0, ones, (np.ones((4, 1)),))
    with pytest.raises(ValueError, match="one R > 0 per cell"):
        seed_question_bootstrap(lambda a: 0.0, (np.ones((5, 2)), np.ones((5, 3))))
