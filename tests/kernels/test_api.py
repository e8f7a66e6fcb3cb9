"""Validation, reductions, all-ignored behaviour and statistics of the public API (CPU path)."""

from __future__ import annotations

import pytest
import torch

from kernels import LCEStats, linear_cross_entropy
from kernels.reference import reference_cross_entropy
from kernels.testing import make_case


@pytest.fixture(autouse=True)
def _torch_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)


def _case() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return make_case(8, 10, 4, torch.float32)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (dict(targets=torch.tensor([0, 1, 2, 3, 4, 5, 6, 10])), "expected targets in \\[0, 10\\)"),
        (dict(targets=torch.tensor([0, 1, 2, 3, 4, 5, 6, -1])), "expected targets in"),
        (dict(targets=torch.zeros(8, dtype=torch.int32)), "expected targets dtype torch.int64"),
        (dict(targets=torch.zeros(7, dtype=torch.int64)), "expected targets of shape \\(8,\\)"),
        (dict(weight=torch.zeros(10, 5)), "expected weight.shape\\[1\\]"),
        (dict(weight=torch.zeros(10, 4, dtype=torch.float64)), "expected weight dtype torch.float32"),
        (dict(weight=torch.zeros(0, 4)), "expected weight of shape \\(V, D\\) with V >= 1"),
        (dict(hidden=torch.zeros(4)), "expected hidden of shape"),
        (dict(hidden=torch.zeros(8, 4, dtype=torch.int32), weight=torch.zeros(10, 4, dtype=torch.int32)),
         "expected hidden dtype"),
        (dict(weight=torch.zeros(10, 4, device="meta")), "expected hidden, weight, targets on one device"),
        (dict(label_smoothing=1.0), "expected label_smoothing in \\[0, 1\\)"),
        (dict(label_smoothing=-0.1), "expected label_smoothing in \\[0, 1\\)"),
        (dict(softcap=0.0), "expected softcap None or > 0"),
        (dict(softcap=-3.0), "expected softcap None or > 0"),
        (dict(reduction="avg"), "expected reduction in"),
        (dict(filter="fast"), "expected filter in \\('exact', 'loose', 'none'\\), got 'fast'"),
    ],
)
def test_clear_errors(change: dict, message: str) -> None:
    hidden, weight, targets = _case()
    args = dict(hidden=hidden, weight=weight, targets=targets)
    kwargs = {k: change.pop(k) for k in list(change) if k not in args}
    args.update(change)
    with pytest.raises(ValueError, match=message):
        linear_cross_entropy(args["hidden"], args["weight"], args["targets"], **kwargs)


def test_custom_ignore_index() -> None:
    hidden, weight, targets = _case()
    targets[2] = 50
    ours = linear_cross_entropy(hidden, weight, targets, ignore_index=50, label_smoothing=0.1)
    ref = reference_cross_entropy(hidden, weight, targets, ignore_index=50, label_smoothing=0.1)
    torch.testing.assert_close(ours.double(), ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_all_ignored_gives_zero_loss_and_zero_grads(reduction: str) -> None:
    """Deliberate difference from torch, whose "mean" over no tokens is nan: we return 0 (and sum is 0)."""
    hidden, weight, _ = _case()
    hidden.requires_grad_(True)
    weight.requires_grad_(True)
    targets = torch.full((8,), -100)
    loss = linear_cross_entropy(hidden, weight, targets, label_smoothing=0.1, reduction=reduction)
    assert loss.item() == 0.0
    loss.backward()
    assert hidden.grad.abs().max().item() == 0.0 and weight.grad.abs().max().item() == 0.0


def test_empty_input() -> None:
    weight = torch.randn(10, 4)
    loss = linear_cross_entropy(torch.zeros(0, 4), weight, torch.zeros(0, dtype=torch.int64))
    assert loss.item() == 0.0


def test_stats() -> None:
    hidden, weight, targets = make_case(9, 30, 6, torch.float32, ignore_frac=0.3, seed=2)
    targets[0] = 3
    targets[1] = -100
    loss, stats = linear_cross_entropy(hidden, weight, targets, softcap=4.0, reduction="none", return_stats=True)
    assert isinstance(stats, LCEStats)
    logits = 4.0 * torch.tanh(hidden.double() @ weight.double().T / 4.0)
    probs = logits.softmax(dim=1)
    valid = targets != -100
    torch.testing.assert_close(stats.lse.double(), logits.logsumexp(dim=1), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(stats.max_prob.double(), probs.amax(dim=1), rtol=1e-5, atol=1e-6)
    p_target = probs.gather(1, targets.clamp_min(0)[:, None]).squeeze(1)
    torch.testing.assert_close(stats.target_prob[valid].double(), p_target[valid], rtol=1e-5, atol=1e-6)
    assert torch.isnan(stats.target_prob[~valid]).all()
    assert not stats.lse.requires_grad
