from __future__ import annotations

import numpy as np
import pytest

from calibration.metrics import negative_log_likelihood
from calibration.probabilities import choice_probs
from calibration.temperature import fit_temperature


def synthetic(true_temperature: float, n: int = 4000, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Scores whose labels are drawn from softmax(scores / T): the NLL-optimal temperature is about T."""
    rng = np.random.default_rng(seed)
    scores = rng.normal(scale=3.0, size=(n, 4)) - 20.0  # log-likelihood-like offsets must not matter
    scores[: n // 10, 3] = np.nan  # some three-choice questions
    probs = np.nan_to_num(choice_probs(scores, true_temperature))
    gold = np.array([rng.choice(4, p=p) for p in probs])
    return scores, gold


@pytest.mark.parametrize("true_temperature", [0.5, 1.0, 2.5])
def test_recovers_the_generating_temperature(true_temperature):
    scores, gold = synthetic(true_temperature)
    assert fit_temperature(scores, gold) == pytest.approx(true_temperature, rel=0.08)


def test_is_the_minimum_of_the_held_out_nll():
    scores, gold = synthetic(1.7, n=1000, seed=1)
    fitted = fit_temperature(scores, gold)
    nll = lambda t: negative_log_likelihood(choice_probs(scores, t), gold)  # noqa: E731
    grid = np.exp(np.linspace(np.log(0.2), np.log(10), 2001))
    best = grid[np.argmin([nll(t) for t in grid])]
    assert fitted == pytest.approx(best, rel=2e-3)
    assert nll(fitted) <= min(nll(fitted * 0.99), nll(fitted * 1.01))


def test_separable_scores_stop_once_the_nll_is_flat():
    scores, gold = np.array([[0.0, -5.0], [-5.0, 0.0]]), np.array([0, 1])
    fitted = fit_temperature(scores, gold)  # the NLL decreases towards T = 0; stop where its slope vanishes
    assert 1e-4 <= fitted < 0.25 and negative_log_likelihood(choice_probs(scores, fitted), gold) < 1e-9
