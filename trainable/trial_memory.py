"""What a trial held in memory: rank 0's GPU peak while training, the layout model's prediction of it, and the
host process's resident set at the trial's end.

So every GPU trial checks ``trainable.layout.peak_bytes`` (its row is a record like the benchmark's), and a warm
actor that keeps something of each trial shows as ``host_rss_gib`` growing from trial to trial.
"""

from __future__ import annotations

from typing import Any

import psutil
import torch

from trainable.config import TrainConfig
from trainable.layout import GIB, ModelShape, peak_bytes


def reset_gpu_peak(device: torch.device) -> None:
    """Start the allocator's peak afresh (a warm actor's previous trial set it); nothing on the CPU."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def gpu_peak_gib(device: torch.device) -> float | None:
    """The peak of PyTorch's allocator on ``device`` since ``reset_gpu_peak`` (GiB); None on the CPU."""
    return torch.cuda.max_memory_allocated(device) / GIB if device.type == "cuda" else None


def predicted_peak_gib(model_config: Any, params: int, train: TrainConfig, engine: str, zero_stage: int,
                       world_size: int, seq_len: int, checkpointed: int, precision: str,
                       device: torch.device) -> float | None:
    """``trainable.layout.peak_bytes`` of the layout that ran (GiB): the model's shape (``params`` real
    parameters), the engine's stage, micro-batch, accumulation and recomputed layers, and ZeRO's buckets as
    ``deepspeed_config`` set them. None where the model does not apply: off CUDA, or in another precision than
    bf16."""
    from trainable.deepspeed_setup import deepspeed_config

    if device.type != "cuda" or precision != "bf16":
        return None
    config = model_config.get_text_config() if hasattr(model_config, "get_text_config") else model_config
    shape = ModelShape.from_config(config, params)
    zero = deepspeed_config(train, precision, world_size, shape.layer_params)["zero_optimization"]
    return peak_bytes(shape, zero_stage, world_size, train.micro_batch_size, seq_len, checkpointed, zero, engine,
                      train.gradient_accumulation_steps) / GIB


def host_rss_gib() -> float:
    """This process's resident set (GiB)."""
    return psutil.Process().memory_info().rss / GIB
