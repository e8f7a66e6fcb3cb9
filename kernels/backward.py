"""Triton backward: recompute logits blockwise, filter negligible blocks, add the exact low-rank parts.

With g_i the upstream gradient, dloss_i/dz_iv = p_iv - (1 - beta)[v = y_i] - beta / V, split into
1. softmax part g_i p_iv (v != y_i): recomputed per (row block, vocabulary tile) into a chunk of dZ, then
   dC += dZ^T E and dE += dZ C. Gradient filtering skips tiles whose probabilities are negligible:
   - filter="exact": P_t = exp(tile max from the forward - min LSE of the block's rows) bounds every non-target
     probability of the tile, for every row of the block; tiles with P_t < FILTER_MASS / V are skipped. Every
     dropped probability is below that, so the mass dropped per token is at most FILTER_MASS = 2^-10,
     |change of dE_i| <= FILTER_MASS g_i max|C| and |change of dC_v| <= FILTER_MASS / V sum_i g_i max|E|.
   - filter="loose": the forward walks the vocabulary sorted by mean logit over the batch (likely tokens share
     tiles; every kernel here follows that order, dC rows written through it), and M_t = max over the block's
     valid rows i of the tile's non-target mass sum_{v in t} p_iv (from the forward's per-row tile
     log-sum-exp). Of the tiles "exact" keeps (in that order), those of smallest M_t are
     skipped while their sum stays <= LOOSE_MASS - FILTER_MASS. So the mass dropped per token is at most
     LOOSE_MASS = 2^-8: |change of dE_i| <= LOOSE_MASS g_i max|C|, sum_v |change of dC_v| <= LOOSE_MASS
     sum_i g_i max|E|; it skips every tile "exact" skips. Like Cut Cross-Entropy's filter (every |dz| < 2^-12),
     it may zero the whole softmax gradient of a rare token's row of C; unlike it, the dropped mass per token
     is bounded.
2. target column a_i = g_i (p_iy - (1 - beta)): dE_i += a_i C_{y_i}; dC_{y_i} += sum_{j: y_j = y_i} a_j E_j.
3. uniform part -beta g_i / V (rank one): dE_i -= beta g_i mean_v C_v; dC_v -= (beta / V) sum_i g_i E_i.
With softcap, every part is multiplied by dz/du = 1 - (z / s)^2; the uniform part is then no longer rank one,
so with softcap and beta > 0 it is added inside every tile and nothing is filtered (either filter). Parts 2 and 3
(the target column and the label-smoothing term) are never filtered.

Memory beyond the gradients: one (chunk_rows x chunk_vocab) dZ chunk in the input dtype and dE's float32
accumulator (none for float32 inputs: dE itself), within TILES.extra_bytes together: at N = 8192, D = 640 (bf16) a
64 MiB dZ chunk (8192 x 4096) + 20 MiB; at N = 8192, D = 2304 a 32 MiB chunk (4096 x 4096) + 72 MiB, 9% of the
gradients. Chunks with at least TILES.cublas_min_active of their tiles active run both gradient GEMMs in cuBLAS
(skipped tiles written as zeros; dE accumulated in float32 by cuBLAS); sparser chunks run a Triton GEMM that skips
them. dC starts as the uniform part and gets one rounded add per row chunk, plus one for target rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


import torch
import triton
import triton.language as tl

from kernels import forward
from kernels._host import AsyncHostCopy
from kernels._tl_utils import dot_acc, dot_flags, logits_tile, softcap_fn, tma_operand

# Probability mass per token that gradient filtering may drop (see module docstring); 0 disables filtering.
FILTER_MASS = 2.0**-10  # filter="exact"
LOOSE_MASS = 2.0**-8  # filter="loose"


@dataclass(frozen=True)
class BackwardTiles:
    extra_bytes: int = 104 << 20  # dZ chunk + float32 dE accumulator: 84 MiB at D = 640, 104 MiB at D = 2304
    dz_elements: int = 1 << 25  # largest dZ chunk (chunk rows x chunk_vocab): 64 MiB in bf16
    chunk_vocab: int = 4096  # multiple of block_v; dE is read and written once per vocabulary chunk
    cublas_min_active: float = 0.5  # share of active tiles from which a chunk's GEMMs run in cuBLAS (inf: never)
    dz_block_v: int = 256  # vocabulary width of a dZ recompute tile; divides the filter tile (forward block_v)
    dz_stages: int = 3
    gemm_m: int = 128  # output rows of the Triton dC / dE GEMM tiles; divides block_n and block_v
    gemm_d: int = 128
    gemm_k: int = 64
    gemm_warps: int = 8
    gemm_stages: int = 3


TILES = BackwardTiles()


@triton.jit
def _dz_kernel(
    E, C, Y, PERM, LSE, G, GSCALE, ACTIVE, DZ,
    N, V, D, r0, row_tiles, c0, vc, c_off, stride_en, stride_ed, stride_cv, stride_cd, stride_dz, num_vtiles,
    beta_over_v, softcap,
    BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
    MASK_V: tl.constexpr, MASKED: tl.constexpr, ZERO_SKIPPED: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
    DENSE_UNIFORM: tl.constexpr, HAS_PERM: tl.constexpr, E_TMA: tl.constexpr, C_TMA: tl.constexpr,
    DOT_UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """dZ[i - r0, j - c0] = (g_i / gscale) (p_iv [v != y_i] (- beta / V if DENSE_UNIFORM)) (1 - (z_iv / s)^2 if
    softcap), v = PERM[j] (v = j without HAS_PERM), for the (BLOCK_N x BLOCK_V) tiles of the (row_tiles x vc)
    chunk starting at row r0, vocabulary position c0, program p taking tiles p, p + programs, ... in one flattened
    loop (the next tile's loads overlap this one's softmax); C holds the head rows of positions c_off, c_off + 1,
    ... With MASKED, tiles inside a skipped (BLOCK_N x MASK_V) filter tile are not computed and left as they are
    (ZERO_SKIPPED: set to 0)."""
    tiles_v = tl.cdiv(vc, BLOCK_V)
    k_tiles = tl.cdiv(D, BLOCK_K)
    for tile in tl.range(tl.program_id(0), row_tiles * tiles_v, tl.num_programs(0), flatten=True):
        tn = tile // tiles_v
        tv = tile % tiles_v
        rows = r0 + tn * BLOCK_N + tl.arange(0, BLOCK_N)
        pos = c0 + tv * BLOCK_V + tl.arange(0, BLOCK_V)
        row_ok = rows < N
        col_ok = pos < V
        active = True
        n_k = k_tiles
        if MASKED:
            active = tl.load(ACTIVE + (r0 // BLOCK_N + tn) * num_vtiles + (c0 + tv * BLOCK_V) // MASK_V) != 0
            n_k = tl.where(active, k_tiles, 0)
        z = logits_tile(
            E, C, tl.minimum(rows, N - 1), tl.minimum(pos, V - 1) - c_off, r0 + tn * BLOCK_N,
            c0 + tv * BLOCK_V - c_off, D, n_k, stride_en, stride_ed, stride_cv, stride_cd, BLOCK_N, BLOCK_V, BLOCK_K,
            EVEN_K, E_TMA, C_TMA, DOT_UPCAST, DOT_PRECISION,
        )
        cols = pos
        if HAS_PERM:
            cols = tl.load(PERM + tl.minimum(pos, V - 1))
        if HAS_SOFTCAP:
            z = softcap_fn(z, softcap)
        lse = tl.load(LSE + rows, mask=row_ok, other=float("inf"))
        g = tl.load(G + rows, mask=row_ok, other=0.0) / tl.load(GSCALE)
        y = tl.load(Y + rows, mask=row_ok, other=-1)
        dz = tl.where(col_ok[None, :] & (cols[None, :] != y[:, None]), tl.exp(z - lse[:, None]), 0.0)
        if DENSE_UNIFORM:
            dz = tl.where(col_ok[None, :], dz - beta_over_v, 0.0)
        dz = dz * g[:, None]
        if HAS_SOFTCAP:
            dz = dz * (1.0 - (z / softcap) * (z / softcap))
        # the (BLOCK_N x BLOCK_V) pointers only now: built before the GEMM they stay live through it and spill
        out = DZ + (tn * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)[:, None] * stride_dz
        out += (tv * BLOCK_V + tl.arange(0, BLOCK_V))[None, :]
        if MASKED:
            dz = tl.where(active, dz, 0.0)
        if MASKED and not ZERO_SKIPPED:
            tl.store(out, dz.to(DZ.dtype.element_ty), mask=(tl.arange(0, BLOCK_N) < tl.where(active, BLOCK_N, 0))[:, None])
        else:
            tl.store(out, dz.to(DZ.dtype.element_ty))


@triton.jit
def _dc_tile(
    pid, DZ, E, DC, PERM, ACTIVE, gscale, N, V, D, r0, nr, c0, vc, stride_dz, stride_en, stride_ed, stride_dcv,
    stride_dcd, num_vtiles,
    BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_K: tl.constexpr, MASK_N: tl.constexpr,
    MASK_V: tl.constexpr, MASKED: tl.constexpr, HAS_PERM: tl.constexpr, DOT_UPCAST: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """dC[v] += gscale * dZ[:, j - c0]^T @ E[r0 : r0 + nr] for the positions j of one (BLOCK_M x BLOCK_D) tile,
    v = PERM[j] (v = j without HAS_PERM)."""
    d_tiles = tl.cdiv(D, BLOCK_D)
    tv = pid // d_tiles
    vl = tv * BLOCK_M + tl.arange(0, BLOCK_M)
    ds = (pid % d_tiles) * BLOCK_D + tl.arange(0, BLOCK_D)
    d_ok = ds < D  # a mask, not a clamp: a clamped index hides the contiguity that vectorised copies need
    ks = tl.arange(0, BLOCK_K)
    mask_col = (c0 + tv * BLOCK_M) // MASK_V
    acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    n_active = 0
    for k in range(0, nr, BLOCK_K):
        active = True
        if MASKED:
            active = tl.load(ACTIVE + ((r0 + k) // MASK_N) * num_vtiles + mask_col) != 0
        if active:
            a = tl.load(DZ + (k + ks).to(tl.int64)[:, None] * stride_dz + vl[None, :])
            rows = tl.minimum(r0 + k + ks, N - 1).to(tl.int64)
            b = tl.load(E + rows[:, None] * stride_en + ds[None, :] * stride_ed, mask=d_ok[None, :], other=0.0)
            acc = dot_acc(tl.trans(a), b, acc, DOT_UPCAST, DOT_PRECISION)
            n_active += 1
    if n_active > 0:
        ok = (vl < vc)[:, None] & d_ok[None, :]
        vs = c0 + vl
        if HAS_PERM:
            vs = tl.load(PERM + tl.minimum(vs, V - 1))
        ptrs = DC + vs.to(tl.int64)[:, None] * stride_dcv + ds[None, :] * stride_dcd
        old = tl.load(ptrs, mask=ok, other=0.0).to(tl.float32)
        tl.store(ptrs, (old + gscale * acc).to(DC.dtype.element_ty), mask=ok)


@triton.jit
def _de_tile(
    pid, DZ, C, ACC, ACTIVE, gscale, V, D, r0, nr, c0, vc, c_off, stride_dz, stride_cv, stride_cd, num_vtiles,
    BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_K: tl.constexpr, MASK_N: tl.constexpr,
    MASK_V: tl.constexpr, MASKED: tl.constexpr, DOT_UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """ACC[r0 + tile] += gscale * dZ[tile, :] @ (head rows of positions c0 : c0 + vc) for one (BLOCK_M x BLOCK_D)
    tile of the float32 accumulator ACC (N x D, contiguous); C holds the head rows of positions c_off, ..."""
    d_tiles = tl.cdiv(D, BLOCK_D)
    tn = pid // d_tiles
    nl = tn * BLOCK_M + tl.arange(0, BLOCK_M)
    ds = (pid % d_tiles) * BLOCK_D + tl.arange(0, BLOCK_D)
    d_ok = ds < D
    ks = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    n_active = 0
    for k in range(0, vc, BLOCK_K):
        active = True
        if MASKED:
            active = tl.load(ACTIVE + ((r0 + tn * BLOCK_M) // MASK_N) * num_vtiles + (c0 + k) // MASK_V) != 0
        if active:
            a = tl.load(DZ + nl.to(tl.int64)[:, None] * stride_dz + (k + ks)[None, :])
            vs = (tl.minimum(c0 + k + ks, V - 1) - c_off).to(tl.int64)
            b = tl.load(C + vs[:, None] * stride_cv + ds[None, :] * stride_cd, mask=d_ok[None, :], other=0.0)
            acc = dot_acc(a, b, acc, DOT_UPCAST, DOT_PRECISION)
            n_active += 1
    if n_active > 0:
        ok = (nl < nr)[:, None] & d_ok[None, :]
        offs = (r0 + nl).to(tl.int64)[:, None] * D + ds[None, :]
        tl.store(ACC + offs, tl.load(ACC + offs, mask=ok, other=0.0) + gscale * acc, mask=ok)


@triton.jit
def _grad_gemm_kernel(
    DZ, E, C, DC, ACC, PERM, ACTIVE, GSCALE,
    N, V, D, r0, nr, c0, vc, c_off, stride_dz, stride_en, stride_ed, stride_cv, stride_cd, stride_dcv, stride_dcd,
    num_vtiles, num_dc_programs,
    BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_K: tl.constexpr, MASK_N: tl.constexpr,
    MASK_V: tl.constexpr, MASKED: tl.constexpr, HAS_DC: tl.constexpr, HAS_PERM: tl.constexpr,
    DOT_UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """One launch for both gradient GEMMs of a chunk: programs [0, num_dc_programs) do dC (the longer
    reduction, so they start first), the rest dE. Without HAS_DC (dC done elsewhere) it needs fewer registers.
    C holds the head rows of positions c_off, c_off + 1, ...; dC rows are vocabulary ids (PERM[position])."""
    pid = tl.program_id(0)
    gscale = tl.load(GSCALE)
    if HAS_DC and pid < num_dc_programs:
        _dc_tile(
            pid, DZ, E, DC, PERM, ACTIVE, gscale, N, V, D, r0, nr, c0, vc, stride_dz, stride_en, stride_ed,
            stride_dcv, stride_dcd, num_vtiles, BLOCK_M, BLOCK_D, BLOCK_K, MASK_N, MASK_V, MASKED, HAS_PERM,
            DOT_UPCAST, DOT_PRECISION,
        )
    else:
        _de_tile(
            pid - num_dc_programs, DZ, C, ACC, ACTIVE, gscale, V, D, r0, nr, c0, vc, c_off, stride_dz, stride_cv,
            stride_cd, num_vtiles, BLOCK_M, BLOCK_D, BLOCK_K, MASK_N, MASK_V, MASKED, DOT_UPCAST, DOT_PRECISION,
        )


@triton.jit
def _finalize_de_kernel(
    ACC, DE, C, Y, A, UB, CMEAN, N, D, stride_cv, stride_cd,
    BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, HAS_UNIFORM: tl.constexpr,
):
    """dE_i = acc_i + a_i C_{y_i} - beta g_i mean_v C_v, in dE's dtype (ACC float32, DE contiguous; DE may be ACC)."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    ds = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    r_ok = rows < N
    ok = r_ok[:, None] & (ds < D)[None, :]
    offs = rows.to(tl.int64)[:, None] * D + ds[None, :]
    x = tl.load(ACC + offs, mask=ok, other=0.0)
    a = tl.load(A + rows, mask=r_ok, other=0.0)
    y = tl.maximum(tl.load(Y + rows, mask=r_ok, other=0), 0).to(tl.int64)
    c_y = tl.load(C + y[:, None] * stride_cv + ds[None, :] * stride_cd, mask=ok, other=0.0)
    x += a[:, None] * c_y.to(tl.float32)
    if HAS_UNIFORM:
        ub = tl.load(UB + rows, mask=r_ok, other=0.0)
        x -= ub[:, None] * tl.load(CMEAN + ds, mask=ds < D, other=0.0)[None, :]
    tl.store(DE + offs, x.to(DE.dtype.element_ty), mask=ok)


@triton.jit
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


@triton.jit
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


def active_tiles(tile_max: torch.Tensor, lse: torch.Tensor, g: torch.Tensor, vocab: int) -> torch.Tensor:
    """(row blocks, vocabulary tiles) bool: the tiles filter="exact" keeps: False where every non-target
    probability of the tile's rows with g != 0 is below FILTER_MASS / V, bounded by exp(tile max - smallest LSE
    of the block)."""
    if FILTER_MASS <= 0.0:
        return torch.ones_like(tile_max, dtype=torch.bool)
    block_n = forward.TILES.block_n
    key = torch.where(g != 0, lse, float("inf"))
    key = torch.nn.functional.pad(key, (0, tile_max.shape[0] * block_n - key.numel()), value=float("inf"))
    min_lse = key.view(-1, block_n).amin(dim=1)
    return tile_max - min_lse[:, None] >= math.log(FILTER_MASS / vocab)


def loose_active_tiles(exact_active: torch.Tensor, tile_log_mass: torch.Tensor) -> torch.Tensor:
    """The tiles filter="loose" keeps: of those `exact_active` keeps, per row block, all but the tiles of smallest
    mass bound M_t = exp(tile_log_mass) while their sum stays <= LOOSE_MASS - FILTER_MASS."""
    if LOOSE_MASS <= 0.0:
        return torch.ones_like(exact_active)
    mass = torch.where(exact_active, tile_log_mass.double().exp(), 0.0)  # float64: the sum must not round down
    order = mass.argsort(dim=1)
    keep_sorted = mass.gather(1, order).cumsum(dim=1) > LOOSE_MASS - max(FILTER_MASS, 0.0)
    return torch.empty_like(keep_sorted).scatter_(1, order, keep_sorted)


def triton_backward(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, saved: tuple[torch.Tensor, ...],
    grad_loss: torch.Tensor, label_smoothing: float, ignore_index: int, softcap: float | None, filter: str,
    need_hidden_grad: bool, need_weight_grad: bool,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(dE, dC) of sum_i g_i loss_i; see the module docstring for the decomposition and the filters."""
    lse, z_y, rest_prob, tile_max, tile_log_mass, order = saved
    n, d = hidden.shape
    vocab = weight.shape[0]
    dev = hidden.device
    beta = label_smoothing
    dense_uniform = softcap is not None and beta > 0.0
    rank_one_uniform = beta > 0.0 and not dense_uniform
    valid = targets != ignore_index
    y = torch.where(valid, targets, -1)
    g = torch.where(valid, grad_loss.float(), 0.0)
    gscale = _gradient_scale(g, hidden.dtype)
    a = g * (beta - rest_prob)  # g (p_y - (1 - beta))
    if softcap is not None:
        a = a * (1.0 - (z_y / softcap) ** 2)
    a = torch.where(valid, a, 0.0)

    d_hidden = torch.zeros((n, d), dtype=torch.float32, device=dev) if need_hidden_grad else None
    d_weight = None
    if need_weight_grad and rank_one_uniform:
        d_weight = (-(beta / vocab) * weighted_colsum(hidden, g)).to(weight.dtype).expand(vocab, d).contiguous()
    elif need_weight_grad:
        d_weight = torch.zeros_like(weight, memory_format=torch.contiguous_format)
    if n > 0:
        _softmax_part(
            hidden, weight, y, lse, g, gscale, tile_max, tile_log_mass, order, d_weight, d_hidden, beta, softcap,
            filter,
        )
    if d_hidden is not None:
        cmean = weighted_colsum(weight) / vocab if rank_one_uniform else a  # a: an unused pointer otherwise
        out = d_hidden
        if d_hidden.dtype != hidden.dtype:
            out = torch.empty((n, d), dtype=hidden.dtype, device=dev)
        if n > 0:
            _finalize_de_kernel[(triton.cdiv(n, 32), triton.cdiv(d, 128))](
                d_hidden, out, weight, y, a, beta * g, cmean, n, d, *weight.stride(),
                BLOCK_R=32, BLOCK_D=128, HAS_UNIFORM=rank_one_uniform,
            )
        d_hidden = out
    if d_weight is not None and n > 0:
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
    """(chunk rows, chunk vocabulary) of the dZ chunk: TILES.chunk_vocab wide (at most the vocabulary), as many
    whole row blocks as TILES.dz_elements and TILES.extra_bytes less the float32 dE accumulator allow (at least one)."""
    ft, bt = forward.TILES, TILES
    chunk_vocab = min(bt.chunk_vocab, num_vtiles * ft.block_v)
    acc_bytes = 4 * n * d if has_acc and itemsize != 4 else 0
    elements = min(bt.dz_elements, (bt.extra_bytes - acc_bytes) // itemsize)
    return min(row_blocks, max(1, elements // (chunk_vocab * ft.block_n))) * ft.block_n, chunk_vocab


def _softmax_part(
    hidden: torch.Tensor, weight: torch.Tensor, y: torch.Tensor, lse: torch.Tensor, g: torch.Tensor,
    gscale: torch.Tensor, tile_max: torch.Tensor, tile_log_mass: torch.Tensor, order: torch.Tensor,
    d_weight: torch.Tensor | None, acc: torch.Tensor | None, beta: float, softcap: float | None, filter: str,
) -> None:
    """dC += (softmax part)^T E and acc += (softmax part) C (acc float32), chunk by chunk of rows and vocabulary
    positions (vocabulary entry order[j] at position j when order is not empty). Chunks without an active tile are
    skipped; those with at least TILES.cublas_min_active of their tiles active run cuBLAS (skipped tiles zeroed),
    the others a Triton GEMM that skips their inactive tiles."""
    n, d = hidden.shape
    vocab = weight.shape[0]
    ft, bt = forward.TILES, TILES
    dense_uniform = softcap is not None and beta > 0.0
    if dense_uniform:
        active = torch.ones_like(tile_max, dtype=torch.bool)
    else:
        active = active_tiles(tile_max, lse, g, vocab)
        if filter == "loose":
            active = loose_active_tiles(active, tile_log_mass)
    active_i8 = active.to(torch.int8)
    host = AsyncHostCopy(active)
    row_blocks, num_vtiles = tile_max.shape
    chunk_rows, chunk_vocab = chunk_shape(row_blocks, num_vtiles, d, n, hidden.element_size(), acc is not None)
    dz = torch.empty(chunk_rows, chunk_vocab, dtype=hidden.dtype, device=hidden.device)
    has_perm = order.numel() > 0
    perm = order if has_perm else y  # y: an unused pointer otherwise
    flags = dot_flags(hidden.dtype)
    d_tiles = triton.cdiv(d, bt.gemm_d)
    dc = (d_weight, *d_weight.stride()) if d_weight is not None else (dz, 0, 0)
    alpha = float(gscale) if hidden.dtype == torch.float16 else 1.0  # float16: a host sync (gscale)
    e_arg, e_tma = tma_operand(hidden, [ft.block_n, ft.block_k])
    sms = forward.num_sms(hidden.device)  # one persistent recompute program per SM
    whole_head = (weight, 0, *tma_operand(weight, [bt.dz_block_v, ft.block_k]))

    def head_rows(c0: int, vc: int) -> tuple[torch.Tensor, int, object, bool]:
        """(rows, c_off, operand, is TMA): the head rows of positions c_off, c_off + 1, ...: the head itself, or
        with a permutation a contiguous copy of the chunk's rows (read by TMA and cuBLAS)."""
        if not has_perm:
            return whole_head
        rows = weight.index_select(0, order[c0 : c0 + vc])
        return (rows, c0, *tma_operand(rows, [bt.dz_block_v, ft.block_k]))

    def recompute(r0: int, c0: int, vc: int, rb: int, head: tuple, masked: bool, zero_skipped: bool) -> None:
        rows, c_off, c_arg, c_tma = head
        _dz_kernel[(min(rb * triton.cdiv(vc, bt.dz_block_v), sms),)](
            e_arg, c_arg, y, perm, lse, g, gscale, active_i8, dz,
            n, vocab, d, r0, rb, c0, vc, c_off, *hidden.stride(), *rows.stride(), dz.stride(0), num_vtiles,
            beta / vocab, softcap or 1.0,
            BLOCK_N=ft.block_n, BLOCK_V=bt.dz_block_v, BLOCK_K=ft.block_k, EVEN_K=d % ft.block_k == 0,
            MASK_V=ft.block_v, MASKED=masked, ZERO_SKIPPED=zero_skipped, HAS_SOFTCAP=softcap is not None,
            DENSE_UNIFORM=dense_uniform, HAS_PERM=has_perm, E_TMA=e_tma, C_TMA=c_tma,
            num_warps=ft.num_warps, num_stages=bt.dz_stages, **flags,
        )

    for r0 in range(0, n, chunk_rows):
        nr = min(chunk_rows, n - r0)
        rb0, rb1 = r0 // ft.block_n, triton.cdiv(r0 + nr, ft.block_n)
        for c0 in range(0, vocab, chunk_vocab):
            vc = min(chunk_vocab, vocab - c0)
            vt0, vt1 = c0 // ft.block_v, triton.cdiv(c0 + vc, ft.block_v)
            early = not host.arrived  # the first chunk's dZ is queued (masked, skipped tiles zeroed) before the wait
            head = None
            if early:
                head = head_rows(c0, vc)
                recompute(r0, c0, vc, rb1 - rb0, head, masked=True, zero_skipped=True)
            share = float(host.get()[rb0:rb1, vt0:vt1].mean())
            if share == 0.0:
                continue
            masked = share < 1.0
            cublas = share >= bt.cublas_min_active
            if not early:
                head = head_rows(c0, vc)
                recompute(r0, c0, vc, rb1 - rb0, head, masked=masked, zero_skipped=cublas)
            rows, c_off = head[:2]
            if cublas:
                dz_chunk = dz[:nr, :vc]
                ids = order[c0 : c0 + vc] if has_perm else None
                if d_weight is not None and ids is None:  # d_weight holds u and earlier row chunks: one rounding
                    d_weight[c0 : c0 + vc].addmm_(dz_chunk.T, hidden[r0 : r0 + nr], alpha=alpha)
                elif d_weight is not None:  # the chunk's rows gathered, updated with one rounding, scattered back
                    part = d_weight.index_select(0, ids).addmm_(dz_chunk.T, hidden[r0 : r0 + nr], alpha=alpha)
                    d_weight.index_copy_(0, ids, part)
                if acc is not None:
                    _accumulate_f32(acc[r0 : r0 + nr], dz_chunk, rows[c0 - c_off : c0 - c_off + vc], alpha)
                continue
            n_dc = triton.cdiv(vc, bt.gemm_m) * d_tiles if d_weight is not None else 0
            n_de = triton.cdiv(nr, bt.gemm_m) * d_tiles if acc is not None else 0
            if n_dc + n_de == 0:
                continue
            _grad_gemm_kernel[(n_dc + n_de,)](
                dz, hidden, rows, dc[0], acc if acc is not None else dz, perm, active_i8, gscale,
                n, vocab, d, r0, nr, c0, vc, c_off, dz.stride(0), *hidden.stride(), *rows.stride(), *dc[1:],
                num_vtiles, n_dc,
                BLOCK_M=bt.gemm_m, BLOCK_D=bt.gemm_d, BLOCK_K=bt.gemm_k, MASK_N=ft.block_n, MASK_V=ft.block_v,
                MASKED=masked, HAS_DC=n_dc > 0, HAS_PERM=has_perm,
                num_warps=bt.gemm_warps, num_stages=bt.gemm_stages, **flags,
            )
