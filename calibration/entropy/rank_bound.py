"""Our rank bound on the entropy of a softmax LM head (not in the paper; its eq. 14 is ``calibration.entropy.bound``).

What it adds to eq. 14: there D enters only through rho sqrt(D), the bound on one context's logit norm
||u||, so at a fixed logit norm the paper's floor is the same for every D. Here the logit scale is fixed
(sigma, the RMS centred logit) and the floor comes from the head's rank: V contexts with distinct targets
cannot all be predicted confidently by a head of rank d < V - 1. ``sweeps/analyze.py`` draws it when a store
holds no measured entropy (rows written before the trials measured sigma_C, sigma_h and their entropy).

Setting. A head of hidden size d maps context i to logits z_i = W h_i in R^V (W in R^{V x d}), so the logit
matrix Z = H W^T (one row per context) has rank <= d. Take V contexts, each with its own target token a(i)
(a permutation: every token is the target of some context, as a language model must be able to predict
each token somewhere). Softmax is shift invariant, so only the centred logits z~_ik = z_ik - mean_j z_ij
matter; their scale is sigma, the RMS centred logit, sigma^2 = (1/V^2) sum_ik z~_ik^2 (the mean over
contexts of each context's logit variance across the vocabulary).

Bound. With r = min(d, V - 1) (centring removes one dimension),

    (1/V) sum_i -log p_{i,a(i)}  >=  H_floor(d, V, sigma) = log(1 + (V - 1) exp(-sigma sqrt(r) V / (V - 1))).

Where a(i) is context i's top token, -log p_{i,a(i)} = -log max_k p_ik <= H(p_i), so the mean Shannon entropy
of the V contexts (and their mean -log confidence) obey the same floor.

Proof. (1) The target margins m_i = z~_{i,a(i)} are the diagonal of Z~ with its columns permuted, a matrix of
rank <= r, so sum_i m_i <= (sum of its singular values) <= sqrt(r) ||Z~||_F = sqrt(r) V sigma: the mean margin
is at most sigma sqrt(r). (2) A centred row's other V - 1 logits sum to -m_i, so by Jensen
sum_{k != a(i)} exp(z~_ik) >= (V - 1) exp(-m_i / (V - 1)), hence -log p_{i,a(i)} >= g(m_i) :=
log(1 + (V - 1) exp(-m_i V / (V - 1))). (3) g is convex and decreasing: mean_i g(m_i) >= g(mean_i m_i) >=
g(sigma sqrt(r)). At d >= V - 1 the bound is attained by Z~ = c (I - 11^T / V).

Behaviour. The floor is about log(1 + V exp(-sigma sqrt(d))): a head is free to be confident only once
sigma sqrt(d) >> log V, and at fixed d and sigma it climbs towards log V as V grows (the paper's claim,
through the rank rather than the norm).

Rank gap: the share of the maximal entropy log V that the rank limit adds to the floor of a full-rank head
(d >= V - 1) at the same logit scale (not the paper's Figure 4 gap, which is (log V - H_min) / log V),

    rank_gap(d, V, sigma) = (H_floor(d, V, sigma) - H_floor(V - 1, V, sigma)) / log V,   0 <= gap < 1.
"""

from __future__ import annotations

import numpy as np

ArrayLike = float | int | np.ndarray


def max_mean_margin(hidden_size: ArrayLike, vocab_size: ArrayLike, logit_std: float = 1.0) -> np.ndarray:
    """The largest mean target margin of V contexts with distinct targets: sigma sqrt(min(d, V - 1))."""
    d, v, sigma = _checked(hidden_size, vocab_size, logit_std)
    return sigma * np.sqrt(np.minimum(d, v - 1))


def rank_entropy_floor(hidden_size: ArrayLike, vocab_size: ArrayLike, logit_std: float = 1.0) -> np.ndarray:
    """H_floor = log(1 + (V - 1) exp(-sigma sqrt(min(d, V - 1)) V / (V - 1))) in nats (see the module doc)."""
    d, v, sigma = _checked(hidden_size, vocab_size, logit_std)
    margin = max_mean_margin(d, v, sigma)
    return np.logaddexp(0.0, np.log(v - 1) - margin * v / (v - 1))


def rank_entropy_gap(hidden_size: ArrayLike, vocab_size: ArrayLike, logit_std: float = 1.0) -> np.ndarray:
    """gap = (H_floor(d, V) - H_floor(V - 1, V)) / log V: the entropy the rank limit forces, per nat of log V."""
    d, v, sigma = _checked(hidden_size, vocab_size, logit_std)
    full_rank = rank_entropy_floor(v - 1, v, sigma)
    return (rank_entropy_floor(d, v, sigma) - full_rank) / np.log(v)


def _checked(hidden_size: ArrayLike, vocab_size: ArrayLike, logit_std: float
             ) -> tuple[np.ndarray, np.ndarray, float]:
    d = np.asarray(hidden_size, dtype=np.float64)
    v = np.asarray(vocab_size, dtype=np.float64)
    if np.any(~(d >= 1)) or np.any(~(v >= 2)):
        raise ValueError(f"expected hidden_size >= 1 and vocab_size >= 2, got {hidden_size!r} and {vocab_size!r}")
    if not logit_std >= 0:
        raise ValueError(f"expected logit_std >= 0, got {logit_std!r}")
    return d, v, float(logit_std)
