"""The Ray Tune function of one trial: it runs the trial, warm or through Ray Train, and records the outcome.

Tune runs ``trial_driver(params)`` per grid point with ``trial_resources(params)``. With ``resources.warm_trials`` a
trial runs in the Tune actor itself (rank 0; a trial of several workers with helper actors for its other ranks,
``sweeps.warm_group``), which Tune keeps for the next trial (``sweeps.warm_trial``); without, it follows the
pattern of Ray Train V2 + Tune: the driver builds the trial's ``TorchTrainer`` (workers running
``trainable.worker.train_fn_per_worker``) and forwards worker reports to Tune (``TuneReportCallback``). Either
way the driver writes the trial's row (ok, or failed with its root error and the layout it ran with) to the results
store; Tune's ``FailureConfig`` retries a failed trial (a Ray Train run gets no
retries of its own), unless its error recurs identically (``sweeps.failures``): that trial ends at once. A
trial already stored as ok is not run again (resume) if its stored config matches the current one
(``sweeps.fingerprint``); one from another config is refused, or re-run with ``rerun_changed``.
The trial's checkpoints go to the results storage (the newest ``train.checkpoints_to_keep`` kept); a retried,
resumed or re-run trial continues from the latest of its config (``sweeps.checkpoints``).
"""

from __future__ import annotations

import datetime as dt
import functools
import os
import socket
import time
from typing import TYPE_CHECKING, Any

from calibration.summary import metric_columns
from sweeps import checkpoints, failures, fingerprint, store, warm_trial
from sweeps.config import SweepConfig, sweep_from_dict, workers_for
from trainable.config import TrialConfig, engine_for, resolved_stage
from trainable.result import ENTROPY_STATS, scalar_columns

if TYPE_CHECKING:
    from ray.tune import PlacementGroupFactory

DRIVER_CPUS = 0.001  # a Ray Train trial's Tune function only waits on its TorchTrainer
# How long a reused Tune actor waits for a stopped trial's thread to end (at its next report, or after scoring) before
# it takes the next trial. Tune's default, 2 s, failed the next trial, unrun and unrecorded, whenever the stopped one
# was still training: 7 of 200 trials of a warm ASHA search on a loaded CPU (2026-11-27).
STOPPED_TRIAL_WAIT_S = 3600


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def process_started(pid: int | None = None) -> dt.datetime:
    """When process ``pid`` (default: this one, the trial's Tune actor: ``sweeps.overhead`` tells a new actor from a
    reused one) started. Where the kernel tells a process's start on the boot clock (Linux), from its age on that
    clock: exact to the clock tick; elsewhere psutil's start time, whose boot time is whole seconds."""
    try:
        with open(f"/proc/{pid or 'self'}/stat") as stat:
            ticks = int(stat.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime: clock ticks after boot
        started = time.time() - (time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK"))
    except (FileNotFoundError, AttributeError):  # no procfs, or no boot clock
        import psutil

        started = psutil.Process(pid).create_time()
    return dt.datetime.fromtimestamp(started, dt.timezone.utc)


def planned_layout(sweep: SweepConfig, trial: TrialConfig) -> dict[str, Any]:
    """The layout columns of ``TrialResult`` as the trial's worker would fill them for the sweep's planned layout
    (``SweepConfig.layout``, applied to ``trial.train``): world size, engine (``engine_for``), ZeRO stage, micro-batch,
    accumulation, recomputed layers and ``trial_memory``'s predicted peak (None off CUDA or outside bf16). A family
    whose shape cannot be read has None for recomputed layers and peak."""
    import torch

    from trainable.deepspeed_setup import resolve_precision
    from trainable.recompute import checkpointed_count
    from trainable.sequence_packing import trial_pack_width
    from trainable.trial_memory import shape_phase_peaks_gib

    world_size = workers_for(sweep, trial.family)
    device = "cuda" if sweep.resources.gpus_per_worker else "cpu"
    engine = engine_for(trial.train, world_size, device)
    stage = 3 if engine == "fsdp2" else resolved_stage(trial.train, world_size)
    shape = sweep.shape(trial.family)
    recomputed = None if shape is None else checkpointed_count(trial.train.activation_checkpointing, shape.layers)
    width = trial_pack_width(trial.train, trial.sft.max_seq_len, device) or trial.sft.max_seq_len
    peaks = None if shape is None else shape_phase_peaks_gib(
        shape, trial, engine, stage, world_size, width, recomputed,
        resolve_precision(trial.train.precision, torch.device(device)), device)
    return {"world_size": world_size, "engine": engine, "zero_stage": stage,
            "micro_batch_size": trial.train.micro_batch_size,
            "gradient_accumulation_steps": trial.train.gradient_accumulation_steps,
            "activation_checkpointing": recomputed,
            "gpu_peak_predicted_gib": max(peaks.values()) if peaks else None}


def trial_row(sweep: SweepConfig, params: dict[str, Any], metrics: dict[str, Any], status: str,
              error: str | None, started: dt.datetime, provenance: dict[str, str]) -> dict[str, Any]:
    """One row of ``store.trial_schema()`` for a finished (or failed) trial: its identity and config, then the
    ``TrialResult`` in ``metrics`` (absent fields null), its layout columns, where ``metrics`` lacks them (a trial
    that failed or was stopped before its final report), from ``planned_layout``; a reported ``<task>_<metric>`` of
    one of the trial's tasks whose metric is not in ``calibration.summary.TASK_METRICS`` is a ValueError."""
    trial = sweep.trial(sweep.point(params))
    row: dict[str, Any] = {
        "run_name": sweep.name, "trial_id": trial.trial_id, "status": status, "error": error,
        "family": trial.family, "sft_dataset": trial.sft.dataset, "learning_rate": trial.learning_rate,
        "label_smoothing": trial.label_smoothing, "seed": trial.seed,
        "config_json": store.config_json(trial.to_dict()),
        "started_at": started, "finished_at": _now(), "actor_started_at": process_started(),
        "hostname": socket.gethostname(), **provenance,
    }
    row.update({key: metrics.get(key) for key in scalar_columns() + ENTROPY_STATS})  # trainable.result.TrialResult
    if metrics.get("world_size") is None:  # no final report: the layout it was to run with
        row.update(planned_layout(sweep, trial))
    reported = {name for name in metrics if name.startswith(tuple(f"{task}_" for task in trial.eval.tasks))}
    unknown = sorted(reported - set(metric_columns(trial.eval.tasks)))
    if unknown:  # a metric the store has no column for fails the trial rather than vanish from its row
        raise ValueError(f"expected <task>_<metric> with metric in calibration.summary.TASK_METRICS, got {unknown}")
    row.update({name: metrics[name] for name in reported})
    return row


def scaling_config(sweep: SweepConfig, family: str):
    """The trial's workers and their resources (null config entries were filled in by the launcher)."""
    from ray.train import ScalingConfig

    resources = sweep.resources
    gpus = resources.gpus_per_worker or 0
    return ScalingConfig(num_workers=workers_for(sweep, family), use_gpu=gpus > 0,
                         resources_per_worker={"CPU": resources.cpus_per_worker or 1, **({"GPU": gpus} if gpus else {})})


def trial_resources(params: dict[str, Any]) -> dict[str, float] | PlacementGroupFactory:
    """What a trial's Tune actor holds: a warm trial's actor its workers' CPUs and GPUs
    (``warm_trial.actor_resources``); a Ray Train trial's driver next to nothing (its workers hold theirs)."""
    sweep, family = sweep_from_dict(params["sweep"]), params["family"]
    return warm_trial.actor_resources(sweep, family) if warm_trial.wanted(sweep) else {"CPU": DRIVER_CPUS}


def worker_env(sweep: SweepConfig) -> dict[str, str]:
    """Environment of the trial's workers: our, the data/model libraries' and Inductor's settings, CPU threads:
    OpenMP's and Inductor's compile workers (``TORCHINDUCTOR_COMPILE_THREADS``, unless set: else up to 32 per rank,
    however many ranks and trials share the host) as many as the worker's CPUs, and the CUDA allocator's settings
    (``trainable.trial_memory.alloc_conf``: the user's, else PyTorch's default, said out loud)."""
    forwarded = ("CALSWEEP_", "DS_", "HF_", "TORCHINDUCTOR_", "TRITON_")
    env = {k: v for k, v in os.environ.items() if k.startswith(forwarded)}
    threads = str(max(1, round(sweep.resources.cpus_per_worker or 1)))
    env["OMP_NUM_THREADS"] = threads
    env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", threads)
    from trainable.trial_memory import ALLOC_CONF_ENV, alloc_conf

    env[ALLOC_CONF_ENV] = alloc_conf()
    return env


class ChangedConfigError(RuntimeError):
    """A trial's stored ok row comes from another config, and re-running it was not asked for."""


def needs_run(sweep: SweepConfig, trial: TrialConfig, rerun_changed: bool) -> bool:
    """Whether to run the trial: not if its stored row is ok and from the same config. A stored ok row from another
    config raises ``ChangedConfigError`` unless ``rerun_changed``. Before a run, the trial's stored row and
    questions (failed, stopped, or of another config) are removed, so that any row found afterwards is this run's."""
    stored = store.stored_trial(sweep.results_dir, sweep.name, trial.trial_id)
    if stored is None:
        return True
    if stored["status"] == "ok":
        changed = fingerprint.row_differences(stored, trial, workers_for(sweep, trial.family))
        if not changed:
            return False
        if not rerun_changed:
            raise ChangedConfigError(f"trial {trial.trial_id}: its stored ok row comes from another config "
                                     f"({fingerprint.describe(changed)}); re-run with --rerun-changed")
    store.remove_trial(sweep.results_dir, sweep.name, trial.trial_id)
    return True


def trial_driver(params: dict[str, Any]) -> None:
    """Run one grid point (warm, or as a TorchTrainer); record ok/failed in the store; re-raise failures for Tune,
    but for one that recurs (``sweeps.failures.recurs``): that trial's last report is of phase ``FAILED_PHASE``."""
    import ray.tune

    os.environ.setdefault("TUNE_FUNCTION_THREAD_TIMEOUT_S", str(STOPPED_TRIAL_WAIT_S))  # read by this actor's reset
    sweep = sweep_from_dict(params["sweep"])
    if warm_trial.wanted(sweep):  # a trial of several workers: its helper ranks start while this rank prepares
        from sweeps import warm_group

        warm_group.start_helpers(sweep)
    trial = sweep.trial(sweep.point(params))
    if not needs_run(sweep, trial, params.get("rerun_changed", False)):
        ray.tune.report({"phase": "done", "resumed_from_store": True})
        return
    started = _now()
    name = checkpoints.run_name(sweep.name, trial.trial_id)
    stale = checkpoints.discard_stale(params["storage_path"], name, trial, workers_for(sweep, trial.family))
    if stale:
        print(f"[calsweep] {trial.trial_id}: checkpoints of another config removed ({stale})", flush=True)
    try:
        if warm_trial.wanted(sweep):
            metrics = warm_trial.run(sweep, trial, params["storage_path"], name, store.trial_writers())
        else:
            metrics = _fit(sweep, trial, params["storage_path"], name)
        row = trial_row(sweep, params, metrics, "ok", None, started, params["provenance"])
    except Exception as exc:  # noqa: BLE001 - every failure is recorded, then raised for a retry or reported failed
        from trainable.trial_memory import out_of_memory_peak_gib

        error = failures.one_line(exc)
        measured = {"gpu_peak_gib": out_of_memory_peak_gib(failures.root_error(exc))}
        store.write_trial(sweep.results_dir, trial_row(sweep, params, measured, "failed", error, started,
                                                        params["provenance"]))
        if not failures.recurs(exc):
            raise
        ray.tune.report({"phase": failures.FAILED_PHASE, "error": error})  # Tune ends it: no retry
        return
    store.write_trial(sweep.results_dir, row)


def _fit(sweep: SweepConfig, trial: TrialConfig, storage_path: str, name: str) -> dict[str, Any]:
    """Run the trial as a TorchTrainer (run ``name`` under ``storage_path``); its final metrics."""
    from ray.train import CheckpointConfig, FailureConfig, RunConfig
    from ray.train.torch import TorchTrainer
    from ray.tune.integration.ray_train import TuneReportCallback

    from trainable.worker import train_fn_per_worker

    trainer = TorchTrainer(
        functools.partial(train_fn_per_worker, writers=store.trial_writers()),
        train_loop_config=trial.to_dict(),
        scaling_config=scaling_config(sweep, trial.family),
        run_config=RunConfig(
            name=name,
            storage_path=storage_path,
            failure_config=FailureConfig(max_failures=0),  # Tune's FailureConfig retries, from the run's checkpoint
            checkpoint_config=CheckpointConfig(num_to_keep=sweep.train.checkpoints_to_keep),
            callbacks=[TuneReportCallback()],
            worker_runtime_env={"env_vars": worker_env(sweep)},
        ),
    )
    return trainer.fit().metrics or {}
