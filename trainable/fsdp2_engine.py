"""PyTorch FSDP2 engine from a ``TrainConfig``: what the trial loop uses of DeepSpeed's engine, sharded like ZeRO-3.

``fully_shard`` goes on each decoder layer (``trainable.compiled.decoder_layers``), then on the loss-wrapped root
(embedding, final norm and the fused head, tied or not). Parameters stay float32 (the master weights) and are
sharded across the ranks; under bf16 the forward and backward compute in bf16 and gradients are reduce-scattered
in float32. Every micro-batch's backward reduce-scatters: unsynced micro-batches would hold unsharded float32
gradients of the whole model. The optimiser is ``deepspeed_setup.adamw`` and the schedule ``deepspeed_setup.lr_lambda``,
stepped as DeepSpeed steps them: at each accumulation boundary, after clipping to ``train.max_grad_norm``.
Checkpoints are torch.distributed.checkpoint's sharded state dicts (each rank writes its shard) with the schedule.
With ``train.fsdp_replicas`` R > 1 the mesh is HSDP's (``device_mesh``): R replica groups of world / R consecutive
ranks (a node's, as Ray Train and torchrun number them), each sharding the model; gradients are reduce-scattered
within a group and all-reduced across groups.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from trainable.config import TrainConfig
from trainable.deepspeed_setup import adamw, lr_lambda, resolve_precision

SCHEDULE_FILE = "schedule.json"


class Fsdp2Engine:
    """The subset of ``deepspeed.DeepSpeedEngine`` the trial loop, checkpoints and result use, over an FSDP2 module.

    ``backward`` divides the loss by the accumulation steps (DeepSpeed's ``scale_wrt_gas``); FSDP2 averages the
    gradients over the ranks; ``step`` steps the optimiser and the schedule at every ``gradient_accumulation_steps``-th
    call. ``compute_dtype`` is the dtype the forward and backward run in (the parameters are float32)."""

    def __init__(self, module: nn.Module, optimizer: torch.optim.Optimizer,
                 scheduler: torch.optim.lr_scheduler.LambdaLR, train: TrainConfig, compute_dtype: torch.dtype):
        self.module, self.optimizer, self.lr_scheduler = module, optimizer, scheduler
        self.compute_dtype = compute_dtype
        self.micro_batch_size, self.accumulation = train.micro_batch_size, train.gradient_accumulation_steps
        self.max_grad_norm = train.max_grad_norm
        self.micro_steps = 0

    def __call__(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self.module(*args, **kwargs)

    def backward(self, loss: torch.Tensor) -> None:
        (loss / self.accumulation).backward()

    def step(self) -> None:
        """Count a micro-batch; at the accumulation boundary clip, step the optimiser and schedule, drop gradients."""
        self.micro_steps += 1
        if self.micro_steps % self.accumulation:
            return
        if self.max_grad_norm and self.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(self.module.parameters(), self.max_grad_norm)
        self.optimizer.step()
        self.lr_scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)

    def drop_optimizer_state(self) -> None:
        """Free the optimizer's states and the gradients once training is over (scoring needs the room)."""
        self.optimizer.zero_grad(set_to_none=True)
        self.optimizer.state.clear()

    def destroy(self) -> None:
        """At the trial's end, as DeepSpeed's ``destroy``: FSDP2's hooks live on the module, so only the optimizer's
        states and the gradients are left to free."""
        self.drop_optimizer_state()

    def get_lr(self) -> list[float]:
        return [group["lr"] for group in self.optimizer.param_groups]

    def train(self) -> None:
        self.module.train()

    def eval(self) -> None:
        self.module.eval()

    def zero_optimization_stage(self) -> int:
        """3: parameters, gradients and optimizer states are sharded as under ZeRO-3."""
        return 3

    def train_micro_batch_size_per_gpu(self) -> int:
        return self.micro_batch_size

    def gradient_accumulation_steps(self) -> int:
        return self.accumulation

    def _states(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

        return {"model": get_model_state_dict(self.module),
                "optimizer": get_optimizer_state_dict(self.module, self.optimizer)}

    def save_checkpoint(self, save_dir: str, tag: str) -> None:
        """Every rank writes its shards of the weights and optimizer states (torch.distributed.checkpoint) under
        ``save_dir/tag``; rank 0 adds the schedule's state. Collective; call it at an accumulation boundary."""
        import torch.distributed.checkpoint as dcp

        path = Path(save_dir) / tag
        dcp.save(self._states(), checkpoint_id=str(path))
        if dist.get_rank() == 0:
            (path / SCHEDULE_FILE).write_text(json.dumps(self.lr_scheduler.state_dict()))

    def load_checkpoint(self, load_dir: str, tag: str) -> tuple[str, dict]:
        """Load ``save_checkpoint``'s files (every rank's, merged) into this engine; returns (path, {}) as DeepSpeed's
        does. Collective."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

        path = Path(load_dir) / tag
        states = self._states()
        dcp.load(states, checkpoint_id=str(path))
        set_model_state_dict(self.module, states["model"])
        set_optimizer_state_dict(self.module, self.optimizer, states["optimizer"])
        self.lr_scheduler.load_state_dict(json.loads((path / SCHEDULE_FILE).read_text()))
        self.micro_steps = self.lr_scheduler.last_epoch * self.accumulation
        return str(path), {}


def build_engine(module: nn.Module, train: TrainConfig, learning_rate: float, total_steps: int,
                 device: torch.device, world_size: int, init_std: float | None = None) -> tuple[Fsdp2Engine, str]:
    """(engine, precision) for ``module`` (a ``CausalLMWithFusedLoss``), as ``deepspeed_setup.build_engine``;
    torch.distributed must already be initialised (Ray Train does it). ``module`` is sharded in place, its
    parameters made float32 DTensors on ``device``. A module built on the meta device (a model whose float32 copy
    does not fit one GPU) needs ``init_std``: each rank then allocates and initialises only its shards
    (``init_sharded``)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from trainable.compiled import decoder_layers

    precision = resolve_precision(train.precision, device)
    if precision not in ("bf16", "fp32"):
        raise ValueError(f"expected precision bf16 or fp32 under FSDP2 (no loss scaling), got {precision!r}")
    mesh = device_mesh(device.type, world_size, train.fsdp_replicas)
    compute_dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    policy = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
    module.float()
    for layer in decoder_layers(module):
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(module, mesh=mesh, mp_policy=policy)
    if init_std is not None:
        init_sharded(module, device, init_std)
    optimizer = adamw([p for p in module.parameters() if p.requires_grad], train, learning_rate, device)
    warmup = int(train.warmup_ratio * total_steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(train.schedule, total_steps, warmup))
    return Fsdp2Engine(module, optimizer, scheduler, train, compute_dtype), precision


def device_mesh(device_type: str, world_size: int, replicas: int = 1):
    """FSDP2's mesh: 1-D over every rank (a full shard), or with ``replicas`` R > 1 HSDP's 2-D mesh (R, world / R),
    dims named ("replicate", "shard"): each row of consecutive ranks shards the model, the columns replicate it.
    Raises ValueError when R does not divide the world."""
    from torch.distributed.device_mesh import init_device_mesh

    if replicas < 1 or world_size % replicas:
        raise ValueError(f"expected train.fsdp_replicas to divide the {world_size} ranks, got {replicas}")
    if replicas == 1:
        return init_device_mesh(device_type, (world_size,))
    return init_device_mesh(device_type, (replicas, world_size // replicas), mesh_dim_names=("replicate", "shard"))


def init_sharded(module: nn.Module, device: torch.device, std: float) -> None:
    """Give a sharded module built on the meta device storage on ``device`` (each rank its shards) and a Llama's
    initialisation: matrices and embeddings drawn from N(0, std^2), norm weights (vectors) 1; the rotary
    embeddings' buffers (computed in their constructor, not stored) made again from their config."""
    module.to_empty(device=device)
    with torch.no_grad():
        for parameter in module.parameters():
            if parameter.dim() >= 2:
                parameter.normal_(0.0, std)
            else:
                parameter.fill_(1.0)
        for rotary in [m for m in module.modules() if type(m).__name__.endswith("RotaryEmbedding")]:
            fresh = type(rotary)(rotary.config).to(device)
            for name, buffer in fresh.named_buffers(recurse=False):
                setattr(rotary, name, buffer)
