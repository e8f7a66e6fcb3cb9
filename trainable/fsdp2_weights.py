"""The trained weights of an FSDP2-sharded model as one plain copy on rank 0 (or on each rank), for scoring and
export.

Rank 0 (or each rank) makes an unsharded model of the same config on ``device``, in the dtype the engine computed
in (bf16 under bf16, as DeepSpeed's 16-bit weights; float32 under fp32). Then, tensor by tensor of the state dict,
the ranks gather the sharded tensor whole on their device (``DTensor.full_tensor``: an all-gather) and each rank
with a copy casts it into its copy. Nothing passes through host memory; every rank's device holds one tensor more
at a time, at most. Buffers that are not in the state dict (not sharded by FSDP2) are copied as they are.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from trainable.zero3_scoring import empty_copy


def resharded(model: nn.Module) -> nn.Module:
    """``model`` with every FSDP2 module's parameters sharded (a root left unsharded by a forward holds plain
    tensors)."""
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()
    return model


def gathered_copy(model: nn.Module, device: torch.device, rank: int, dtype: torch.dtype,
                  everywhere: bool = False) -> nn.Module | None:
    """On rank 0 (on every rank with ``everywhere``), a plain Hugging Face model in ``dtype`` on ``device`` holding
    the full weights of the FSDP2-sharded ``model``; None on other ranks. Collective: every rank must call it."""
    copy = empty_copy(model, device, dtype) if rank == 0 or everywhere else None
    targets = copy.state_dict() if copy is not None else {}  # views of the copy's tensors: copy_ writes the model
    with torch.no_grad():
        for name, tensor in resharded(model).state_dict().items():
            whole = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
            if copy is not None:
                targets[name].copy_(whole)
            del whole
    if copy is None:
        return None
    in_state = set(targets)
    buffers = dict(model.named_buffers())
    for name, buffer in copy.named_buffers():
        if name not in in_state:
            buffer.copy_(buffers[name])
    return copy
