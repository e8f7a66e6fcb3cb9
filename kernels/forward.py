"""Triton forward: per-token LSE, target logit and logit sum without materialising the (N, V) logits.

For token i with target y (ignored tokens: y = -1), z_iv = E_i . C_v (capped s * tanh(. / s) with softcap):
- `_lse_forward_kernel`: program (row block, vocabulary split) walks its vocabulary tiles and keeps the online
  max m and sum s = sum exp(z - m) over v != y, plus, with label smoothing and a softcap (SMOOTHING), sum_v z_iv
  (all v; without a cap `_finish_kernel` takes it as E_i . sum_v C_v); where V is a multiple of the tile width
  (EVEN_V) no column is masked. For the backward's gradient filter (kernels/filter.py), with FILTERING tile
  position j holds vocabulary entry PERM[j] (the vocabulary sorted so that likely tokens share tiles), each row
  block looks its targets' positions up once (POS, the order's inverse) and stores them for the backward, and each
  row's log-sum-exp of each tile's non-target logits is stored, (tiles, N). The loop compares positions and loads
  no ids for that (with the head read in place it loads C's rows through PERM): the variant that loaded the ids
  per tile compiled with 646 spilled registers (30x slower) on one H100 on 2026-11-25; that machine was not
  retested with this one.
- `_finish_kernel`: z_iy (and E_i . sum_v C_v), dot products per token, and the splits combined: LSE_i =
  logaddexp(m + log s, z_iy), loss_i = LSE_i - (1 - beta) z_iy - (beta / V) sum_v z_iv, the statistics.
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl

from kernels._tl_utils import dot_flags, logits_tile, softcap_fn, tma_operand
from kernels.filter import filter_mass
from kernels.head_sum import head_column_sum
from kernels.plan_triton import triton_plan
from kernels.tuning import (FINISH_BLOCK_D, FINISH_BLOCK_R, MIN_TILES_PER_PROGRAM, SPLIT_BUFFER_BYTES,
                            ForwardTiles)


TILES = ForwardTiles()  # kernels.tuning's; tests swap in small ones


def kept_chunks(n: int, vocab: int, d: int) -> int:
    """Chunks of TILES.keep_vocab leading vocabulary positions whose logits a dense forward keeps for its backward in
    the storage of dC (V x d elements, allocated by the forward): chunk j (n x w, w = keep_vocab) lies at element
    V d - (J - j) w n. The backward turns each into its dZ in place and writes dC rows [0, (j + 1) w) once done
    with it, so chunk j must start past them: V d - (J - j) w n >= (j + 1) w d for j < J; J is the largest such
    count (with J w <= V); none below TILES.keep_min_dim."""
    return _kept_chunks(n, vocab, d, TILES.keep_vocab, TILES.keep_min_dim)


@functools.cache  # host time before the forward's launch is GPU idle time
def _kept_chunks(n: int, vocab: int, d: int, w: int, min_dim: int) -> int:
    total = vocab * d
    if d < min_dim:
        return 0
    chunks = 0
    while (chunks + 1) * w <= vocab and all(
        total - (chunks + 1 - j) * w * n >= (j + 1) * w * d for j in range(chunks + 1)
    ):
        chunks += 1
    return chunks


@triton.jit(do_not_specialize=["N", "splits", "group", "keep_tiles"])  # row-dependent sizes: one kernel for every batch
def _lse_forward_kernel(
    E, C, T, PERM, POS, TPOS_out, M_out, S_out, ZSUM_out, TLSE_out, KEEP_out, SHIFT_out,
    N, V, D, stride_en, stride_ed, stride_cv, stride_cd, splits, group,
    stride_tlse, keep_tiles, keep_chunk_tiles, softcap, ignore_index,
    BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr, FILTERING: tl.constexpr, KEEP_LOGITS: tl.constexpr,
    KEEP_TMA: tl.constexpr, E_TMA: tl.constexpr, C_TMA: tl.constexpr, DOT_UPCAST: tl.constexpr,
    DOT_PRECISION: tl.constexpr, EVEN_V: tl.constexpr, SMOOTHING: tl.constexpr,
):
    """The vocabulary positions' tiles, split among programs (split s takes tiles s, s + splits, ...); results of
    split s go to row s of M_out, S_out, ZSUM_out (the last with
    SMOOTHING only). Programs run in groups of `group` row blocks x `splits` (the last group may hold fewer row
    blocks): a wave of programs reads few row blocks' E and few tiles' C, which stay in L2. With KEEP_LOGITS,
    tile t < keep_tiles also stores its logits less each row's tile max (the target's as -inf) in chunk
    t // keep_chunk_tiles of KEEP_out (N x keep_chunk_tiles BLOCK_V each, one after another; a pointer, or with
    KEEP_TMA a descriptor of the (chunks, N, keep_chunk_tiles BLOCK_V) array) and that max in SHIFT_out[t, row] (see
    kept_chunks). C is the whole head; with FILTERING position j is read at row PERM[j] (pointer loads). E, C: pointers,
    or TMA descriptors where E_TMA / C_TMA (see logits_tile). T: the raw targets; with FILTERING, POS[v] is entry
    v's position (POS[PERM[j]] = j) and each row block's first split stores its targets' positions (-1: ignored or
    out of range) in TPOS_out."""
    pid = tl.program_id(0)
    num_rblocks = tl.cdiv(N, BLOCK_N)
    first = (pid // (group * splits)) * group  # the group's first row block
    in_group = tl.minimum(group, num_rblocks - first)
    rblock = first + pid % (group * splits) % in_group  # neighbouring programs share vocabulary tiles
    split = pid % (group * splits) // in_group
    rows = rblock * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    y = tl.load(T + rows, mask=row_ok, other=ignore_index)  # raw: nothing to prepare before the launch
    y = tl.where((y == ignore_index) | (y < 0) | (y >= V), -1, y)
    if FILTERING:  # the loop compares positions
        y = tl.load(POS + tl.maximum(y, 0), mask=y >= 0, other=-1)
        if split == 0:
            tl.store(TPOS_out + rows, y, mask=row_ok)
    rows_c = tl.minimum(rows, N - 1)

    m_run = tl.full((BLOCK_N,), float("-inf"), dtype=tl.float32)
    s_run = tl.zeros((BLOCK_N,), dtype=tl.float32)
    z_sum = tl.zeros((BLOCK_N,), dtype=tl.float32)
    # one pipelined (tile, k) loop: loads overlap the softmax; strided, so that every split keeps as many tiles
    for t in tl.range(split, tl.cdiv(V, BLOCK_V), splits, flatten=True):
        pos = t * BLOCK_V + tl.arange(0, BLOCK_V)
        col_ok = pos < V
        c_rows = tl.minimum(pos, V - 1)
        if FILTERING:  # tile positions -> vocabulary ids
            c_rows = tl.load(PERM + c_rows)
        z = logits_tile(
            E, C, rows_c, c_rows, rblock * BLOCK_N, t * BLOCK_V, D, tl.cdiv(D, BLOCK_K), stride_en,
            stride_ed, stride_cv, stride_cd, BLOCK_N, BLOCK_V, BLOCK_K, EVEN_K, E_TMA, C_TMA, DOT_UPCAST,
            DOT_PRECISION,
        )
        if HAS_SOFTCAP:
            z = softcap_fn(z, softcap)
        if EVEN_V:  # every tile whole: no column mask
            if SMOOTHING:
                z_sum += tl.sum(z, axis=1)
            z = tl.where(pos[None, :] != y[:, None], z, float("-inf"))
        else:
            if SMOOTHING:
                z_sum += tl.sum(tl.where(col_ok[None, :], z, 0.0), axis=1)
            z = tl.where(col_ok[None, :] & (pos[None, :] != y[:, None]), z, float("-inf"))
        t_max = tl.max(z, axis=1)
        if KEEP_LOGITS:
            if t < keep_tiles:
                shift = tl.where(t_max == float("-inf"), 0.0, t_max)
                tl.store(SHIFT_out + t * N + rows, shift, mask=row_ok)
                chunk = t // keep_chunk_tiles
                col0 = (t - chunk * keep_chunk_tiles) * BLOCK_V
                if KEEP_TMA:  # through shared memory, asynchronously
                    kept = (z - shift[:, None]).to(KEEP_out.dtype)
                    KEEP_out.store([chunk, rblock * BLOCK_N, col0], kept.reshape(1, BLOCK_N, BLOCK_V))
                else:
                    width = keep_chunk_tiles * BLOCK_V
                    block = KEEP_out + (chunk * N + rblock * BLOCK_N).to(tl.int64) * width + col0
                    tl.store(block + tl.arange(0, BLOCK_N)[:, None] * width + tl.arange(0, BLOCK_V)[None, :],
                             (z - shift[:, None]).to(KEEP_out.dtype.element_ty), mask=row_ok[:, None])
        m_new = tl.maximum(m_run, t_max)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        t_sum = tl.sum(tl.exp(z - m_safe[:, None]), axis=1)
        s_run = s_run * tl.exp(m_run - m_safe) + t_sum
        m_run = m_new
        if FILTERING:  # t_sum = 0 only where it underflows (or the tile is empty): bound it by BLOCK_V e^{t_max}
            t_lse = tl.where(t_sum > 0.0, m_safe + tl.log(t_sum), t_max + tl.log(tl.zeros_like(t_max) + BLOCK_V))
            tl.store(TLSE_out + t * stride_tlse + rows, t_lse, mask=row_ok)

    out = split * N + rows
    tl.store(M_out + out, m_run, mask=row_ok)
    tl.store(S_out + out, s_run, mask=row_ok)
    if SMOOTHING:
        tl.store(ZSUM_out + out, z_sum, mask=row_ok)


@triton.jit(do_not_specialize=["N", "splits"])  # row-dependent sizes: one kernel for every batch
def _finish_kernel(
    E, C, C_SUM, T, M, S, ZSUM, Y_out, ZY_out, LOSS_out, LSE_out, PT_out, PMAX_out, REST_out,
    N, V, D, splits, stride_en, stride_ed, stride_cv, stride_cd, softcap, ignore_index, one_minus_beta, beta_over_v,
    BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, HAS_SOFTCAP: tl.constexpr, SMOOTHING: tl.constexpr,
    SUM_BY_HEAD: tl.constexpr,
):
    """Per token i, after the forward kernel: y_i (the target; -1 where ignored or outside [0, V)); z_iy = E_i .
    C_{y_i} (capped with softcap); the splits' partial results (rows of M, S, ZSUM) combined: LSE of the rest =
    m + log sum_s S_s e^{M_s - m} (m = max_s M_s); LSE_i = logaddexp(LSE of the rest, z_iy) where the target is not
    ignored; loss_i = LSE_i - (1 - beta) z_iy - (beta / V) sum_v z_iv (0 where ignored), the logit sum from the
    splits' ZSUM or, with SUM_BY_HEAD, as E_i . C_SUM (C_SUM = sum_v C_v in float32); p_iy (nan where ignored);
    the largest p; 1 - p_iy = exp(LSE of the rest - LSE_i), exact even where p_iy rounds to 1."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows < N
    t = tl.load(T + rows, mask=row_ok, other=ignore_index)
    valid = t != ignore_index
    y = tl.where(valid & (t >= 0) & (t < V), t, -1)  # api raises on the out-of-range
    y_c = tl.maximum(y, 0).to(tl.int64)
    rows_c = tl.minimum(rows, N - 1).to(tl.int64)
    z_y = tl.zeros((BLOCK_R,), dtype=tl.float32)
    z_sum = tl.zeros((BLOCK_R,), dtype=tl.float32)
    for d0 in range(0, D, BLOCK_D):
        ds = d0 + tl.arange(0, BLOCK_D)
        d_ok = ds < D
        e = tl.load(E + rows_c[:, None] * stride_en + ds[None, :] * stride_ed, mask=d_ok[None, :], other=0.0)
        c = tl.load(C + y_c[:, None] * stride_cv + ds[None, :] * stride_cd, mask=d_ok[None, :], other=0.0)
        z_y += tl.sum(e.to(tl.float32) * c.to(tl.float32), axis=1)
        if SUM_BY_HEAD:
            z_sum += tl.sum(e.to(tl.float32) * tl.load(C_SUM + ds, mask=d_ok, other=0.0)[None, :], axis=1)
    if HAS_SOFTCAP:
        z_y = softcap_fn(z_y, softcap)
    m = tl.full((BLOCK_R,), float("-inf"), dtype=tl.float32)
    for s in range(0, splits):  # rows past N: finite values (nothing stored)
        m = tl.maximum(m, tl.load(M + s * N + rows, mask=row_ok, other=0.0))
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    s_sum = tl.zeros((BLOCK_R,), dtype=tl.float32)
    for s in range(0, splits):
        m_s = tl.load(M + s * N + rows, mask=row_ok, other=0.0)
        s_sum += tl.load(S + s * N + rows, mask=row_ok, other=1.0) * tl.exp(m_s - m_safe)
        if SMOOTHING and not SUM_BY_HEAD:
            z_sum += tl.load(ZSUM + s * N + rows, mask=row_ok, other=0.0)
    lse_rest = m_safe + tl.log(s_sum)
    hi = tl.maximum(lse_rest, z_y)  # z_y is finite
    lse = tl.where(valid, hi + tl.log(1.0 + tl.exp(tl.minimum(lse_rest, z_y) - hi)), lse_rest)
    loss = lse - one_minus_beta * z_y
    if SMOOTHING:
        loss -= beta_over_v * z_sum
    tl.store(Y_out + rows, y, mask=row_ok)
    tl.store(ZY_out + rows, z_y, mask=row_ok)
    tl.store(LOSS_out + rows, tl.where(valid, loss, 0.0), mask=row_ok)
    tl.store(LSE_out + rows, lse, mask=row_ok)
    tl.store(PT_out + rows, tl.where(valid, tl.exp(z_y - lse), float("nan")), mask=row_ok)
    tl.store(PMAX_out + rows, tl.exp(tl.where(valid, tl.maximum(m, z_y), m) - lse), mask=row_ok)
    tl.store(REST_out + rows, tl.exp(lse_rest - lse), mask=row_ok)


@functools.cache
def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors to fill (4 under the interpreter)."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4


@functools.cache
def side_stream(device: torch.device) -> torch.cuda.Stream:
    """A second stream of the device, for the head's column sum beside the forward kernel."""
    return torch.cuda.Stream(device)


@functools.cache
def l2_bytes(device: torch.device) -> int:
    """The GPU's L2 cache (50 MB on an H100; the same taken under the interpreter)."""
    return torch.cuda.get_device_properties(device).L2_cache_size if device.type == "cuda" else 50 << 20


@functools.cache
def choose_order(n: int, row_blocks: int, vocab_tiles: int, sms: int, row_bytes: int, l2: int) -> tuple[int, int]:
    """(vocabulary splits, row blocks per group of programs), among splits whose partial results fit in
    SPLIT_BUFFER_BYTES and that leave each program at least MIN_TILES_PER_PROGRAM tiles (or one split): first those
    whose wave (sms // splits row blocks x splits tiles) reads at most half the L2 (l2 / 2 bytes) of E and C rows,
    (row blocks x BLOCK_N + splits x BLOCK_V) x row_bytes; then the least wave quantisation, (waves of programs) x
    (tiles per program); then the smallest wave. Measured on an H100 (50 MB of L2) at the paper's shape (2026-11-26,
    64 row blocks, 1000 tiles, row_bytes 4608): forward kernel 12.70 ms with 8 splits in groups of 16 row blocks
    (18.9 MB a wave), 12.77 with 4 x 32 (23.6 MB), 12.97 with 16 x 8 (23.6 MB), against 13.75 with 2 splits over
    all 64 (40 MB) and 13.74 with 8 over all 64 (47 MB) in one call; 14.75 against 15.27 (2 x 64) on a hotter
    machine. At Gemma-3-270M's shape (D = 640; 11 MB a wave even over all 64 row blocks) 8 x 16 took 4.43-4.45 ms
    against 4.36-4.39 for 2 x 64."""
    most = max(1, min(vocab_tiles // MIN_TILES_PER_PROGRAM, SPLIT_BUFFER_BYTES // (12 * max(n, 1))))

    def group(s: int) -> int:
        return max(1, min(row_blocks, sms // s))

    def cost(s: int) -> tuple[bool, int, int]:
        wave_rows = group(s) * TILES.block_n + s * TILES.block_v
        steps = math.ceil(row_blocks * s / sms) * math.ceil(vocab_tiles / s)
        return wave_rows * row_bytes > l2 // 2, steps, wave_rows

    splits = min(range(1, most + 1), key=cost)
    return splits, group(splits)


def triton_forward(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
    label_smoothing: float, ignore_index: int, softcap: float | None, filter: str = "exact",
    keep_logits: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, tuple[torch.Tensor, ...]]:
    """(loss, LSE, target probability, max probability, saved for backward = (LSE, z_y, 1 - p_y, vocabulary
    order, row order, kept tiles, the targets' positions in the order, dC's storage, the kept logits' shifts)).
    With a filter that drops mass (kernels/filter.py; not with softcap and beta > 0, which must stay dense) the
    vocabulary is walked in the order of descending mean logit over the batch (C @ mean_i E_i), and
    kernels/plan_triton.py turns the per-row tile statistics into the backward's row order and kept tiles;
    otherwise the three are empty (natural order, everything kept) and the positions are the raw targets. Without
    a filter and with keep_logits (dC will be computed), the forward allocates dC's storage and keeps the logits
    of the first `kept_chunks` vocabulary chunks there (less their tile max, in the input dtype; the max in float32):
    the backward skips their recompute; otherwise both are empty."""
    n, d = hidden.shape
    vocab = weight.shape[0]
    dev = hidden.device
    targets = targets.contiguous()  # read raw by the kernel
    # sum_v z_iv = E_i . sum_v C_v where no cap bends the logits: the head's column sum (one read of the head)
    # instead of a sum over every logit in the kernel's epilogue. On a GPU it runs on a second stream beside the
    # forward kernel, on the SMs its last wave leaves free (H100, 2026-11-26, ab17: it started 9.7 ms into the paper
    # shape's 13.0 ms forward kernel and ended before it; run first on the same stream it added its 0.40 ms wherever
    # the host was ahead of the GPU)
    sum_by_head = label_smoothing > 0.0 and softcap is None and n > 0
    beside = sum_by_head and dev.type == "cuda"
    if beside:  # the side stream waits for what precedes the forward kernel, not for it
        main, ready = torch.cuda.current_stream(dev), torch.cuda.Event()
        ready.record(main)
    tl_args = dict(
        HAS_SOFTCAP=softcap is not None, **dot_flags(hidden.dtype),
    )
    t = TILES
    row_blocks, vocab_tiles = triton.cdiv(n, t.block_n), triton.cdiv(vocab, t.block_v)
    mass = filter_mass(filter, hidden.dtype)
    filtering = mass > 0.0 and not (softcap is not None and label_smoothing > 0.0) and n > 0
    # Before the launch only what the kernel reads: the host issues every op, and the GPU idles until the kernel
    order = torch.empty(0, dtype=torch.int64, device=dev)
    position = target_pos = targets  # with a filter: entry v's position in the order, the targets' positions
    if filtering:
        mean_hidden = hidden.mean(dim=0, dtype=torch.float32).to(weight.dtype)
        order = torch.argsort(torch.mv(weight, mean_hidden).float(), descending=True)
        position = torch.empty_like(order).scatter_(0, order, torch.arange(vocab, device=dev))
        target_pos = torch.empty_like(targets)  # written by the kernel (-1: ignored or out of range)
    splits, group = choose_order(n, row_blocks, vocab_tiles, num_sms(dev), d * weight.element_size(), l2_bytes(dev))
    m_part = torch.empty(splits, n, dtype=torch.float32, device=dev)
    s_part, zsum_part = torch.empty_like(m_part), torch.empty_like(m_part)
    padded = row_blocks * t.block_n
    # (tiles, padded N) float32: 32 MiB at N = 8192, V = 262144, freed at the end of the forward
    tile_lse = torch.empty(vocab_tiles if filtering else 0, padded, dtype=torch.float32, device=dev)
    chunks = kept_chunks(n, vocab, d) if keep_logits and not filtering and n > 0 else 0
    keep_tiles = chunks * t.keep_vocab // t.block_v
    d_weight_storage = torch.empty(vocab * d if chunks else 0, dtype=weight.dtype, device=dev)
    shift = torch.empty(keep_tiles, n, dtype=torch.float32, device=dev)
    keep_arg, keep_tma = hidden, False  # an unused pointer without kept logits
    if chunks:  # the kept chunks end dC's storage
        kept_region = d_weight_storage[vocab * d - chunks * t.keep_vocab * n :].view(chunks, n, t.keep_vocab)
        keep_arg, keep_tma = tma_operand(kept_region, [1, t.block_n, t.block_v])
    e_arg, e_tma = tma_operand(hidden, [t.block_n, t.block_k])
    # with a filter the head's rows are read through the permutation by pointer loads, else by TMA where it can
    c_arg, c_tma = (weight, False) if filtering else tma_operand(weight, [t.block_v, t.block_k])
    if n > 0:
        _lse_forward_kernel[(row_blocks * splits,)](
            e_arg, c_arg, targets, order if filtering else targets, position, target_pos, m_part, s_part, zsum_part,
            tile_lse if filtering else m_part, keep_arg, shift if chunks else m_part,
            n, vocab, d, *hidden.stride(), *weight.stride(), splits, group,
            padded, keep_tiles, t.keep_vocab // t.block_v, softcap or 1.0, ignore_index,
            BLOCK_N=t.block_n, BLOCK_V=t.block_v, BLOCK_K=t.block_k, EVEN_K=d % t.block_k == 0, FILTERING=filtering,
            KEEP_LOGITS=chunks > 0, KEEP_TMA=keep_tma, E_TMA=e_tma, C_TMA=c_tma,
            EVEN_V=vocab % t.block_v == 0, SMOOTHING=label_smoothing > 0.0 and not sum_by_head,
            num_warps=t.num_warps, **tl_args,
            # float32: 96 KiB a stage; a TMA store of kept logits: 64 KiB of shared memory more
            num_stages=(t.keep_stages if keep_tma else t.num_stages) if hidden.element_size() == 2 else 2,
        )
    head_sum = weight  # a placeholder pointer where the logit sum is not taken from the head
    if beside:  # launched after the forward kernel: its programs take the SMs the forward's last wave leaves free
        side = side_stream(dev)
        side.wait_event(ready)
        with torch.cuda.stream(side):
            head_sum = head_column_sum(weight, num_sms(dev))
        main.wait_stream(side)
        head_sum.record_stream(main)
    elif sum_by_head:
        head_sum = head_column_sum(weight, num_sms(dev))
    y = torch.empty_like(targets)
    z_y, loss, lse, target_prob, max_prob, rest_prob = (torch.empty(n, dtype=torch.float32, device=dev)
                                                         for _ in range(6))
    if n > 0:  # one kernel: the target logits, the splits combined, loss and statistics (~25 torch ops before)
        _finish_kernel[(triton.cdiv(n, FINISH_BLOCK_R),)](
            hidden, weight, head_sum, targets, m_part, s_part, zsum_part, y, z_y, loss, lse, target_prob, max_prob,
            rest_prob,
            n, vocab, d, splits, *hidden.stride(), *weight.stride(), softcap or 1.0, ignore_index,
            1.0 - label_smoothing, label_smoothing / vocab, BLOCK_R=FINISH_BLOCK_R, BLOCK_D=FINISH_BLOCK_D,
            HAS_SOFTCAP=softcap is not None, SMOOTHING=label_smoothing > 0.0, SUM_BY_HEAD=sum_by_head,
        )
    rows = kept = torch.empty(0, dtype=torch.int64, device=dev)
    if filtering:
        rows, kept = triton_plan(tile_lse, lse, y >= 0, t.block_n, mass)
    return loss, lse, target_prob, max_prob, (lse, z_y, rest_prob, order, rows, kept, target_pos,
                                              d_weight_storage, shift)
