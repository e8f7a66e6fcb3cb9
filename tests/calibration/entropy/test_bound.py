"""Eq. 14 (the paper's Theorem 4.2) in float64: the two-level minimiser's entropy, random and optimised logit
vectors of the same norm never below it, and the limits the paper states."""

import mpmath
import numpy as np
import pytest

from calibration.entropy.bound import entropy_floor, normalised_entropy_gap


def _entropy(u: np.ndarray) -> float:
    """H(softmax(u)) in float64; log Z = u_max + log1p(sum of the others' e^(u - u_max)) keeps tiny H accurate."""
    top = int(np.argmax(u))
    shifted = u - u[top]
    log_p = shifted - np.log1p(np.exp(np.delete(shifted, top)).sum())
    return float(-(np.exp(log_p) * log_p).sum())


def _two_level_entropy(v: int, d: int, rho: float) -> float:
    """H of eq. 36's vector at 50 digits: p_top = 1 / Z, p_other = e^(b - a) / Z, Z = 1 + (V - 1) e^(b - a)."""
    with mpmath.workdps(50):
        a = rho * mpmath.sqrt(d) * mpmath.sqrt(1 - mpmath.mpf(1) / v)
        b = -rho * mpmath.sqrt(d) / mpmath.sqrt(mpmath.mpf(v) * (v - 1))
        z = 1 + (v - 1) * mpmath.exp(b - a)
        log_top, log_other = -mpmath.log(z), b - a - mpmath.log(z)
        return float(-(mpmath.exp(log_top) * log_top + (v - 1) * mpmath.exp(log_other) * log_other))


def _two_level(v: int, d: int, rho: float) -> np.ndarray:
    """Eq. 36: one logit a = rho sqrt(D) sqrt(1 - 1/V), the other V - 1 at b = -rho sqrt(D) / sqrt(V (V - 1))."""
    u = np.full(v, -rho * np.sqrt(d) / np.sqrt(v * (v - 1.0)))
    u[0] = rho * np.sqrt(d) * np.sqrt(1 - 1 / v)
    return u


@pytest.mark.parametrize("v", [2, 3, 10, 1000, 50_000])
@pytest.mark.parametrize("d,rho", [(1, 0.01), (4, 0.3), (64, 0.2), (576, 0.05), (640, 1.0)])
def test_floor_is_the_entropy_of_the_two_level_minimiser(v, d, rho):
    u = _two_level(v, d, rho)
    assert abs(u.mean()) < 1e-12 * max(1.0, np.abs(u).max())
    assert np.linalg.norm(u) == pytest.approx(rho * np.sqrt(d), rel=1e-12)
    assert float(entropy_floor(v, d, rho)) == pytest.approx(_two_level_entropy(v, d, rho), rel=1e-12, abs=1e-300)
    assert _entropy(u) == pytest.approx(_two_level_entropy(v, d, rho), rel=1e-9, abs=1e-15)  # the vector itself


def _random_logits(v: int, rng: np.random.Generator) -> np.ndarray:
    """Assorted shapes: Gaussian, heavy-tailed, one spike over noise, a perturbed two-level vector, not centred."""
    kind = rng.integers(5)
    if kind == 0:
        return rng.normal(size=v)
    if kind == 1:
        return rng.standard_cauchy(size=v)
    if kind == 2:
        u = rng.normal(scale=0.1, size=v)
        u[rng.integers(v)] += 1.0
        return u
    if kind == 3:
        return _two_level(v, 1, 1.0) + rng.normal(scale=1e-3, size=v)
    return rng.normal(size=v) + rng.normal(scale=5.0)


@pytest.mark.parametrize("seed", range(40))
def test_random_logit_vectors_of_the_same_norm_never_go_below_the_floor(seed):
    rng = np.random.default_rng(seed)
    for _ in range(50):
        v, d = int(rng.choice([2, 3, 7, 50, 4000])), int(rng.integers(1, 1024))
        rho = float(rng.uniform(0.0, 3.0) / np.sqrt(d) * rng.choice([0.3, 1.0, 3.0]))
        u = _random_logits(v, rng)
        u *= rho * np.sqrt(d) * rng.uniform(0.5, 1.0) / np.linalg.norm(u)  # ||u|| <= rho sqrt(D)
        assert _entropy(u) >= float(entropy_floor(v, d, rho)) - 1e-12


def _minimised_entropy(v: int, radius: float, seed: int, steps: int = 3000) -> float:
    """min H(u) over ||u|| = radius by projected gradient descent from a random start (dH/du_i = -p_i (log p_i + H))."""
    rng = np.random.default_rng(seed)
    u = rng.normal(size=v)
    for _ in range(steps):
        u = radius * (u - u.mean()) / np.linalg.norm(u - u.mean())
        log_p = u - np.logaddexp.reduce(u)
        p = np.exp(log_p)
        grad = -p * (log_p + _entropy(u))
        grad -= grad.mean() + (grad @ u) / (u @ u) * u
        u = u - 0.05 * max(1.0, radius) * grad
    return _entropy(radius * (u - u.mean()) / np.linalg.norm(u - u.mean()))


@pytest.mark.parametrize("v", [3, 5, 8])
@pytest.mark.parametrize("radius", [0.5, 2.0, 4.0])
def test_optimised_logits_reach_the_floor_and_not_below(v, radius):
    best = min(_minimised_entropy(v, radius, seed) for seed in range(3))
    floor = float(entropy_floor(v, 1, radius))  # rho sqrt(D) = radius with D = 1
    assert best >= floor - 1e-12
    assert best == pytest.approx(floor, abs=1e-9)  # the bound is attained


def test_linear_in_vocabulary_and_exponentially_falling_in_sqrt_hidden_size():
    """Where |V| gamma << 1, H_min = (|V| - 1) gamma (1 + s) (1 + O(|V| gamma)), s = rho sqrt(D |V| / (|V| - 1))."""
    rho = 0.5
    d = np.array([2500.0, 3600.0, 4900.0, 6400.0])  # sqrt(D) = 50 ... 80: |V| gamma < 1e-5 for every |V| below
    v = np.array([32_000.0, 64_000.0, 128_000.0, 256_000.0])[:, None]
    floor = entropy_floor(v, d, rho)
    s = rho * np.sqrt(d * v / (v - 1))
    np.testing.assert_allclose(floor, (v - 1) * np.exp(-s) * (1 + s), rtol=1e-4)
    np.testing.assert_allclose(floor[1:] / floor[:-1], 2.0, rtol=1e-3)  # linear in |V|: twice |V|, twice H_min
    slope = np.diff(np.log(floor / (1 + s)), axis=1) / np.diff(np.sqrt(d))  # d log(H_min / (1 + s)) / d sqrt(D)
    np.testing.assert_allclose(slope, np.broadcast_to(-rho * np.sqrt(v / (v - 1)), slope.shape), rtol=1e-6)


def test_floor_and_gap_move_as_the_paper_says():
    d = np.geomspace(1, 16384, 40)[:, None]
    v = np.array([32_000, 49_152, 128_256, 262_144])[None, :]
    floor, gap = entropy_floor(v, d, 0.1), normalised_entropy_gap(v, d, 0.1)
    assert np.all(np.diff(floor, axis=0) <= 0) and np.all(np.diff(floor, axis=1) >= 0)  # falls with D, rises with V
    assert np.all(np.diff(gap, axis=0) >= 0) and np.all(np.diff(gap, axis=1) <= 0)
    assert np.all((gap >= 0) & (gap <= 1)) and np.all(floor <= np.log(v) + 1e-12)
    rho = np.geomspace(1e-4, 10, 30)  # Remark 4.4: dividing the logits by T > 1 lowers rho and raises the floor
    assert np.all(np.diff(entropy_floor(1000, 64, rho)) < 0)
    assert entropy_floor(100, 4, 0.0) == pytest.approx(np.log(100), rel=1e-15)  # no logit scale: uniform
    assert entropy_floor(262_144, 640, 50.0) == 0.0  # gamma underflows: no floor


@pytest.mark.parametrize("args", [(1, 10, 1.0), (10, 0, 1.0), (10, 4, -1.0), (10, 4, np.inf),
                                  (np.array([4, 1]), 4, 1.0)])
def test_invalid_arguments_are_one_line_errors(args):
    with pytest.raises(ValueError, match="expected vocab_size >= 2"):
        entropy_floor(*args)
