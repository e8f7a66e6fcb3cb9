"""Skips the gradient filter's planning for a loss whose last plan sent the backward dense.

A filter pays for its plan (the sorted forward, the per-token tile statistics, the plan kernels, the host sync, the
pieces queued before it) and gets nothing back when the plan keeps most tiles and the backward runs dense: on a flat
softmax, or a small vocabulary (SmolLM2-135M's real rows keep 86%). Per loss shape (vocabulary, hidden size, dtype,
device) and filter, a ``PlanHistory`` remembers whether the last plan went dense; while it did, the next
probe_every - 1 calls run without a filter (every tile: within any filter's bound) and the one after plans again, so a
distribution that sharpens is filtered again within probe_every steps.

The kernel keeps no history of its own: the module that calls it (the fused LM head, the ATS loss) owns one, hands
it to ``linear_cross_entropy(..., plan_history=...)`` and, where training resumes, saves it (``state`` /
``from_state``) with its checkpoint.
"""

from __future__ import annotations

from typing import Any

import torch

from kernels.tuning import PROBE_EVERY

Key = tuple[int, int, torch.dtype, torch.device, str]


def plan_key(weight: torch.Tensor, filter: str) -> Key:
    """The history's key for a loss with this head and filter."""
    return weight.shape[0], weight.shape[1], weight.dtype, weight.device, filter


class PlanHistory:
    """key -> calls since its last plan went dense (absent: the last plan did not, or none was made)."""

    def __init__(self, probe_every: int = PROBE_EVERY) -> None:
        self.probe_every = probe_every
        self._since_dense: dict[Key, int] = {}

    def filter_for(self, key: Key) -> str:
        """The filter this call runs: "none" for the probe_every - 1 calls after a dense plan, else key's filter."""
        since = self._since_dense.get(key)
        if since is None:
            return key[-1]
        self._since_dense[key] = since + 1
        return "none" if since + 1 < self.probe_every else key[-1]

    def record(self, key: Key, dense: bool) -> None:
        """The backward's verdict on a plan made for key."""
        if dense:
            self._since_dense[key] = 0
        else:
            self._since_dense.pop(key, None)

    def state(self) -> list[list[Any]]:
        """The history as JSON-able rows [vocab, dim, dtype, device, filter, calls since dense]."""
        return [[v, d, str(dtype).removeprefix("torch."), str(device), f, since]
                for (v, d, dtype, device, f), since in self._since_dense.items()]

    @classmethod
    def from_state(cls, rows: list[list[Any]], probe_every: int = PROBE_EVERY) -> PlanHistory:
        """The history ``state`` wrote."""
        history = cls(probe_every)
        for v, d, dtype, device, f, since in rows:
            history._since_dense[(v, d, getattr(torch, dtype), torch.device(device), f)] = since
        return history
