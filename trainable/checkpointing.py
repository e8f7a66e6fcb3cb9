"""Mid-trial checkpoints: what one holds, when to take one, and how a trial continues from it.

A checkpoint is one directory (Ray Train merges every rank's files into it):

    deepspeed/trial/...   DeepSpeed's own checkpoint: model states, each rank's ZeRO optimizer shard, LR schedule
                          (under FSDP2: torch.distributed.checkpoint's shards of both, and schedule.json)
    loop.json             the loop's position (rank 0): optimiser steps done, losses so far, tokens
    rng_rank<r>.pt        rank r's Python, NumPy and torch RNG states (dropout draws continue where they were)
    plan_history_rank<r>.json  rank r's fused head's plan history (kernels/plan_history.py: which filters skip planning)
    trial.json            the trial's config and workers (rank 0): a checkpoint of another config is not resumed

The final report's checkpoint holds ``final_metrics.json`` and ``questions.parquet`` (the per-question records)
with ``trial.json``: a trial found finished is reported again without training or scoring.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from kernels.plan_history import PlanHistory
from trainable.step_accounting import PendingLoss

DEEPSPEED_DIR, TAG = "deepspeed", "trial"
LOOP_FILE, TRIAL_FILE, FINAL_FILE, QUESTIONS_FILE = "loop.json", "trial.json", "final_metrics.json", "questions.parquet"


@dataclass(frozen=True)
class LoopState:
    """Where the training loop stood at a checkpoint: ``step`` optimiser steps done and what the final report
    needs of them (``tokens``: rank 0's real tokens, as the loop counts them)."""

    step: int
    total_steps: int
    train_loss_first: float
    train_loss: float
    confidence: float
    val_loss: float | None
    tokens: int


def _rng_states() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def _set_rng_states(states: dict[str, Any]) -> None:
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.set_rng_state(states["torch"])
    if states["cuda"] is not None:
        torch.cuda.set_rng_state_all(states["cuda"])


def write_trial_record(directory: Path, trial_config: dict[str, Any], world_size: int) -> None:
    """``trial.json``: the config a checkpoint comes from, and its number of workers (``read_trial_record``)."""
    record = {"config": trial_config, "world_size": world_size}
    (directory / TRIAL_FILE).write_text(json.dumps(record, sort_keys=True, default=str))


def save(engine, directory: Path, state: LoopState, trial_config: dict[str, Any], rank: int,
         world_size: int, plan_history: PlanHistory) -> None:
    """Write this rank's part of a checkpoint into ``directory`` (a local folder of its own). Every rank must call
    it at the same step: the engine's save is collective (each rank writes its shard)."""
    (directory / DEEPSPEED_DIR).mkdir(parents=True, exist_ok=True)
    engine.save_checkpoint(str(directory / DEEPSPEED_DIR), tag=TAG)
    torch.save(_rng_states(), directory / f"rng_rank{rank}.pt")
    (directory / f"plan_history_rank{rank}.json").write_text(json.dumps(plan_history.state()))
    if rank == 0:
        (directory / LOOP_FILE).write_text(json.dumps(asdict(state)))
        write_trial_record(directory, trial_config, world_size)


def loop_state(directory: Path) -> LoopState | None:
    """The loop's position in a training checkpoint, or None for a checkpoint that holds no training state."""
    path = directory / LOOP_FILE
    return LoopState(**json.loads(path.read_text())) if path.is_file() else None


def restore(engine, directory: Path, rank: int) -> PlanHistory:
    """Load the checkpoint's weights, optimizer shards and LR schedule into ``engine`` and this rank's RNG states;
    return this rank's plan history (empty from a checkpoint written before it was saved). Every rank calls it, with
    the merged checkpoint (all ranks' files) at ``directory``."""
    loaded, _ = engine.load_checkpoint(str(directory / DEEPSPEED_DIR), tag=TAG)
    if loaded is None:
        raise RuntimeError(f"DeepSpeed could not load the checkpoint at {directory / DEEPSPEED_DIR}")
    _set_rng_states(torch.load(directory / f"rng_rank{rank}.pt", weights_only=False))
    history = directory / f"plan_history_rank{rank}.json"
    return PlanHistory.from_state(json.loads(history.read_text())) if history.is_file() else PlanHistory()


class CheckpointSchedule:
    """When to checkpoint: after every ``every_steps`` optimiser steps and/or once ``every_minutes`` have passed
    since the last checkpoint (or the start); both None: never. One rank decides the time rule on its own clock, at
    once and without touching the GPU. Several ranks decide it together (any rank's clock past due counts for all),
    so that every rank saves at the same step, without the host waiting for the GPU: each step's flags are summed
    over the ranks behind its kernels and read at the next step, once that one is queued (a checkpoint due by time
    comes one step late). Reading the flag at once would hold every step's host until the GPU had finished it."""

    def __init__(self, every_steps: int | None, every_minutes: float | None, world_size: int,
                 device: torch.device):
        self.every_steps, self.every_minutes = every_steps, every_minutes
        self.world_size, self.device = world_size, device
        self.last = time.monotonic()
        self.pending: PendingLoss | None = None  # several ranks: the last step's flags, summed behind its kernels

    def due(self, step: int) -> bool:
        """Whether to checkpoint after step ``step``; a True answer restarts the clock."""
        due = bool(self.every_steps and step % self.every_steps == 0)
        if self.every_minutes is not None:
            due = self._late() or due
        if due:
            self.last = time.monotonic()
        if self.every_minutes is not None and self.world_size > 1:  # this step's flag, read at the next
            late = float(time.monotonic() - self.last >= 60 * self.every_minutes)
            self.pending = PendingLoss(torch.full((), late, device=self.device), 1, self.world_size)
        return due

    def _late(self) -> bool:
        """One rank: its clock past due now; several: any rank's clock past due at the last call."""
        if self.world_size == 1:
            return time.monotonic() - self.last >= 60 * self.every_minutes
        return self.pending is not None and self.pending.value() > 0
