"""Scoring after a ZeRO-3 trial without ZeRO-3: one plain copy of the trained weights on rank 0.

Under ZeRO-3 every module's forward all-gathers its partitioned weights and frees them again, so scoring
thousands of small batches through the engine costs several times scoring the same model on one GPU. When
the full 16-bit model fits in rank 0's free device memory (with ``headroom`` left for activations), the ranks
all-gather the weights a block at a time and rank 0 copies them into a model built on the device; rank 0
scores with it and the other ranks skip scoring. Otherwise every rank scores through the partitioned model,
as before.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

GATHER_CHUNK_BYTES = 1 << 30


def _full_bytes(parameters: list[nn.Parameter]) -> int:
    return sum(getattr(p, "ds_numel", p.numel()) * p.element_size() for p in parameters)


def _fits_everywhere(needed: int, device: torch.device, rank: int, world_size: int, headroom: int) -> bool:
    """Whether rank 0 has ``needed + headroom`` bytes free (CPU: always), agreed by every rank."""
    fits = True
    if rank == 0 and device.type == "cuda":
        fits = needed + headroom <= torch.cuda.mem_get_info(device)[0]
    flag = torch.tensor(float(fits), device=device)
    if world_size > 1:
        dist.broadcast(flag, src=0)
    return bool(flag.item())


def empty_copy(model: nn.Module, device: torch.device, dtype: torch.dtype) -> nn.Module:
    """An uninitialised ``type(model)`` of the same config on ``device`` (weights tied as the config says)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        copy = AutoModelForCausalLM.from_config(model.config, dtype=dtype,
                                                attn_implementation=model.config._attn_implementation)
    copy.to_empty(device=device)
    copy.tie_weights()
    return copy.eval()


def gathered_copy(model: nn.Module, device: torch.device, rank: int) -> nn.Module | None:
    """On rank 0, a plain model holding the full weights of ZeRO-3-partitioned ``model``; None on other ranks.

    Collective: every rank must call it. Weights are gathered in blocks of about ``GATHER_CHUNK_BYTES``.
    Buffers (not partitioned by ZeRO) are copied as they are.
    """
    import deepspeed

    named = list(model.named_parameters())
    copy = empty_copy(model, device, named[0][1].dtype) if rank == 0 else None
    targets = dict(copy.named_parameters()) if copy is not None else {}
    chunks, chunk, size = [], [], 0
    for name, parameter in named:
        chunk.append((name, parameter))
        size += _full_bytes([parameter])
        if size >= GATHER_CHUNK_BYTES:
            chunks.append(chunk)
            chunk, size = [], 0
    chunks += [chunk] if chunk else []
    for chunk in chunks:
        with deepspeed.zero.GatheredParameters([p for _, p in chunk], modifier_rank=None):
            for name, parameter in chunk:
                if name in targets:
                    targets[name].data.copy_(parameter.data)
    if copy is not None:
        buffers = dict(model.named_buffers())
        for name, buffer in copy.named_buffers():
            buffer.copy_(buffers[name])
        missing = set(targets) - {name for name, _ in named}
        if missing:
            raise RuntimeError(f"expected every weight of the scoring copy in the trained model, missing {sorted(missing)}")
    return copy


def scoring_model(model: nn.Module, zero_stage: int, device: torch.device, rank: int, world_size: int,
                  headroom: int = 8 << 30) -> nn.Module | None:
    """The model to score on this rank: ``model`` unless ZeRO-3 partitioned it and a full copy fits on rank 0;
    then rank 0's gathered copy, and None (skip scoring) on the other ranks."""
    if zero_stage != 3:
        return model
    if not _fits_everywhere(_full_bytes(list(model.parameters())), device, rank, world_size, headroom):
        return model
    return gathered_copy(model, device, rank)
