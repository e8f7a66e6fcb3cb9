"""Triton backward: recompute logits blockwise, skip negligible tiles, add the exact low-rank parts.

With g_i the upstream gradient, dloss_i/dz_iv = p_iv - (1 - beta)[v = y_i] - beta / V, split into
1. softmax part g_i p_iv (v != y_i): recomputed per (row block, vocabulary tile) into dZ, then dC += dZ^T E and
   dE += dZ C by cuBLAS (dE accumulated in float32). With a filter that drops mass (kernels/filter.py) the rows
   are taken in the forward's row order and the vocabulary in its sorted order, and block b keeps tiles
   [0, K_b), K_b ascending: a vocabulary tile is kept by a contiguous run of trailing rows only, so the backward
   runs over pieces (filter.pieces) of one vocabulary chunk x exactly those rows (tiles inside a piece past a
   block's K_b written as zeros, not computed), and never visits the tiles past the largest K_b. Without a
   filter (or where the plan keeps over STAIRCASE_MAX_SHARE of the tiles): every row, every chunk.
2. target column a_i = g_i (p_iy - (1 - beta)): dE_i += a_i C_{y_i}; dC_{y_i} += sum_{j: y_j = y_i} a_j E_j.
3. uniform part -beta g_i / V (rank one): dE_i -= beta g_i mean_v C_v; dC_v -= (beta / V) sum_i g_i E_i.
With softcap, every part is multiplied by dz/du = 1 - (z / s)^2. Parts 2 and 3 (the target column and the
label-smoothing term) are never filtered. The dense path needs no low-rank parts: its dZ holds all three (the
products add them up), and the logits the forward kept in dC's storage (forward.kept_chunks) become their dZ in
place instead of being recomputed.

Memory beyond the gradients: one dedicated (chunk_rows x chunk_vocab) dZ chunk in the input dtype and dE's
float32 accumulator, within TILES.extra_bytes together: at N = 8192, D = 640 (bf16) a 64 MiB dZ chunk (8192 x 4096)
+ 20 MiB; at N = 8192, D = 2304 also a 64 MiB chunk (8192 x 4096) + 72 MiB, 12% of the gradients. The dense path
first puts larger chunks of every row (up to TILES.workspace_vocab wide) in the rows of dC it has not written yet
(`dense_chunks`): at N = 8192, D = 2304, after the 65536 positions whose logits the forward kept, 10 chunks of 32768
down to 4864 bring it to 93% of the vocabulary, each dC row is written once (dZ^T E); with the dedicated chunks dE's
accumulator is read and written 23 times instead of 63. With a filter: the hidden states in the row order (N x D
in their dtype), a dZ buffer of the dense chunk less them, and a 24 MiB buffer of a piece's head rows, then its dC
rows; dC starts as the uniform part and gets one rounded write per piece, and each target's row one more rounded
add (part 2).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import triton
import triton.language as tl

from kernels import forward
from kernels._host import AsyncHostCopy
from kernels._tl_utils import dot_flags, logits_tile, softcap_fn, tma_operand
from kernels.filter import pieces as filter_pieces
from kernels.tuning import GATHER_BUFFER_BYTES, PREFIX_SHARE, STAIRCASE_MAX_SHARE, BackwardTiles


TILES = BackwardTiles()  # kernels.tuning's; tests swap in small ones



def prefix_tiles(vocab_tiles: int) -> int:
    """Leading tiles of the sorted vocabulary a filtered backward computes before it has the plan: PREFIX_SHARE of
    them, at least one."""
    return min(vocab_tiles, max(1, round(PREFIX_SHARE * vocab_tiles)))


# p = exp2(z LOG2E - LSE LOG2E): one FMA before each exp2, and the target term only in tiles that hold a target.
# Measured on an H100 (2026-11-25, paper shape, torch profiler, rounds alternating): the dZ kernels of a step 12.2-12.3
# ms against 12.5-12.8. The same exp2 in the forward's kernel (at 255 registers) took 16.1 ms against 15.1.
LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)


@triton.jit(do_not_specialize=["N", "row_tiles", "vc"])  # one compiled kernel for every launch and batch
def _dz_kernel(
    E, C, Y, LSE, G, GSCALE, KEPT, DZ,
    N, V, D, r0, row_tiles, c0, vc, c_off, stride_en, stride_ed, stride_cv, stride_cd, stride_dz,
    beta_over_v, one_minus_beta, softcap,
    BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
    GROUP_V: tl.constexpr, MASK_V: tl.constexpr, FILTERING: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
    DENSE_PARTS: tl.constexpr, E_TMA: tl.constexpr, C_TMA: tl.constexpr, DOT_UPCAST: tl.constexpr,
    DOT_PRECISION: tl.constexpr, EVEN_V: tl.constexpr,
):
    """dZ[i - r0, j - c0] = (g_i / gscale) (p_iv [v != y_i]) (1 - (z_iv / s)^2 if softcap) for rows i (of E, LSE,
    G, Y) and vocabulary positions j of the (row_tiles x vc) chunk starting at row r0, position c0 (v: the entry at
    position j; Y holds the targets' positions); with DENSE_PARTS the whole gradient of the logit,
    (g_i / gscale) (p_iv - (1 - beta) [v = y_i] - beta / V) (1 - (z_iv / s)^2 if softcap). Program p takes tiles
    p, p + programs, ... in one flattened loop (the next tile's loads overlap this one's softmax); tiles are
    numbered by groups of GROUP_V vocabulary tiles, each over all rows (so a wave reads one group of head rows,
    which stays in L2); C holds the head rows of positions c_off, c_off + 1, ... With FILTERING, tiles of row block
    b at filter tiles (MASK_V wide) >= KEPT[b] are not computed and written as zeros. With EVEN_V (V a multiple of
    BLOCK_V) no column is masked."""
    tiles_v = tl.cdiv(vc, BLOCK_V)
    k_tiles = tl.cdiv(D, BLOCK_K)
    for tile in tl.range(tl.program_id(0), row_tiles * tiles_v, tl.num_programs(0), flatten=True):
        first_v = tile // (row_tiles * GROUP_V) * GROUP_V
        width = tl.minimum(tiles_v - first_v, GROUP_V)
        in_group = tile - first_v * row_tiles
        tn = in_group // width
        tv = first_v + in_group % width
        rows = r0 + tn * BLOCK_N + tl.arange(0, BLOCK_N)
        pos0 = c0 + tv * BLOCK_V
        pos = pos0 + tl.arange(0, BLOCK_V)
        row_ok = rows < N
        col_ok = pos < V
        active = True
        n_k = k_tiles
        if FILTERING:
            active = (c0 + tv * BLOCK_V) // MASK_V < tl.load(KEPT + r0 // BLOCK_N + tn)
            n_k = tl.where(active, k_tiles, 0)
        z = logits_tile(
            E, C, tl.minimum(rows, N - 1), tl.minimum(pos, V - 1) - c_off, r0 + tn * BLOCK_N,
            c0 + tv * BLOCK_V - c_off, D, n_k, stride_en, stride_ed, stride_cv, stride_cd, BLOCK_N, BLOCK_V, BLOCK_K,
            EVEN_K, E_TMA, C_TMA, DOT_UPCAST, DOT_PRECISION,
        )
        if HAS_SOFTCAP:
            z = softcap_fn(z, softcap)
        lse = tl.load(LSE + rows, mask=row_ok, other=float("inf"))
        g = tl.load(G + rows, mask=row_ok, other=0.0) / tl.load(GSCALE)
        y = tl.load(Y + rows, mask=row_ok, other=-1)
        p = tl.exp2(z * LOG2E - (lse * LOG2E)[:, None])  # one FMA before each exp2
        if DENSE_PARTS:
            if tl.max(((y >= pos0) & (y < pos0 + BLOCK_V)).to(tl.int32), axis=0) > 0:  # a target in the tile
                p -= tl.where(pos[None, :] == y[:, None], one_minus_beta, 0.0)
            dz = p - beta_over_v
            if not EVEN_V:  # the last tile's columns past V
                dz = tl.where(col_ok[None, :], dz, 0.0)
        else:
            dz = tl.where(col_ok[None, :] & (pos[None, :] != y[:, None]), p, 0.0)
        dz = dz * g[:, None]
        if HAS_SOFTCAP:
            dz = dz * (1.0 - (z / softcap) * (z / softcap))
        if FILTERING:
            dz = tl.where(active, dz, 0.0)
        # the (BLOCK_N x BLOCK_V) pointers only now: built before the GEMM they stay live through it and spill
        out = DZ + (tn * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)[:, None] * stride_dz
        out += (tv * BLOCK_V + tl.arange(0, BLOCK_V))[None, :]
        tl.store(out, dz.to(DZ.dtype.element_ty))


@triton.jit(do_not_specialize=["N", "R"])  # row-dependent sizes: one kernel for every batch
def _finalize_de_kernel(
    ACC, DE, C, Y, A, UB, CMEAN, ROWS, N, R, D, stride_cv, stride_cd,
    BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, HAS_UNIFORM: tl.constexpr,
):
    """dE_i = acc_p + a_i C_{y_i} - beta g_i mean_v C_v in dE's dtype, for the R rows p of ACC (float32,
    contiguous), i = ROWS[p] (rows i >= N are padding)."""
    ps = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    rows = tl.load(ROWS + ps, mask=ps < R, other=N)
    ds = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    r_ok = (ps < R) & (rows < N)
    ok = r_ok[:, None] & (ds < D)[None, :]
    x = tl.load(ACC + ps.to(tl.int64)[:, None] * D + ds[None, :], mask=ok, other=0.0)
    a = tl.load(A + rows, mask=r_ok, other=0.0)
    y = tl.maximum(tl.load(Y + rows, mask=r_ok, other=0), 0).to(tl.int64)
    c_y = tl.load(C + y[:, None] * stride_cv + ds[None, :] * stride_cd, mask=ok, other=0.0)
    x += a[:, None] * c_y.to(tl.float32)
    if HAS_UNIFORM:
        ub = tl.load(UB + rows, mask=r_ok, other=0.0)
        x -= ub[:, None] * tl.load(CMEAN + ds, mask=ds < D, other=0.0)[None, :]
    tl.store(DE + rows.to(tl.int64)[:, None] * D + ds[None, :], x.to(DE.dtype.element_ty), mask=ok)


@triton.jit(do_not_specialize=["N"])  # row-dependent sizes: one kernel for every batch
def _target_dc_kernel(
    DC, E, A, ORDER, SORTED, N, D, stride_en, stride_ed, stride_dcv, stride_dcd,
    BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """dC[u] += sum over tokens j with target u of a_j E_j, summed in float32 before one rounding. SORTED holds the
    targets in ascending order (-1: ignored), ORDER their tokens; the program at sorted position k does target u =
    SORTED[k] if u's run starts at k (BLOCK_T tokens of the run at a time), else nothing. No host sync."""
    k = tl.program_id(0)
    u = tl.load(SORTED + k)
    prev = tl.load(SORTED + tl.maximum(k - 1, 0))
    if (u >= 0) & ((k == 0) | (prev != u)):
        ds = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
        d_ok = ds < D
        acc = tl.zeros((BLOCK_T, BLOCK_D), dtype=tl.float32)
        start = k
        more = start < N
        while more:
            ts = start + tl.arange(0, BLOCK_T)
            same = tl.load(SORTED + ts, mask=ts < N, other=-1) == u
            i = tl.load(ORDER + ts, mask=same, other=0)
            e = tl.load(E + i[:, None] * stride_en + ds[None, :] * stride_ed, mask=same[:, None] & d_ok[None, :],
                        other=0.0)
            acc += tl.load(A + i, mask=same, other=0.0)[:, None] * e.to(tl.float32)
            start += BLOCK_T
            more = (tl.sum(same.to(tl.int32), axis=0) == BLOCK_T) & (start < N)
        ptrs = DC + u * stride_dcv + ds * stride_dcd
        old = tl.load(ptrs, mask=d_ok, other=0.0).to(tl.float32)
        tl.store(ptrs, (old + tl.sum(acc, axis=0)).to(DC.dtype.element_ty), mask=d_ok)


@triton.jit(do_not_specialize=["R", "rows_per_program"])  # row-dependent sizes: one kernel for every batch
def _colsum_kernel(
    X, W, OUT, R, D, stride_xr, stride_xd, rows_per_program,
    BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, HAS_W: tl.constexpr,
):
    """OUT[d] += sum_r w_r X[r, d] over this program's rows (float32, atomic across programs)."""
    ds = tl.program_id(0) * BLOCK_D + tl.arange(0, BLOCK_D)
    d_ok = ds < D
    r_begin = tl.program_id(1) * rows_per_program
    r_end = tl.minimum(r_begin + rows_per_program, R)
    acc = tl.zeros((BLOCK_R, BLOCK_D), dtype=tl.float32)
    for r in range(r_begin, r_end, BLOCK_R):
        rows = r + tl.arange(0, BLOCK_R)
        r_ok = rows < r_end
        x = tl.load(
            X + rows.to(tl.int64)[:, None] * stride_xr + ds[None, :] * stride_xd,
            mask=r_ok[:, None] & d_ok[None, :], other=0.0,
        ).to(tl.float32)
        if HAS_W:
            x *= tl.load(W + rows, mask=r_ok, other=0.0)[:, None]
        acc += x
    tl.atomic_add(OUT + ds, tl.sum(acc, axis=0), mask=d_ok)


def weighted_colsum(x: torch.Tensor, w: torch.Tensor | None = None) -> torch.Tensor:
    """sum_r w_r x[r, :] in float32 (w = 1 when None), without an upcast copy of x."""
    rows, d = x.shape
    out = torch.zeros(d, dtype=torch.float32, device=x.device)
    if rows == 0:
        return out
    block_d = 128
    programs_r = max(1, min(triton.cdiv(rows, 64), 8 * forward.num_sms(x.device) // triton.cdiv(d, block_d)))
    rows_per_program = triton.cdiv(rows, programs_r)
    _colsum_kernel[(triton.cdiv(d, block_d), triton.cdiv(rows, rows_per_program))](
        x, w if w is not None else out, out, rows, d, *x.stride(), rows_per_program,
        BLOCK_R=16, BLOCK_D=block_d, HAS_W=w is not None,
    )
    return out


def triton_backward(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, saved: tuple[torch.Tensor, ...],
    grad_loss: torch.Tensor, label_smoothing: float, ignore_index: int, softcap: float | None, filter: str,
    need_hidden_grad: bool, need_weight_grad: bool, plan_verdict: Callable[[bool], None] | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(dE, dC) of sum_i g_i loss_i; see the module docstring for the decomposition and kernels/filter.py for the
    filter (its row order and kept tiles come from the forward, in `saved`). ``plan_verdict`` (with a plan) is told
    whether the plan sent the backward dense."""
    lse, z_y, rest_prob, order, rows, kept, target_pos, d_weight_storage, shift = saved
    n, d = hidden.shape
    vocab = weight.shape[0]
    dev = hidden.device
    beta = label_smoothing
    valid = targets != ignore_index
    y = torch.where(valid, targets, -1)
    g = torch.where(valid, grad_loss.float(), 0.0)
    gscale = _gradient_scale(g, hidden.dtype)

    plan = stairs = None
    if rows.numel() > 0 and n > 0:  # the filter's plan, read once the GPU has the work queued below
        plan = AsyncHostCopy(kept)
        stairs = _Staircase(hidden, weight, target_pos, lse, g, gscale, order, rows, kept, beta, softcap,
                            need_hidden_grad)
    acc = torch.zeros((max(rows.numel(), n), d), dtype=torch.float32, device=dev) if need_hidden_grad else None
    # written by the path taken below (the dense one uses its unwritten rows meanwhile); the forward may have
    # allocated it, holding logits it kept
    d_weight = None
    if need_weight_grad:
        d_weight = d_weight_storage.view(weight.shape) if d_weight_storage.numel() else torch.empty_like(
            weight, memory_format=torch.contiguous_format)
    alpha = float(gscale) if hidden.dtype == torch.float16 else 1.0  # float16: a host sync (gscale)
    if stairs is not None:  # one host sync, with the first pieces queued (a filter runs without softcap if beta > 0)
        uniform_row = None
        if d_weight is not None and beta > 0.0:
            uniform_row = (-(beta / vocab) * weighted_colsum(hidden, g)).to(weight.dtype)
        stairs.start(weight, d_weight, uniform_row, acc, alpha)
        kept_host = plan.get()
        dense = kept_host.mean() > STAIRCASE_MAX_SHARE * triton.cdiv(vocab, forward.TILES.block_v)
        if plan_verdict is not None:
            plan_verdict(dense)
        if not dense:
            stairs.finish(kept_host)
            return _low_rank_parts(hidden, weight, y, g, z_y, rest_prob, rows, acc, d_weight, beta, softcap)
        stairs = None  # little dropped: dense, in the natural orders, from the start (its buffers freed)
        if acc is not None:
            acc.zero_()
    if n > 0:
        start = 0
        if shift.numel() > 0:  # the forward kept the logits of the first vocabulary chunks in dC's storage
            start = _kept_part(hidden, weight, y, lse, g, gscale, z_y, rest_prob, shift, d_weight, acc, beta,
                               softcap, alpha)
        _dense_part(hidden, weight, y, lse, g, gscale, d_weight, acc, beta, softcap, alpha, start)
    elif d_weight is not None:
        d_weight.zero_()
    return (acc[:n].to(hidden.dtype) if acc is not None else None), d_weight


def _low_rank_parts(
    hidden: torch.Tensor, weight: torch.Tensor, y: torch.Tensor, g: torch.Tensor, z_y: torch.Tensor,
    rest_prob: torch.Tensor, rows: torch.Tensor, acc: torch.Tensor | None, d_weight: torch.Tensor | None,
    beta: float, softcap: float | None,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(dE, dC) after the staircase: dE = acc (rows in the row order `rows`) + the target column a_i C_{y_i} and
    the uniform part -beta g_i mean_v C_v; dC (holding the uniform part and the softmax part) += the target
    column's sum_{j: y_j = u} a_j E_j, with a_i = g_i (p_iy - (1 - beta)) (1 - (z_iy / s)^2 with softcap)."""
    n, d = hidden.shape
    a = g * (beta - rest_prob)  # g (p_y - (1 - beta)), exact where p_y rounds to 1
    if softcap is not None:
        a = a * (1.0 - (z_y / softcap) ** 2)
    a = torch.where(y >= 0, a, 0.0)
    d_hidden = None
    if acc is not None:
        uniform = beta > 0.0  # filters run without softcap where beta > 0: the uniform part is rank one
        cmean = weighted_colsum(weight) / weight.shape[0] if uniform else a  # a: an unused pointer otherwise
        d_hidden = torch.empty((n, d), dtype=hidden.dtype, device=hidden.device)
        _finalize_de_kernel[(triton.cdiv(acc.shape[0], 32), triton.cdiv(d, 128))](
            acc, d_hidden, weight, y, a, beta * g, cmean, rows, n, acc.shape[0], d, *weight.stride(),
            BLOCK_R=32, BLOCK_D=128, HAS_UNIFORM=uniform,
        )
    if d_weight is not None:
        sorted_y, tokens = torch.sort(y)
        _target_dc_kernel[(n, triton.cdiv(d, 128))](
            d_weight, hidden, a, tokens, sorted_y, n, d, *hidden.stride(), *d_weight.stride(), BLOCK_T=16, BLOCK_D=128,
        )
    return d_hidden, d_weight


def _gradient_scale(g: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(1,) float32 divisor of g in dZ: max |g| for float16 (dz g / max|g| in [-1, 1] stays in its range; one host
    sync, for cuBLAS's alpha), 1 otherwise (bfloat16 and float32 hold dz g as it is)."""
    if dtype != torch.float16 or g.numel() == 0:
        return torch.ones(1, dtype=torch.float32, device=g.device)
    gmax = g.abs().amax()
    return torch.where(gmax > 0, gmax, 1.0).reshape(1)


def _accumulate_f32(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor, alpha: float) -> None:
    """acc += alpha a @ b, acc float32, a and b 16- or 32-bit: cuBLAS accumulates in float32 and adds to acc in
    place (on the CPU, under the interpreter: an upcast copy of the operands)."""
    if a.dtype == torch.float32:
        acc.addmm_(a, b, alpha=alpha)
    elif acc.is_cuda:
        torch.addmm(acc, a, b, alpha=alpha, out_dtype=torch.float32, out=acc)
    else:
        acc.addmm_(a.float(), b.float(), alpha=alpha)


def chunk_shape(row_blocks: int, num_vtiles: int, d: int, n: int, itemsize: int, has_acc: bool) -> tuple[int, int]:
    """(chunk rows, chunk vocabulary) of a dedicated dZ buffer: TILES.chunk_vocab wide (at most the vocabulary), as
    many whole row blocks as TILES.dz_elements and TILES.extra_bytes less the float32 dE accumulator allow (at
    least one)."""
    ft, bt = forward.TILES, TILES
    chunk_vocab = min(bt.chunk_vocab, num_vtiles * ft.block_v)
    acc_bytes = 4 * n * d if has_acc else 0
    elements = min(bt.dz_elements, (bt.extra_bytes - acc_bytes) // itemsize)
    return min(row_blocks, max(1, elements // (chunk_vocab * ft.block_n))) * ft.block_n, chunk_vocab


# Element alignment of a dZ chunk placed in dC's storage (128 bytes in 16-bit types).
WORKSPACE_ALIGN = 64


@dataclass(frozen=True)
class DenseChunk:
    """Vocabulary positions [c0, c0 + vc) over rows taken `rows` at a time; dZ lives at element `workspace` of dC's
    storage (behind the chunk's own dC rows, not yet written), or in the dedicated buffer (workspace None)."""

    c0: int
    vc: int
    rows: int
    workspace: int | None


def dense_chunks(n: int, vocab: int, d: int, itemsize: int, has_acc: bool, has_dc: bool,
                 start: int = 0) -> list[DenseChunk]:
    """The dense path's vocabulary chunks from position `start` (dC rows below it written), in order. With dC
    computed (has_dc), chunk c0 writes dC rows [c0, c0 + vc) only, so rows [c0 + vc, V) hold nothing yet (kept
    logits there are consumed by then): while a chunk of every row, up to
    TILES.workspace_vocab wide, fits at the end of that space (padded rows x vc <= (V - c0 - vc) d) and is larger
    than the dedicated chunk, its dZ lives there, each of its dC rows is written once and dE's float32 accumulator
    is read and written once for it. The rest of the vocabulary (all of it without dC) goes through the dedicated
    buffer of `chunk_shape`."""
    ft, bt = forward.TILES, TILES
    row_blocks = triton.cdiv(n, ft.block_n)
    ded_rows, ded_vocab = chunk_shape(row_blocks, triton.cdiv(vocab, ft.block_v), d, n, itemsize, has_acc)
    padded_rows, tile = row_blocks * ft.block_n, bt.dz_block_v
    out: list[DenseChunk] = []
    c0 = start
    while has_dc and n > 0:
        room = (vocab - c0) * d - WORKSPACE_ALIGN  # elements of dC from row c0 on, less the alignment
        vc = min(bt.workspace_vocab, room // (padded_rows + d)) // tile * tile  # vc rows of dC + its dZ fit
        if vc * padded_rows <= ded_rows * ded_vocab:
            break
        size = padded_rows * vc
        out.append(DenseChunk(c0, vc, padded_rows, (vocab * d - size) // WORKSPACE_ALIGN * WORKSPACE_ALIGN))
        c0 += vc
    out += [DenseChunk(c, min(ded_vocab, vocab - c), ded_rows, None) for c in range(c0, vocab, ded_vocab)]
    return out


@dataclass
class _Recompute:
    """What every dZ launch of one backward shares: rows (E, LSE, G, Y in the row order), the head operand (the
    whole head, or a buffer of gathered rows), the kept tiles (with a filter); dense_parts: dZ holds the whole
    gradient of the logits (the dense path)."""

    e: torch.Tensor
    y: torch.Tensor
    lse: torch.Tensor
    g: torch.Tensor
    gscale: torch.Tensor
    head: torch.Tensor
    kept: torch.Tensor | None
    vocab: int
    beta: float
    softcap: float | None
    dense_parts: bool = False

    def __post_init__(self) -> None:
        ft, bt = forward.TILES, TILES
        e_arg, e_tma = tma_operand(self.e, [ft.block_n, ft.block_k])
        c_arg, c_tma = tma_operand(self.head, [bt.dz_block_v, ft.block_k])
        filtering = self.kept is not None
        self.head_args = (e_arg, c_arg, self.y, self.lse, self.g, self.gscale, self.kept if filtering else self.y)
        self.sizes = (self.e.shape[0], self.vocab, self.e.shape[1])
        # every argument after the launch's own (r0, row_tiles, c0, vc, c_off, dZ row stride), constexprs included
        self.tail_args = (
            self.beta / self.vocab, 1.0 - self.beta, self.softcap or 1.0, ft.block_n, bt.dz_block_v, ft.block_k,
            self.e.shape[1] % ft.block_k == 0, bt.dz_group_v, ft.block_v, filtering, self.softcap is not None,
            self.dense_parts, e_tma, c_tma, *dot_flags(self.e.dtype).values(), self.vocab % bt.dz_block_v == 0,
        )
        self.strides = (*self.e.stride(), *self.head.stride())
        self.options = dict(num_warps=ft.num_warps, num_stages=bt.dz_stages if self.e.element_size() == 2 else 2)
        self.sms = forward.num_sms(self.e.device)  # one persistent recompute program per SM
        self.compiled = None
        self.runners: dict[int, Callable[..., None]] = {}  # the compiled kernel's launcher per grid size
        self.stream = torch.cuda.current_stream(self.e.device).cuda_stream if self.e.is_cuda else None

    def __call__(self, dz: torch.Tensor, r0: int, nr: int, c0: int, vc: int, c_off: int) -> None:
        """dZ (nr x vc, rows dz.stride(0) apart, room for whole tiles) of rows r0 ..., vocabulary positions
        c0 ...; the head operand's row 0 is position c_off. After the first launch the compiled kernel is called
        directly, on the stream of the first (Triton's launcher re-derives the specialisation of ~35 arguments per
        call, ~30 us of host time): the arguments that change between launches are multiples of 16 (r0, c0, c_off,
        the dZ row stride: whole tiles) or not specialised on (row_tiles, vc)."""
        rb = triton.cdiv(nr, forward.TILES.block_n)
        programs = min(rb * triton.cdiv(vc, TILES.dz_block_v), self.sms)
        args = (*self.head_args, dz, *self.sizes, r0, rb, c0, vc, c_off, *self.strides, dz.stride(0), *self.tail_args)
        if self.compiled is None:  # under the interpreter a launch returns nothing: every launch comes here
            self.compiled = _dz_kernel[(programs,)](*args, **self.options)
            return
        runner = self.runners.get(programs)
        if runner is None:  # its runner takes all three grid dimensions
            runner = self.runners[programs] = self.compiled[(programs, 1, 1)]
        runner(*args, stream=self.stream)


def _kept_part(
    hidden: torch.Tensor, weight: torch.Tensor, y: torch.Tensor, lse: torch.Tensor, g: torch.Tensor,
    gscale: torch.Tensor, z_y: torch.Tensor, rest_prob: torch.Tensor, shift: torch.Tensor, d_weight: torch.Tensor,
    acc: torch.Tensor | None, beta: float, softcap: float | None, alpha: float,
) -> int:
    """The vocabulary chunks whose logits the forward kept in dC's storage (forward.kept_chunks): each turned into
    its dZ in place, then dC rows = dZ^T E and acc += alpha dZ C, chunk by chunk. Returns the vocabulary positions
    done."""
    n, d = hidden.shape
    ft = forward.TILES
    width = ft.keep_vocab
    chunks = shift.shape[0] * ft.block_v // width
    region = d_weight.view(-1)[d_weight.numel() - chunks * width * n :]
    row_blocks = triton.cdiv(n, TILES.kept_rows)
    _kept_dz_kernel[(chunks * row_blocks, width // ft.block_v)](
        region, shift, lse, g, gscale, y, rest_prob, z_y, n, width // ft.block_v, beta, beta / weight.shape[0],
        softcap or 1.0, BLOCK_N=TILES.kept_rows, BLOCK_V=ft.block_v, HAS_SOFTCAP=softcap is not None,
        num_warps=TILES.kept_warps,
    )
    for j in range(chunks):
        dz = region[j * width * n : (j + 1) * width * n].view(n, width)
        _add_dc(d_weight[j * width : (j + 1) * width], dz.T, hidden, None, alpha, True)
        if acc is not None:
            _accumulate_f32(acc[:n], dz, weight[j * width : (j + 1) * width], alpha)
    return chunks * width


@triton.jit(do_not_specialize=["N"])  # row-dependent sizes: one kernel for every batch
def _kept_dz_kernel(
    Z, SHIFT, LSE, G, GSCALE, Y, REST, ZY, N, chunk_tiles, beta, beta_over_v, softcap,
    BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
):
    """In place, Z's chunks (N x W each, W = chunk_tiles BLOCK_V, one after another: vocabulary positions jW ...)
    of logits less SHIFT[tile, row] (the target's -inf) become dZ = (g_i / gscale) (p_iv - (1 - beta) [v = y_i] -
    beta / V) (1 - (z_iv / s)^2 with softcap), p_iv = exp(z_iv - LSE_i); at the target p - (1 - beta) is taken
    exactly as beta - REST_i (REST = 1 - p_y) and z as ZY_i. Program (chunk, row block) x tile of the chunk."""
    row_blocks = tl.cdiv(N, BLOCK_N)
    chunk = tl.program_id(0) // row_blocks
    rows = (tl.program_id(0) % row_blocks) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    tile = chunk * chunk_tiles + tl.program_id(1)
    cols = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
    ptrs = Z + (chunk * N + rows).to(tl.int64)[:, None] * (chunk_tiles * BLOCK_V) + cols[None, :]
    shift = tl.load(SHIFT + tile * N + rows, mask=row_ok, other=0.0)
    z = tl.load(ptrs, mask=row_ok[:, None], other=float("-inf")).to(tl.float32) + shift[:, None]
    lse = tl.load(LSE + rows, mask=row_ok, other=float("inf"))
    g = tl.load(G + rows, mask=row_ok, other=0.0) / tl.load(GSCALE)
    y = tl.load(Y + rows, mask=row_ok, other=-1)
    rest = tl.load(REST + rows, mask=row_ok, other=1.0)
    target = (tile * BLOCK_V + tl.arange(0, BLOCK_V))[None, :] == y[:, None]
    dz = tl.where(target, beta - rest[:, None], tl.exp(z - lse[:, None])) - beta_over_v
    if HAS_SOFTCAP:
        z = tl.where(target, tl.load(ZY + rows, mask=row_ok, other=0.0)[:, None], z)
        dz = dz * (1.0 - (z / softcap) * (z / softcap))
    tl.store(ptrs, (dz * g[:, None]).to(Z.dtype.element_ty), mask=row_ok[:, None])


def _dense_part(
    hidden: torch.Tensor, weight: torch.Tensor, y: torch.Tensor, lse: torch.Tensor, g: torch.Tensor,
    gscale: torch.Tensor, d_weight: torch.Tensor | None, acc: torch.Tensor | None, beta: float,
    softcap: float | None, alpha: float, start: int = 0,
) -> None:
    """dC rows [start, V) = dZ^T E (their contents on entry unused) and acc += alpha dZ C (acc float32) with dZ the
    whole gradient of the logits (target column and uniform part inside), over every row and the tiles from
    `start` on, in the natural orders (rows of acc: tokens): the chunks of `dense_chunks`, rows inside, the head
    read in place."""
    n, d = hidden.shape
    vocab = weight.shape[0]
    chunks = dense_chunks(n, vocab, d, hidden.element_size(), acc is not None, d_weight is not None, start)
    recompute = _Recompute(hidden, y, lse, g, gscale, weight, None, vocab, beta, softcap, dense_parts=True)
    dedicated = None
    for chunk in chunks:
        c0, vc = chunk.c0, chunk.vc
        stride = triton.cdiv(vc, TILES.dz_block_v) * TILES.dz_block_v  # the kernel writes whole tiles
        if chunk.workspace is not None:
            space = d_weight.view(-1)[chunk.workspace :]
        else:
            dedicated = dedicated if dedicated is not None else torch.empty(
                chunk.rows * stride, dtype=hidden.dtype, device=hidden.device)
            space = dedicated
        for r0 in range(0, n, chunk.rows):
            nr = min(chunk.rows, n - r0)
            dz = space.as_strided((nr, vc), (stride, 1))
            recompute(dz, r0, nr, c0, vc, 0)
            if d_weight is not None:
                _add_dc(d_weight[c0 : c0 + vc], dz.T, hidden[r0 : r0 + nr], None, alpha, r0 == 0)
            if acc is not None:
                _accumulate_f32(acc[r0 : r0 + nr], dz, weight[c0 : c0 + vc], alpha)


def _add_dc(out: torch.Tensor, dz_t: torch.Tensor, e: torch.Tensor, uniform_row: torch.Tensor | None, alpha: float,
            first: bool) -> None:
    """out = uniform_row (or 0) + alpha dz^T e where first (out's contents unused), else out += alpha dz^T e (dz_t:
    dz^T): cuBLAS sums in float32, one rounding per call."""
    if not first:
        out.addmm_(dz_t, e, alpha=alpha)
    elif uniform_row is not None:
        torch.addmm(uniform_row, dz_t, e, alpha=alpha, out=out)
    else:  # out's contents are not read (nan there stays out)
        torch.addmm(out, dz_t, e, beta=0.0, alpha=alpha, out=out)


def _with_transpose(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(t, t^T), views."""
    return t, t.T


def piece_budget(n_rows: int, vocab: int, d: int, itemsize: int, has_acc: bool) -> tuple[int, int]:
    """(dZ elements, head tiles) of a filtered backward's pieces: the dense path's dZ chunk less the hidden
    states in the row order (n_rows x d), at least half of it, and the tiles of head rows GATHER_BUFFER_BYTES
    hold."""
    ft = forward.TILES
    rows, width = chunk_shape(triton.cdiv(n_rows, ft.block_n), triton.cdiv(vocab, ft.block_v), d, n_rows, itemsize,
                              has_acc)
    elements = max(rows * width // 2, rows * width - n_rows * d, ft.block_n * ft.block_v)
    return elements, max(1, GATHER_BUFFER_BYTES // (d * itemsize * ft.block_v))


class _Staircase:
    """The softmax part over the pieces of kernels.filter.pieces: token rows[p] at row p (acc's rows too),
    vocabulary entry order[j] at position j. What does not depend on the plan's kept tiles is set up (and queued)
    before the host waits for them: the hidden states, LSE, targets (y: their positions in the vocabulary order)
    and g in the row order, a buffer for a piece's head rows (gathered; one TMA descriptor for all pieces), a flat
    dZ buffer (`piece_budget`), and (`start`) the pieces of the first `prefix_tiles` tiles over every row: the dZ
    kernel reads each block's kept tiles on the device, so they compute exactly the plan's tiles whatever it is.
    Per piece: dZ recomputed, acc += dZ head, and the piece's dC rows = uniform_row + dZ^T E written into the head
    buffer once acc is done with it, then copied into dC (one rounding). A vocabulary chunk whose rows take several
    pieces sums its dC rows in a second buffer. Views of the buffers are made once per shape (each costs host
    time, and the host issues a piece's launches no faster than the GPU runs them)."""

    def __init__(
        self, hidden: torch.Tensor, weight: torch.Tensor, y: torch.Tensor, lse: torch.Tensor, g: torch.Tensor,
        gscale: torch.Tensor, order: torch.Tensor, rows: torch.Tensor, kept: torch.Tensor, beta: float,
        softcap: float | None, has_acc: bool,
    ) -> None:
        n, d = hidden.shape
        ft = forward.TILES
        real = rows < n  # padding rows (index >= n) get g = 0
        src = torch.where(real, rows, 0)
        self.e = hidden.index_select(0, src)
        lse, y, g = lse[src], torch.where(real, y[src], -1), torch.where(real, g[src], 0.0)
        self.elements, self.max_tiles = piece_budget(self.e.shape[0], weight.shape[0], d, hidden.element_size(),
                                                     has_acc)
        self.head_buf = torch.empty(self.max_tiles * ft.block_v, d, dtype=weight.dtype, device=weight.device)
        self.dz_flat = torch.empty(self.elements, dtype=hidden.dtype, device=hidden.device)
        self.sum_buf: torch.Tensor | None = None
        self.order = order
        self.recompute = _Recompute(self.e, y, lse, g, gscale, self.head_buf, kept, weight.shape[0], beta,
                                    softcap)
        self.prefix_tiles = prefix_tiles(triton.cdiv(weight.shape[0], ft.block_v))
        self._views: dict[tuple, tuple[torch.Tensor, ...]] = {}

    def start(self, weight: torch.Tensor, d_weight: torch.Tensor | None, uniform_row: torch.Tensor | None,
              acc: torch.Tensor | None, alpha: float) -> None:
        """dC = uniform_row (or 0) and the pieces of tiles [0, prefix_tiles) over every row queued (dC's contents on
        entry unused); `finish` does the rest once the plan's kept tiles are on the host."""
        if d_weight is not None and uniform_row is not None:  # rows the pieces do not write keep this
            d_weight.copy_(uniform_row.expand_as(d_weight))
        elif d_weight is not None:
            d_weight.zero_()
        self.weight, self.d_weight, self.uniform_row, self.acc, self.alpha = weight, d_weight, uniform_row, acc, alpha
        blocks = self.e.shape[0] // forward.TILES.block_n
        self._run(filter_pieces([self.prefix_tiles] * blocks, forward.TILES.block_n, self.elements, self.max_tiles,
                                forward.TILES.block_v))

    def finish(self, kept_host: np.ndarray) -> None:
        """dC += (softmax part)^T E and acc += alpha (softmax part) C over the plan's kept tiles (kept_host, on the
        host) past the prefix."""
        ft = forward.TILES
        self._run(filter_pieces(kept_host.tolist(), ft.block_n, self.elements, self.max_tiles, ft.block_v,
                                start=self.prefix_tiles))

    def _view(self, key: tuple, make: Callable[[], tuple[torch.Tensor, ...]]) -> tuple[torch.Tensor, ...]:
        """The views `make` returns, made on the first call with this key."""
        views = self._views.get(key)
        if views is None:
            views = self._views[key] = make()
        return views

    def _run(self, plan: list[tuple[int, int, int, int]]) -> None:
        """The pieces of `plan` (kernels.filter.pieces), a vocabulary chunk's pieces consecutive."""
        if not plan:
            return
        bv, vocab = forward.TILES.block_v, self.weight.shape[0]
        weight, d_weight, acc, e, alpha = self.weight, self.d_weight, self.acc, self.e, self.alpha
        chunks = [(t0, list(chunk)) for (t0, _), chunk in itertools.groupby(plan, key=lambda piece: piece[:2])]
        widths = [min(chunk[0][1] * bv, vocab) - t0 * bv for t0, chunk in chunks]
        ids_of_chunks = self.order[chunks[0][0] * bv : chunks[0][0] * bv + sum(widths)].split(widths)
        for (t0, chunk), ids, vc in zip(chunks, ids_of_chunks, widths):
            c0 = t0 * bv
            (head,) = self._view(("head", vc), lambda: (self.head_buf[:vc],))
            torch.index_select(weight, 0, ids, out=head)
            part = head
            if d_weight is not None and len(chunk) > 1:  # the head stays in use for the chunk's later pieces
                if self.sum_buf is None:
                    self.sum_buf = torch.empty_like(self.head_buf)
                (part,) = self._view(("sum", vc), lambda: (self.sum_buf[:vc],))
            for k, (_, _, r0, r1) in enumerate(chunk):
                dz, dz_t = self._view(("dz", r1 - r0, vc), lambda: _with_transpose(  # room for whole tiles
                    self.dz_flat.as_strided((r1 - r0, vc), (triton.cdiv(vc, bv) * bv, 1))))
                acc_rows, e_rows = self._view(("rows", r0, r1), lambda: (
                    acc[r0:r1] if acc is not None else None, e[r0:r1]))
                self.recompute(dz, r0, r1 - r0, c0, vc, c0)
                if acc is not None:
                    _accumulate_f32(acc_rows, dz, head, alpha)
                if d_weight is not None:
                    _add_dc(part, dz_t, e_rows, self.uniform_row, alpha, k == 0)
            if d_weight is not None:
                d_weight.index_copy_(0, ids, part)
