"""kernels/filter.py on its own (no Triton): the plan's rule on random tile masses and the staircase's rectangles."""

from __future__ import annotations

import pytest
import torch

from kernels import filter as lce_filter


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
    assert torch.equal(rows.sort().values, torch.arange(padded)) and (kept.diff() >= 0).all()
    mass = torch.where(valid, log_mass.double().exp(), 0.0)  # (tiles, n)
    per_token = lce_filter.kept_per_token(rows, kept, n, bn)
    dropped = torch.where(torch.arange(tiles)[:, None] >= per_token[None, :], mass, 0.0).sum(dim=0)
    assert dropped.max().item() <= budget
    block_mass = torch.nn.functional.pad(mass, (0, padded - n))[:, rows].view(tiles, -1, bn).amax(dim=2)
    one_fewer = torch.stack([block_mass[k - 1 :, b].sum() for b, k in enumerate(kept.tolist()) if k > 0])
    assert (one_fewer > budget).all()
    first = rows[:bn]
    assert ((first >= n) | ~valid[first.clamp_max(n - 1)]).all()  # ignored and padding rows first
    assert kept[0] == 0 and 0.0 < lce_filter.kept_share(kept, tiles) < 1.0


@pytest.mark.parametrize("seed", range(5))
def test_staircase_covers_exactly_the_kept_tiles(seed: int) -> None:
    """Every kept (block, tile) lies in one rectangle, rectangles do not overlap, a rectangle holds only blocks
    from its first on (which keep its first tile), and all but the last are at least min_tiles wide."""
    g = torch.Generator().manual_seed(seed)
    kept = torch.randint(0, 60, (12,), generator=g).sort().values.tolist()
    kept[0] = 0
    rects = lce_filter.staircase(kept, min_tiles=8)
    cover = torch.zeros(12, 60, dtype=torch.int64)
    for b, t0, t1 in rects:
        assert t0 < t1 and kept[b] > t0
        cover[b:, t0:t1] += 1
    kept_mask = torch.arange(60)[None, :] < torch.tensor(kept)[:, None]
    assert cover.max() == 1 and (cover[kept_mask] == 1).all()
    assert all(t1 - t0 >= 8 for _, t0, t1 in rects[:-1])
    assert rects[-1][2] == kept[-1] and [t0 for _, t0, _ in rects] == sorted({t0 for _, t0, _ in rects})
    assert lce_filter.staircase([0, 0], 8) == [] and lce_filter.staircase([5, 5], 8) == [(0, 0, 5)]
