"""The chunked PyTorch (CPU) path against the float64 reference: loss and both gradients."""

from __future__ import annotations

import pytest
import torch

from kernels import linear_cross_entropy, reference
from kernels.api import TORCH_BACKEND, select_backend
from kernels.testing import assert_accurate, loss_and_grads, make_case, truth_and_torch

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.fixture(autouse=True)
def _small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Force several chunks (and a ragged last one) even on small inputs."""
    monkeypatch.setattr(reference, "_CHUNK_ELEMENTS", 7 * 123)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)


def test_cpu_dispatches_to_torch_path() -> None:
    assert select_backend(torch.zeros(1, 1)) is TORCH_BACKEND


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("beta", [0.0, 0.1])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_matches_reference(dtype: torch.dtype, beta: float, reduction: str) -> None:
    hidden, weight, targets = make_case(37, 123, 24, dtype, ignore_frac=0.2)
    kw = dict(label_smoothing=beta, reduction=reduction)
    ours = loss_and_grads(linear_cross_entropy, hidden, weight, targets, **kw)
    assert_accurate(ours, *truth_and_torch(hidden, weight, targets, **kw), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("beta", [0.0, 0.3])
def test_softcap(dtype: torch.dtype, beta: float) -> None:
    hidden, weight, targets = make_case(29, 123, 24, dtype, ignore_frac=0.1, seed=3)
    kw = dict(label_smoothing=beta, softcap=5.0)
    ours = loss_and_grads(linear_cross_entropy, hidden, weight, targets, **kw)
    assert_accurate(ours, *truth_and_torch(hidden, weight, targets, **kw), dtype)


@pytest.mark.parametrize("beta", [0.0, 0.1])
def test_peaked(beta: float) -> None:
    hidden, weight, targets = make_case(40, 123, 32, torch.bfloat16, peaked=True, seed=5)
    kw = dict(label_smoothing=beta)
    ours = loss_and_grads(linear_cross_entropy, hidden, weight, targets, **kw)
    assert_accurate(ours, *truth_and_torch(hidden, weight, targets, **kw), torch.bfloat16)


def test_single_token_and_batch_dims() -> None:
    hidden, weight, targets = make_case(6, 50, 16, torch.float32, seed=7)
    one = loss_and_grads(linear_cross_entropy, hidden[:1], weight, targets[:1], label_smoothing=0.1)
    truth, own = truth_and_torch(hidden[:1], weight, targets[:1], label_smoothing=0.1)
    assert_accurate(one, truth, own, torch.float32)
    flat = linear_cross_entropy(hidden, weight, targets, reduction="none")
    batched = linear_cross_entropy(hidden.reshape(2, 3, 16), weight, targets.reshape(2, 3), reduction="none")
    assert batched.shape == (2, 3)
    torch.testing.assert_close(batched.reshape(-1), flat)


def test_non_contiguous_inputs() -> None:
    hidden, weight, targets = make_case(31, 77, 20, torch.float32, ignore_frac=0.2, seed=9)
    h_nc = torch.stack([hidden, hidden], dim=2)[..., 0]  # stride 2 in the last dimension
    w_nc = weight.T.contiguous().T  # column-major
    y_nc = torch.stack([targets, targets], dim=1)[:, 0]
    assert not (h_nc.is_contiguous() or w_nc.is_contiguous() or y_nc.is_contiguous())
    ours = loss_and_grads(linear_cross_entropy, h_nc, w_nc, y_nc, label_smoothing=0.1)
    assert_accurate(ours, *truth_and_torch(hidden, weight, targets, label_smoothing=0.1), torch.float32)


def test_gradcheck_float64() -> None:
    hidden, weight, targets = make_case(5, 11, 4, torch.float64, ignore_frac=0.2, seed=11)
    hidden.requires_grad_(True)
    weight.requires_grad_(True)
    for softcap in (None, 2.0):
        assert torch.autograd.gradcheck(
            lambda h, w: linear_cross_entropy(h, w, targets, label_smoothing=0.2, softcap=softcap, reduction="sum"),
            (hidden, weight),
        )


def test_beta_zero_is_plain_cross_entropy() -> None:
    hidden, weight, targets = make_case(13, 40, 8, torch.float32, seed=13)
    plain = torch.nn.functional.cross_entropy(hidden @ weight.T, targets)
    torch.testing.assert_close(linear_cross_entropy(hidden, weight, targets, label_smoothing=0.0), plain)


def test_loose_filter_is_exact_on_the_torch_path() -> None:
    """The chunked path computes whole chunks of logits, so it filters nothing: "loose" gives the exact result."""
    hidden, weight, targets = make_case(37, 123, 24, torch.bfloat16, ignore_frac=0.2, seed=5)
    loose = loss_and_grads(linear_cross_entropy, hidden, weight, targets, label_smoothing=0.1, filter="loose")
    exact = loss_and_grads(linear_cross_entropy, hidden, weight, targets, label_smoothing=0.1)
    assert all(torch.equal(a, b) for a, b in zip(loose, exact))
