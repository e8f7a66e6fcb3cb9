"""Skips the gradient filter's planning for a loss whose last plan sent the backward dense.

A filter pays for its plan (the sorted forward, the per-token tile statistics, the plan kernels, the host sync, the
pieces queued before it) and gets nothing back when the plan keeps most tiles and the backward runs dense: on a flat
softmax, or a small vocabulary (SmolLM2-135M's real rows keep 86%). Per loss shape (vocabulary, hidden size, dtype,
device) and filter, this remembers whether the last plan went dense; while it did, the next PROBE_EVERY - 1 calls run
without a filter (every tile: within any filter's bound) and the one after plans again, so a distribution that
sharpens is filtered again within PROBE_EVERY steps.
"""

from __future__ import annotations

import torch

PROBE_EVERY = 16

Key = tuple[int, int, torch.dtype, torch.device, str]


def plan_key(weight: torch.Tensor, filter: str) -> Key:
    """The history's key for a loss with this head and filter."""
    return weight.shape[0], weight.shape[1], weight.dtype, weight.device, filter


class PlanHistory:
    """key -> calls since its last plan went dense (absent: the last plan did not, or none was made)."""

    def __init__(self) -> None:
        self._since_dense: dict[Key, int] = {}

    def filter_for(self, key: Key) -> str:
        """The filter this call runs: "none" for the PROBE_EVERY - 1 calls after a dense plan, else key's filter."""
        since = self._since_dense.get(key)
        if since is None:
            return key[-1]
        self._since_dense[key] = since + 1
        return "none" if since + 1 < PROBE_EVERY else key[-1]

    def record(self, key: Key, dense: bool) -> None:
        """The backward's verdict on a plan made for key."""
        if dense:
            self._since_dense[key] = 0
        else:
            self._since_dense.pop(key, None)

    def clear(self) -> None:
        self._since_dense.clear()


HISTORY = PlanHistory()
