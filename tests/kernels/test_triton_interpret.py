"""The Triton kernels under TRITON_INTERPRET=1 on small shapes, against the float64 reference.

Skipped where CUDA is available (the GPU tests need the kernels compiled). Triton reads the interpreter flag
when a kernel, its own library functions included, is defined: tests/conftest.py defines them under it before
any test module is collected, and the fixture below sets it for these tests' calls.
Chunks are shrunk so that small inputs span several of them.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

if torch.cuda.is_available():
    pytest.skip("interpreter tests run on CPU-only machines", allow_module_level=True)
triton = pytest.importorskip("triton")  # a third-party package: absent on platforms without Triton wheels

import triton.language as tl  # noqa: E402
from triton.runtime import interpreter  # noqa: E402

from kernels import linear_cross_entropy  # noqa: E402
from kernels import backward, forward  # noqa: E402
from kernels._tl_utils import tma_operand  # noqa: E402
from kernels.api import select_backend  # noqa: E402
from kernels.testing import (  # noqa: E402
    assert_accurate, filtered_truth, loose_slack, loss_and_grads, make_case, truth_and_torch,
)
from kernels.triton_backend import BACKEND  # noqa: E402

# tests/conftest.py defines Triton's library and our kernels under TRITON_INTERPRET=1 before collection
if not isinstance(forward._target_logit_kernel, interpreter.InterpretedFunction):
    raise RuntimeError("the Triton kernels were defined compiled; run pytest from the repository root "
                       "(tests/conftest.py defines them under TRITON_INTERPRET=1)")

N, V, D = 300, 700, 40  # none a multiple of any block


def _cast_rounding_to_nearest(self, src, dst_type):  # noqa: ANN001, ANN202
    """Triton's interpreter truncates float32 -> bfloat16; the GPU rounds to nearest even. Do as the GPU."""
    if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
        rounded = torch.from_numpy(src.data.astype(np.float32)).to(torch.bfloat16).view(torch.uint16).numpy()
        return interpreter.TensorHandle(rounded, tl.bfloat16)
    return _TRUNCATING_CAST(self, src, dst_type)


_TRUNCATING_CAST = interpreter.InterpreterBuilder.cast_impl


@pytest.fixture(autouse=True)
def _interpret_small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(interpreter.InterpreterBuilder, "cast_impl", _cast_rounding_to_nearest)
    # N = 300, V = 700: two row chunks (256 + 44 rows) by two vocabulary chunks (512 + 188)
    monkeypatch.setattr(backward, "TILES", backward.BackwardTiles(dz_elements=256 * 512, chunk_vocab=512))


def test_dispatches_to_triton() -> None:
    assert select_backend(torch.zeros(1, 1)) is BACKEND


@pytest.mark.parametrize(
    ("dtype", "beta", "reduction"),
    [
        (torch.float32, 0.1, "mean"),
        (torch.bfloat16, 0.0, "mean"),
        (torch.bfloat16, 0.1, "sum"),
        (torch.bfloat16, 0.1, "none"),
        (torch.float16, 0.1, "mean"),
    ],
)
def test_matches_reference(dtype: torch.dtype, beta: float, reduction: str) -> None:
    hidden, weight, targets = make_case(N, V, D, dtype, ignore_frac=0.2)
    kw = dict(label_smoothing=beta, reduction=reduction)
    ours = loss_and_grads(linear_cross_entropy, hidden, weight, targets, **kw)
    assert_accurate(ours, *truth_and_torch(hidden, weight, targets, **kw), dtype)


def _small_chunks(cublas_min_active: float, dz_block_v: int = 256) -> backward.BackwardTiles:
    return backward.BackwardTiles(
        dz_elements=256 * 512, chunk_vocab=512, cublas_min_active=cublas_min_active, dz_block_v=dz_block_v,
    )


def test_dense_chunks_with_the_triton_gemms(monkeypatch: pytest.MonkeyPatch) -> None:
    """cublas_min_active = inf: dense chunks through the Triton dC / dE GEMMs, not cuBLAS."""
    monkeypatch.setattr(backward, "TILES", _small_chunks(float("inf")))
    hidden, weight, targets = make_case(N, V, D, torch.bfloat16, ignore_frac=0.2, seed=4)
    kw = dict(label_smoothing=0.1)
    ours = loss_and_grads(linear_cross_entropy, hidden, weight, targets, **kw)
    assert_accurate(ours, *truth_and_torch(hidden, weight, targets, **kw), torch.bfloat16)


@pytest.mark.parametrize(("dtype", "beta"), [(torch.bfloat16, 0.0), (torch.bfloat16, 0.3), (torch.float32, 0.3)])
def test_softcap(dtype: torch.dtype, beta: float) -> None:
    """beta > 0 takes the dense exact path (uniform part inside every tile); beta = 0 filters."""
    hidden, weight, targets = make_case(N, V, D, dtype, ignore_frac=0.1, seed=3)
    kw = dict(label_smoothing=beta, softcap=4.0, reduction="none")
    ours = loss_and_grads(linear_cross_entropy, hidden, weight, targets, **kw)
    assert_accurate(ours, *truth_and_torch(hidden, weight, targets, **kw), dtype)


def _peaked_mixed(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Peaked rows, except one flat row block: chunks are then fully skipped, partly active or dense."""
    hidden, weight, targets = make_case(N, V, 256, dtype, peaked=True, ignore_frac=0.1, seed=5)
    hidden[128:256] *= 0.05  # flat softmax in the second row block
    return hidden, weight, targets


@pytest.mark.parametrize(
    ("beta", "cublas_min_active", "dz_block_v"),
    [(0.0, 0.5, 256), (0.1, 0.5, 256), (0.1, 0.0, 256), (0.1, float("inf"), 256), (0.1, 0.5, 128)],
)
def test_filtering_skips_blocks_and_stays_within_bound(
    beta: float, cublas_min_active: float, dz_block_v: int, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Filtered vs unfiltered gradients differ by at most the filter's bound plus one bf16 ulp:
    |dE_i| change <= FILTER_MASS g_i max|C|, |dC_v| change <= FILTER_MASS / V sum_i g_i max|E|. Partly active
    chunks go through cuBLAS with zeroed skipped tiles (cublas_min_active 0), the masked Triton GEMMs (inf), or by
    their share (0.5); dZ recompute tiles half a filter tile wide (dz_block_v 128) follow the filter's mask."""
    monkeypatch.setattr(backward, "TILES", _small_chunks(cublas_min_active, dz_block_v))
    dtype = torch.bfloat16
    hidden, weight, targets = _peaked_mixed(dtype)
    _, lse, _, _, (_, _, _, tile_max, _, _) = forward.triton_forward(hidden, weight, targets, beta, -100, None)
    g = (targets != -100).float() / (targets != -100).sum()
    active = backward.active_tiles(tile_max, lse, g, V)
    assert not active[0].any() and active[1].all()
    assert 0.0 < active.float().mean().item() < 0.5  # most blocks skipped, the flat block kept

    kw = dict(label_smoothing=beta)
    filtered = loss_and_grads(linear_cross_entropy, hidden, weight, targets, **kw)
    mass = backward.FILTER_MASS
    monkeypatch.setattr(backward, "FILTER_MASS", 0.0)
    dense = loss_and_grads(linear_cross_entropy, hidden, weight, targets, **kw)
    ulp = 2.0**-8
    bound_de = mass * g.max() * weight.double().abs().max() + ulp * dense[1].abs()
    bound_dc = mass / V * hidden.double().abs().max() + ulp * dense[2].abs()
    assert torch.equal(filtered[0], dense[0])
    assert ((filtered[1] - dense[1]).abs() <= bound_de).all()
    assert ((filtered[2] - dense[2]).abs() <= bound_dc).all()
    assert_accurate(filtered, *truth_and_torch(hidden, weight, targets, **kw), dtype)


def test_loose_rule_keeps_its_budget_and_skips_what_exact_skips() -> None:
    """On random tile masses: per row block, the tiles skipped beyond exact's have masses summing to at most
    LOOSE_MASS - FILTER_MASS, the next smallest would exceed it, and every tile exact skips is skipped."""
    g = torch.Generator().manual_seed(17)
    exact = torch.rand(3, 40, generator=g) > 0.2
    log_mass = -4.0 - 14.0 * torch.rand(3, 40, generator=g)
    loose = backward.loose_active_tiles(exact, log_mass)
    assert (loose <= exact).all() and loose.sum() < exact.sum() and loose.any(dim=1).all()
    mass = log_mass.double().exp()
    extra = torch.where(exact & ~loose, mass, 0.0).sum(dim=1)
    budget = backward.LOOSE_MASS - backward.FILTER_MASS
    assert (extra <= budget).all()
    assert (extra + torch.where(loose, mass, float("inf")).amin(dim=1) > budget).all()


def _loose_case(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """_peaked_mixed, with row block 2 between the filters: its probabilities are above exact's 2^-10 / V, but
    its whole non-target mass is within loose's budget, so only filter="loose" skips it."""
    hidden, weight, targets = _peaked_mixed(dtype)
    hidden[256:] *= 0.53
    return hidden, weight, targets


@pytest.mark.parametrize(("beta", "cublas_min_active"), [(0.0, 0.5), (0.1, 0.5), (0.1, 0.0)])
def test_loose_filter(beta: float, cublas_min_active: float, monkeypatch: pytest.MonkeyPatch) -> None:
    """The forward sorts the vocabulary by mean logit; the kernel computes exactly the gradient with the skipped
    tiles' softmax part removed (the target and label-smoothing parts kept), the rule drops at most LOOSE_MASS
    per token, and the result meets the loose tolerance against the unfiltered float64 truth (cublas_min_active 0:
    partly active chunks by cuBLAS on gathered rows of C and dC). The forward reads the sorted head in three
    gathered spans of one tile (GATHER_BYTES), by TMA."""
    monkeypatch.setattr(backward, "TILES", _small_chunks(cublas_min_active))
    monkeypatch.setattr(forward, "GATHER_BYTES", 1)
    assert forward.position_spans(V, D * 2, 256, permuted=True) == [(0, 256), (256, 512), (512, V)]
    dtype = torch.bfloat16
    hidden, weight, targets = _loose_case(dtype)
    _, lse, _, _, (_, _, _, tile_max, log_mass, order) = forward.triton_forward(
        hidden, weight, targets, beta, -100, None, "loose",
    )
    mean_logit = weight.double() @ hidden.double().mean(dim=0)
    assert (mean_logit[order].diff() <= 2.0**-7 * mean_logit.abs().max()).all()  # descending, up to bf16 rounding
    g = (targets != -100).float() / (targets != -100).sum()
    exact = backward.active_tiles(tile_max, lse, g, V)
    loose = backward.loose_active_tiles(exact, log_mass)
    assert (loose <= exact).all() and exact[2].any() and not loose[2].any() and loose[1].all()
    z = hidden.double() @ weight.double().T  # the forward's tile masses (in sorted order), against float64
    p = z.softmax(dim=1).scatter(1, targets.clamp_min(0)[:, None], 0.0)[:, order]
    mass = torch.nn.functional.pad(p, (0, 68)).view(N, 3, 256).sum(dim=2)
    mass = torch.where((targets != -100)[:, None], mass, 0.0)
    mass = torch.nn.functional.pad(mass, (0, 0, 0, 84)).view(3, 128, 3).amax(dim=1)
    torch.testing.assert_close(log_mass.double().exp(), mass, rtol=2e-2, atol=1e-30)

    kw = dict(label_smoothing=beta)
    ours = loss_and_grads(linear_cross_entropy, hidden, weight, targets, filter="loose", **kw)
    *filtered, dropped = filtered_truth(hidden, weight, targets, loose, forward.TILES.block_n,
                                        forward.TILES.block_v, beta, order)
    assert dropped.max().item() <= backward.LOOSE_MASS
    truth, own = truth_and_torch(hidden, weight, targets, **kw)
    own_error_about_filtered = tuple(f + (o - t) for f, o, t in zip(filtered, own, truth))  # torch's own error
    assert_accurate(ours, tuple(filtered), own_error_about_filtered, dtype)
    assert_accurate(ours, truth, own, dtype, slack=loose_slack(hidden, weight, targets, backward.LOOSE_MASS))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_loose_filter_on_dense_chunks(dtype: torch.dtype) -> None:
    """A flat softmax: "loose" keeps every tile, so the sorted vocabulary goes through the dense chunks (dC by
    cuBLAS on gathered rows) and must meet the plain accuracy rule; float32 reads the gathered rows by pointers."""
    hidden, weight, targets = make_case(N, V, D, dtype, ignore_frac=0.2, seed=6)
    kw = dict(label_smoothing=0.1)
    ours = loss_and_grads(linear_cross_entropy, hidden, weight, targets, filter="loose", **kw)
    assert_accurate(ours, *truth_and_torch(hidden, weight, targets, **kw), dtype)


def test_loose_filter_keeps_the_dense_softcap_path() -> None:
    """With softcap and beta > 0 the uniform part lives inside every tile: "loose" filters nothing either."""
    hidden, weight, targets = make_case(64, 300, 40, torch.float32, seed=3)
    kw = dict(label_smoothing=0.1, softcap=4.0)
    loose = loss_and_grads(linear_cross_entropy, hidden, weight, targets, filter="loose", **kw)
    exact = loss_and_grads(linear_cross_entropy, hidden, weight, targets, **kw)
    assert all(torch.equal(a, b) for a, b in zip(loose, exact))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_single_token_even_d_and_frozen_weight(dtype: torch.dtype) -> None:
    hidden, weight, targets = make_case(1, 300, 64, dtype, seed=7)
    ours = loss_and_grads(linear_cross_entropy, hidden, weight, targets, label_smoothing=0.1)
    assert_accurate(ours, *truth_and_torch(hidden, weight, targets, label_smoothing=0.1), dtype)
    h = hidden.clone().requires_grad_(True)
    linear_cross_entropy(h, weight, targets, label_smoothing=0.1).backward()
    torch.testing.assert_close(h.grad.double(), ours[1])


def test_non_contiguous_inputs() -> None:
    hidden, weight, targets = make_case(N, V, D, torch.float32, ignore_frac=0.2, seed=9)
    h_nc = torch.stack([hidden, hidden], dim=2)[..., 0]
    w_nc = weight.T.contiguous().T
    y_nc = torch.stack([targets, targets], dim=1)[:, 0]
    ours = loss_and_grads(linear_cross_entropy, h_nc, w_nc, y_nc, label_smoothing=0.1)
    assert_accurate(ours, *truth_and_torch(hidden, weight, targets, label_smoothing=0.1), torch.float32)


def test_all_ignored_and_stats() -> None:
    hidden, weight, targets = make_case(40, V, D, torch.float32, seed=11)
    h = hidden.clone().requires_grad_(True)
    loss = linear_cross_entropy(h, weight, torch.full_like(targets, -100), label_smoothing=0.1)
    loss.backward()
    assert loss.item() == 0.0 and h.grad.abs().max().item() == 0.0
    targets[:5] = -100
    _, stats = linear_cross_entropy(hidden, weight, targets, softcap=3.0, return_stats=True)
    logits = 3.0 * torch.tanh(hidden.double() @ weight.double().T / 3.0)
    probs = logits.softmax(dim=1)
    torch.testing.assert_close(stats.lse.double(), logits.logsumexp(dim=1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(stats.max_prob.double(), probs.amax(dim=1), rtol=1e-5, atol=1e-6)
    p_y = probs.gather(1, targets.clamp_min(0)[:, None]).squeeze(1)
    torch.testing.assert_close(stats.target_prob[5:].double(), p_y[5:], rtol=1e-5, atol=1e-6)
    assert torch.isnan(stats.target_prob[:5]).all()


def test_beta_zero_is_plain_cross_entropy() -> None:
    hidden, weight, targets = make_case(50, V, D, torch.float32, seed=13)
    plain = torch.nn.functional.cross_entropy(hidden @ weight.T, targets)
    torch.testing.assert_close(linear_cross_entropy(hidden, weight, targets), plain)


def test_tma_operand_only_where_tma_can_read() -> None:
    """TMA descriptors for row-contiguous 16-bit operands with 16-byte aligned rows; pointers otherwise (these are
    the two paths the tests above run: contiguous inputs by TMA, the non-contiguous and float32 ones by pointer)."""
    x = torch.zeros(64, 40, dtype=torch.bfloat16)
    assert tma_operand(x, [16, 16])[1]
    assert not tma_operand(x.float(), [16, 16])[1]
    assert not tma_operand(torch.zeros(64, 36, dtype=torch.bfloat16), [16, 16])[1]  # 72-byte rows
    assert not tma_operand(x.T.contiguous().T, [16, 16])[1]
    assert not tma_operand(torch.stack([x, x], dim=2)[..., 0], [16, 16])[1]


def test_unaligned_rows_take_the_pointer_path() -> None:
    hidden, weight, targets = make_case(N, V, 36, torch.bfloat16, ignore_frac=0.1, seed=11)
    ours = loss_and_grads(linear_cross_entropy, hidden, weight, targets, label_smoothing=0.1)
    assert_accurate(ours, *truth_and_torch(hidden, weight, targets, label_smoothing=0.1), torch.bfloat16)
