"""What a trial held in memory: rank 0's GPU peak while training, the layout model's prediction of it, and the
host process's resident set at the trial's end.

So every GPU trial checks ``trainable.layout.peak_bytes`` (its row is a record like the benchmark's), and a warm
actor that keeps something of each trial shows as ``host_rss_gib`` growing from trial to trial. A trial that runs
out of GPU memory carries its peak on the error (``peak_on_out_of_memory``), for its failed row.
"""

from __future__ import annotations

import contextlib
import re
from typing import Any, Iterator

import psutil
import torch

from trainable.config import TrainConfig
from trainable.layout import GIB, ModelShape, peak_bytes

OOM_PEAK = "gpu_peak_gib"  # the attribute of an out-of-memory error that carries its rank's peak (GiB)
_ALLOCATED = re.compile(r"([\d.]+) (GiB|MiB) is allocated by PyTorch")  # the CUDA caching allocator's message


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
    config = model_config.get_text_config() if hasattr(model_config, "get_text_config") else model_config
    return shape_peak_gib(ModelShape.from_config(config, params), train, engine, zero_stage, world_size, seq_len,
                          checkpointed, precision, device.type)


def shape_peak_gib(shape: ModelShape, train: TrainConfig, engine: str, zero_stage: int, world_size: int, seq_len: int,
                   checkpointed: int, precision: str, device_type: str) -> float | None:
    """``predicted_peak_gib`` of a model ``shape`` on a ``device_type`` device: what a trial's row predicts, from
    the loaded model (``predicted_peak_gib``) or, for a trial that failed before it reported, from its family's
    shape."""
    from trainable.deepspeed_setup import deepspeed_config

    if device_type != "cuda" or precision != "bf16":
        return None
    zero = deepspeed_config(train, precision, world_size, shape.layer_params)["zero_optimization"]
    return peak_bytes(shape, zero_stage, world_size, train.micro_batch_size, seq_len, checkpointed, zero, engine,
                      train.gradient_accumulation_steps) / GIB


def host_rss_gib() -> float:
    """This process's resident set (GiB)."""
    return psutil.Process().memory_info().rss / GIB


@contextlib.contextmanager
def peak_on_out_of_memory(device: torch.device) -> Iterator[None]:
    """Run the block; a ``torch.OutOfMemoryError`` leaves it carrying this rank's allocator peak as its
    ``gpu_peak_gib`` attribute (None on the CPU), which travels with it to Ray's driver (pickled)."""
    try:
        yield
    except torch.OutOfMemoryError as error:
        setattr(error, OOM_PEAK, gpu_peak_gib(device))
        raise


def out_of_memory_peak_gib(error: BaseException) -> float | None:
    """The measured GPU peak (GiB) of an out-of-memory error: the one ``peak_on_out_of_memory`` attached, else what
    the allocator's message says PyTorch had allocated; None where neither says (the CPU)."""
    attached = getattr(error, OOM_PEAK, None)
    if attached is not None:
        return attached
    said = _ALLOCATED.search(str(error))
    return None if said is None else float(said[1]) / (1 if said[2] == "GiB" else 1024)
