"""The Triton kernels on CUDA: the paper's shape (N=8192, V=256000, D=2304, bf16) against a float64 truth,
and the other dtypes, softcap and odd sizes at a moderate shape. Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch

if not torch.cuda.is_available():  # before the kernels are defined: the interpreter tests define them on CPU
    pytest.skip("needs CUDA", allow_module_level=True)

from kernels import backward, forward, linear_cross_entropy  # noqa: E402
from kernels import filter as lce_filter  # noqa: E402
from kernels.head_sum import head_column_sum  # noqa: E402
from kernels.reference import reference_cross_entropy  # noqa: E402
from kernels.testing import (  # noqa: E402
    assert_accurate, chunked_truth, filter_slack, filtered_truth, loss_and_grads, make_case, truth_and_torch,
)

pytestmark = pytest.mark.gpu
N, V, D = 8192, 256000, 2304


def _torch_bf16(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, **kw: object) -> tuple:
    return loss_and_grads(
        lambda h, w, y, **k: reference_cross_entropy(h, w, y, dtype=torch.bfloat16, **k), hidden, weight, targets, **kw
    )


@pytest.mark.parametrize("peaked", [False, True], ids=["random", "peaked"])
def test_paper_shape(peaked: bool) -> None:
    """Random inputs and peaked ones, beta = 0.1, 5% ignored, against the float64 truth: "none" (dense) by the
    plain rule, "exact" and "loose" within their bounds; on a flat softmax both keep over STAIRCASE_MAX_SHARE of
    the tiles (so the backward runs dense), on peaked inputs both filters skip nearly every tile and stay within
    their bound of "none"."""
    hidden, weight, targets = make_case(N, V, D, torch.bfloat16, peaked=peaked, ignore_frac=0.05, device="cuda")
    kw = dict(label_smoothing=0.1)
    *_, saved = forward.triton_forward(hidden, weight, targets, 0.1, -100, None, "none", keep_logits=True)
    assert saved[-1].shape == (forward.kept_chunks(N, V, D) * 32, N) == (256, N)  # "none" keeps 256 tiles' logits
    del saved
    dense = loss_and_grads(linear_cross_entropy, hidden, weight, targets, filter="none", **kw)
    truth = chunked_truth(hidden, weight, targets, **kw)
    own = _torch_bf16(hidden, weight, targets, **kw)
    assert_accurate(dense, truth, own, torch.bfloat16)
    tiles = -(-V // forward.TILES.block_v)
    g = (targets != -100).double() / (targets != -100).sum()
    ulp = 2.0**-8
    for name in ("exact", "loose"):
        *_, (_, _, _, _, _, kept, *_) = forward.triton_forward(hidden, weight, targets, 0.1, -100, None, name)
        share = lce_filter.kept_share(kept, tiles)
        assert share < 0.01 if peaked else share > backward.STAIRCASE_MAX_SHARE
        ours = loss_and_grads(linear_cross_entropy, hidden, weight, targets, filter=name, **kw)
        mass = lce_filter.FILTER_MASS[name]
        assert_accurate(ours, truth, own, torch.bfloat16, slack=filter_slack(hidden, weight, targets, mass))
        if not peaked:  # the backward ran dense; only the forward's vocabulary order (its rounding) differs
            continue
        d_hidden = (ours[1] - dense[1]).abs()
        assert (d_hidden <= mass * g.max() * weight.double().abs().max() + ulp * dense[1].abs()).all()
        d_weight = (ours[2] - dense[2]).abs().sum(dim=0).max()
        assert d_weight <= mass * hidden.double().abs().max() + ulp * dense[2].abs().sum()


@pytest.mark.parametrize(
    ("dtype", "beta", "softcap", "reduction"),
    [
        (torch.float16, 0.1, None, "mean"),
        (torch.float32, 0.1, None, "sum"),
        (torch.bfloat16, 0.1, 30.0, "none"),
        (torch.bfloat16, 0.0, 30.0, "mean"),
        (torch.bfloat16, 0.0, None, "mean"),
    ],
)
def test_moderate_shape(dtype: torch.dtype, beta: float, softcap: float | None, reduction: str) -> None:
    """N, V, D multiples of no block; 20% ignored tokens; non-contiguous hidden."""
    hidden, weight, targets = make_case(1000, 50000, 520, dtype, ignore_frac=0.2, seed=1, device="cuda")
    kw = dict(label_smoothing=beta, softcap=softcap, reduction=reduction)
    h_nc = torch.stack([hidden, hidden], dim=2)[..., 0]
    ours = loss_and_grads(linear_cross_entropy, h_nc, weight, targets, **kw)
    assert_accurate(ours, *truth_and_torch(hidden, weight, targets, **kw), dtype)


@pytest.mark.parametrize(("filter_name", "dz_block_v", "column_major"),
                         [("loose", 256, False), ("loose", 128, True), ("exact", 256, False), ("none", 256, False)])
def test_mixed_filtering(filter_name: str, dz_block_v: int, column_major: bool, monkeypatch: pytest.MonkeyPatch,
                         ) -> None:
    """Peaked rows, one flat and one intermediate row block: vocabulary chunks kept by all rows, by trailing rows
    only, or by none; exactly the float64 gradient with the dropped tiles' softmax part removed, at most the budget
    dropped per token, within the filter's tolerance of the plain truth; dZ tiles 128 wide; column-major hidden
    and weight (strided operands: pointer loads, no copy of the head)."""
    monkeypatch.setattr(backward, "TILES", backward.BackwardTiles(dz_block_v=dz_block_v))
    hidden, weight, targets = make_case(1000, 50000, 512, torch.bfloat16, peaked=True, ignore_frac=0.1, device="cuda")
    hidden[128:256] *= 0.05
    hidden[256:384] *= 0.5
    kw = dict(label_smoothing=0.1)
    h_in, w_in = hidden, weight
    if column_major:
        h_in, w_in = hidden.T.contiguous().T, weight.T.contiguous().T  # dense, so loss_and_grads' clone keeps them
    ours = loss_and_grads(linear_cross_entropy, h_in, w_in, targets, filter=filter_name, **kw)
    truth, own = truth_and_torch(hidden, weight, targets, **kw)
    if filter_name == "none":
        assert_accurate(ours, truth, own, torch.bfloat16)
        return
    *_, (_, _, _, order, rows, kept, *_) = forward.triton_forward(hidden, weight, targets, 0.1, -100, None, filter_name)
    tiles = -(-50000 // forward.TILES.block_v)
    assert kept[0] == 0 and kept[-1] > tiles // 2 and 0.0 < lce_filter.kept_share(kept, tiles) < 0.5
    per_token = lce_filter.kept_per_token(rows, kept, 1000, forward.TILES.block_n)
    *filtered, dropped = filtered_truth(hidden, weight, targets, per_token, forward.TILES.block_v, 0.1, order)
    budget = lce_filter.FILTER_MASS[filter_name]
    assert dropped.max().item() <= budget
    assert_accurate(ours, tuple(filtered), tuple(f + (o - t) for f, o, t in zip(filtered, own, truth)), torch.bfloat16)
    assert_accurate(ours, truth, own, torch.bfloat16, slack=filter_slack(hidden, weight, targets, budget))


def test_out_of_range_target_raises_after_the_kernels() -> None:
    """On CUDA the range check runs once the forward is queued: raised by the forward without gradients, by
    backward() with them; the kernels must not read out of bounds, and the device stays usable."""
    hidden, weight, targets = make_case(300, 5000, 128, torch.bfloat16, device="cuda")
    bad = targets.clone()
    bad[7] = 5000
    message = r"expected targets in \[0, 5000\) or == ignore_index \(-100\), got 5000"
    with pytest.raises(ValueError, match=message):
        linear_cross_entropy(hidden, weight, bad)
    loss = linear_cross_entropy(hidden.clone().requires_grad_(True), weight, bad, label_smoothing=0.1)
    with pytest.raises(ValueError, match=message):
        loss.backward()
    bad[7] = -3
    with pytest.raises(ValueError, match="got -3"):
        linear_cross_entropy(hidden, weight.clone().requires_grad_(True), bad).backward()
    torch.cuda.synchronize()
    ours = loss_and_grads(linear_cross_entropy, hidden, weight, targets)
    assert_accurate(ours, *truth_and_torch(hidden, weight, targets), torch.bfloat16)


def test_single_token_and_all_ignored() -> None:
    hidden, weight, targets = make_case(3, 50000, 512, torch.bfloat16, seed=2, device="cuda")
    one = loss_and_grads(linear_cross_entropy, hidden[:1], weight, targets[:1], label_smoothing=0.1)
    assert_accurate(one, *truth_and_torch(hidden[:1], weight, targets[:1], label_smoothing=0.1), torch.bfloat16)
    h = hidden.clone().requires_grad_(True)
    loss = linear_cross_entropy(h, weight, torch.full_like(targets, -100), label_smoothing=0.1)
    loss.backward()
    assert loss.item() == 0.0 and h.grad.abs().max().item() == 0.0


@pytest.mark.parametrize(("vocab", "dim"), [(262144, 640), (256000, 2304), (1001, 257)])
def test_head_column_sum(vocab: int, dim: int) -> None:
    """sum_v C_v (the forward's logit sum is E_i . sum_v C_v) on the GPU's grid against float64: within 1e-6 of
    sum_v |C_vd| per column; the same bits on a second call (no atomics)."""
    weight = (torch.randn(vocab, dim, device="cuda") + 1.0).to(torch.bfloat16)
    got = head_column_sum(weight, forward.num_sms(weight.device))
    exact = weight.double().sum(dim=0)
    assert ((got.double() - exact).abs() <= 1e-6 * weight.double().abs().sum(dim=0)).all()
    assert torch.equal(head_column_sum(weight, forward.num_sms(weight.device)), got)


def test_precompile_leaves_nothing_allocated_and_stays_within_its_bytes() -> None:
    """Three trials' precompiles at the 1B head (V 128256, D 2048, 8192 tokens a micro-batch), beta 0 then 0.1: after
    each join nothing stays allocated (its threads' streams left 96 MiB of cuBLAS workspaces a call before the join
    cleared them), and the peak stays within ``precompile_bytes``. The join clears every stream's workspaces, so the
    baseline is taken without those that earlier tests' streams left."""
    from kernels.precompile import precompile, precompile_bytes

    device = torch.device("cuda", torch.cuda.current_device())
    torch.cuda.synchronize()
    torch._C._cuda_clearCublasWorkspaces()
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    for _ in range(3):
        for beta in (0.0, 0.1):
            precompile(128256, 2048, torch.bfloat16, device, 8192, beta, None, "exact")()
            assert torch.cuda.memory_allocated(device) == before
    assert torch.cuda.max_memory_allocated(device) - before <= precompile_bytes(128256, 2048, 2)
