"""kernels/plan_triton.py against its reference kernels.filter.plan, under TRITON_INTERPRET=1 on CPU (on a CUDA
machine, compiled on the GPU): the same row order and kept tiles, tile_lse left unchanged, and the filter's
guarantee checked directly in float64."""

from __future__ import annotations

import importlib
import os

import pytest
import torch

triton = pytest.importorskip("triton")  # a third-party package: absent on platforms without Triton wheels

from kernels import filter as lce_filter  # noqa: E402
from kernels.testing import assert_plan_keeps_budget  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BUDGETS = (2.0**-8, 2.0**-10)
# (n, tiles, block_n): plan's test shape (padding columns, tiles < one chunk), n a multiple of block_n with tiles
# over two chunks, and a block_n that is not a power of two
SHAPES = ((200, 40, 16), (256, 70, 32), (150, 9, 24))


def _import_plan_triton():  # noqa: ANN202
    """kernels.plan_triton, its kernels defined under the interpreter where there is no GPU (Triton reads the flag
    when a kernel is defined; tests/conftest.py has defined Triton's library under it)."""
    if torch.cuda.is_available():
        return importlib.import_module("kernels.plan_triton")
    from triton.runtime import interpreter

    user_value = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        module = importlib.import_module("kernels.plan_triton")
    finally:
        if user_value is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = user_value
    if not isinstance(module._cutoff_kernel, interpreter.InterpretedFunction):
        raise RuntimeError("kernels.plan_triton was imported before this test without TRITON_INTERPRET=1")
    return module


plan_triton = _import_plan_triton()


@pytest.fixture(autouse=True, params=["default", "small"])
def _chunks(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernels' steps as set, and shrunk so that every walk over the tiles takes several steps and ends in a
    partial one. The interpreter also reads its flag when a kernel runs."""
    if not torch.cuda.is_available():
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    if request.param == "small":
        monkeypatch.setattr(plan_triton, "CUTOFF_BLOCK_T", 16)
        monkeypatch.setattr(plan_triton, "KEPT_ELEMENTS", 128)


def _case(shape: tuple[int, int, int], budget: float,
          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """(tile_lse (tiles, padded) with nan padding columns, lse, valid, per-token masses (tiles, n) float64,
    block_n). The first shape draws masses as test_filter.py::test_plan_on_random_masses does; the others decay
    geometrically over the tiles at per-token rates, so that cutoffs spread over the whole range. Tokens whose
    suffix mass lies within 1% of the budget are ignored: plan's cutoff subtracts float32 prefix sums from the
    total (a relative error of ~1e-4 there), the kernel sums suffixes, so such a token could sort differently."""
    n, tiles, block_n = shape
    g = torch.Generator().manual_seed(17)
    if shape == SHAPES[0]:
        log_mass = -2.0 - 16.0 * torch.rand(tiles, n, generator=g) * torch.linspace(0.1, 1.0, tiles)[:, None]
        lse = torch.zeros(n)
    else:
        rate = 0.1 + 0.6 * torch.rand(n, generator=g)
        log_mass = -1.0 - torch.arange(tiles)[:, None] * rate * (0.5 + torch.rand(tiles, n, generator=g))
        lse = 4.0 * torch.randn(n, generator=g)
    valid = torch.rand(n, generator=g) > 0.2
    mass = ((log_mass + lse) - lse).double().exp()  # what the plan sees: the exponent rounded as in float32
    suffix = mass.flip(0).cumsum(dim=0).flip(0)
    valid &= ~((suffix - budget).abs() <= 0.01 * budget).any(dim=0)
    mass = torch.where(valid, mass, 0.0)
    padded = triton.cdiv(n, block_n) * block_n
    tile_lse = torch.nn.functional.pad(log_mass + lse, (0, padded - n), value=float("nan"))  # padding: never read
    return tile_lse.to(DEVICE), lse.to(DEVICE), valid.to(DEVICE), mass, block_n


@pytest.mark.parametrize("budget", BUDGETS)
@pytest.mark.parametrize("shape", SHAPES)
def test_matches_plan(shape: tuple[int, int, int], budget: float) -> None:
    """The same row order and kept tiles as kernels.filter.plan (on a copy, which it overwrites); tile_lse
    unchanged, bit for bit (its nan padding included)."""
    tile_lse, lse, valid, _, block_n = _case(shape, budget)
    before = tile_lse.clone()
    rows_ref, kept_ref = lce_filter.plan(tile_lse.clone(), lse, valid, block_n, budget)
    rows, kept = plan_triton.triton_plan(tile_lse, lse, valid, block_n, budget)
    assert rows.dtype == kept.dtype == torch.int64
    assert torch.equal(kept, kept_ref) and torch.equal(rows, rows_ref)
    assert torch.equal(tile_lse.view(torch.int32), before.view(torch.int32))


@pytest.mark.parametrize("budget", BUDGETS)
@pytest.mark.parametrize("shape", SHAPES)
def test_drops_at_most_the_budget(shape: tuple[int, int, int], budget: float) -> None:
    """As test_filter.py::test_plan_on_random_masses, in float64: every token drops at most the budget, each block
    keeping one tile fewer would exceed it, blocks come in ascending kept tiles, ignored and padding rows first."""
    tile_lse, lse, valid, mass, block_n = _case(shape, budget)
    tiles = tile_lse.shape[0]
    rows, kept = (x.cpu() for x in plan_triton.triton_plan(tile_lse, lse, valid, block_n, budget))
    assert_plan_keeps_budget(rows, kept, mass, valid.cpu(), budget, block_n)
    assert kept[0] == 0 and 0.0 < lce_filter.kept_share(kept, tiles) < 1.0
