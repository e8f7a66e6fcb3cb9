"""An FSDP2 trial's model over several ranks, built on the meta device so that no rank's device ever holds it whole:
once ``fsdp2_engine.build_engine`` has sharded it, each rank allocates and fills only its shards (its
``materialise``). One rank shards nothing: its model is built whole as before (``common.models.load_model``), the
same weights as DeepSpeed's from the same seed.

Random init, for the architectures in ``SHARDED_INIT_ARCHITECTURES`` (those whose Hugging Face init is the one
``fsdp2_engine.init_sharded`` draws: N(0, initializer_range^2) matrices and embeddings, norm weights 1): each rank
draws its shards. On GPUs DTensor's RNG tracker draws each shard as its slice of one draw of the whole tensor; on the
CPU (no tracker) each shard from a generator of its own. Either way the values are not those of the whole model
drawn from the same seed (``common.models.load_model``): same distribution, another draw. Another architecture's
random init (Gemma's norms start at 0, its embeddings carry a scale) is built whole on the device as before.

Stored weights (hub, local folder, GGUF): rank 0 loads the model on its CPU (host memory, 4 bytes a parameter),
sends its config to the other ranks, and every rank builds that config on the meta device; once sharded, rank 0's
weights are broadcast one tensor at a time (``fsdp2_engine.load_sharded``): a rank's device holds its shards and
one whole tensor at most.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn

from common.models import ModelSpec, load_model
from trainable.fsdp2_engine import init_sharded, load_sharded

SHARDED_INIT_ARCHITECTURES = frozenset({"llama", "mistral", "qwen2"})  # default Hugging Face init: init_sharded's

Materialise = Callable[[nn.Module], None]  # fills a sharded module built on the meta device (build_engine's)


def sharded_model(spec: ModelSpec, *, seed: int, device: torch.device, rank: int, world_size: int,
                  **config_overrides: Any) -> tuple[nn.Module, Materialise | None]:
    """(the model of an FSDP2 trial, how to fill it once sharded): over several ranks built on the meta device with
    its ``materialise`` (module docstring); on one rank, or for a random-init architecture ``init_sharded`` does not
    draw, built whole (random init on ``device`` from ``seed``) with None. Collective for stored weights over several
    ranks (rank 0 sends the config)."""
    if world_size == 1 or spec.source == "random_init" and spec.location not in SHARDED_INIT_ARCHITECTURES:
        return load_model(spec, seed=seed, device=device, **config_overrides), None
    if spec.source == "random_init":
        model = load_model(spec, seed=seed, device="meta", **config_overrides)
        return model, functools.partial(_drawn, device=device, std=model.config.initializer_range, seed=seed)
    from transformers import AutoModelForCausalLM

    source = load_model(spec, **config_overrides) if rank == 0 else None  # on rank 0's CPU
    config = [None if source is None else source.config]
    dist.broadcast_object_list(config, src=0)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config[0], dtype=torch.float32,
                                                 attn_implementation=config[0]._attn_implementation)
    return model, functools.partial(load_sharded, device=device, source=source)


def _drawn(module: nn.Module, device: torch.device, std: float, seed: int) -> None:
    """``init_sharded`` from ``seed`` (as ``load_model`` draws a whole model), the process's RNG states kept. On GPUs
    DTensor's RNG tracker offsets each shard's draw; elsewhere the seed is offset by the rank's place along the
    shard dimension of the mesh, so that shards differ and HSDP's replicas match."""
    cuda = device.type == "cuda"
    mesh = next(module.parameters()).device_mesh
    with torch.random.fork_rng(devices=[device] if cuda else []):
        torch.manual_seed(seed if cuda else seed + mesh.get_local_rank(mesh.ndim - 1))
        init_sharded(module, device, std)
