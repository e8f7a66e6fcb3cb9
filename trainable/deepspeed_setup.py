"""DeepSpeed engine from a ``TrainConfig``: ZeRO stage, precision, micro-batch, accumulation, AdamW, schedule.

The learning-rate schedule is linear warmup over ``warmup_ratio * total_steps`` then cosine or linear decay
to 0 (or constant), as a ``LambdaLR`` handed to DeepSpeed so it steps with the engine.
"""

from __future__ import annotations

import math
import os
from typing import Any

import torch

from trainable.config import TrainConfig, resolved_stage
from trainable.layout import zero_buckets


def resolve_precision(precision: str, device: torch.device) -> str:
    """'auto' means bf16 on CUDA and fp32 elsewhere."""
    if precision == "auto":
        return "bf16" if device.type == "cuda" else "fp32"
    return precision


def deepspeed_config(train: TrainConfig, precision: str, world_size: int,
                     layer_params: int | None = None) -> dict[str, Any]:
    """The DeepSpeed JSON config; ``train.deepspeed`` entries are merged in last (researcher overrides).

    Two defaults keep the host from waiting on the GPU every step: the throughput timer (two device
    synchronisations per step) is off, and bf16 skips ZeRO's overflow check (a per-parameter inf/nan scan read
    back on the host; bf16 has float32's range, and a non-finite loss still stops the trial). With a known
    decoder-layer size the ZeRO-2/3 buckets follow ``zero_buckets``.
    """
    stage = resolved_stage(train, world_size)
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": train.micro_batch_size,
        "gradient_accumulation_steps": train.gradient_accumulation_steps,
        "train_batch_size": train.micro_batch_size * train.gradient_accumulation_steps * world_size,
        "gradient_clipping": train.max_grad_norm,
        "zero_optimization": {"stage": stage, **(zero_buckets(stage, layer_params) if layer_params else {})},
        "bf16": {"enabled": precision == "bf16", "check_grad_overflow": False},
        "fp16": {"enabled": precision == "fp16"},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
        "timers": {"throughput": {"enabled": False}},
    }
    return _merge(config, train.deepspeed)


def adamw(parameters: list[torch.nn.Parameter], train: TrainConfig, learning_rate: float,
          device: torch.device) -> torch.optim.AdamW:
    """torch's AdamW (its fused kernel on CUDA), handed to DeepSpeed as a client optimizer.

    DeepSpeed's own FusedAdam is JIT-built, which fails on H100 images that set TORCH_CUDA_ARCH_LIST=9.0a and
    needs a CUDA toolchain; torch's fused AdamW needs neither. ZeRO rebinds it to the fp32 master partitions.
    A researcher's ``train.deepspeed.optimizer`` entry replaces it.
    """
    return torch.optim.AdamW(parameters, lr=learning_rate, betas=train.adam_betas, eps=train.adam_eps,
                             weight_decay=train.weight_decay, fused=device.type == "cuda")


def _merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        merged[key] = _merge(merged[key], value) if isinstance(value, dict) and isinstance(merged.get(key), dict) \
            else value
    return merged


def lr_lambda(schedule: str, total_steps: int, warmup_steps: int):
    """Multiplier of the peak lr at step s: s/warmup during warmup, then cosine/linear decay to 0, or 1."""
    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        if schedule == "constant":
            return 1.0
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return 0.5 * (1 + math.cos(math.pi * progress)) if schedule == "cosine" else 1.0 - progress
    return factor


def sanitize_cuda_arch_list() -> None:
    """DeepSpeed's op builder rejects arch suffixes such as '9.0a' in TORCH_CUDA_ARCH_LIST; keep the numbers."""
    value = os.environ.get("TORCH_CUDA_ARCH_LIST")
    if value:
        os.environ["TORCH_CUDA_ARCH_LIST"] = ";".join(part.rstrip("a") for part in value.replace(" ", ";").split(";")
                                                      if part)


def build_engine(module: torch.nn.Module, train: TrainConfig, learning_rate: float, total_steps: int,
                 device: torch.device, world_size: int):
    """(engine, precision) for ``module``; torch.distributed must already be initialised (Ray Train does it).
    Under ZeRO-3 each decoder layer is a ZeRO-3 leaf module: gathered and released whole, with DeepSpeed's hooks
    on the layer alone, so that a compiled layer's graph holds none of them (``trainable.compiled``)."""
    sanitize_cuda_arch_list()
    if device.type == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed
    from deepspeed.utils import set_z3_leaf_modules

    from trainable.compiled import decoder_layers

    precision = resolve_precision(train.precision, device)
    deepspeed.init_distributed(dist_backend="nccl" if device.type == "cuda" else "gloo")
    warmup = int(train.warmup_ratio * total_steps)
    layers = decoder_layers(module)
    layer_params = sum(p.numel() for p in layers[0].parameters()) if layers else None
    config = deepspeed_config(train, precision, world_size, layer_params)
    if config["zero_optimization"]["stage"] == 3 and layers:
        set_z3_leaf_modules(module, list({type(layer) for layer in layers}))
    parameters = [p for p in module.parameters() if p.requires_grad]
    optimizer = None if "optimizer" in config else adamw(parameters, train, learning_rate, device)
    engine, _, _, _ = deepspeed.initialize(
        model=module,
        model_parameters=parameters,
        optimizer=optimizer,
        config=config,
        lr_scheduler=lambda optimizer: torch.optim.lr_scheduler.LambdaLR(
            optimizer, lr_lambda(train.schedule, total_steps, warmup)),
    )
    return engine, precision
