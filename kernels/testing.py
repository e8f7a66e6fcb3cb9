"""Test inputs and the accuracy rule for linear_cross_entropy (used by tests/kernels and the GPU checks).

Accuracy rule (after Cut Cross-Entropy): for float16/bfloat16 inputs, the max abs error of our loss and of
each gradient against the float64 truth must not exceed torch's own error in that dtype (F.cross_entropy on
materialised low-precision logits) plus a margin of LOWP_MARGIN * max|truth|. For float32 inputs the error
must be below FP32_RTOL * max|truth|. With a gradient filter the bound of each gradient grows by the mass the
filter may drop per token (kernels.filter.FILTER_MASS = m): m max_i g_i max|C| for dhidden, m sum_i g_i max|E|
for dweight (`filter_slack`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from kernels.api import TORCH_BACKEND
from kernels.filter import kept_per_token
from kernels.function import LinearCrossEntropyFunction
from kernels.reference import reference_cross_entropy

LOWP_MARGIN = 2e-3
FP32_RTOL = 2e-5


def make_case(
    n: int, vocab: int, dim: int, dtype: torch.dtype, *, ignore_frac: float = 0.0, peaked: bool = False,
    seed: int = 0, device: str = "cpu",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """hidden (n, dim), weight (vocab, dim), targets (n,). Random logits have std about 3; `peaked` puts each
    target row of the weight along its hidden state (CCE's trick): target logits 30, the others of order
    30 / sqrt(dim)."""
    g = torch.Generator(device=device).manual_seed(seed)
    hidden = torch.randn(n, dim, generator=g, device=device)
    weight = torch.randn(vocab, dim, generator=g, device=device) * (3.0 / dim**0.5)
    targets = torch.randint(0, vocab, (n,), generator=g, device=device)
    if peaked:
        if n <= vocab:  # distinct targets: no two tokens share (and so sum into) one weight row
            targets = torch.randperm(vocab, generator=g, device=device)[:n]
        hidden = hidden * (dim**0.5 / hidden.norm(dim=1, keepdim=True))  # target logit exactly 30 (no collision)
        weight = weight * 0.3
        weight[targets] = 0.0
        weight.index_add_(0, targets, hidden * (30.0 / dim))
    if ignore_frac > 0.0:
        targets[torch.rand(n, generator=g, device=device) < ignore_frac] = -100
    return hidden.to(dtype), weight.to(dtype), targets


def loss_and_grads(
    fn: Callable[..., torch.Tensor], hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
    reduction: str = "mean", seed: int = 1, **kwargs: object,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss, dhidden, dweight) as float64; for reduction="none" the upstream gradient is random."""
    h = hidden.detach().clone().requires_grad_(True)
    w = weight.detach().clone().requires_grad_(True)
    loss = fn(h, w, targets, reduction=reduction, **kwargs)
    if reduction == "none":
        g = torch.Generator().manual_seed(seed)
        upstream = torch.rand(loss.shape, generator=g, dtype=torch.float64).to(loss.device)
        (loss.double() * upstream).sum().backward()
    else:
        loss.backward()
    return loss.detach().double(), h.grad.double(), w.grad.double()


def chunked_truth(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, reduction: str = "mean", **kwargs: object,
) -> tuple[torch.Tensor, ...]:
    """float64 truth from the chunked PyTorch path on the inputs' device: never holds N x V (large shapes)."""

    def fn(h: torch.Tensor, w: torch.Tensor, y: torch.Tensor, reduction: str, label_smoothing: float = 0.0,
           softcap: float | None = None) -> torch.Tensor:
        loss = LinearCrossEntropyFunction.apply(h, w, y, TORCH_BACKEND, label_smoothing, -100, softcap, "exact")[0]
        return loss.sum() / (y != -100).sum() if reduction == "mean" else loss.sum() if reduction == "sum" else loss

    return loss_and_grads(fn, hidden.double(), weight.double(), targets, reduction, **kwargs)


def truth_and_torch(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, reduction: str = "mean", **kwargs: object,
) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    """float64 truth and torch's own computation in the input dtype (for the low-precision rule)."""
    truth = loss_and_grads(
        lambda h, w, y, **kw: reference_cross_entropy(h, w, y, dtype=torch.float64, **kw),
        hidden.double(), weight.double(), targets, reduction, **kwargs,
    )
    own = loss_and_grads(
        lambda h, w, y, **kw: reference_cross_entropy(h, w, y, dtype=hidden.dtype, **kw),
        hidden, weight, targets, reduction, **kwargs,
    )
    return truth, own


def filtered_truth(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, kept_tiles: torch.Tensor, block_v: int,
    label_smoothing: float = 0.0, order: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """float64 (loss, dhidden, dweight, dropped mass per token) of reduction="mean" with the softmax part p_iv
    (v != y_i) zeroed at the positions j >= kept_tiles[i] * block_v of token i, v = order[j] (v = j without order):
    exactly what a backward filtering those tiles computes (the loss, the target column and the uniform -beta / V
    part are never filtered)."""
    e, c = hidden.double(), weight.double()
    valid = targets != -100
    y = torch.where(valid, targets, 0)
    logits = e @ c.T
    p = logits.softmax(dim=1)
    positions = torch.arange(c.shape[0], device=e.device)
    kept = positions[None, :] < kept_tiles.to(e.device)[:, None] * block_v  # by position
    if order is not None:
        kept = torch.empty_like(kept).index_copy_(1, order, kept)
    is_target = torch.nn.functional.one_hot(y, c.shape[0]).bool()
    kept = kept | is_target
    g = valid.double() / valid.sum().clamp_min(1)
    dropped = torch.where(kept | ~valid[:, None], 0.0, p).sum(dim=1)
    dz = torch.where(kept, p, 0.0) - (1.0 - label_smoothing) * is_target - label_smoothing / c.shape[0]
    dz = dz * g[:, None]
    loss = reference_cross_entropy(e, c, targets, label_smoothing=label_smoothing)
    return loss, dz @ c, dz.T @ e, dropped


def filter_slack(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, mass: float,
) -> tuple[float, float, float]:
    """What dropping at most `mass` of probability per token may change, for reduction="mean": (loss: 0,
    dhidden: mass max_i g_i max|C|, dweight: mass sum_i g_i max|E|), g_i = 1 / (non-ignored tokens)."""
    count = int((targets != -100).sum().clamp_min(1))
    return 0.0, mass / count * weight.double().abs().max().item(), mass * hidden.double().abs().max().item()


def assert_accurate(
    ours: tuple[torch.Tensor, ...], truth: tuple[torch.Tensor, ...], own: tuple[torch.Tensor, ...],
    dtype: torch.dtype, margin: float = LOWP_MARGIN, slack: tuple[float, float, float] = (0.0, 0.0, 0.0),
) -> None:
    """Apply the accuracy rule of this module to (loss, dhidden, dweight); `slack` is added to each bound."""
    for name, o, t, r, extra in zip(("loss", "dhidden", "dweight"), ours, truth, own, slack):
        o, t, r = o.cpu(), t.cpu(), r.cpu()
        scale = t.abs().max().item() if t.numel() else 0.0
        err = (o - t).abs().max().item() if t.numel() else 0.0
        if dtype in (torch.float32, torch.float64):
            bound = FP32_RTOL * scale + 1e-12
        else:
            bound = (r - t).abs().max().item() + margin * scale
        bound += extra
        assert err <= bound, f"{name}: error {err:.3e} > bound {bound:.3e} (scale {scale:.3e}, {dtype})"


def assert_plan_keeps_budget(rows: torch.Tensor, kept: torch.Tensor, mass: torch.Tensor, valid: torch.Tensor,
                             budget: float, block_n: int) -> None:
    """A filter plan's guarantee, in float64: rows a permutation of the padded rows, blocks ascending by kept
    tiles, every token (mass: (tiles, n) float64 tile masses, 0 where ignored) dropping at most the budget, each
    block keeping one tile fewer exceeding it, ignored and padding rows first."""
    tiles, n = mass.shape
    padded = rows.numel()
    assert torch.equal(rows.sort().values, torch.arange(padded)) and (kept.diff() >= 0).all()
    per_token = kept_per_token(rows, kept, n, block_n)
    dropped = torch.where(torch.arange(tiles)[:, None] >= per_token[None, :], mass, 0.0).sum(dim=0)
    assert dropped.max().item() <= budget
    block_mass = torch.nn.functional.pad(mass, (0, padded - n))[:, rows].view(tiles, -1, block_n).amax(dim=2)
    one_fewer = torch.stack([block_mass[k - 1 :, b].sum() for b, k in enumerate(kept.tolist()) if k > 0])
    assert (one_fewer > budget).all()
    first = rows[:block_n]
    assert ((first >= n) | ~valid[first.clamp_max(n - 1)]).all()
