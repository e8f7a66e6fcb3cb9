"""Activation checkpointing of decoder layers: the first k layers keep only their input for the backward and run
their forward again there (``torch.utils.checkpoint``, non-reentrant), trading a k/L share of a forward's FLOPs
for (L - k) layers' activations. The wrapper replaces ``layer.forward``, so module hooks (DeepSpeed ZeRO-3's
gather and release) stay outside the recomputed region and a compiled layer (``trainable.compiled``, entered
inside this block) compiles the recompute with it.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Iterator

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from trainable.compiled import decoder_layers


def checkpointed_count(setting: bool | int | str, layers: int) -> int:
    """Layers to recompute for ``train.activation_checkpointing``: true all, false/'auto' none, k the first k."""
    if setting is True:
        return layers
    if setting is False or setting == "auto":
        return 0
    return min(int(setting), layers)


@contextlib.contextmanager
def recomputed_layers(model: nn.Module, count: int, always: bool = False) -> Iterator[int]:
    """Within the block the first ``count`` decoder layers recompute their activations in the backward (while
    training, or with ``always`` in eval mode too: any forward under grad); yields how many; the plain forwards
    are back afterwards."""
    layers = decoder_layers(model)[:count]
    for layer in layers:
        layer.forward = _checkpointed(layer, layer.forward, always)
    try:
        yield len(layers)
    finally:
        for layer in layers:
            del layer.forward


def _checkpointed(layer: nn.Module, forward, always: bool):
    @functools.wraps(forward)
    def run(*args, **kwargs):
        if not ((always or layer.training) and torch.is_grad_enabled()):
            return forward(*args, **kwargs)
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)
    return run
