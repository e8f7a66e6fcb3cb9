"""Packing small trials onto shared GPUs: the GPU fraction a worker needs (``resources.gpus_per_worker: auto``, from
a measured one-step probe of each family), and which failed trials ran out of memory while sharing (the launcher
runs those again alone, on whole GPUs).
"""

from __future__ import annotations

import dataclasses
import math
import tempfile
from typing import Any

from sweeps.config import SweepConfig

OOM_MARKERS = ("OutOfMemoryError", "CUDA out of memory")  # torch's error type, and its message on older versions
FRACTION_STEP = 8  # fractions are rounded up to eighths of a GPU


def out_of_memory(error: str | None) -> bool:
    """Whether a stored trial error (``failures.one_line``) is a GPU out-of-memory error."""
    return bool(error) and any(marker in error for marker in OOM_MARKERS)


def alone(sweep: SweepConfig) -> SweepConfig:
    """The sweep with its trials run one at a time, each worker on a whole GPU (CPU-only sweeps keep 0 GPUs)."""
    gpus = sweep.resources.gpus_per_worker or 0
    resources = dataclasses.replace(sweep.resources, gpus_per_worker=max(1, gpus) if gpus else 0,
                                    max_concurrent_trials=1)
    return dataclasses.replace(sweep, resources=resources)


def gpu_fraction(peak_bytes: float, total_bytes: float, margin: float) -> float:
    """min(1, peak x margin / total) rounded up to the next 1/8: the GPU share a worker that peaked at ``peak_bytes``
    on a ``total_bytes`` GPU asks for."""
    if peak_bytes <= 0 or total_bytes <= 0 or margin < 1:
        raise ValueError(f"expected peak > 0, total > 0 and margin >= 1, got {peak_bytes}, {total_bytes}, {margin}")
    return min(1.0, math.ceil(peak_bytes * margin / total_bytes * FRACTION_STEP - 1e-9) / FRACTION_STEP)


def probe_fraction(sweep: SweepConfig) -> float:
    """``gpu_fraction`` of the hungriest family: each family's first trial takes one optimiser step on a whole GPU
    (a Ray task with num_gpus=1; Ray must be initialised)."""
    import ray

    from sweeps.driver import worker_env

    task = ray.remote(num_gpus=1, runtime_env={"env_vars": worker_env(sweep)})(_peak_bytes)
    first = {}
    for point in sweep.trial_points():
        first.setdefault(point.family, sweep.trial(point))
    measured = ray.get([task.remote(trial.to_dict()) for trial in first.values()])
    for family, (_, _, allocated) in zip(first, measured):
        print(layout_check(sweep, family, allocated), flush=True)
    return max(gpu_fraction(peak, total, sweep.resources.probe_margin) for peak, total, _ in measured)


def layout_check(sweep: SweepConfig, family: str, allocated: float) -> str:
    """The probe's peak (PyTorch's allocator, one step on one GPU) against the layout's prediction, one line; a
    peak more than 10% above it is flagged (the planner then under-counts this family: check its layout)."""
    layout = sweep.layout(family)
    if layout.workers > 1 or not layout.peak_bytes == layout.peak_bytes:  # a one-GPU probe; NaN: shape unknown
        return f"GPU memory probe: {family}: {allocated / 2**30:.1f} GiB in one step (its layout is not one GPU's)"
    ratio = allocated / layout.peak_bytes
    flag = "; above the layout's memory model by more than 10%" if ratio > 1.1 else ""
    return (f"GPU memory probe: {family}: {allocated / 2**30:.1f} GiB in one step, layout predicted "
            f"{layout.peak_gib:.1f} GiB ({100 * (ratio - 1):+.0f}%){flag}")


def _peak_bytes(config: dict[str, Any]) -> tuple[int, int, int]:
    """(peak bytes, GPU bytes, PyTorch's peak allocated bytes) of one optimiser step of the trial ``config`` on this
    task's GPU: the CUDA context and whatever else held the GPU when it started, plus PyTorch's peak reserved
    memory (the caching allocator's share, which a co-tenant cannot use)."""
    import torch
    import torch.distributed as dist

    from sweeps import store
    from sweeps.warm_trial import process_group
    from trainable.config import TrialConfig
    from trainable.worker import run_trial

    trial = TrialConfig.from_dict(config)
    device = torch.device("cuda", 0)
    torch.cuda.init()
    free, total = torch.cuda.mem_get_info(device)
    process_group(device)  # a one-rank group, as a one-worker trial has
    try:
        with tempfile.TemporaryDirectory(prefix="calsweep-probe-") as results:
            one_step = dataclasses.replace(trial, results_dir=results,
                                           train=dataclasses.replace(trial.train, max_steps=1, save_model=False),
                                           eval=dataclasses.replace(trial.eval, tasks=()))
            run_trial(one_step, device, 0, 1, lambda metrics: None, writers=store.trial_writers())
    finally:
        dist.destroy_process_group()
    return total - free + torch.cuda.max_memory_reserved(device), total, torch.cuda.max_memory_allocated(device)
