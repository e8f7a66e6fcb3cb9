"""Our rank-limited entropy floor: its margin lemma, the floor against random heads and against an optimiser."""

import numpy as np
import pytest

from calibration.entropy.rank_bound import max_mean_margin, rank_entropy_floor, rank_entropy_gap


def _centred_rms(z: np.ndarray) -> tuple[np.ndarray, float]:
    centred = z - z.mean(axis=1, keepdims=True)
    return centred, float(np.sqrt(np.mean(centred ** 2)))


def _random_heads(v: int, d: int, n: int, seed: int):
    """Logit matrices H W^T of rank d (V contexts x V tokens) at assorted scales, with a random target per row."""
    rng = np.random.default_rng(seed)
    for _ in range(n):
        z = rng.normal(size=(v, d)) @ rng.normal(size=(d, v)) * rng.uniform(0.1, 10.0)
        yield z, rng.permutation(v)


@pytest.mark.parametrize("v,d", [(6, 1), (6, 3), (6, 5), (6, 9), (50, 4), (50, 49)])
def test_mean_margin_and_cross_entropy_stay_above_the_floor_for_random_heads(v, d):
    for z, target in _random_heads(v, d, n=200, seed=v * 100 + d):
        centred, sigma = _centred_rms(z)
        margins = centred[np.arange(v), target]
        assert margins.mean() <= max_mean_margin(d, v, sigma) + 1e-9
        log_p = z - np.logaddexp.reduce(z, axis=1, keepdims=True)
        assert -log_p[np.arange(v), target].mean() >= rank_entropy_floor(d, v, sigma) - 1e-9


def test_mean_entropy_is_above_the_floor_when_every_token_is_some_context_s_top_prediction():
    v, d = 8, 3
    for z, _ in _random_heads(v, d, n=300, seed=1):
        top = z.argmax(axis=1)
        if len(set(top)) < v:
            continue  # the bound needs distinct top tokens
        p = np.exp(z - np.logaddexp.reduce(z, axis=1, keepdims=True))
        entropy = -(p * np.log(p)).sum(axis=1).mean()
        assert entropy >= rank_entropy_floor(d, v, _centred_rms(z)[1]) - 1e-9


def _cross_entropy_and_gradient(a: np.ndarray, b: np.ndarray, sigma: float) -> tuple[float, np.ndarray, np.ndarray]:
    """Mean -log p_ii of Z~ = s (A B^T) P, with P the row centring and s scaling onto ||Z~||_F <= V sigma."""
    v = len(a)
    centred = a @ b.T
    centred = centred - centred.mean(axis=1, keepdims=True)
    norm = np.linalg.norm(centred)
    scale = min(1.0, sigma * v / norm)
    z = scale * centred
    log_p = z - np.logaddexp.reduce(z, axis=1, keepdims=True)
    grad_z = (np.exp(log_p) - np.eye(v)) / v
    grad_c = scale * grad_z
    if scale < 1.0:  # d/dC of V sigma C / ||C||
        grad_c = grad_c - scale * np.sum(grad_z * centred) * centred / norm ** 2
    grad_c = grad_c - grad_c.mean(axis=1, keepdims=True)
    return float(-np.trace(log_p) / v), grad_c @ b, grad_c.T @ a


def _minimised_cross_entropy(v: int, d: int, sigma: float, seed: int, steps: int = 3000) -> float:
    """min over rank-d heads with RMS centred logit <= sigma of the mean -log p_ii (Adam, every row its own target)."""
    rng = np.random.default_rng(seed)
    params = [rng.normal(size=(v, d)), rng.normal(size=(v, d))]
    moments = [[np.zeros_like(p), np.zeros_like(p)] for p in params]
    for step in range(1, steps + 1):
        _, *grads = _cross_entropy_and_gradient(*params, sigma)
        for p, g, m in zip(params, grads, moments):
            m[0] = 0.9 * m[0] + 0.1 * g
            m[1] = 0.999 * m[1] + 0.001 * g ** 2
            p -= 0.05 * (m[0] / (1 - 0.9 ** step)) / (np.sqrt(m[1] / (1 - 0.999 ** step)) + 1e-12)
    return _cross_entropy_and_gradient(*params, sigma)[0]


def test_the_optimiser_s_gradient_is_the_loss_s_gradient():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(5, 3)), rng.normal(size=(5, 3))
    for sigma in (0.1, 100.0):  # norm constraint active, inactive
        _, grad_a, _ = _cross_entropy_and_gradient(a, b, sigma)
        step = np.zeros_like(a)
        step[2, 1] = 1e-6
        numeric = (_cross_entropy_and_gradient(a + step, b, sigma)[0]
                   - _cross_entropy_and_gradient(a - step, b, sigma)[0]) / 2e-6
        assert grad_a[2, 1] == pytest.approx(numeric, rel=1e-5, abs=1e-9)


@pytest.mark.parametrize("d", [1, 2, 3, 4, 5])
def test_optimised_heads_do_not_beat_the_floor_and_reach_it_at_full_rank(d):
    v, sigma = 6, 1.0
    best = min(_minimised_cross_entropy(v, d, sigma, seed) for seed in range(2))
    floor = float(rank_entropy_floor(d, v, sigma))
    assert best >= floor - 1e-6
    if d == v - 1:
        assert best == pytest.approx(floor, abs=1e-4)  # the bound is tight at full rank


def test_floor_and_gap_move_with_vocabulary_and_hidden_size():
    d = np.geomspace(8, 16384, 40)[:, None]
    v = np.array([32000, 49152, 128256, 262144])[None, :]
    floor, gap = rank_entropy_floor(d, v), rank_entropy_gap(d, v)
    assert np.all(np.diff(floor, axis=0) <= 0) and np.all(np.diff(floor, axis=1) >= 0)
    assert np.all(np.diff(gap, axis=0) <= 0) and np.all(np.diff(gap, axis=1) >= 0)
    assert np.all((gap >= 0) & (gap < 1)) and np.all(floor <= np.log(v))
    assert rank_entropy_gap(5, 6) == 0.0 and rank_entropy_gap(100, 6) == 0.0
    assert rank_entropy_floor(4, 100, logit_std=0.0) == pytest.approx(np.log(100))  # no logit scale: uniform


@pytest.mark.parametrize("args", [(0, 10), (4, 1), (4, 10, -1.0), (np.array([4, 0]), 10)])
def test_invalid_arguments_are_one_line_errors(args):
    with pytest.raises(ValueError, match="expected"):
        rank_entropy_floor(*args)
