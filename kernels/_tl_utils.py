"""Small Triton helpers shared by the forward and backward kernels."""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor


def tma_operand(t: torch.Tensor, block: list[int]) -> tuple[object, bool]:
    """(a TMA tensor descriptor of t (2- or 3-D) with that block shape, True) where TMA can reach t: last dimension
    contiguous, 16-byte aligned strides and base, on a GPU of compute capability >= 9 (or under the interpreter);
    else (t, False), for pointer access. 16-bit dtypes only (float32 keeps the pointer path and its IEEE
    products)."""
    interpret = os.environ.get("TRITON_INTERPRET") == "1"
    ok = (
        (interpret or (t.is_cuda and _capability(t.device)[0] >= 9))
        and t.element_size() == 2
        and t.stride(-1) == 1
        and all((stride * t.element_size()) % 16 == 0 for stride in t.stride()[:-1])
        and t.data_ptr() % 16 == 0
        and t.shape[0] > 0
    )
    if not ok:
        return t, False
    return TensorDescriptor.from_tensor(t, block), True


@functools.cache
def _capability(device: torch.device) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device)


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
    E, C, rows, cols, row0, col0, D, k_tiles, stride_en, stride_ed, stride_cv, stride_cd,
    BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
    E_TMA: tl.constexpr, C_TMA: tl.constexpr, DOT_UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """(BLOCK_N, BLOCK_V) float32 tile of E[rows] @ C[cols]^T over the first k_tiles * BLOCK_K of D (all of it:
    cdiv(D, BLOCK_K); 0: a zero tile). With E_TMA (C_TMA), E (C) is a tensor descriptor
    read by TMA at rows row0 : row0 + BLOCK_N (col0 : col0 + BLOCK_V), zero beyond its bounds; otherwise a pointer
    read at `rows` (`cols`), which callers clamp into range, so only the D tail needs a mask."""
    ks = tl.arange(0, BLOCK_K)
    if not E_TMA:
        e_ptrs = E + rows.to(tl.int64)[:, None] * stride_en + ks[None, :] * stride_ed
    if not C_TMA:
        c_ptrs = C + cols.to(tl.int64)[None, :] * stride_cv + ks[:, None] * stride_cd
    acc = tl.zeros((BLOCK_N, BLOCK_V), dtype=tl.float32)
    for k in range(0, k_tiles):
        k_ok = ks < D - k * BLOCK_K
        if E_TMA:
            e = E.load([row0, k * BLOCK_K])
        elif EVEN_K:
            e = tl.load(e_ptrs)
        else:
            e = tl.load(e_ptrs, mask=k_ok[None, :], other=0.0)
        if C_TMA:
            c = tl.trans(C.load([col0, k * BLOCK_K]))
        elif EVEN_K:
            c = tl.load(c_ptrs)
        else:
            c = tl.load(c_ptrs, mask=k_ok[:, None], other=0.0)
        acc = dot_acc(e, c, acc, DOT_UPCAST, DOT_PRECISION)
        if not E_TMA:
            e_ptrs += BLOCK_K * stride_ed
        if not C_TMA:
            c_ptrs += BLOCK_K * stride_cd
    return acc
