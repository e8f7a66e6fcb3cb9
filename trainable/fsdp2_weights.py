"""The trained weights of an FSDP2-sharded model as one plain copy on rank 0, for scoring and export.

The ranks gather each sharded parameter whole in turn (torch.distributed.checkpoint's full state dict, offloaded to
rank 0's host memory as it goes), and rank 0 copies them into an unsharded model of the same config on ``device``,
in the dtype the engine computed in (bf16 under bf16, as DeepSpeed's 16-bit weights; float32 under fp32). Buffers
(not sharded by FSDP2) are copied as they are. Every rank's device holds one parameter more at a time, at most.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule

from trainable.zero3_scoring import empty_copy


def full_weights(model: nn.Module, rank: int) -> dict[str, torch.Tensor]:
    """``model``'s state dict (an FSDP2-sharded module, or a module inside one) with every tensor whole, on rank 0's
    host; {} on the other ranks. Collective: every rank must call it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    for module in model.modules():  # a root left unsharded by a forward holds plain tensors: shard it back first
        if isinstance(module, FSDPModule):
            module.reshard()
    weights = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return weights if rank == 0 else {}


def gathered_copy(model: nn.Module, device: torch.device, rank: int, dtype: torch.dtype) -> nn.Module | None:
    """On rank 0, a plain Hugging Face model in ``dtype`` on ``device`` holding the full weights of the
    FSDP2-sharded ``model``; None on other ranks. Collective: every rank must call it."""
    weights = full_weights(model, rank)
    if rank != 0:
        return None
    copy = empty_copy(model, device, dtype)
    copy.load_state_dict(weights)
    buffers = dict(model.named_buffers())
    for name, buffer in copy.named_buffers():
        buffer.copy_(buffers[name])
    return copy
