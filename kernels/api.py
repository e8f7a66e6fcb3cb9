"""Public entry point: input validation, backend dispatch and reduction.

Dispatch: CUDA tensors use the Triton kernels; CPU tensors use the chunked PyTorch path, except that with
the environment variable TRITON_INTERPRET=1 the Triton kernels run on CPU (for tests).
"""

from __future__ import annotations

import functools
import os
from types import SimpleNamespace
from typing import NamedTuple

import torch

from kernels import reference
from kernels._host import AsyncHostCopy
from kernels.filter import FILTERS
from kernels.function import Backend, LinearCrossEntropyFunction
from kernels.plan_history import PlanHistory, plan_key

_REDUCTIONS = ("mean", "sum", "none")
_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)

TORCH_BACKEND: Backend = SimpleNamespace(forward=reference.chunked_forward, backward=reference.chunked_backward)


class LCEStats(NamedTuple):
    """Per-token statistics (float32, shape of targets): log-sum-exp of the logits, probability of the
    target (nan where the target is ignored) and the largest probability."""

    lse: torch.Tensor
    target_prob: torch.Tensor
    max_prob: torch.Tensor


def _triton_backend() -> Backend:
    from kernels import triton_backend  # imported lazily: the CPU path must not need a working Triton

    return triton_backend.BACKEND


def select_backend(hidden: torch.Tensor) -> Backend:
    """Triton for CUDA tensors (or any tensors under TRITON_INTERPRET=1), else the chunked PyTorch path."""
    if hidden.is_cuda or os.environ.get("TRITON_INTERPRET") == "1":
        return _triton_backend()
    return TORCH_BACKEND


def _validate(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, label_smoothing: float,
    ignore_index: int, reduction: str, softcap: float | None, filter: str,
) -> None:
    for name, t in (("hidden", hidden), ("weight", weight), ("targets", targets)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"expected {name} to be a torch.Tensor, got {type(t).__name__}")
    if hidden.dim() < 2:
        raise ValueError(f"expected hidden of shape (..., D), got shape {tuple(hidden.shape)}")
    if weight.dim() != 2 or weight.shape[0] == 0:
        raise ValueError(f"expected weight of shape (V, D) with V >= 1, got shape {tuple(weight.shape)}")
    if weight.shape[1] != hidden.shape[-1]:
        raise ValueError(f"expected weight.shape[1] == hidden.shape[-1] == {hidden.shape[-1]}, got {weight.shape[1]}")
    if tuple(targets.shape) != tuple(hidden.shape[:-1]):
        raise ValueError(f"expected targets of shape {tuple(hidden.shape[:-1])}, got {tuple(targets.shape)}")
    allowed = _FLOAT_DTYPES + ((torch.float64,) if select_backend(hidden) is TORCH_BACKEND else ())
    if hidden.dtype not in allowed:
        raise ValueError(f"expected hidden dtype in {allowed}, got {hidden.dtype}")
    if weight.dtype != hidden.dtype:
        raise ValueError(f"expected weight dtype {hidden.dtype} (same as hidden), got {weight.dtype}")
    if targets.dtype != torch.int64:
        raise ValueError(f"expected targets dtype torch.int64, got {targets.dtype}")
    if weight.device != hidden.device or targets.device != hidden.device:
        raise ValueError(
            f"expected hidden, weight, targets on one device, got {hidden.device}, {weight.device}, {targets.device}"
        )
    if not 0.0 <= label_smoothing < 1.0:
        raise ValueError(f"expected label_smoothing in [0, 1), got {label_smoothing}")
    if reduction not in _REDUCTIONS:
        raise ValueError(f"expected reduction in {_REDUCTIONS}, got {reduction!r}")
    if softcap is not None and not softcap > 0.0:
        raise ValueError(f"expected softcap None or > 0, got {softcap}")
    if filter not in FILTERS:
        raise ValueError(f"expected filter in {FILTERS}, got {filter!r}")


class TargetRangeCheck:
    """Raises ValueError naming the first target outside [0, vocab) that is not ignore_index. `start()` queues
    the test and a host copy of its flag; calling reads the flag. On CUDA, started after the forward kernels and
    called at the end of the backward, it costs no host sync that leaves the GPU idle (the kernels treat such
    targets as ignored meanwhile)."""

    def __init__(self, targets: torch.Tensor, ignore_index: int, vocab: int) -> None:
        self._targets, self._ignore_index, self._vocab = targets, ignore_index, vocab

    def start(self) -> TargetRangeCheck:
        targets, vocab = self._targets, self._vocab
        self._bad = (targets != self._ignore_index) & ((targets < 0) | (targets >= vocab))
        self._flag = AsyncHostCopy(self._bad.any().reshape(1))
        return self

    def __call__(self) -> None:
        if self._flag.get()[0]:
            raise ValueError(
                f"expected targets in [0, {self._vocab}) or == ignore_index ({self._ignore_index}), "
                f"got {self._targets[self._bad][0].item()}"
            )


def linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    label_smoothing: float = 0.0,
    ignore_index: int = -100,
    reduction: str = "mean",
    softcap: float | None = None,
    return_stats: bool = False,
    filter: str = "exact",
    plan_history: PlanHistory | None = None,
) -> torch.Tensor | tuple[torch.Tensor, LCEStats]:
    """F.cross_entropy(hidden @ weight.T, targets, label_smoothing=..., ...) without the (N, V) logits.

    hidden (..., D), weight (V, D), targets (...) int64. softcap s caps logits as s * tanh(z / s) first.
    reduction "mean" averages over non-ignored tokens; when every token is ignored it returns 0 (torch returns
    nan) with zero gradients. The loss is float32 (float64 for float64 inputs) whatever the input dtype.
    With return_stats=True also returns LCEStats (detached).
    filter picks the backward's gradient filter (Triton path; the CPU path is dense; kernels/filter.py): the
    vocabulary is sorted by mean logit and the tokens by how far into it their probability mass reaches, and each
    block of 128 tokens skips its trailing vocabulary tiles while their mass sums to at most B per token: "exact"
    B = 2^-10 for 16-bit inputs (under their rounding; float32: every tile), "loose" B = 2^-8, "none" every tile.
    The loss and the target and label-smoothing parts of the gradient are never filtered. Without gradients the
    forward does no filter work. With ``plan_history`` (the caller's, kernels/plan_history.py), where a plan keeps so
    much that the backward runs dense (a flat softmax, a small vocabulary), the next 15 calls of that head shape and
    filter skip planning (every tile computed) and the 16th plans again; without it every call with gradients plans.
    The call keeps no state of its own.
    Bad input raises ValueError; on CUDA with gradients required, an out-of-range target raises in backward().
    """
    _validate(hidden, weight, targets, label_smoothing, ignore_index, reduction, softcap, filter)
    check = TargetRangeCheck(targets, ignore_index, weight.shape[0])
    if not hidden.is_cuda:  # the CPU path indexes with the targets: checked first
        check.start()()
    lead_shape = targets.shape
    flat_hidden = hidden.reshape(-1, hidden.shape[-1])
    flat_targets = targets.reshape(-1)
    backend = select_backend(flat_hidden)
    # CUDA: with gradients, the check raises at the end of the backward (no host sync in the forward)
    wants_grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    backward_check = check if hidden.is_cuda and wants_grad else None
    run_filter, plan_verdict = "none", None  # without gradients no filter work
    if wants_grad:  # with them, none while the history's last plan for this head went dense
        run_filter = filter
        if plan_history is not None and backend is not TORCH_BACKEND:
            key = plan_key(weight, filter)
            run_filter, plan_verdict = plan_history.filter_for(key), functools.partial(plan_history.record, key)
    loss, lse, target_prob, max_prob = LinearCrossEntropyFunction.apply(
        flat_hidden, weight, flat_targets, backend, float(label_smoothing), int(ignore_index),
        None if softcap is None else float(softcap), run_filter, backward_check, wants_grad and weight.requires_grad,
        plan_verdict,
    )
    if hidden.is_cuda:  # queued behind the forward kernels
        check.start()
        if backward_check is None:
            check()
    if reduction == "sum":
        out = loss.sum()
    elif reduction == "mean":
        count = (flat_targets != ignore_index).sum().clamp_min(1)
        out = loss.sum() / count
    else:
        out = loss.reshape(lead_shape)
    if not return_stats:
        return out
    return out, LCEStats(lse.reshape(lead_shape), target_prob.reshape(lead_shape), max_prob.reshape(lead_shape))
