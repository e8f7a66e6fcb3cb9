"""Triton version of the gradient filter's plan (kernels/filter.py, whose `plan` is the reference): the backward's
row order and each row block's kept vocabulary tiles, in two small kernels and two argsorts, reading the
(tiles x padded rows) tile log-sum-exps once each and leaving them unchanged.

1. `_cutoff_kernel`: per token i, k_i = the number of tiles t whose suffix mass sum_{s >= t} m_is exceeds the
   budget (m_it = exp(tile LSE - LSE_i), float32; 0 for ignored tokens and padding rows), summed in float32.
2. rows = the tokens sorted by k_i (stable: ignored and padding rows, k_i = 0, first).
3. `_block_kept_kernel`: per block b of block_n positions of rows, K_b = the number of tiles t whose suffix
   sum_{s >= t} M_bs exceeds the budget, M_bs = max over the block's tokens of m_is, summed in float64 as
   `kernels.filter.kept_tiles` does.
4. Blocks sorted by K_b (stable).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.tuning import CUTOFF_BLOCK_I, CUTOFF_BLOCK_T, KEPT_ELEMENTS


@triton.jit
def _token_lse(LSE, VALID, tokens, real):
    """(ok, LSE) of the tokens: ok where real and not ignored; LSE 0 elsewhere."""
    ok = real & (tl.load(VALID + tokens, mask=real, other=0) != 0)
    return ok, tl.load(LSE + tokens, mask=ok, other=0.0)


@triton.jit
def _masses(TLSE, stride_t, ts, t_ok, tokens, ok, lse):
    """m[t, j] = exp(TLSE[ts[t], tokens[j]] - lse[j]) (float32) for tiles t_ok and tokens ok, else 0; nothing else
    is read."""
    both = t_ok[:, None] & ok[None, :]
    x = tl.load(TLSE + ts.to(tl.int64)[:, None] * stride_t + tokens[None, :], mask=both, other=float("-inf"))
    return tl.where(both, tl.exp(x - lse[None, :]), 0.0)


@triton.jit(do_not_specialize=["N"])  # row-dependent sizes: one kernel for every batch
def _cutoff_kernel(
    TLSE, LSE, VALID, CUTOFF, N, P, tiles, stride_t, mass,
    BLOCK_I: tl.constexpr, BLOCK_T: tl.constexpr,
):
    """CUTOFF[i] = number of tiles t with sum_{s >= t} exp(TLSE[s, i] - LSE[i]) > mass (float32), for the program's
    BLOCK_I columns i < P of TLSE; 0 for ignored tokens and columns i >= N, whose TLSE is never read."""
    cols = tl.program_id(0) * BLOCK_I + tl.arange(0, BLOCK_I)
    ok, lse = _token_lse(LSE, VALID, cols, cols < N)
    carry = tl.zeros((BLOCK_I,), dtype=tl.float32)  # mass in the tiles already walked
    count = tl.zeros((BLOCK_I,), dtype=tl.int32)
    steps = tl.cdiv(tiles, BLOCK_T)
    for step in range(0, steps):  # tile chunks from the last to the first
        ts = (steps - 1 - step) * BLOCK_T + tl.arange(0, BLOCK_T)
        t_ok = ts < tiles
        m = _masses(TLSE, stride_t, ts, t_ok, cols, ok, lse)
        suffix = carry[None, :] + tl.cumsum(m, axis=0, reverse=True)
        count += tl.sum((t_ok[:, None] & (suffix > mass)).to(tl.int32), axis=0)
        carry += tl.sum(m, axis=0)
    tl.store(CUTOFF + cols, count.to(CUTOFF.dtype.element_ty), mask=cols < P)


@triton.jit(do_not_specialize=["N"])  # row-dependent sizes: one kernel for every batch
def _block_kept_kernel(
    TLSE, LSE, VALID, ROWS, KEPT, N, tiles, stride_t, block_n, mass: tl.float64,
    BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr,
):
    """KEPT[b] = number of tiles t with sum_{s >= t} M_bs > mass (float64), M_bs = max over the tokens
    i = ROWS[b * block_n + j], j < block_n, of exp(TLSE[s, i] - LSE[i]) (float32; 0 for ignored tokens, i >= N)."""
    b = tl.program_id(0)
    js = tl.arange(0, BLOCK_N)
    rows = tl.load(ROWS + b * block_n + js, mask=js < block_n, other=N)
    ok, lse = _token_lse(LSE, VALID, rows, rows < N)
    carry = tl.zeros((), dtype=tl.float64)  # block mass in the tiles already walked
    count = tl.zeros((), dtype=tl.int32)
    steps = tl.cdiv(tiles, BLOCK_T)
    for step in range(0, steps):  # tile chunks from the last to the first
        ts = (steps - 1 - step) * BLOCK_T + tl.arange(0, BLOCK_T)
        t_ok = ts < tiles
        m = _masses(TLSE, stride_t, ts, t_ok, rows, ok, lse)
        block_mass = tl.max(m, axis=1).to(tl.float64)
        suffix = carry + tl.cumsum(block_mass, axis=0, reverse=True)
        count += tl.sum((t_ok & (suffix > mass)).to(tl.int32), axis=0)
        carry += tl.sum(block_mass, axis=0)
    tl.store(KEPT + b, count.to(tl.int64))


def triton_plan(tile_lse: torch.Tensor, lse: torch.Tensor, valid: torch.Tensor, block_n: int, mass: float,
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """`kernels.filter.plan` (same arguments and results) without overwriting tile_lse: the row order, (padded
    rows,) int64 (positions n and beyond: padding, index >= n), and K_b, (padded rows / block_n,) int64 ascending.
    tile_lse: (tiles, padded rows) float32 with unit column stride; columns n and beyond are never read."""
    tiles, padded = tile_lse.shape
    n = lse.numel()
    assert tile_lse.dtype == torch.float32 and tile_lse.stride(1) == 1 and padded % block_n == 0 and padded >= n
    dev = tile_lse.device
    if padded == 0:
        empty = torch.empty(0, dtype=torch.int64, device=dev)
        return empty, empty
    # narrow keys: a stable argsort of 8192 int16 keys takes 39 us on an H100, of int64 keys 86 us
    cutoff = torch.empty(padded, dtype=torch.int16 if tiles < 2**15 else torch.int32, device=dev)
    _cutoff_kernel[(triton.cdiv(padded, CUTOFF_BLOCK_I),)](
        tile_lse, lse, valid, cutoff, n, padded, tiles, tile_lse.stride(0), mass,
        BLOCK_I=CUTOFF_BLOCK_I, BLOCK_T=CUTOFF_BLOCK_T, num_warps=4,
    )
    rows = torch.argsort(cutoff, stable=True)
    blocks = padded // block_n
    kept = torch.empty(blocks, dtype=torch.int64, device=dev)
    block_span = triton.next_power_of_2(block_n)
    _block_kept_kernel[(blocks,)](
        tile_lse, lse, valid, rows, kept, n, tiles, tile_lse.stride(0), block_n, mass,
        BLOCK_N=block_span, BLOCK_T=max(1, KEPT_ELEMENTS // block_span), num_warps=8,
    )
    order = torch.argsort(kept, stable=True)
    return rows.view(-1, block_n)[order].reshape(-1), kept[order]
