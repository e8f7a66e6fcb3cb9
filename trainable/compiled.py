"""torch.compile for training: each decoder layer's forward compiled, so its norms, rotary embedding and
activation fuse into a few kernels while the module tree (and DeepSpeed's hooks on it) stays as it was.
Scoring afterwards runs the eager forwards again (its shapes vary batch to batch and it carries a KV cache).

All layers share one code object, so Dynamo counts every layer whose guards differ (a KV cache's per-layer
state, Gemma's sliding and global layers) as a recompile of it; past its ``recompile_limit`` (8) the remaining
layers would silently run eager. The limit is raised for the block to the number of layers plus the graphs the
code object already holds (a warm actor's earlier trials), and the training forward passes ``use_cache=False`` so
that one graph serves every layer of a kind. Graphs are static (``dynamic=False``): a warm actor's next trial of
another shape (family, micro-batch, sequence length) compiles graphs of its own shapes, as a fresh process and the
benchmark do, where Dynamo's automatic dynamic shapes would recompile the layers for symbolic sizes.

SDPA's kernel is chosen when a graph is traced, under the ``sdpa_kernel`` flags of that moment, and Dynamo does not
guard those flags: a graph traced inside one ``sdpa_kernel`` block would serve a later block under another kernel
set (a warm actor's next trial, a benchmark's next path) with the kernel it traced. So each kernel set compiles a
function of its own code object (Dynamo keeps graphs per code object), entered under that set. The set is not
entered inside the graph: AOTAutograd's cache refuses a graph that calls ``sdpa_kernel``, and the node's compile
cache then held Inductor's code alone, every later process tracing the joint forward and backward again."""

from __future__ import annotations

import contextlib
import functools
import types
from typing import Any, Callable, Iterator

import torch
from torch import nn
from torch._dynamo.eval_frame import _debug_get_cache_entry_list
from torch.nn.attention import SDPBackend, _cur_sdpa_kernel_backends, sdpa_kernel


def compile_wanted(setting: bool | None, device: torch.device) -> bool:
    """``TrainConfig.compile``: True/False as given; None means on CUDA only."""
    return device.type == "cuda" if setting is None else setting


@contextlib.contextmanager
def compiled_decoder_layers(model: nn.Module, enabled: bool = True, backend: Any = "inductor") -> Iterator[int]:
    """Within the block every ``*DecoderLayer`` of a Hugging Face model runs ``torch.compile(layer.forward)``, under
    the SDPA kernels enabled on entering the block; yields how many layers were compiled (0 when not ``enabled``);
    the eager forwards are back afterwards. ``backend`` is torch.compile's (tests count Dynamo's graphs with a
    backend of their own)."""
    layers = decoder_layers(model) if enabled else []
    before = [layer.__dict__.get("forward") for layer in layers]  # a wrapper set before (activation recompute)
    attention = tuple(_cur_sdpa_kernel_backends())
    for layer in layers:
        layer.forward = _attending_with(torch.compile(_forward_of(layer.forward, attention), backend=backend,
                                                      dynamic=False),
                                        attention)
    # the code object's graphs of earlier blocks (a warm actor's earlier trials) count towards the limit too
    earlier = len(_debug_get_cache_entry_list(_code_for(attention)))
    limit = max(torch._dynamo.config.recompile_limit, earlier + len(layers))
    try:
        with torch._dynamo.config.patch(recompile_limit=limit):
            yield len(layers)
    finally:
        for layer, forward in zip(layers, before):
            del layer.forward
            if forward is not None:
                layer.forward = forward


def _attending_with(forward: Callable, attention: tuple[SDPBackend, ...]) -> Callable:
    """``forward`` run inside ``sdpa_kernel(attention)``."""

    @functools.wraps(forward)
    def run(*args, **kwargs):
        with sdpa_kernel(list(attention)):
            return forward(*args, **kwargs)
    return run


def _calling(forward: Callable) -> Callable:
    """A function calling ``forward``: its code is the template ``_code_for`` copies."""

    def call(*args, **kwargs):
        return forward(*args, **kwargs)
    return call


@functools.cache
def _code_for(attention: tuple[SDPBackend, ...]) -> types.CodeType:
    """``_calling``'s inner code, one object per kernel set (named after it)."""
    name = "forward_under_" + "_".join(backend.name.lower() for backend in attention)
    return _calling(None).__code__.replace(co_name=name)


def _forward_of(forward: Callable, attention: tuple[SDPBackend, ...]) -> Callable:
    """A function calling ``forward`` whose code object is the kernel set's (``_code_for``)."""
    code = _code_for(attention)
    return types.FunctionType(code, globals(), code.co_name, None, (types.CellType(forward),))


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The ``*DecoderLayer`` modules of a Hugging Face model, in order."""
    return [m for m in model.modules() if type(m).__name__.endswith("DecoderLayer")]
