"""What one optimiser step of a trial counts: its loss normaliser, its mean loss, and the steady token rate.

The loss of a step is the mean over all its response tokens, across micro-batches and ranks:
    loss_step = sum over micro-batches m, ranks r, response tokens t of l_t / T_step
DeepSpeed divides each micro-batch's loss by the accumulation steps A and averages gradients over the R ranks,
so each micro-batch returns sum_t l_t / (T_step / (A R)); T_step is counted on the device from the labels before
the forwards (one all-reduce of a device scalar, no host sync).

A step queues its work without waiting for the GPU: the micro-batches go up from pinned memory, and its loss is
copied back behind its kernels (``PendingLoss``) for the loop to read after it has queued the next step.
"""

from __future__ import annotations

import contextlib
import math
import time
from typing import Iterator, Sequence

import torch
import torch.distributed as dist

IGNORE_INDEX = -100


def _all_reduce(value: torch.Tensor, world_size: int) -> torch.Tensor:
    if world_size > 1:
        dist.all_reduce(value)
    return value


def step_loss_divisor(micro_batches: Sequence[dict[str, torch.Tensor]], device: torch.device,
                      world_size: int) -> torch.Tensor:
    """T_step / (A R): response tokens (targets = labels shifted by one) of the step on every rank, over A R,
    counted where the labels are and returned on ``device`` (float32; no host sync when they are there)."""
    local = sum((batch["labels"][:, 1:] != IGNORE_INDEX).sum() for batch in micro_batches)
    total = _all_reduce(local.to(device, torch.float32), world_size)
    return total.clamp_min(1.0) / (len(micro_batches) * world_size)


class PendingLoss:
    """A step's mean loss over all its response tokens (from this rank's sum of micro-batch losses), all-reduced
    and copied to pinned host memory behind the step's kernels; ``value()`` waits for that copy alone, so reading
    it after queueing the next step never leaves the GPU without work."""

    def __init__(self, summed_micro_losses: torch.Tensor, accumulation: int, world_size: int):
        total = _all_reduce(summed_micro_losses.detach().clone(), world_size)
        self.divisor = accumulation * world_size
        self.ready: torch.cuda.Event | None = None
        if total.is_cuda:
            self.host = torch.empty((), dtype=total.dtype, pin_memory=True)
            self.host.copy_(total, non_blocking=True)
            self.ready = torch.cuda.Event()
            self.ready.record()
        else:
            self.host = total

    def value(self) -> float:
        if self.ready is not None:
            self.ready.synchronize()
        return float(self.host) / self.divisor


def global_mean_loss(summed_micro_losses: torch.Tensor, accumulation: int, world_size: int) -> float:
    """The step's mean loss over all its response tokens, from this rank's sum of micro-batch losses (a host sync)."""
    return PendingLoss(summed_micro_losses, accumulation, world_size).value()


def to_device(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    """The micro-batch on ``device``; to a GPU from pinned memory, without waiting (a pageable copy would)."""
    if device.type != "cuda":
        return {k: v.to(device) for k, v in batch.items()}
    return {k: v.pin_memory().to(device, non_blocking=True) for k, v in batch.items()}


def optimizer_step(engine, micro_batches: Sequence[dict[str, torch.Tensor]], device: torch.device,
                   world_size: int) -> torch.Tensor:
    """One optimiser step through a DeepSpeed engine: forward, backward and ``engine.step()`` per micro-batch
    (DeepSpeed steps the optimiser at the last), each loss divided by ``step_loss_divisor``; returns this
    rank's sum of the micro-batch losses, on the device (``PendingLoss`` turns it into the step's loss)."""
    on_device = [to_device(batch, device) for batch in micro_batches]
    divisor = step_loss_divisor(on_device, device, world_size)
    summed = torch.zeros((), device=device)
    for batch in on_device:
        loss = engine(**batch, loss_divisor=divisor)
        engine.backward(loss)
        engine.step()
        summed += loss.detach()
    return summed


def warmup_step_count(total_steps: int) -> int:
    """Steps counted as warm-up (compilation, allocator growth): 10% of the steps, 1 to 10, leaving one steady."""
    return max(1, min(10, math.ceil(0.1 * total_steps), total_steps - 1))


class StepClock:
    """Tokens and wall time of the optimiser steps, with the warm-up steps split off for a steady rate.

    ``tokens`` counts this rank's real (non-padding) tokens and ``rows`` its rows; rates are per second over all
    ranks (tokens x ranks) of training alone: time spent ``paused`` (validation passes, checkpoints) is left out of
    every window.
    """

    def __init__(self, world_size: int, warmup_steps: int):
        self.world_size, self.warmup_steps = world_size, warmup_steps
        self.started = time.time()
        self.tokens = 0
        self.rows = 0
        self.warm_at: float | None = None
        self.warm_tokens = 0
        self.stopped: float | None = None
        self.paused_s = 0.0  # seconds left out so far
        self.paused_s_at_warm = 0.0  # of them, before the warm-up's end

    def step_done(self, step: int) -> None:
        """Call after step ``step`` (1-based) has synchronised with the device."""
        if step == self.warmup_steps:
            self.warm_at, self.warm_tokens, self.paused_s_at_warm = time.time(), self.tokens, self.paused_s

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """The block's wall time is not training time (a validation pass, a checkpoint)."""
        began = time.time()
        try:
            yield
        finally:
            self.paused_s += time.time() - began

    def stop(self) -> None:
        self.stopped = time.time()

    def _now(self) -> float:
        return self.stopped or time.time()

    def warmup_s(self) -> float:
        """Training time of the warm-up steps (all steps so far while still warming up)."""
        if self.warm_at is None:
            return self._now() - self.started - self.paused_s
        return self.warm_at - self.started - self.paused_s_at_warm

    def steady_rate(self) -> float | None:
        """tokens/s of training after the warm-up steps, or None before any steady step."""
        if self.warm_at is None or self.tokens == self.warm_tokens:
            return None
        seconds = self._now() - self.warm_at - (self.paused_s - self.paused_s_at_warm)
        return (self.tokens - self.warm_tokens) * self.world_size / max(seconds, 1e-9)

    def rate(self) -> float:
        """The steady rate once there is one, else the rate over every step so far."""
        steady = self.steady_rate()
        return steady if steady is not None else \
            self.tokens * self.world_size / max(self._now() - self.started - self.paused_s, 1e-9)

    def mean_row_tokens(self) -> float | None:
        """Real tokens per row over the steps so far (the attention's length for FLOPs), None before any row."""
        return self.tokens / self.rows if self.rows else None
