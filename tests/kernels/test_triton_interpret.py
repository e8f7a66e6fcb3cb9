"""The Triton kernels under TRITON_INTERPRET=1 on small shapes, against the float64 reference.

Skipped where CUDA is available (the GPU tests need the kernels compiled). Triton reads the interpreter flag
when a kernel, its own library functions included, is defined: tests/conftest.py defines them under it before
any test module is collected, and the fixture below sets it for these tests' calls.
Chunks are shrunk so that small inputs span several of them.
"""

from __future__ import annotations

import dataclasses

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
from kernels import filter as lce_filter  # noqa: E402
from kernels.plan_history import PlanHistory  # noqa: E402
from kernels._tl_utils import tma_operand  # noqa: E402
from kernels.head_sum import head_column_sum  # noqa: E402
from kernels.api import select_backend  # noqa: E402
from kernels.testing import (  # noqa: E402
    assert_accurate, filter_slack, filtered_truth, loss_and_grads, make_case, truth_and_torch,
)
from kernels.triton_backend import BACKEND  # noqa: E402

# tests/conftest.py defines Triton's library and our kernels under TRITON_INTERPRET=1 before collection
if not isinstance(forward._finish_kernel, interpreter.InterpretedFunction):
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


@pytest.mark.parametrize(("dtype", "beta", "frozen"), [
    (torch.bfloat16, 0.1, None), (torch.float16, 0.1, None), (torch.float32, 0.0, None),
    (torch.bfloat16, 0.1, "hidden"), (torch.bfloat16, 0.1, "weight"),
])
def test_dense_dz_in_dc_storage(dtype: torch.dtype, beta: float, frozen: str | None,
                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The dense path with dZ chunks in the rows of dC not yet written (N = 200, V = 1500, D = 192: chunks 512,
    256, 256 wide there, the rest through a dedicated 128 x 256 buffer, two row chunks each); dZ tiles taken in
    groups of 2 vocabulary tiles. A frozen weight (no dC) takes the dedicated buffer only (dE as accurate, summed
    in another order); a frozen hidden state (no dE accumulator) leaves dC the same."""
    monkeypatch.setattr(backward, "TILES", backward.BackwardTiles(
        dz_elements=128 * 256, chunk_vocab=256, workspace_vocab=512, dz_group_v=2))
    n, vocab, d = 200, 1500, 192
    chunks = backward.dense_chunks(n, vocab, d, 2, True, True)
    assert [c.vc for c in chunks if c.workspace is not None] == [512, 256, 256]
    assert all(c.rows == 128 for c in chunks if c.workspace is None)
    hidden, weight, targets = make_case(n, vocab, d, dtype, ignore_frac=0.1, seed=21)
    kw = dict(label_smoothing=beta, filter="none")
    ours = loss_and_grads(linear_cross_entropy, hidden, weight, targets, **kw)
    assert_accurate(ours, *truth_and_torch(hidden, weight, targets, label_smoothing=beta), dtype)
    if frozen is not None:
        h = hidden.clone().requires_grad_(frozen != "hidden")
        w = weight.clone().requires_grad_(frozen != "weight")
        linear_cross_entropy(h, w, targets, **kw).backward()
        if frozen == "hidden":
            assert torch.equal(w.grad.double(), ours[2])
        else:
            assert_accurate((ours[0], h.grad.double(), ours[2]),
                            *truth_and_torch(hidden, weight, targets, label_smoothing=beta), dtype)


@pytest.mark.parametrize(("filter_name", "dtype"), [("none", torch.bfloat16), ("exact", torch.float32)])
def test_dense_filters_plan_nothing(filter_name: str, dtype: torch.dtype) -> None:
    """filter="none", and "exact" on float32 inputs: no sorted vocabulary, no row order, every tile computed
    (cuBLAS on whole chunks); "exact" on bf16 plans (its budget is 2^-10)."""
    hidden, weight, targets = make_case(N, V, D, dtype, ignore_frac=0.2, seed=4)
    *_, (_, _, _, order, rows, kept, *_) = forward.triton_forward(hidden, weight, targets, 0.1, -100, None, filter_name)
    assert order.numel() == rows.numel() == kept.numel() == 0
    kw = dict(label_smoothing=0.1)
    ours = loss_and_grads(linear_cross_entropy, hidden, weight, targets, filter=filter_name, **kw)
    assert_accurate(ours, *truth_and_torch(hidden, weight, targets, **kw), dtype)
    *_, (_, _, _, order, rows, kept, *_) = forward.triton_forward(
        hidden.bfloat16(), weight.bfloat16(), targets, 0.1, -100, None, "exact")
    assert order.numel() == V and rows.numel() == 384 and kept.numel() == 3


@pytest.mark.parametrize(("dtype", "beta"), [(torch.bfloat16, 0.0), (torch.bfloat16, 0.3), (torch.float32, 0.3)])
def test_softcap(dtype: torch.dtype, beta: float) -> None:
    """beta > 0 takes the dense path under the default filter (uniform part inside every tile); beta = 0 filters."""
    hidden, weight, targets = make_case(N, V, D, dtype, ignore_frac=0.1, seed=3)
    kw = dict(label_smoothing=beta, softcap=4.0, reduction="none")
    ours = loss_and_grads(linear_cross_entropy, hidden, weight, targets, **kw)
    assert_accurate(ours, *truth_and_torch(hidden, weight, targets, **kw), dtype)


def _mixed_case(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Peaked rows (CCE's trick: nearly all mass on the target), 128 flat rows (mass spread over the whole
    vocabulary) and 44 rows between 2^-10 and 2^-8 of non-target mass: a budget of 2^-8 drops all of it, one of
    2^-10 not."""
    hidden, weight, targets = make_case(N, V, 256, dtype, peaked=True, ignore_frac=0.1, seed=5)
    hidden[128:256] *= 0.05
    hidden[256:] *= 0.42
    return hidden, weight, targets


def _block_masses(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, order: torch.Tensor,
                  rows: torch.Tensor) -> torch.Tensor:
    """float64 (blocks, tiles): max over each block's tokens (in the plan's row order) of the tile's non-target
    probability mass, tiles of the sorted vocabulary."""
    bn, bv = forward.TILES.block_n, forward.TILES.block_v
    p = (hidden.double() @ weight.double().T).softmax(dim=1)
    p = p.scatter(1, targets.clamp_min(0)[:, None], 0.0)[:, order]
    p = torch.where((targets != -100)[:, None], p, 0.0)
    mass = torch.nn.functional.pad(p, (0, (-V) % bv)).view(N, -1, bv).sum(dim=2)
    mass = torch.nn.functional.pad(mass, (0, 0, 0, rows.numel() - N))[rows]  # padding rows: zero mass
    return mass.view(-1, bn, mass.shape[1]).amax(dim=1)


@pytest.mark.parametrize(("filter_name", "beta", "dz_block_v", "dz_rows", "chunk_vocab"), [
    ("loose", 0.0, 256, 128, 512), ("loose", 0.1, 128, 384, 512), ("exact", 0.1, 256, 384, 1024),
    ("exact", 0.0, 256, 128, 512),
])
def test_filter_drops_its_budget_and_computes_exactly_the_kept_tiles(
    filter_name: str, beta: float, dz_block_v: int, dz_rows: int, chunk_vocab: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The plan (kernels/filter.py) against float64 tile masses: blocks ascending by kept tiles K_b, the dropped
    tiles' block masses summing to at most the budget and K_b the fewest that allow it; the rows a permutation.
    The kernel then computes exactly the float64 gradient with the dropped tiles' softmax part removed (target
    and label-smoothing parts kept), at most the budget dropped per token, within the filter's tolerance of the
    plain truth. Small chunks: several row and vocabulary chunks, later chunks kept by trailing blocks only; the
    forward reads the sorted head through the permutation by pointer loads; dZ tiles half a
    filter tile wide (dz_block_v 128); filter="loose" (2^-8) and "exact" (2^-10). The dZ budget (the dense chunk
    dz_rows x chunk_vocab less the 384 x 256 hidden states, at least half of it): 128 x 256 splits the rows of a
    vocabulary tile into pieces (their dC rows summed in the second buffer); 384 x 256 takes a tile per piece;
    384 x 768 the whole staircase in one piece."""
    monkeypatch.setattr(backward, "TILES", backward.BackwardTiles(dz_elements=dz_rows * chunk_vocab,
                                                                  chunk_vocab=chunk_vocab, dz_block_v=dz_block_v))
    budget = lce_filter.filter_mass(filter_name, torch.bfloat16)
    hidden, weight, targets = _mixed_case(torch.bfloat16)
    *_, (_, _, _, order, rows, kept, *_) = forward.triton_forward(hidden, weight, targets, beta, -100, None,
                                                              filter_name)
    mean_logit = weight.double() @ hidden.double().mean(dim=0)
    assert (mean_logit[order].diff() <= 2.0**-7 * mean_logit.abs().max()).all()  # descending, up to bf16 rounding
    assert torch.equal(rows.sort().values, torch.arange(384)) and (kept.diff() >= 0).all()
    block_mass = _block_masses(hidden, weight, targets, order, rows)
    suffix = block_mass.flip(1).cumsum(dim=1).flip(1)  # mass of tiles >= t
    tiles = block_mass.shape[1]
    dropped_bound = torch.where(kept < tiles, suffix.gather(1, kept.clamp_max(tiles - 1)[:, None])[:, 0], 0.0)
    assert (dropped_bound <= budget * (1 + 1e-4)).all()
    last_kept = suffix.gather(1, (kept - 1).clamp_min(0)[:, None])[:, 0]
    assert ((kept == 0) | (last_kept > budget * (1 - 1e-4))).all()  # one tile fewer kept would exceed the budget
    assert kept[0] == 0 and kept[-1] == tiles  # peaked blocks drop everything, the flat one keeps everything

    kw = dict(label_smoothing=beta)
    ours = loss_and_grads(linear_cross_entropy, hidden, weight, targets, filter=filter_name, **kw)
    per_token = lce_filter.kept_per_token(rows, kept, N, forward.TILES.block_n)
    *filtered, dropped = filtered_truth(hidden, weight, targets, per_token, forward.TILES.block_v, beta, order)
    assert dropped.max().item() <= budget
    truth, own = truth_and_torch(hidden, weight, targets, **kw)
    own_error_about_filtered = tuple(f + (o - t) for f, o, t in zip(filtered, own, truth))  # torch's own error
    assert_accurate(ours, tuple(filtered), own_error_about_filtered, torch.bfloat16)
    assert_accurate(ours, truth, own, torch.bfloat16, slack=filter_slack(hidden, weight, targets, budget))


def test_a_larger_budget_drops_more(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rows between 2^-10 and 2^-8 of mass: a budget of 2^-8 drops all of their softmax part, 2^-10 not."""
    hidden, weight, targets = _mixed_case(torch.bfloat16)
    kept_tiles = {}
    for budget in (2.0**-10, 2.0**-8):
        monkeypatch.setitem(lce_filter.FILTER_MASS, "loose", budget)
        *_, (_, _, _, _, rows, kept, *_) = forward.triton_forward(hidden, weight, targets, 0.0, -100, None, "loose")
        per_token = lce_filter.kept_per_token(rows, kept, N, forward.TILES.block_n)
        kept_tiles[budget] = per_token[256:][targets[256:] != -100]
    assert (kept_tiles[2.0**-8] == 0).all() and (kept_tiles[2.0**-10] > 0).any()


@pytest.mark.parametrize("share", [0.0, 1.0])
def test_pieces_queued_before_the_plan_compute_only_the_kept_tiles(share: float,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The pieces the backward queues before it has the plan cover tiles [0, P) of every row and the dZ kernel masks
    what each block does not keep, so the gradients are the plan's: P = 1 tile (PREFIX_SHARE 0: the least) and every
    tile (1: all pieces before the plan). float32 and loose: computing every dropped tile moves the gradients by
    ~2e-4 of their largest, ten times float32's rule (2e-5), which the filtered truth is held to."""
    monkeypatch.setattr(backward, "PREFIX_SHARE", share)
    hidden, weight, targets = _mixed_case(torch.float32)
    *_, (_, _, _, order, rows, kept, *_) = forward.triton_forward(hidden, weight, targets, 0.1, -100, None, "loose")
    tiles = -(-V // forward.TILES.block_v)
    assert kept.min() == 0 and kept.double().mean() <= backward.STAIRCASE_MAX_SHARE * tiles  # the staircase runs
    kw = dict(label_smoothing=0.1)
    ours = loss_and_grads(linear_cross_entropy, hidden, weight, targets, filter="loose", **kw)
    per_token = lce_filter.kept_per_token(rows, kept, N, forward.TILES.block_n)
    *filtered, _ = filtered_truth(hidden, weight, targets, per_token, forward.TILES.block_v, 0.1, order)
    truth, own = truth_and_torch(hidden, weight, targets, **kw)
    assert_accurate(ours, tuple(filtered), tuple(f + (o - t) for f, o, t in zip(filtered, own, truth)),
                    torch.float32)
    dense = loss_and_grads(linear_cross_entropy, hidden, weight, targets, filter="none", **kw)
    gap = [((d - o).abs().max() / t.abs().max()).item() for d, o, t in zip(dense[1:], ours[1:], truth[1:])]
    assert min(gap) > 1e-4  # every dropped tile computed would move the gradients by 5x float32's rule (2e-4 here)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_filter_on_a_flat_softmax(dtype: torch.dtype) -> None:
    """Random logits of std 3: the filter drops little; float32 reads the gathered rows by pointers."""
    hidden, weight, targets = make_case(N, V, D, dtype, ignore_frac=0.2, seed=6)
    kw = dict(label_smoothing=0.1)
    ours = loss_and_grads(linear_cross_entropy, hidden, weight, targets, filter="loose", **kw)
    assert_accurate(ours, *truth_and_torch(hidden, weight, targets, **kw), dtype,
                    slack=filter_slack(hidden, weight, targets, lce_filter.FILTER_MASS["loose"]))


def test_softcap_with_beta_stays_dense_under_every_filter() -> None:
    """With softcap and beta > 0 the uniform part lives inside every tile: no filter drops anything."""
    hidden, weight, targets = make_case(64, 300, 40, torch.float32, seed=3)
    kw = dict(label_smoothing=0.1, softcap=4.0)
    results = [loss_and_grads(linear_cross_entropy, hidden, weight, targets, filter=f, **kw)
               for f in lce_filter.FILTERS]
    assert all(torch.equal(a, b) for other in results[1:] for a, b in zip(results[0], other))


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


@pytest.mark.parametrize(("dtype", "beta", "softcap", "reduction"), [
    (torch.bfloat16, 0.1, None, "mean"), (torch.bfloat16, 0.0, None, "none"), (torch.float16, 0.1, None, "sum"),
    (torch.float32, 0.1, None, "mean"), (torch.bfloat16, 0.3, 4.0, "none"), (torch.float32, 0.3, 4.0, "mean"),
])
def test_logits_kept_for_the_dense_backward(dtype: torch.dtype, beta: float, softcap: float | None, reduction: str,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """With dC to compute and no filter, the forward keeps the logits of the first chunks (here two tiles wide: N =
    200, V = 1500, D = 256 keep 2, the rest recomputed in dC's storage and a dedicated buffer) less their tile max
    in dC's storage, and the backward turns them into dZ in place: loss and both gradients as accurate as the
    dense path's (targets inside the kept chunks included; the target column from the forward's exact 1 - p_y).
    16-bit logits leave the forward by TMA, float32 ones by pointer stores."""
    monkeypatch.setattr(forward, "TILES", dataclasses.replace(forward.TILES, keep_vocab=512, keep_min_dim=256))
    monkeypatch.setattr(backward, "TILES", backward.BackwardTiles(
        dz_elements=128 * 256, chunk_vocab=256, workspace_vocab=512, dz_group_v=2))
    n, vocab, d = 200, 1500, 256
    assert forward.kept_chunks(n, vocab, d) == 2
    hidden, weight, targets = make_case(n, vocab, d, dtype, ignore_frac=0.1, seed=23)
    assert ((targets >= 0) & (targets < 1024)).sum() > 50
    kw = dict(label_smoothing=beta, softcap=softcap, reduction=reduction)
    *_, saved = forward.triton_forward(hidden, weight.clone().requires_grad_(True), targets, beta, -100, softcap,
                                       "none", keep_logits=True)
    assert saved[-2].numel() == vocab * d and saved[-1].shape == (4, n)  # one shift per kept tile and row
    ours = loss_and_grads(linear_cross_entropy, hidden, weight, targets, filter="none", **kw)
    assert_accurate(ours, *truth_and_torch(hidden, weight, targets, **kw), dtype)
    # nothing kept without the weight's gradient, under no_grad, or with a filter that plans
    for keep, name in ((False, "none"), (True, "exact")):
        *_, saved = forward.triton_forward(hidden.bfloat16(), weight.bfloat16(), targets, beta, -100, None, name,
                                           keep_logits=keep)
        assert saved[-2].numel() == saved[-1].numel() == 0
    h = hidden.clone().requires_grad_(True)  # frozen weight: dE alone, upstream as in loss_and_grads
    loss = linear_cross_entropy(h, weight, targets, filter="none", **kw).double()
    upstream = torch.rand(loss.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    (loss * (upstream if reduction == "none" else 1.0)).sum().backward()
    assert_accurate((ours[0], h.grad.double(), ours[2]), *truth_and_torch(hidden, weight, targets, **kw), dtype)


@pytest.mark.parametrize(("dtype", "beta", "softcap", "filter_name"), [
    (torch.bfloat16, 0.0, None, "none"), (torch.bfloat16, 0.1, None, "none"), (torch.float32, 0.1, None, "none"),
    (torch.bfloat16, 0.2, 5.0, "none"), (torch.bfloat16, 0.1, None, "exact"),
])
def test_whole_vocabulary_tiles_take_the_unmasked_path(dtype: torch.dtype, beta: float, softcap: float | None,
                                                       filter_name: str) -> None:
    """V = 768, three whole 256-wide tiles: the forward and the dZ recompute drop their column masks (EVEN_V), and
    the forward sums the logits only with label smoothing; loss and gradients as accurate as elsewhere (beta 0 and
    0.1, float32, softcap with beta, a planning filter)."""
    n, vocab, d = 200, 768, 64
    assert vocab % forward.TILES.block_v == 0 and vocab % backward.TILES.dz_block_v == 0
    hidden, weight, targets = make_case(n, vocab, d, dtype, ignore_frac=0.1, seed=31)
    kw = dict(label_smoothing=beta, softcap=softcap)
    ours = loss_and_grads(linear_cross_entropy, hidden, weight, targets, filter=filter_name, **kw)
    assert_accurate(ours, *truth_and_torch(hidden, weight, targets, **kw), dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_targets_on_a_dz_tile_edge(dtype: torch.dtype) -> None:
    """The dZ recompute adds the target term only to tiles that hold a target: each row block's targets here sit on
    the last column of tile 0 or the first of tile 2 (none in tile 1), so a tile test off by one column at either
    edge drops the term from a whole tile (it failed this test, and no other, when mutated)."""
    n, vocab, d = 256, 768, 64
    bv = backward.TILES.dz_block_v
    assert vocab == 3 * bv and n % forward.TILES.block_n == 0
    hidden, weight, _ = make_case(n, vocab, d, dtype, ignore_frac=0.0, seed=41)
    targets = torch.where(torch.arange(n) % 2 == 0, bv - 1, 2 * bv)
    kw = dict(label_smoothing=0.1, softcap=None)
    ours = loss_and_grads(linear_cross_entropy, hidden, weight, targets, filter="none", **kw)
    assert_accurate(ours, *truth_and_torch(hidden, weight, targets, **kw), dtype)


@pytest.mark.parametrize(("vocab", "dtype", "filter_name", "softcap"), [
    (700, torch.bfloat16, "none", None), (768, torch.bfloat16, "none", None), (700, torch.float32, "none", None),
    (700, torch.bfloat16, "exact", None), (768, torch.bfloat16, "none", 30.0),
])
def test_label_smoothing_logit_sum_with_a_large_mean_logit(vocab: int, dtype: torch.dtype, filter_name: str,
                                                           softcap: float | None) -> None:
    """Every logit raised by 4 (a constant feature): the label-smoothing term (beta / V) sum_v z_iv is then about
    1.2 of each token's loss, and a vocabulary tile's logits summed twice or missed, or a column past V counted,
    would move it by 0.4 (a halved sum passed the other tests, whose mean logit is 0). TMA or pointer loads, the
    head sorted under a filter, a partial last tile, softcap."""
    n, d = 300, 100
    hidden, weight, targets = make_case(n, vocab, d, dtype, ignore_frac=0.1, seed=37)
    hidden[:, -1], weight[:, -1] = 1.0, 4.0
    kw = dict(label_smoothing=0.3, softcap=softcap)
    ours = loss_and_grads(linear_cross_entropy, hidden, weight, targets, filter=filter_name, **kw)
    truth, own = truth_and_torch(hidden, weight, targets, **kw)
    assert truth[0].min() > 1.0  # the mean loss, the smoothing term about 1.2 of it
    assert_accurate(ours, truth, own, dtype)


@pytest.mark.parametrize(("splits", "group", "filter_name"), [
    (2, 2, "none"), (3, 4, "none"), (2, 5, "none"), (3, 2, "exact"),
])
def test_program_order_in_groups(monkeypatch: pytest.MonkeyPatch, splits: int, group: int, filter_name: str) -> None:
    """The forward's programs in groups of `group` row blocks x `splits` vocabulary splits (kernels.forward.
    choose_order), the last group short where 5 row blocks do not divide into groups: loss and gradients against
    float64 (every tile of every row must land in exactly one split's partial results)."""
    monkeypatch.setattr(forward, "choose_order", lambda *args: (splits, group))
    hidden, weight, targets = make_case(600, 900, 40, torch.bfloat16, ignore_frac=0.1, seed=43)  # 5 x 4 tiles
    kw = dict(label_smoothing=0.1)
    ours = loss_and_grads(linear_cross_entropy, hidden, weight, targets, filter=filter_name, **kw)
    truth, own = truth_and_torch(hidden, weight, targets, **kw)
    mass = lce_filter.filter_mass(filter_name, torch.bfloat16)
    assert_accurate(ours, truth, own, torch.bfloat16, slack=filter_slack(hidden, weight, targets, mass))


def test_choose_order_keeps_a_wave_in_half_the_l2() -> None:
    """The paper's shape on an H100 (64 row blocks, 1000 tiles, rows of 4608 bytes, 132 SMs, 50 MB of L2): 8
    splits in groups of 16 row blocks, a wave of 18.9 MB (2 splits over all 64 row blocks: 40 MB); where every
    wave fits (rows of 1280 bytes, Gemma-3-270M's) the smallest wave of the least wave quantisation (500 tile
    steps), and where none fits (a 1 MB L2) the least quantisation: 500 (1 split: 1000)."""
    l2 = 50 << 20
    splits, group = forward.choose_order(8192, 64, 1000, 132, 4608, l2)
    assert (splits, group) == (8, 16)
    assert (group * 128 + splits * 256) * 4608 <= l2 // 2 < (64 * 128 + 2 * 256) * 4608
    assert forward.choose_order(8192, 64, 1000, 132, 1280, l2) == (8, 16)
    splits, group = forward.choose_order(8192, 64, 1000, 132, 4608, 1 << 20)
    assert -(-64 * splits // 132) * -(-1000 // splits) == 500


@pytest.mark.parametrize(("vocab", "dim", "dtype", "col_step"), [
    (700, 40, torch.bfloat16, 1), (1000, 300, torch.float32, 1), (33, 257, torch.bfloat16, 2),
])
def test_head_column_sum(vocab: int, dim: int, dtype: torch.dtype, col_step: int) -> None:
    """sum_v C_v (the forward's logit sum is E_i . sum_v C_v) against float64: within 1e-6 of sum_v |C_vd| (float32
    sums of a few hundred terms), every column, several programs with a partial last one (700 rows: 11 programs of
    64 rows under the interpreter's 4 SMs), a column block past D, a strided head; the same bits on a second call."""
    gen = torch.Generator().manual_seed(41)
    wide = torch.randn(vocab, dim * col_step, generator=gen) + 2.0  # a mean far from 0: sums of like terms
    weight = wide.to(dtype)[:, ::col_step]
    got = head_column_sum(weight, sms=4)
    exact = weight.double().sum(dim=0)
    assert got.dtype == torch.float32 and got.shape == (dim,)
    assert ((got.double() - exact).abs() <= 1e-6 * weight.double().abs().sum(dim=0)).all()
    assert torch.equal(head_column_sum(weight, sms=4), got)


def test_a_dense_plan_skips_planning_until_the_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    """exact on a flat softmax (logits of std 0.15: every tile holds mass): the first call plans and its backward
    runs dense; the next PROBE_EVERY - 1 calls (3 here) plan nothing and compute every tile, as accurate as the
    dense path; the one after plans again; a history rebuilt from its state goes on where it was. Peaked rows (the
    plan drops nearly everything) plan at every call; so does another head shape, and every call without a history
    (the kernel keeps none)."""
    plans: list[int] = []
    real_plan = forward.triton_plan

    def counting_plan(*args: object, **kwargs: object) -> object:
        plans.append(1)
        return real_plan(*args, **kwargs)

    monkeypatch.setattr(forward, "triton_plan", counting_plan)
    hidden, weight, targets = make_case(N, V, D, torch.bfloat16, ignore_frac=0.1, seed=31)
    hidden = hidden * 0.05
    kw = dict(label_smoothing=0.1, plan_history=PlanHistory(probe_every=3))
    truth = truth_and_torch(hidden, weight, targets, label_smoothing=0.1)
    for call in range(7):
        ours = loss_and_grads(linear_cross_entropy, hidden, weight, targets, filter="exact", **kw)
        assert_accurate(ours, *truth, torch.bfloat16)
        assert len(plans) == 1 + call // 3  # calls 0, 3 and 6 plan
    plans.clear()
    kw["plan_history"] = PlanHistory.from_state(kw["plan_history"].state(), probe_every=3)  # as a checkpoint has it
    loss_and_grads(linear_cross_entropy, hidden, weight, targets, filter="exact", **kw)
    assert not plans  # call 7: the second after call 6's dense plan
    for _ in range(2):
        loss_and_grads(linear_cross_entropy, hidden, weight, targets, filter="exact", label_smoothing=0.1)
    assert len(plans) == 2
    plans.clear()
    loss_and_grads(linear_cross_entropy, hidden[:, :32].contiguous(), weight[:, :32].contiguous(), targets,
                   filter="exact", **kw)
    assert len(plans) == 1  # another head shape has its own history
    plans.clear()
    hidden, weight, targets = make_case(N, V, 256, torch.bfloat16, peaked=True, seed=32)
    for _ in range(3):
        loss_and_grads(linear_cross_entropy, hidden, weight, targets, filter="exact", **kw)
    assert len(plans) == 3
