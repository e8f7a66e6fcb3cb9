"""PyTorch FSDP2 engine from a ``TrainConfig``: what the trial loop uses of DeepSpeed's engine, sharded like ZeRO-3.

``fully_shard`` goes on each decoder layer (``trainable.compiled.decoder_layers``), then on the loss-wrapped root
(embedding, final norm and the fused head, tied or not). Parameters stay float32 (the master weights) and are
sharded across the ranks; under bf16 the forward and backward compute in bf16 and gradients are reduce-scattered
in float32. Every micro-batch's backward reduce-scatters: unsynced micro-batches would hold unsharded float32
gradients of the whole model. The optimiser is ``deepspeed_setup.adamw`` and the schedule ``deepspeed_setup.lr_lambda``,
stepped as DeepSpeed steps them: at each accumulation boundary, after clipping to ``train.max_grad_norm``.
Checkpoints are torch.distributed.checkpoint's sharded state dicts (each rank writes its shard) with the schedule.
With ``train.fsdp_replicas`` R > 1 the mesh is HSDP's (``device_mesh``): R replica groups of world / R ranks, each
whole nodes' ranks as the ranks say where they run (Ray's placement groups and Ray Train do not promise that a node's
ranks are consecutive), each sharding the model; gradients are reduce-scattered within a group and all-reduced across
groups.

A model too large for one GPU is built on the meta device and given storage only for each rank's shards
(``build_engine``'s ``materialise``): random weights drawn shard by shard (``init_sharded``), or rank 0's loaded
weights broadcast tensor by tensor (``load_sharded``).
"""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist
from torch import nn

from trainable.config import TrainConfig
from trainable.deepspeed_setup import adamw, lr_lambda, resolve_precision
from trainable.lm_head import COMPUTE_DTYPES

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
                 device: torch.device, world_size: int, materialise: Callable[[nn.Module], None] | None = None,
                 node: str | None = None) -> tuple[Fsdp2Engine, str]:
    """(engine, precision) for ``module`` (a ``CausalLMWithFusedLoss``), as ``deepspeed_setup.build_engine``;
    torch.distributed must already be initialised (Ray Train does it). ``module`` is sharded in place, its
    parameters made float32 DTensors on ``device``. A module built on the meta device (a model whose float32 copy
    does not fit one GPU) needs ``materialise``, called on it once sharded: each rank then allocates and fills only
    its shards (``init_sharded``, ``load_sharded``). ``node``: where this rank runs (``device_mesh``)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from trainable.compiled import decoder_layers

    precision = resolve_precision(train.precision, device)
    if precision not in ("bf16", "fp32"):
        raise ValueError(f"expected precision bf16 or fp32 under FSDP2 (no loss scaling), got {precision!r}")
    mesh = device_mesh(device.type, world_size, train.fsdp_replicas, node)
    compute_dtype = COMPUTE_DTYPES[precision]
    policy = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
    module.float()
    for layer in decoder_layers(module):
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(module, mesh=mesh, mp_policy=policy)
    if materialise is not None:
        materialise(module)
    optimizer = adamw([p for p in module.parameters() if p.requires_grad], train, learning_rate, device)
    warmup = int(train.warmup_ratio * total_steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(train.schedule, total_steps, warmup))
    return Fsdp2Engine(module, optimizer, scheduler, train, compute_dtype), precision


def device_mesh(device_type: str, world_size: int, replicas: int = 1, node: str | None = None):
    """FSDP2's mesh: 1-D over every rank (a full shard), or with ``replicas`` R > 1 HSDP's 2-D mesh (R, world / R),
    dims named ("replicate", "shard"): each row shards the model, the columns replicate it, and each row is whole
    nodes' ranks (``replica_rows`` of every rank's ``node``, gathered: default ``node_name()``). Collective under
    HSDP. Raises ValueError when R does not divide the world, or when the ranks' nodes cannot form whole-node rows."""
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

    if replicas < 1 or world_size % replicas:
        raise ValueError(f"expected train.fsdp_replicas to divide the {world_size} ranks, got {replicas}")
    if replicas == 1:
        return init_device_mesh(device_type, (world_size,))
    nodes: list[str | None] = [None] * world_size
    dist.all_gather_object(nodes, node or node_name())
    return DeviceMesh(device_type, torch.tensor(replica_rows(nodes, replicas)), mesh_dim_names=("replicate", "shard"))


def node_name() -> str:
    """The node this rank runs on: its Ray node id, else the host's name (torchrun, a plain process group)."""
    from trainable.node_setup import ray_node_id

    return ray_node_id() or socket.gethostname()


def replica_rows(nodes: Sequence[str], replicas: int) -> list[list[int]]:
    """HSDP's ``replicas`` replica groups as rows of len(nodes) / replicas ranks (``nodes[r]``: rank r's node), each
    row the ranks of whole nodes or, where a node has more ranks than a row, its ranks split into whole rows: nodes
    placed largest first, each part into the first row with room for it; rows and their ranks in rank order
    (consecutive ranks per node give init_device_mesh's rows). Raises ValueError naming the ranks per node when a
    row would have to take part of a node."""
    size = len(nodes) // replicas
    by_node: dict[str, list[int]] = {}
    for rank, node in enumerate(nodes):
        by_node.setdefault(node, []).append(rank)
    rows: list[list[int]] = [[] for _ in range(replicas)]
    for ranks in sorted(by_node.values(), key=lambda ranks: (-len(ranks), ranks[0])):
        if not _placed(rows, ranks, size):
            counts = {node: len(ranks) for node, ranks in by_node.items()}
            raise ValueError(f"expected the trial's ranks to fill {replicas} HSDP replica groups of {size} ranks "
                             f"with whole nodes, got ranks per node {counts}; set train.fsdp_replicas: 1 (a full "
                             f"shard) or place the ranks by whole nodes")
    return sorted(sorted(row) for row in rows)


def _placed(rows: list[list[int]], ranks: list[int], size: int) -> bool:
    """Put one node's ``ranks`` into ``rows`` of ``size`` ranks: whole into the first row with room, or, more than a
    row, as whole rows (a multiple of ``size`` ranks); False where neither can be."""
    if len(ranks) > size and len(ranks) % size:
        return False
    for part in (ranks[i:i + size] for i in range(0, len(ranks), size)):
        row = next((row for row in rows if len(row) + len(part) <= size), None)
        if row is None:
            return False
        row.extend(part)
    return True


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


def load_sharded(module: nn.Module, device: torch.device, source: nn.Module | None) -> None:
    """Give a sharded ``CausalLMWithFusedLoss`` built on the meta device the weights of ``source``, rank 0's loaded
    Hugging Face model on its CPU (None on the other ranks): storage on ``device`` for each rank's shards, then
    rank 0's full state dict broadcast (torch's ``set_model_state_dict``, ``full_state_dict`` and
    ``broadcast_from_rank0``: one whole tensor at a time on each rank's device, each rank keeping its slice), then
    every buffer of rank 0's (rotary frequencies, embedding scales: computed in constructors, not all in the state
    dict). Collective."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    module.to_empty(device=device)
    model = module.model
    set_model_state_dict(model, source.state_dict() if source is not None else {},
                         options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    buffers = dict(source.named_buffers()) if source is not None else {}
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            if source is not None:
                buffer.copy_(buffers[name])
            dist.broadcast(buffer, src=0)
