"""Host copies of small CUDA tensors that do not stall the GPU."""

from __future__ import annotations

import numpy as np
import torch


class AsyncHostCopy:
    """A host copy of a tensor, started now and waited for on first use, so that the GPU has work queued while
    the host waits (CPU tensors: a plain copy, `arrived` at once)."""

    def __init__(self, t: torch.Tensor) -> None:
        self.arrived = not t.is_cuda
        self._host = torch.empty(t.shape, dtype=t.dtype, pin_memory=t.is_cuda)
        self._host.copy_(t, non_blocking=t.is_cuda)
        self._ready = None
        if t.is_cuda:
            self._ready = torch.cuda.Event()
            self._ready.record()
        self._array: np.ndarray | None = None

    def get(self) -> np.ndarray:
        """The copy as a numpy array (waits for it on first use)."""
        if self._array is None:
            if self._ready is not None:
                self._ready.synchronize()
            self._array, self.arrived = self._host.numpy(), True
        return self._array
