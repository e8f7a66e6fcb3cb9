"""torch.compile for training: each decoder layer's forward compiled, so its norms, rotary embedding and
activation fuse into a few kernels while the module tree (and DeepSpeed's hooks on it) stays as it was.
Scoring afterwards runs the eager forwards again (its shapes vary batch to batch and it carries a KV cache).

All layers share one code object, so Dynamo counts every layer whose guards differ (a KV cache's per-layer
state, Gemma's sliding and global layers) as a recompile of it; past its ``recompile_limit`` (8) the remaining
layers would silently run eager. The limit is raised to the number of layers for the block, and the training
forward passes ``use_cache=False`` so that one graph serves every layer of a kind."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
from torch import nn


def compile_wanted(setting: bool | None, device: torch.device) -> bool:
    """``TrainConfig.compile``: True/False as given; None means on CUDA only."""
    return device.type == "cuda" if setting is None else setting


@contextlib.contextmanager
def compiled_decoder_layers(model: nn.Module, enabled: bool = True, backend: Any = "inductor") -> Iterator[int]:
    """Within the block every ``*DecoderLayer`` of a Hugging Face model runs ``torch.compile(layer.forward)``;
    yields how many layers were compiled (0 when not ``enabled``); the eager forwards are back afterwards.
    ``backend`` is torch.compile's (tests count Dynamo's graphs with a backend of their own)."""
    layers = decoder_layers(model) if enabled else []
    before = [layer.__dict__.get("forward") for layer in layers]  # a wrapper set before (activation recompute)
    for layer in layers:
        layer.forward = torch.compile(layer.forward, backend=backend)
    limit = max(torch._dynamo.config.recompile_limit, len(layers))
    try:
        with torch._dynamo.config.patch(recompile_limit=limit):
            yield len(layers)
    finally:
        for layer, forward in zip(layers, before):
            del layer.forward
            if forward is not None:
                layer.forward = forward


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The ``*DecoderLayer`` modules of a Hugging Face model, in order."""
    return [m for m in model.modules() if type(m).__name__.endswith("DecoderLayer")]
