"""A one-worker trial run in its own Ray Tune actor, with no Ray Train worker group: the warm path.

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
one continues from it, as a Ray Train trial does. Multi-worker trials keep Ray Train (``sweeps.driver``).
"""

from __future__ import annotations

import gc
import os
import socket
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from sweeps import checkpoints
from sweeps.config import SweepConfig, workers_for
from trainable.config import TrialConfig

if TYPE_CHECKING:  # torch and the worker load in the trial's actor, not with the launcher
    import torch

    from trainable.worker import TrialWriters


TRIAL_THREAD = ThreadPoolExecutor(max_workers=1, thread_name_prefix="calsweep-trial")  # started by the first trial


def wanted(sweep: SweepConfig, family: str) -> bool:
    """Whether a trial of ``family`` runs warm: ``resources.warm_trials`` is on and it has one worker."""
    return sweep.resources.warm_trials and workers_for(sweep, family) == 1


def actor_resources(sweep: SweepConfig) -> dict[str, float]:
    """The Tune actor of a warm trial holds what its one Ray Train worker would have held."""
    gpus = sweep.resources.gpus_per_worker or 0
    return {"CPU": sweep.resources.cpus_per_worker or 1, **({"GPU": gpus} if gpus else {})}


def _device() -> torch.device:
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
    workers, read when its pool starts at the actor's first compile. Call before the trial compiles anything."""
    import torch
    import torch._inductor.config

    from sweeps.driver import worker_env

    env = worker_env(sweep)
    torch.set_num_threads(int(env["OMP_NUM_THREADS"]))
    torch._inductor.config.compile_threads = int(env["TORCHINDUCTOR_COMPILE_THREADS"])


def process_group(device: torch.device) -> None:
    """A torch.distributed group of this one process (gloo on the CPU, NCCL on CUDA) on an in-memory store: no port
    to race for. A warm actor's first trial makes it and its later trials keep it; the GPU memory probe makes one too."""
    import torch.distributed as dist

    if dist.is_initialized():
        return
    with socket.socket() as probe:  # DeepSpeed wants a master address in the environment; nothing connects to it
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0",
                      LOCAL_WORLD_SIZE="1")
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", store=dist.HashStore(), rank=0,
                            world_size=1)


def run(sweep: SweepConfig, trial: TrialConfig, storage_path: str, name: str, writers: TrialWriters) -> dict[str, Any]:
    """Run ``trial`` in this process on its trial thread (``TRIAL_THREAD``), reporting to Tune; checkpoints in the
    run folder ``name`` under ``storage_path``, resumed from its newest. Returns the final metrics (what the store's
    row is made of); the trial's exceptions, and Tune's stop (SystemExit at a report), reach the caller."""
    trial_run = TRIAL_THREAD.submit(_run_here, sweep, trial, storage_path, name, writers)
    TRIAL_THREAD.submit(_release_memory)  # while Tune books the trial; the next trial's run queues behind it
    return trial_run.result()


def _run_here(sweep: SweepConfig, trial: TrialConfig, storage_path: str, name: str,
              writers: TrialWriters) -> dict[str, Any]:
    """``run``'s work, on the calling thread."""
    import torch
    from ray import tune

    from trainable.worker import LiveMetrics, run_trial

    device = _device()
    cap_threads(sweep)
    process_group(device)
    gauges = LiveMetrics(trial.trial_id)

    def report(metrics: dict[str, Any]) -> None:
        gauges.set(metrics)
        tune.report(metrics)

    def report_checkpoint(metrics: dict[str, Any], directory) -> None:
        if directory is not None:  # stored before the report: a death after the report resumes from it
            checkpoints.persist(storage_path, name, directory, sweep.train.checkpoints_to_keep)
        report(metrics)

    with checkpoints.latest(storage_path, name) as resume_from:
        return run_trial(trial, device, 0, 1, report, report_checkpoint, resume_from=resume_from, writers=writers)


def _release_memory() -> None:
    """After a trial, on its thread: its model, optimizer and engine (gone with ``_run_here``'s frame, some in
    reference cycles) collected, and the CUDA allocator's cache emptied."""
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
