"""Ranks 1..N-1 of a warm trial of N workers (``sweeps.warm_trial``): helper actors that outlive the trial.

The trial's Tune actor holds a placement group of N bundles (``warm_trial.actor_resources``) and is rank 0. As its
first trial's driver begins (``start_helpers``), it starts a ``WarmRank`` actor in each other bundle
(``PlacementGroupSchedulingStrategy``, with the environment ``sweeps.driver.worker_env`` gives Ray Train workers), so
that their processes start (Ray's worker, torch and the trial's code imported) while rank 0 prepares the trial; the
trial then makes the torch.distributed group of the N processes (``warm_trial.process_group``: a TCP store on rank
0's node). Helpers and group are kept in this module (``_helpers``, ``_joined``) for the actor's next trial, which
Tune hands it with the same resources. Each trial runs
``warm_trial.run_rank`` on every rank at once: rank 0 on ``warm_trial.TRIAL_THREAD``, reporting to Tune; a helper in
its actor's one thread, its reports dropped (Ray Train keeps rank 0's too); each rank's memory released after it.
Checkpoints are one stored folder with every rank's part (``run_rank``); every rank resumes from the newest.

A trial whose rank raised, whose helper died (``RayActorError``) or that Tune stopped ends the group: its helpers
are killed (a rank waiting on them in a collective then fails too) and forgotten, and the error reaches Tune, which
records and retries a failed trial in a fresh actor; a next trial of this actor (after a stop) starts a new group.
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING, Any

import ray

from sweeps import store, warm_trial
from sweeps.config import SweepConfig, sweep_from_dict, sweep_to_dict, workers_for
from trainable.config import TrialConfig

if TYPE_CHECKING:
    from trainable.worker import TrialWriters

POLL_S = 0.5  # how often rank 0's Tune thread looks for a helper's failure while the trial runs
_helpers: list[ray.actor.ActorHandle] = []  # this Tune actor's helper ranks (1..N-1), once started
_joined = threading.Event()  # set while the helpers and this process form the trials' torch.distributed group


@ray.remote
class WarmRank:
    """One helper rank of a Tune actor's warm trials: joins the group once, then runs each trial's rank."""

    def __init__(self, sweep: dict[str, Any]) -> None:
        warm_trial.cap_threads(sweep_from_dict(sweep))

    def pid(self) -> int:
        """This rank's process id."""
        return os.getpid()

    def join(self, address: str, port: int, rank: int, world_size: int) -> None:
        """Join rank 0's group as ``rank`` of ``world_size`` (rank 0's TCP store at ``address:port``)."""
        import torch.distributed as dist

        warm_trial.process_group(warm_trial.accelerator(), rank, world_size,
                                 dist.TCPStore(address, port, world_size, is_master=False))

    def run(self, sweep: dict[str, Any], trial: dict[str, Any], storage_path: str, name: str) -> None:
        """Run this rank of ``trial``; its reports are dropped (rank 0 reports), its memory released afterwards."""
        try:
            warm_trial.run_rank(sweep_from_dict(sweep), TrialConfig.from_dict(trial), storage_path, name,
                                lambda metrics: None, store.trial_writers())
        finally:
            warm_trial.release_memory()


def run(sweep: SweepConfig, trial: TrialConfig, storage_path: str, name: str, writers: TrialWriters) -> dict[str, Any]:
    """``warm_trial.run`` for a trial of several workers: every rank at once, the group started if this actor has
    none; rank 0's final metrics. Any rank's error, a helper's death or Tune's stop ends the group and is raised."""
    try:
        if not _joined.is_set():
            start_helpers(sweep)
            _join(sweep, trial.family)
        pending = [helper.run.remote(sweep_to_dict(sweep), trial.to_dict(), storage_path, name) for helper in _helpers]
        rank0 = warm_trial.TRIAL_THREAD.submit(warm_trial.run_rank, sweep, trial, storage_path, name,
                                               warm_trial.tune_report(trial), writers)
        warm_trial.TRIAL_THREAD.submit(warm_trial.release_memory)
        while pending and not rank0.done():
            ready, pending = ray.wait(pending, timeout=POLL_S)
            ray.get(ready)  # a helper's error, or RayActorError for a dead one
        metrics = rank0.result()
        ray.get(pending)
        return metrics
    except BaseException:
        _end()
        raise


def start_helpers(sweep: SweepConfig) -> None:
    """Start this Tune actor's helper ranks, unless it has them: a ``WarmRank`` in each bundle of its placement group
    after the first, none in a group of one bundle (a one-worker trial's) or outside one. Returns at once; called as
    a warm trial's driver begins (``sweeps.driver.trial_driver``), so that the helpers start while rank 0 prepares
    its trial."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from sweeps.driver import worker_env

    group = ray.util.get_current_placement_group()
    if _helpers or group is None:
        return
    _helpers.extend(WarmRank.options(
        num_cpus=bundle.get("CPU", 0), num_gpus=bundle.get("GPU", 0), runtime_env={"env_vars": worker_env(sweep)},
        scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=rank),
    ).remote(sweep_to_dict(sweep)) for rank, bundle in enumerate(group.bundle_specs) if rank > 0)


def _join(sweep: SweepConfig, family: str) -> None:
    """Make the group of a trial of ``family``'s workers' processes: this one (rank 0) and its helpers."""
    world_size, group = workers_for(sweep, family), ray.util.get_current_placement_group()
    if group is None or len(_helpers) + 1 != world_size:
        raise RuntimeError(f"a warm trial of {world_size} workers: expected its Tune actor in a placement group of "
                           f"{world_size} bundles (sweeps.warm_trial.actor_resources), found "
                           f"{'none' if group is None else len(group.bundle_specs)}")
    warm_trial.TRIAL_THREAD.submit(_join_as_rank0, sweep, world_size).result()
    _joined.set()


def _join_as_rank0(sweep: SweepConfig, world_size: int) -> None:
    """On the trial thread: rank 0's TCP store on this node, the helpers asked to join, this process joined."""
    import torch.distributed as dist

    warm_trial.cap_threads(sweep)
    address = ray.util.get_node_ip_address()
    rendezvous = dist.TCPStore(address, 0, world_size, is_master=True, wait_for_workers=False)  # a free port
    joined = [helper.join.remote(address, rendezvous.port, rank, world_size)
              for rank, helper in enumerate(_helpers, start=1)]
    warm_trial.process_group(warm_trial.accelerator(), 0, world_size, rendezvous)
    ray.get(joined)


def _end() -> None:
    """Kill the helper ranks and forget them; rank 0 leaves the group once its trial thread is free."""
    import torch.distributed as dist

    for helper in _helpers:
        ray.kill(helper, no_restart=True)
    _helpers.clear()
    _joined.clear()
    warm_trial.TRIAL_THREAD.submit(lambda: dist.is_initialized() and dist.destroy_process_group())
