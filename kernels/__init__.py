"""Fused linear + label-smoothed cross-entropy: Triton kernels on CUDA, a chunked PyTorch path on CPU."""

from kernels.api import LCEStats, linear_cross_entropy

__all__ = ["LCEStats", "linear_cross_entropy"]
