"""The Triton backend (CUDA, or CPU under TRITON_INTERPRET=1) behind the autograd Function's Backend protocol."""

from types import SimpleNamespace

from kernels.backward import triton_backward
from kernels.forward import triton_forward

BACKEND = SimpleNamespace(forward=triton_forward, backward=triton_backward)
