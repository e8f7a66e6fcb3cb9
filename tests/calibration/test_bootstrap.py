from __future__ import annotations

import numpy as np
import pytest

from calibration import metrics
from calibration.bootstrap import bootstrap_ci, bootstrap_many


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
