"""A trained model as a Hugging Face folder (config, safetensors weights, tokenizer) that any HF tool loads.

The weights are those the engine trained (16-bit under bf16/fp16, float32 under fp32), without the fused loss head:
the folder holds the model's own architecture, so ``AutoModelForCausalLM.from_pretrained``, lm-evaluation-harness
(``lm_eval --model hf --model_args pretrained=DIR``) and ``calsweep evaluate --model DIR`` read it.
Under ZeRO-3 the ranks gather the partitioned weights a block at a time (``deepspeed.zero.GatheredParameters``,
through ``zero3_scoring.gathered_copy``) into a plain copy in rank 0's host memory; under ZeRO 0-2 every rank holds
them all and the copy is made the same way, so the GPU never holds a second model. Under FSDP2 the caller hands
``fsdp2_weights.gathered_copy`` (bound to the engine's compute dtype) as ``gather``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from trainable.zero3_scoring import gathered_copy


Gather = Callable[[nn.Module, torch.device, int], "nn.Module | None"]  # (model, device, rank) -> rank 0's copy


def save_hf_model(model: nn.Module, tokenizer: Any, rank: int, directory: str | Path,
                  gather: Gather = gathered_copy) -> Path | None:
    """Write ``model`` (partitioned by ZeRO-3 or not; sharded by FSDP2 with its ``gather``) and ``tokenizer`` as a
    Hugging Face folder at ``directory`` on rank 0 and return it; None on other ranks. Collective: every rank must
    call it."""
    copy = gather(model, torch.device("cpu"), rank)
    if copy is None:
        return None
    directory = Path(directory)
    copy.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    del copy
    return directory
