"""ATS's selective smoothing loss, through ``kernels.linear_cross_entropy`` (no (N, V) logits), and its reference.

With z_i = (h_i / tau_i) W^T (so softcap s(z) = s tanh(z / s) when the model caps its logits), per target token:

    right (argmax_v z_iv == y_i):  l_i = CE(z_i, onehot(y_i)) = LSE_i - z_iy                 (beta 0)
    wrong:                          l_i = CE(z_i, uniform)     = LSE_i - (1 / V) sum_v z_iv   (the beta -> 1 limit)

The kernel takes beta in [0, 1), so the uniform term is two of its reductions: with L_i(beta) = LSE_i -
(1 - beta) z_iy - beta mean_v z_iv, CE(z_i, uniform) = 2 L_i(1/2) - L_i(0), an identity of the kernel's own loss
(softcap included). One call at beta 0 over every target token gives L_i(0) and, from its statistics, which tokens
are right (p_target >= p_max: the target is the top token; tau > 0 never changes which); a second at beta 1/2 runs
over the wrong tokens only (the right ones are ignored). Gradients reach tau, and the head, through h_i / tau_i.

Weights (the authors' ``SelectiveSmoothingLoss`` with ``weighted_average=True``): with n_r right and n_w wrong
tokens, n = n_r + n_w, a_r = (1 - alpha) n_w / n and a_w = alpha n_r / n, normalised to a_r + a_w = 1,

    loss = a_r mean_right(l) + a_w mean_wrong(l)

(0 when either class is empty; ``balanced=False``: a_r = 1 - alpha, a_w = alpha). The authors' means also count
ignored (prompt, padding) positions as wrong with loss 0; here only target tokens count.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import kernels
from kernels.plan_history import PlanHistory

IGNORE_INDEX = -100


def _combine(right: torch.Tensor, wrong: torch.Tensor, per_token: torch.Tensor, alpha: float,
             balanced: bool) -> torch.Tensor:
    """a_r mean_right + a_w mean_wrong of ``per_token`` (the module doc's weights)."""
    n_right, n_wrong = right.sum().to(per_token.dtype), wrong.sum().to(per_token.dtype)
    w_right, w_wrong = (1 - alpha) * torch.ones_like(n_right), alpha * torch.ones_like(n_right)
    if balanced:
        w_right, w_wrong = w_right * n_wrong, w_wrong * n_right  # the common 1 / n cancels in the normalisation
        norm = (w_right + w_wrong).clamp_min(torch.finfo(per_token.dtype).tiny)
        w_right, w_wrong = w_right / norm, w_wrong / norm
    weights = torch.where(right, w_right / n_right.clamp_min(1), torch.where(wrong, w_wrong / n_wrong.clamp_min(1), 0))
    return (weights * per_token).sum()


def selective_smoothing_loss(hidden: torch.Tensor, log_temperature: torch.Tensor, weight: torch.Tensor,
                             targets: torch.Tensor, *, alpha: float = 0.5, balanced: bool = True,
                             softcap: float | None = None,
                             plan_history: PlanHistory | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, right) for hidden (N, D), log_temperature (N,), the output embedding weight (V, D) and targets (N,)
    (IGNORE_INDEX: not a target). ``right`` (N,) bool marks target tokens the model ranks first. The scaled rows
    h_i / tau_i are rounded to ``weight``'s dtype for the kernel; the loss is float32 (float64 for float64 input).
    ``plan_history``: the caller's, for both kernel calls (the fit's loop owns one, kernels/plan_history.py)."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"expected alpha in [0, 1], got {alpha}")
    if log_temperature.shape != targets.shape or hidden.shape[:-1] != targets.shape:
        raise ValueError(f"expected hidden (N, D), log_temperature (N,) and targets (N,), got {tuple(hidden.shape)}, "
                         f"{tuple(log_temperature.shape)} and {tuple(targets.shape)}")
    compute = torch.promote_types(torch.promote_types(hidden.dtype, log_temperature.dtype), torch.float32)
    scaled = (hidden.to(compute) * torch.exp(-log_temperature.to(compute))[:, None]).to(weight.dtype)
    valid = targets != IGNORE_INDEX
    onehot, stats = kernels.linear_cross_entropy(scaled, weight, targets, reduction="none", softcap=softcap,
                                                 return_stats=True, plan_history=plan_history)
    right = valid & (stats.target_prob >= stats.max_prob)
    wrong = valid & ~right
    half = kernels.linear_cross_entropy(scaled, weight, torch.where(wrong, targets, IGNORE_INDEX),
                                        label_smoothing=0.5, reduction="none", softcap=softcap,
                                        plan_history=plan_history)
    per_token = torch.where(right, onehot, torch.where(wrong, 2 * half - onehot, 0))
    return _combine(right, wrong, per_token, alpha, balanced), right


def reference_selective_smoothing_loss(hidden: torch.Tensor, log_temperature: torch.Tensor, weight: torch.Tensor,
                                       targets: torch.Tensor, *, alpha: float = 0.5, balanced: bool = True,
                                       softcap: float | None = None) -> torch.Tensor:
    """The truth for tests: materialised float64 logits z_i / tau_i, argmax for right and wrong,
    ``F.cross_entropy`` with one-hot targets and with ``label_smoothing=1.0`` (the uniform target)."""
    logits = (hidden.double() / torch.exp(log_temperature.double())[:, None]) @ weight.double().T
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    valid = targets != IGNORE_INDEX
    safe = torch.where(valid, targets, 0)
    right = valid & (logits.argmax(-1) == safe)
    wrong = valid & ~right
    onehot = F.cross_entropy(logits, safe, reduction="none")
    uniform = F.cross_entropy(logits, safe, label_smoothing=1.0, reduction="none")
    return _combine(right, wrong, torch.where(right, onehot, torch.where(wrong, uniform, 0)), alpha, balanced)
