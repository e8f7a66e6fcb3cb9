from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from calibration import metrics
from calibration.probabilities import choice_probs, pad, top_label

torchmetrics = pytest.importorskip("torchmetrics")

# n_bins = 5, edges 0 .2 .4 .6 .8 1: bins {0.0, 0.1} {0.35} {0.55} {} {0.9, 1.0} (the last bin is closed)
CONF = np.array([0.1, 0.35, 0.55, 0.9, 1.0, 0.0])
CORRECT = np.array([0, 1, 1, 1, 1, 0], dtype=bool)


def test_hand_computed_binned_errors_with_confidence_zero_and_one():
    # per-bin (n, |acc - conf|): (2, .05) (1, .65) (1, .45) (2, .05)
    assert metrics.expected_calibration_error(CONF, CORRECT, 5) == pytest.approx(1.3 / 6, abs=1e-12)
    assert metrics.rms_calibration_error(CONF, CORRECT, 5) == pytest.approx(
        math.sqrt((2 * 0.05**2 + 0.65**2 + 0.45**2 + 2 * 0.05**2) / 6), abs=1e-12)
    assert metrics.max_calibration_error(CONF, CORRECT, 5) == pytest.approx(0.65, abs=1e-12)
    # equal mass, 3 bins of sorted confidences: {0, .1} {.35, .55} {.9, 1}
    assert metrics.adaptive_calibration_error(CONF, CORRECT, 3) == pytest.approx((0.1 + 1.1 + 0.1) / 6, abs=1e-12)
    assert metrics.accuracy(CORRECT) == pytest.approx(4 / 6)
    count, acc, conf = metrics.reliability_bins(CONF, CORRECT, 5)
    np.testing.assert_allclose(count, [2, 1, 1, 0, 2])
    np.testing.assert_allclose(acc, [0, 1, 1, 0, 1])
    np.testing.assert_allclose(conf, [0.05, 0.35, 0.55, 0, 0.95])


def test_perfect_and_worst_calibration():
    assert metrics.expected_calibration_error([1.0, 1.0, 0.0], [1, 1, 0]) == 0.0
    assert metrics.expected_calibration_error([1.0, 1.0], [0, 0]) == 1.0
    assert metrics.max_calibration_error([0.0], [1]) == 1.0


def torchmetrics_ce(confidence: np.ndarray, correct: np.ndarray, n_bins: int, norm: str) -> float:
    from torchmetrics.classification import BinaryCalibrationError

    metric = BinaryCalibrationError(n_bins=n_bins, norm=norm)
    return float(metric(torch.tensor(confidence, dtype=torch.float64), torch.tensor(correct, dtype=torch.long)))


OURS = {"l1": metrics.expected_calibration_error, "l2": metrics.rms_calibration_error,
        "max": metrics.max_calibration_error}


@pytest.mark.parametrize("norm", ["l1", "l2", "max"])
@pytest.mark.parametrize("n_bins", [1, 10, 15])
@pytest.mark.parametrize("seed", [0, 1])
def test_agrees_with_torchmetrics_on_random_inputs(norm, n_bins, seed):
    rng = np.random.default_rng(seed)
    confidence = rng.uniform(size=500)
    confidence[:20] = 0.0
    confidence[20:40] = np.arange(20) / 20  # values on bin edges
    correct = rng.uniform(size=500) < confidence
    assert OURS[norm](confidence, correct, n_bins) == pytest.approx(
        torchmetrics_ce(confidence, correct, n_bins, norm), abs=1e-12)


@pytest.mark.parametrize("norm", ["l1", "l2", "max"])
def test_confidence_one_differs_from_torchmetrics_only_by_its_extra_bin(norm):
    """torchmetrics bins c = 1.0 alone in an (M+1)-th bin; we close the last bin. Nudged below 1 they agree."""
    rng = np.random.default_rng(2)
    confidence = rng.uniform(0.5, 0.9, size=300)
    correct = rng.uniform(size=300) < confidence
    confidence[:60], correct[:60] = 1.0, np.arange(60) < 48  # overconfident at exactly 1 ...
    confidence[60:100], correct[60:100] = 0.95, True  # ... underconfident just below: merging the two changes CE
    nudged = np.where(confidence == 1.0, np.nextafter(1.0, 0.0), confidence)
    assert OURS[norm](confidence, correct, 15) == pytest.approx(torchmetrics_ce(nudged, correct, 15, norm), abs=1e-9)
    assert OURS[norm](confidence, correct, 15) != pytest.approx(torchmetrics_ce(confidence, correct, 15, norm),
                                                                  abs=1e-6)


def test_top_label_from_probs_agrees_with_torchmetrics_multiclass():
    from torchmetrics.classification import MulticlassCalibrationError

    rng = np.random.default_rng(3)
    probs = choice_probs(rng.normal(scale=2.0, size=(400, 4)))
    gold = rng.integers(0, 4, size=400)
    confidence, correct = top_label(probs, gold)
    expected = MulticlassCalibrationError(num_classes=4, n_bins=15, norm="l1")(
        torch.tensor(probs), torch.tensor(gold))
    assert metrics.expected_calibration_error(confidence, correct) == pytest.approx(float(expected), abs=1e-6)


def test_static_calibration_error_hand_computed():
    probs = np.array([[0.7, 0.3], [0.4, 0.6]])
    # class 0: p .7 (y 1) gap .3, p .4 (y 1) gap .6 -> .45; class 1: .3 (y 0), .6 (y 0) -> .45
    assert metrics.static_calibration_error(probs, np.array([0, 0]), 2) == pytest.approx(0.45, abs=1e-12)
    ragged = pad([[0.5, 0.5], [0.2, 0.3, 0.5]])
    # class 0: (.5 -> 1 gap .5) (.2 -> 0 gap .2) -> .35; class 1: .5/.3 all wrong -> .4; class 2: .5 right -> .5
    assert metrics.static_calibration_error(ragged, np.array([0, 2]), 2) == pytest.approx(1.25 / 3, abs=1e-12)


def test_brier_and_nll_hand_computed_with_ragged_choices():
    probs = np.array([[0.7, 0.3], [0.4, 0.6]])
    assert metrics.brier_score(probs, np.array([0, 0])) == pytest.approx(0.45, abs=1e-12)
    assert metrics.negative_log_likelihood(probs, np.array([0, 0])) == pytest.approx(
        -(math.log(0.7) + math.log(0.4)) / 2, abs=1e-12)
    ragged = pad([[0.5, 0.5], [0.2, 0.3, 0.5]])
    assert metrics.brier_score(ragged, np.array([0, 2])) == pytest.approx((0.5 + 0.38) / 2, abs=1e-12)
    assert math.isfinite(metrics.negative_log_likelihood(np.array([[1.0, 0.0]]), np.array([1])))


def test_invalid_inputs_are_value_errors():
    with pytest.raises(ValueError, match="expected confidences in \\[0, 1\\]"):
        metrics.expected_calibration_error([1.2], [1])
    with pytest.raises(ValueError, match="one equal length"):
        metrics.expected_calibration_error([0.2, 0.3], [1])
    with pytest.raises(ValueError, match="expected n_bins"):
        metrics.expected_calibration_error([0.2], [1], n_bins=0)
    with pytest.raises(ValueError, match="correctness"):
        metrics.expected_calibration_error([0.2], [2])
    with pytest.raises(ValueError, match="gold labels"):
        metrics.brier_score(np.array([[0.5, 0.5]]), np.array([2]))
    with pytest.raises(ValueError, match="NaN gold"):
        metrics.negative_log_likelihood(pad([[0.5, 0.5], [0.2, 0.3, 0.5]]), np.array([2, 2]))
