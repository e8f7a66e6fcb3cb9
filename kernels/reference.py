"""PyTorch implementations: the chunked CPU path and the materialised float64 reference.

Notation (see ../shared/notes/ls-kernel-math.md): E = hidden (N, D), C = weight (V, D),
u = E C^T, z = u or s * tanh(u / s) with softcap s, beta = label smoothing, and

    loss_i = LSE_i - (1 - beta) z_{i,y_i} - (beta / V) sum_v z_iv,
    dloss_i / dz_iv = p_iv - (1 - beta) [v = y_i] - beta / V,   dz/du = 1 - (z / s)^2.

Ignored tokens (y_i == ignore_index) have loss 0 and gradient 0.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

# Rows per chunk are chosen so that one chunk of float32 logits holds at most this many elements (64 MiB).
_CHUNK_ELEMENTS = 1 << 24


def _rows_per_chunk(vocab: int) -> int:
    return max(1, _CHUNK_ELEMENTS // max(vocab, 1))


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 stays float64; every other dtype is computed in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _chunk_logits(e: torch.Tensor, c: torch.Tensor, softcap: float | None) -> torch.Tensor:
    """z = e c^T, capped as s * tanh(z / s) when softcap is set."""
    z = e @ c.T
    return z if softcap is None else softcap * torch.tanh(z / softcap)


def chunked_forward(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    label_smoothing: float,
    ignore_index: int,
    softcap: float | None,
    filter: str = "exact",
    keep_logits: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, tuple[torch.Tensor, ...]]:
    """Per-token (loss, LSE, target probability, max probability), all float32 (float64 for float64 input),
    and (LSE,) saved for the backward (dense: `filter` changes nothing; no logits kept whatever keep_logits).

    Holds at most one (rows_per_chunk, V) block of logits; the target probability is nan for ignored tokens.
    """
    n, vocab = hidden.shape[0], weight.shape[0]
    cdt = _compute_dtype(hidden.dtype)
    c = weight.to(cdt)
    beta = label_smoothing
    valid = targets != ignore_index
    safe_targets = torch.where(valid, targets, 0)
    loss = torch.empty(n, dtype=cdt, device=hidden.device)
    lse = torch.empty_like(loss)
    target_prob = torch.empty_like(loss)
    max_prob = torch.empty_like(loss)
    step = _rows_per_chunk(vocab)
    for start in range(0, n, step):
        rows = slice(start, min(start + step, n))
        z = _chunk_logits(hidden[rows].to(cdt), c, softcap)
        lse_c = torch.logsumexp(z, dim=1)
        z_y = z.gather(1, safe_targets[rows, None]).squeeze(1)
        loss_c = lse_c - (1.0 - beta) * z_y
        if beta > 0.0:
            loss_c = loss_c - (beta / vocab) * z.sum(dim=1)
        loss[rows] = torch.where(valid[rows], loss_c, 0.0)
        lse[rows] = lse_c
        target_prob[rows] = torch.where(valid[rows], torch.exp(z_y - lse_c), float("nan"))
        max_prob[rows] = torch.exp(z.amax(dim=1) - lse_c)
    return loss, lse, target_prob, max_prob, (lse,)


def chunked_backward(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    saved: tuple[torch.Tensor, ...],
    grad_loss: torch.Tensor,
    label_smoothing: float,
    ignore_index: int,
    softcap: float | None,
    filter: str,
    need_hidden_grad: bool,
    need_weight_grad: bool,
    plan_verdict: Callable[[bool], None] | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Gradients (dE, dC) of sum_i g_i loss_i, recomputing each chunk's logits; dense, so exact whatever
    `filter` asks (a chunk of logits costs the same with or without skipped tiles): no plan, so no
    `plan_verdict`."""
    n, vocab = hidden.shape[0], weight.shape[0]
    (lse,) = saved
    cdt = _compute_dtype(hidden.dtype)
    c = weight.to(cdt)
    beta = label_smoothing
    valid = targets != ignore_index
    safe_targets = torch.where(valid, targets, 0)
    g = torch.where(valid, grad_loss.to(cdt), 0.0)
    d_hidden = torch.empty(hidden.shape, dtype=hidden.dtype, device=hidden.device) if need_hidden_grad else None
    d_weight = torch.zeros(weight.shape, dtype=cdt, device=weight.device) if need_weight_grad else None
    step = _rows_per_chunk(vocab)
    for start in range(0, n, step):
        rows = slice(start, min(start + step, n))
        e = hidden[rows].to(cdt)
        z = _chunk_logits(e, c, softcap)
        dz = torch.exp(z - lse[rows, None].to(cdt))  # p
        # Target column: p_y - (1 - beta) = beta - sum_{v != y} p_v, exact even where p_y rounds to 1.
        y_rows = safe_targets[rows, None]
        dz.scatter_(1, y_rows, 0.0)
        dz.scatter_(1, y_rows, beta - dz.sum(dim=1, keepdim=True))
        if beta > 0.0:
            dz.sub_(beta / vocab)
        dz.mul_(g[rows, None])
        if softcap is not None:
            dz.mul_(1.0 - (z / softcap) ** 2)  # dz/du
        if d_hidden is not None:
            d_hidden[rows] = (dz @ c).to(hidden.dtype)
        if d_weight is not None:
            d_weight.addmm_(dz.T, e)
    return d_hidden, None if d_weight is None else d_weight.to(weight.dtype)


def reference_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    label_smoothing: float = 0.0,
    ignore_index: int = -100,
    reduction: str = "mean",
    softcap: float | None = None,
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """The truth for tests: F.cross_entropy on materialised (N, V) logits computed in `dtype`."""
    logits = hidden.to(dtype) @ weight.to(dtype).T
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    return F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]),
        targets.reshape(-1),
        label_smoothing=label_smoothing,
        ignore_index=ignore_index,
        reduction=reduction,
    )
