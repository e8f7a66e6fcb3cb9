"""The head's column sum, sum_v C_v in float32: with it the forward's label-smoothing term sum_v z_iv = E_i . sum_v C_v
is one dot product per token instead of a sum over every logit in the forward kernel's epilogue.

Two deterministic passes: program p sums rows [p R, (p + 1) R) of a column block into partial row p (float32), then
the partial rows are summed; a few hundred KiB of partials (torch.sum over the vocabulary held 132 MiB for
Gemma-3-270M's head and 281 MiB for the paper's on an H100, 2026-11-26, docs/measurements/2026-11-26/ab13).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.tuning import HEAD_SUM_BLOCK_D as BLOCK_D, HEAD_SUM_BLOCK_R as BLOCK_R, HEAD_SUM_PROGRAMS_PER_SM


@triton.jit
def _column_sum_kernel(C, PART_out, V, D, stride_cv, stride_cd, rows_per_program,
                       BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    """PART_out[p, d] = sum of C[v, d] over v in [p R, min((p + 1) R, V)) (R = rows_per_program), in float32, for
    the BLOCK_D columns of program (p, column block)."""
    p = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    col_ok = cols < D
    r_lo = p * rows_per_program
    r_hi = tl.minimum(r_lo + rows_per_program, V)
    acc = tl.zeros((BLOCK_R, BLOCK_D), dtype=tl.float32)
    for r0 in range(r_lo, r_hi, BLOCK_R):
        rows = r0 + tl.arange(0, BLOCK_R)
        ok = (rows < r_hi)[:, None] & col_ok[None, :]
        acc += tl.load(C + rows.to(tl.int64)[:, None] * stride_cv + cols[None, :] * stride_cd, mask=ok,
                       other=0.0).to(tl.float32)
    tl.store(PART_out + p * D + cols, tl.sum(acc, axis=0), mask=col_ok)


def head_column_sum(weight: torch.Tensor, sms: int) -> torch.Tensor:
    """sum_v weight[v, :] as a float32 (D,) tensor (deterministic: the same order every call)."""
    vocab, d = weight.shape
    col_blocks = max(1, triton.cdiv(d, BLOCK_D))
    programs = max(1, min(triton.cdiv(vocab, BLOCK_R), HEAD_SUM_PROGRAMS_PER_SM * sms // col_blocks))
    rows_per_program = triton.cdiv(triton.cdiv(vocab, programs), BLOCK_R) * BLOCK_R
    programs = triton.cdiv(vocab, rows_per_program)
    partial = torch.empty(programs, d, dtype=torch.float32, device=weight.device)
    _column_sum_kernel[(programs, col_blocks)](
        weight, partial, vocab, d, *weight.stride(), rows_per_program, BLOCK_R=BLOCK_R, BLOCK_D=BLOCK_D,
    )
    return partial.sum(dim=0)
