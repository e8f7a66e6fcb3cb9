"""What the paper's entropy floor (eq. 14, ``calibration.entropy.bound``) needs, measured on a model's own head
and hidden states, beside the entropy the model actually has.

For the LM head W (|V| x D; the paper's C^T) and N final hidden states h_n (the head's inputs, after the final
norm; D entries each):

    sigma_c       = ||W||_2 = sqrt(lambda_max(W^T W)), W^T W accumulated over row chunks in float64
    sigma_h_max   = max_{n,i} |h_ni|: Lemma 4.1's sigma_h, every entry of every h_n is within it
    sigma_h_p999  = 99.9th percentile of the N D values |h_ni| (nearest rank: the ceil(0.999 N D)-th smallest)
    rho           = sigma_c * sigma_h_max
    entropy_floor = H_min(|V|, D, rho) of eq. 14, in nats: no h_n's next-token entropy is below it
    mean_entropy  = (1/N) sum_n H(softmax(z_n)), z_n = W h_n (or s tanh(W h_n / s) with logit soft-capping s,
                    which only shrinks |z|, so the floor still holds), in nats, over row chunks of logits
"""

from __future__ import annotations

import math

import torch

from calibration.entropy.bound import entropy_floor

CHUNK_ELEMENTS = 1 << 24  # float32 logits computed at a time

STATS = ("sigma_c", "sigma_h_max", "sigma_h_p999", "rho", "entropy_floor", "mean_entropy")  # the keys, in order
QUANTILE = 0.999


def entropy_floor_stats(head_weight: torch.Tensor, hidden: torch.Tensor, *, softcap: float | None = None,
                        chunk_elements: int = CHUNK_ELEMENTS) -> dict[str, float]:
    """``STATS`` of the head ``head_weight`` (|V|, D) over the hidden states ``hidden`` (..., D) (module doc).

    Logits are computed in float32 (float64 for float64 inputs), at most ``chunk_elements`` of them at a time.
    """
    _validate(head_weight, hidden, softcap, chunk_elements)
    hidden = hidden.detach().reshape(-1, hidden.shape[-1])
    weight = head_weight.detach()
    magnitude = hidden.abs().to(torch.float64 if hidden.dtype == torch.float64 else torch.float32).flatten()
    rank = math.ceil(QUANTILE * magnitude.numel())
    sigma_c = _spectral_norm(weight, chunk_elements)
    sigma_h = float(magnitude.max())
    rho = sigma_c * sigma_h
    return {"sigma_c": sigma_c, "sigma_h_max": sigma_h,
            "sigma_h_p999": float(torch.kthvalue(magnitude, rank).values),
            "rho": rho, "entropy_floor": float(entropy_floor(weight.shape[0], weight.shape[1], rho)),
            "mean_entropy": _mean_entropy(weight, hidden, softcap, chunk_elements)}


def _spectral_norm(weight: torch.Tensor, chunk_elements: int) -> float:
    """sqrt of the largest eigenvalue of W^T W (D x D, float64): cheap where |V| >> D (262,144 x 640)."""
    gram = torch.zeros(weight.shape[1], weight.shape[1], dtype=torch.float64, device=weight.device)
    step = max(1, chunk_elements // weight.shape[1])
    for start in range(0, weight.shape[0], step):
        rows = weight[start:start + step].to(torch.float64)
        gram += rows.T @ rows
    return float(torch.linalg.eigvalsh(gram)[-1].clamp_min(0.0).sqrt())


def _mean_entropy(weight: torch.Tensor, hidden: torch.Tensor, softcap: float | None, chunk_elements: int) -> float:
    """(1/N) sum_n -sum_v p_nv log p_nv over chunks of rows, p_n = softmax(z_n)."""
    dtype = torch.float64 if hidden.dtype == torch.float64 else torch.float32
    weight = weight.to(dtype)
    total = torch.zeros((), dtype=torch.float64, device=hidden.device)
    step = max(1, chunk_elements // weight.shape[0])
    for start in range(0, hidden.shape[0], step):
        logits = hidden[start:start + step].to(dtype) @ weight.T
        if softcap is not None:
            logits = softcap * torch.tanh(logits / softcap)
        log_p = torch.log_softmax(logits, dim=-1)
        total += -(log_p.exp() * log_p).sum(dim=-1).to(torch.float64).sum()
    return float(total) / hidden.shape[0]


def _validate(weight: torch.Tensor, hidden: torch.Tensor, softcap: float | None, chunk_elements: int) -> None:
    if weight.dim() != 2 or weight.shape[0] < 2 or weight.shape[1] < 1:
        raise ValueError(f"expected head_weight of shape (|V| >= 2, D >= 1), got {tuple(weight.shape)}")
    if hidden.dim() < 1 or hidden.shape[-1] != weight.shape[1] or hidden.numel() == 0:
        raise ValueError(f"expected hidden of shape (..., {weight.shape[1]}) with at least one state, got "
                         f"{tuple(hidden.shape)}")
    if not (weight.is_floating_point() and hidden.is_floating_point()) or weight.device != hidden.device:
        raise ValueError(f"expected floating head_weight and hidden on one device, got {weight.dtype} on "
                         f"{weight.device} and {hidden.dtype} on {hidden.device}")
    if softcap is not None and not softcap > 0 or chunk_elements < 1:
        raise ValueError(f"expected softcap None or > 0 and chunk_elements >= 1, got {softcap} and {chunk_elements}")
