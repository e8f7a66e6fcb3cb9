"""kernels/filter.py on its own (no Triton): the plan's rule on random tile masses and the pieces covering it."""

from __future__ import annotations

import pytest
import torch

from kernels import filter as lce_filter
from kernels.testing import assert_plan_keeps_budget


def test_plan_on_random_masses() -> None:
    """kernels.filter.plan on random per-token tile masses: per block the dropped tiles' block masses sum to at
    most the budget and keeping one tile fewer would exceed it, so every token drops at most the budget; blocks
    come in ascending kept tiles; ignored tokens have no mass, sort first, and a block of them keeps nothing."""
    g = torch.Generator().manual_seed(17)
    n, tiles, bn, budget = 200, 40, 16, 2.0**-8
    log_mass = -2.0 - 16.0 * torch.rand(tiles, n, generator=g) * torch.linspace(0.1, 1.0, tiles)[:, None]
    lse = torch.zeros(n)
    valid = torch.rand(n, generator=g) > 0.2
    padded = 208
    tile_lse = torch.nn.functional.pad(log_mass, (0, padded - n), value=float("nan"))  # padding: never read
    rows, kept = lce_filter.plan(tile_lse, lse, valid, bn, budget)
    mass = torch.where(valid, log_mass.double().exp(), 0.0)  # (tiles, n)
    assert_plan_keeps_budget(rows, kept, mass, valid, budget, bn)
    assert kept[0] == 0 and 0.0 < lce_filter.kept_share(kept, tiles) < 1.0


@pytest.mark.parametrize(("seed", "max_elements", "max_tiles", "start"),
                         [(0, 4000, 6, 0), (1, 4000, 6, 0), (2, 900, 3, 0), (3, 64, 8, 0), (4, 4000, 6, 7),
                          (5, 900, 3, 70)])
def test_pieces_cover_exactly_the_kept_tiles(seed: int, max_elements: int, max_tiles: int, start: int) -> None:
    """Every kept (block, tile) from tile `start` on lies in one piece, pieces do not overlap nor reach below
    start, a piece's rows are whole blocks from the first that keeps its first tile to the end (or a split of
    them, consecutive), it is at most max_tiles wide and within max_elements unless one tile of its rows alone
    exceeds it, and each piece of whole rows is as wide as the budget allows."""
    g = torch.Generator().manual_seed(seed)
    blocks, tiles, bn, bv = 12, 60, 4, 8
    kept = torch.randint(0, tiles + 1, (blocks,), generator=g).sort().values.tolist()
    kept[0] = 0
    pieces = lce_filter.pieces(kept, bn, max_elements, max_tiles, bv, start=start)
    cover = torch.zeros(blocks * bn, tiles, dtype=torch.int64)
    for t0, t1, r0, r1 in pieces:
        assert start <= t0 < t1 <= max(kept) and t1 - t0 <= max_tiles and r0 % bn == 0 and r0 < r1 <= blocks * bn
        cover[r0:r1, t0:t1] += 1
        first = next(b for b, k in enumerate(kept) if k > t0)
        assert r0 >= first * bn
        if r1 - r0 > bn:
            assert (r1 - r0) * (t1 - t0) * bv <= max_elements
    kept_rows = torch.tensor(kept).repeat_interleave(bn)
    kept_mask = (torch.arange(tiles)[None, :] < kept_rows[:, None]) & (torch.arange(tiles) >= start)
    assert cover.max() <= 1 and (cover[kept_mask] == 1).all() and (cover[:, :start] == 0).all()
    assert (pieces == []) == (start >= max(kept))
    for t0, t1, r0, r1 in pieces:
        if r0 == next(b for b, k in enumerate(kept) if k > t0) * bn and r1 == blocks * bn and t1 < max(kept):
            assert t1 - t0 == max_tiles or (r1 - r0) * (t1 - t0 + 1) * bv > max_elements
    assert lce_filter.pieces([0, 0], bn, 100, 4, bv) == []
    assert lce_filter.pieces([5, 5], bn, 1000, 8, bv) == [(0, 5, 0, 8)]
