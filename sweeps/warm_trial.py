"""A trial run in its own Ray Tune actor, with no Ray Train worker group: the warm path.

Ray Tune hands a finished trial's actor to the next trial of the same resources (``TuneConfig(reuse_actors=True)``),
so a one-worker trial runs ``trainable.worker.run_trial`` from its Tune function. What outlives a trial is the
process: its imports, its torch.distributed group of one (made once, kept), its CUDA context, the graphs Dynamo and
Inductor compiled (a later trial of the same shape compiles nothing), and one thread that runs every trial of the
actor (Tune starts a new thread per trial; PyTorch keeps some caches per thread, cuDNN's attention graphs among
them, which a new thread would build again in its first training step). What does not outlive it is the
trial's own state: ``run_trial`` seeds every RNG and builds the model, data, optimizer and DeepSpeed engine anew,
and afterwards they are collected and the CUDA allocator's cache is emptied. An actor whose trial failed is not
reused (Tune ends it), so a retry starts in a fresh process.

Checkpoints go to the trial's run folder in the results storage, named as Ray Train names them
(``sweeps.checkpoints.persist``), and a trial starts from the newest there (``sweeps.checkpoints.latest``): a
trial retried by Tune's ``FailureConfig`` after an error or the death of its process, a resumed one or a re-run
one continues from it, as a Ray Train trial does.

A trial of several workers runs the same way on rank 0, with ranks 1..N-1 in helper actors of the Tune actor's
placement group, kept with it (``sweeps.warm_group``); ``resources.warm_trials: false`` gives every trial a Ray Train
worker group instead (``sweeps.driver``).
"""

from __future__ import annotations

import gc
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from common.ports import free_port
from sweeps import checkpoints
from sweeps.config import SweepConfig, workers_for
from trainable.config import TrialConfig

if TYPE_CHECKING:  # torch and the worker load in the trial's actor, not with the launcher
    import torch
    import torch.distributed as dist
    from ray.tune import PlacementGroupFactory

    from trainable.worker import TrialWriters


TRIAL_THREAD = ThreadPoolExecutor(max_workers=1, thread_name_prefix="calsweep-trial")  # started by the first trial


def wanted(sweep: SweepConfig) -> bool:
    """Whether the sweep's trials run warm, of one worker or several: ``resources.warm_trials`` is on."""
    return sweep.resources.warm_trials


def actor_resources(sweep: SweepConfig, family: str) -> dict[str, float] | PlacementGroupFactory:
    """What a warm trial's Tune actor holds: what its one Ray Train worker would have held; with N workers, a
    placement group of N such bundles (``PACK``), the first the actor's own (rank 0), the others its helper ranks'
    (``sweeps.warm_group``): Tune reuses the actor, with its group, for a next trial of the same resources."""
    gpus = sweep.resources.gpus_per_worker or 0
    bundle = {"CPU": sweep.resources.cpus_per_worker or 1, **({"GPU": gpus} if gpus else {})}
    workers = workers_for(sweep, family)
    if workers == 1:
        return bundle
    from ray import tune

    return tune.PlacementGroupFactory([bundle] * workers, strategy="PACK")


def accelerator() -> torch.device:
    """This actor's accelerator (Ray sets CUDA_VISIBLE_DEVICES to the trial's GPU), else the CPU."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.set_device(0)
        return torch.device("cuda", 0)
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    return torch.device("cpu")


def cap_threads(sweep: SweepConfig) -> None:
    """This actor's CPU threads as a Ray Train worker of the trial gets them (``sweeps.driver.worker_env``: Tune
    starts the actor with the job's environment, not the workers'): torch's intra-op threads, and Inductor's compile
    workers, read when its pool starts at the actor's first compile; and the workers' CUDA allocator settings. Call
    before the trial compiles or allocates anything."""
    import torch
    import torch._inductor.config

    from sweeps.driver import worker_env
    from trainable.trial_memory import ALLOC_CONF_ENV, use_alloc_conf

    env = worker_env(sweep)
    torch.set_num_threads(int(env["OMP_NUM_THREADS"]))
    torch._inductor.config.compile_threads = int(env["TORCHINDUCTOR_COMPILE_THREADS"])
    use_alloc_conf(env[ALLOC_CONF_ENV])


def process_group(device: torch.device, rank: int = 0, world_size: int = 1, store: dist.TCPStore | None = None) -> None:
    """A torch.distributed group (gloo on the CPU, NCCL on CUDA): of this one process on an in-memory store (no
    port to race for), or, with ``store`` (rank 0's TCP store), this process as ``rank`` of ``world_size``
    (``sweeps.warm_group``). A warm actor's first trial makes it and its later trials keep it; the GPU memory probe
    makes one too. Every process sees its one GPU only (Ray's CUDA_VISIBLE_DEVICES): its local rank is 0."""
    import torch.distributed as dist

    if dist.is_initialized():
        return
    if store is None:
        address, port = "127.0.0.1", free_port()  # DeepSpeed wants a master address; nothing connects to it
    else:
        address, port = store.host, store.port
    os.environ.update(MASTER_ADDR=address, MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size),
                      LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", store=store or dist.HashStore(), rank=rank,
                            world_size=world_size)


def run(sweep: SweepConfig, trial: TrialConfig, storage_path: str, name: str, writers: TrialWriters) -> dict[str, Any]:
    """Run ``trial`` in this process on its trial thread (``TRIAL_THREAD``), reporting to Tune; checkpoints in the
    run folder ``name`` under ``storage_path``, resumed from its newest. Returns the final metrics (what the store's
    row is made of); the trial's exceptions, and Tune's stop (SystemExit at a report), reach the caller. A trial of
    several workers runs with its helper ranks (``sweeps.warm_group``)."""
    if workers_for(sweep, trial.family) > 1:
        from sweeps import warm_group

        return warm_group.run(sweep, trial, storage_path, name, writers)
    trial_run = TRIAL_THREAD.submit(_run_here, sweep, trial, storage_path, name, writers)
    TRIAL_THREAD.submit(release_memory)  # while Tune books the trial; the next trial's run queues behind it
    return trial_run.result()


def _run_here(sweep: SweepConfig, trial: TrialConfig, storage_path: str, name: str,
              writers: TrialWriters) -> dict[str, Any]:
    """``run``'s work, on the calling thread."""
    cap_threads(sweep)
    process_group(accelerator())
    return run_rank(sweep, trial, storage_path, name, tune_report(trial), writers)


def tune_report(trial: TrialConfig) -> Callable[[dict[str, Any]], None]:
    """Rank 0's reports: to Tune, and to the trial's live gauges."""
    from ray import tune

    from trainable.worker import LiveMetrics

    gauges = LiveMetrics(trial.trial_id)

    def report(metrics: dict[str, Any]) -> None:
        gauges.set(metrics)
        tune.report(metrics)

    return report


def run_rank(sweep: SweepConfig, trial: TrialConfig, storage_path: str, name: str,
             report: Callable[[dict[str, Any]], None], writers: TrialWriters) -> dict[str, Any]:
    """This process's rank of ``trial`` (the torch.distributed group made, ``process_group``), on the calling thread,
    from the run's newest checkpoint; ``report`` gets this rank's reports. At a checkpoint every rank copies its part
    into the stored folder that rank 0 names, and rank 0, once all have, its own with ``trial.json`` last: the folder
    is complete when every rank's part is in it."""
    import torch.distributed as dist

    from trainable.worker import run_trial

    rank, world_size = dist.get_rank(), dist.get_world_size()

    def report_checkpoint(metrics: dict[str, Any], directory: Path | None) -> None:
        target = [checkpoints.new_folder(storage_path, name) if rank == 0 else None]
        dist.broadcast_object_list(target, src=0)
        if rank != 0 and directory is not None:
            checkpoints.copy_part(storage_path, directory, target[0])
        dist.barrier()
        if rank == 0 and directory is not None:  # stored before the report: a death after the report resumes from it
            checkpoints.persist(storage_path, name, directory, sweep.train.checkpoints_to_keep, target[0])
        report(metrics)

    with checkpoints.latest(storage_path, name) as resume_from:
        return run_trial(trial, accelerator(), rank, world_size, report, report_checkpoint, resume_from=resume_from,
                         writers=writers)


def release_memory() -> None:
    """After a trial, on its thread: its model, optimizer and engine (gone with ``_run_here``'s frame, some in
    reference cycles) collected, and the CUDA allocator's cache emptied."""
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
