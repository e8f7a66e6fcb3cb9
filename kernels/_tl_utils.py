"""Small Triton helpers shared by the forward and backward kernels."""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl


def dot_flags(dtype: torch.dtype) -> dict[str, object]:
    """Compile-time flags for `dot_acc`: exact fp32 products for fp32 inputs (no TF32), and, under the
    interpreter, an fp32 upcast of bf16 operands (Triton's interpreter multiplies bf16 as raw uint16 bits)."""
    return {
        "DOT_UPCAST": os.environ.get("TRITON_INTERPRET") == "1" and dtype == torch.bfloat16,
        "DOT_PRECISION": "ieee" if dtype == torch.float32 else "tf32",
    }


@triton.jit
def dot_acc(a, b, acc, DOT_UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """acc + a @ b with float32 accumulation."""
    if DOT_UPCAST:
        out = tl.dot(a.to(tl.float32), b.to(tl.float32), acc)
    else:
        out = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
    return out


@triton.jit
def softcap_fn(u, softcap):
    """z = s * tanh(u / s), with tanh(x) = 1 - 2 / (exp(2x) + 1) (saturates cleanly at +-1)."""
    return softcap * (1.0 - 2.0 / (tl.exp(2.0 * u / softcap) + 1.0))


@triton.jit
def logits_tile(
    E, C, rows, cols, D, stride_en, stride_ed, stride_cv, stride_cd,
    BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
    DOT_UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """(BLOCK_N, BLOCK_V) float32 tile of E[rows] @ C[cols]^T. Callers clamp rows/cols into range, so only the
    D tail needs a mask."""
    ks = tl.arange(0, BLOCK_K)
    e_ptrs = E + rows.to(tl.int64)[:, None] * stride_en + ks[None, :] * stride_ed
    c_ptrs = C + cols.to(tl.int64)[None, :] * stride_cv + ks[:, None] * stride_cd
    acc = tl.zeros((BLOCK_N, BLOCK_V), dtype=tl.float32)
    for k in range(0, tl.cdiv(D, BLOCK_K)):
        if EVEN_K:
            e = tl.load(e_ptrs)
            c = tl.load(c_ptrs)
        else:
            k_ok = ks < D - k * BLOCK_K
            e = tl.load(e_ptrs, mask=k_ok[None, :], other=0.0)
            c = tl.load(c_ptrs, mask=k_ok[:, None], other=0.0)
        acc = dot_acc(e, c, acc, DOT_UPCAST, DOT_PRECISION)
        e_ptrs += BLOCK_K * stride_ed
        c_ptrs += BLOCK_K * stride_cd
    return acc
