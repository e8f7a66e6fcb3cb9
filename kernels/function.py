"""The autograd Function shared by both backends: forward keeps only O(N) state, backward recomputes.

A backend supplies `forward(E, C, y, beta, ignore_index, softcap, filter, keep_logits) -> (loss, lse, p_target,
p_max, saved)` (per token, float32; `saved`: O(N + V) tensors, or dC's storage, allocated early to hold logits for
the backward, where keep_logits says dC will be needed) and
`backward(E, C, y, saved, g, beta, ignore_index, softcap, filter, need_dE, need_dC, plan_verdict) -> (dE, dC)`
(filter: one of kernels.filter.FILTERS; plan_verdict: None, or called with whether the filter's plan sent the
backward dense, by a backend that plans).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch


class Backend(Protocol):
    def forward(
        self, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
        label_smoothing: float, ignore_index: int, softcap: float | None, filter: str, keep_logits: bool,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, tuple[torch.Tensor, ...]]: ...

    def backward(
        self, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, saved: tuple[torch.Tensor, ...],
        grad_loss: torch.Tensor, label_smoothing: float, ignore_index: int, softcap: float | None, filter: str,
        need_hidden_grad: bool, need_weight_grad: bool, plan_verdict: Callable[[bool], None] | None = None,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]: ...


class LinearCrossEntropyFunction(torch.autograd.Function):
    """Per-token label-smoothed cross-entropy of hidden @ weight.T; the statistics are non-differentiable."""

    @staticmethod
    def forward(
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        targets: torch.Tensor,
        backend: Backend,
        label_smoothing: float,
        ignore_index: int,
        softcap: float | None,
        filter: str = "exact",
        input_check: Callable[[], None] | None = None,
        keep_logits: bool = False,
        plan_verdict: Callable[[bool], None] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """input_check: raises on bad input; called at the end of the backward (after its work is queued).
        keep_logits: the backward will compute the weight's gradient (autograd cannot tell inside forward).
        plan_verdict: handed to the backend's backward (the caller's plan history, kernels/plan_history.py)."""
        loss, lse, target_prob, max_prob, saved = backend.forward(
            hidden, weight, targets, label_smoothing, ignore_index, softcap, filter, keep_logits
        )
        ctx.save_for_backward(hidden, weight, targets, *saved)
        ctx.backend, ctx.label_smoothing, ctx.ignore_index, ctx.softcap, ctx.filter, ctx.input_check = (
            backend, label_smoothing, ignore_index, softcap, filter, input_check,
        )
        ctx.plan_verdict = plan_verdict
        ctx.mark_non_differentiable(lse, target_prob, max_prob)
        return loss, lse, target_prob, max_prob

    @staticmethod
    def backward(ctx: Any, grad_loss: torch.Tensor, *_unused: torch.Tensor) -> tuple[Any, ...]:
        hidden, weight, targets, *saved = ctx.saved_tensors
        d_hidden, d_weight = ctx.backend.backward(
            hidden, weight, targets, tuple(saved), grad_loss.contiguous(), ctx.label_smoothing, ctx.ignore_index,
            ctx.softcap, ctx.filter, ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.plan_verdict,
        )
        if ctx.input_check is not None:
            ctx.input_check()
        return d_hidden, d_weight, None, None, None, None, None, None, None, None, None
