"""The backward's gradient filter: which (row block, vocabulary tile) products of the softmax part it may skip.

With a filter, the forward walks the vocabulary sorted by mean logit over the batch (C @ mean_i E_i, descending:
likely tokens first) in tiles of BLOCK_V positions and stores, per token i and tile t, the log-sum-exp of the
tile's non-target logits; with LSE_i that is m_it = the tile's share of token i's probability mass. With the
budget B (`filter_mass`):
1. Tokens are sorted by their cutoff k_i, the fewest leading tiles outside which their mass is at most B
   (ignored tokens have none: k_i = 0), and cut into blocks of BLOCK_N rows in that order, so that tokens whose
   mass reaches equally far into the vocabulary share a block.
2. Block b keeps the leading tiles [0, K_b), K_b the smallest K with sum_{t >= K} M_bt <= B, where
   M_bt = max over the block's tokens of m_it (summed in float64). Every token of the block therefore drops at
   most B of probability mass: |change of dE_i| <= B g_i max|C| and sum_v |change of dC_v| <= B sum_i g_i max|E|.
3. Blocks are ordered by K_b ascending, so the kept tiles form a staircase: the tokens that keep a vocabulary
   tile are a contiguous run of trailing rows, and the backward's GEMMs run dense (cuBLAS) over pieces of
   exactly those rows (`pieces`).
The loss, the target column and the label-smoothing term -beta / V are never filtered. Budgets: "exact" (the
default) B = 2^-10 for 16-bit inputs, under their rounding (a bf16 gradient's ulp is 2^-8 of its scale
g_i max|C|), and nothing for float32; "loose" B = 2^-8; "none" computes every tile.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

FILTERS = ("exact", "loose", "none")
FILTER_MASS = {"exact": 2.0**-10, "loose": 2.0**-8, "none": 0.0}  # probability mass per token each may drop


def filter_mass(filter: str, dtype: torch.dtype) -> float:
    """B, the probability mass per token `filter` may drop for inputs of `dtype` (0: every tile computed):
    FILTER_MASS, except that "exact" drops nothing from float32 inputs (2^-10 is above their rounding)."""
    return 0.0 if filter == "exact" and dtype == torch.float32 else FILTER_MASS[filter]


def token_tile_mass(tile_lse: torch.Tensor, lse: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """m_it = exp(tile LSE - LSE_i), (tiles, padded rows) float32, computed in place in tile_lse; 0 for ignored
    tokens and padding rows (columns n and beyond)."""
    padded, n = tile_lse.shape[1], lse.numel()
    pad = torch.nn.functional.pad
    m = tile_lse.sub_(pad(lse, (0, padded - n), value=float("inf")))
    return m.masked_fill_(~pad(valid, (0, padded - n), value=False), float("-inf")).exp_()


def kept_tiles(block_mass: torch.Tensor, mass: float) -> torch.Tensor:
    """K_b, (blocks,) int64: the fewest leading tiles outside which the block masses (tiles, blocks) sum to at most
    `mass` (summed in float64)."""
    suffix = block_mass.double().flip(0).cumsum(dim=0).flip(0)  # sum over tiles >= t, nonincreasing in t
    return (suffix > mass).sum(dim=0)


def plan(tile_lse: torch.Tensor, lse: torch.Tensor, valid: torch.Tensor, block_n: int, mass: float,
         ) -> tuple[torch.Tensor, torch.Tensor]:
    """(row order, kept tiles) of the rule above. tile_lse: (tiles, padded rows) float32, the log-sum-exp of each
    tile's non-target logits per token (overwritten); lse, valid: (n,) per token. Returns the token at each
    position of the backward's row order, (padded rows,) int64 (positions n and beyond: padding, index >= n), and
    K_b, (padded rows / block_n,) int64 ascending: block b (positions b * block_n ...) keeps tiles [0, K_b)."""
    tiles = tile_lse.shape[0]
    m = token_tile_mass(tile_lse, lse, valid)
    before = m.cumsum(dim=0).sub_(m)  # mass in tiles < t
    cutoff = (before < (before[-1] + m[-1] - mass)).sum(dim=0)  # tiles t whose suffix mass exceeds the budget
    del before
    rows = torch.argsort(cutoff, stable=True)
    kept = kept_tiles(m.index_select(1, rows).view(tiles, -1, block_n).amax(dim=2), mass)
    blocks = torch.argsort(kept, stable=True)
    return rows.view(-1, block_n)[blocks].reshape(-1), kept[blocks]


def kept_share(kept: torch.Tensor, tiles: int) -> float:
    """Share of (row block, tile) products the backward computes (1 where nothing is filtered: kept empty)."""
    return 1.0 if kept.numel() == 0 else kept.double().mean().item() / tiles


def kept_per_token(rows: torch.Tensor, kept: torch.Tensor, n: int, block_n: int) -> torch.Tensor:
    """(n,) int64: how many leading vocabulary tiles each token's block keeps (its softmax part is computed on
    tiles [0, k_i) of the sorted vocabulary), from plan's row order and kept tiles."""
    per_row = kept.repeat_interleave(block_n)
    real = rows < n
    return torch.zeros(n, dtype=torch.int64, device=rows.device).index_copy_(0, rows[real], per_row[real])


def pieces(kept: Sequence[int], block_n: int, max_elements: int, max_tiles: int, block_v: int, start: int = 0,
           ) -> list[tuple[int, int, int, int]]:
    """Dense pieces (first tile, end tile, first row, end row) covering, without overlap, the tiles >= start kept
    by blocks (block_n rows each) whose kept tiles K_b ascend. Walking the tiles from start, a piece starting at
    tile t holds every row of the blocks that keep t (a trailing run) and as many tiles as rows x tiles x block_v
    <= max_elements allows, between 1 and max_tiles, up to the largest K_b (tiles in it past a block's K_b are
    that block's zeros). Where one tile of those rows exceeds max_elements, its rows are split into pieces of
    whole blocks, consecutive in the list."""
    out: list[tuple[int, int, int, int]] = []
    rows, end = len(kept) * block_n, max(kept, default=0)
    t, first = start, 0
    while t < end:
        while kept[first] <= t:
            first += 1
        r0 = first * block_n
        width = max(1, min(max_tiles, max_elements // ((rows - r0) * block_v), end - t))
        step = max(block_n, max_elements // (width * block_v) // block_n * block_n)
        out += [(t, t + width, r, min(rows, r + step)) for r in range(r0, rows, step)]
        t += width
    return out
