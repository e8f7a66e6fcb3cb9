"""The paper's LM-head entropy floor: Theorem 4.2, eq. 14 of Huang, Lu & Zeng (ICML 2025).

Notation of the paper: C the head (D x |V|), h a final hidden state (D entries), u = C^T h the logits,
H(u) the entropy of softmax(u). Lemma 4.1 (eq. 13): with sigma_C = ||C||_2 and |h_i| <= sigma_h for every i,
||u||_2 <= rho sqrt(D), rho = sigma_C sigma_h. Theorem 4.2 (eq. 14): with

    gamma = exp(-rho sqrt(D |V| / (|V| - 1))),

    H(u) >= H_min = log(1 + (|V| - 1) gamma) + rho gamma sqrt(D |V| (|V| - 1)) / (1 + (|V| - 1) gamma).

H_min is the entropy of the two-level minimiser of H under ||u||_2 <= rho sqrt(D) (Appendix A.4, eq. 36):
one logit a = rho sqrt(D) sqrt(1 - 1/|V|), the other |V| - 1 logits b = -rho sqrt(D) / sqrt(|V| (|V| - 1)),
so a - b = rho sqrt(D |V| / (|V| - 1)) and gamma = exp(b - a). For large |V| with |V| gamma << 1,
H_min ~ |V| exp(-rho sqrt(D)) (1 + rho sqrt(D)): linear in |V|, falling exponentially in sqrt(D).

Normalised entropy gap (Figure 4): (log |V| - H_min) / log |V|, in [0, 1]; lower means the head cannot make
concentrated predictions. The paper does not state the rho of its figure; callers state theirs.
"""

from __future__ import annotations

import numpy as np

ArrayLike = float | int | np.ndarray


def entropy_floor(vocab_size: ArrayLike, hidden_size: ArrayLike, rho: ArrayLike) -> np.ndarray:
    """H_min of eq. 14 in nats: log(1 + (|V| - 1) gamma) + (|V| - 1) (a - b) gamma / (1 + (|V| - 1) gamma)."""
    v, d, rho = _checked(vocab_size, hidden_size, rho)
    spread = rho * np.sqrt(d * v / (v - 1))  # a - b of the two-level minimiser; log gamma = -spread
    log_norm = np.logaddexp(0.0, np.log(v - 1) - spread)  # log(1 + (|V| - 1) gamma)
    return log_norm + (v - 1) * spread * np.exp(-spread - log_norm)


def normalised_entropy_gap(vocab_size: ArrayLike, hidden_size: ArrayLike, rho: ArrayLike) -> np.ndarray:
    """(log |V| - H_min) / log |V|: the share of the maximal entropy the head may still give up (Figure 4)."""
    v = np.asarray(vocab_size, dtype=np.float64)
    return (np.log(v) - entropy_floor(vocab_size, hidden_size, rho)) / np.log(v)


def _checked(vocab_size: ArrayLike, hidden_size: ArrayLike, rho: ArrayLike
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    v, d, r = (np.asarray(x, dtype=np.float64) for x in (vocab_size, hidden_size, rho))
    if np.any(~(v >= 2)) or np.any(~(d >= 1)) or np.any(~(r >= 0)) or np.any(np.isinf(r)):
        raise ValueError(f"expected vocab_size >= 2, hidden_size >= 1 and finite rho >= 0, got {vocab_size!r}, "
                         f"{hidden_size!r} and {rho!r}")
    return v, d, r
