"""What Ray Tune explores: the grid, or an Optuna study over the same ranges, and optional ASHA early stopping.

The grid reaches Tune as one point per trial in ``trial_order`` (the longest trials first, a one-GPU trial placed
where it fills a GPU that a waiting multi-GPU trial cannot use), handed out by Tune's own ``BasicVariantGenerator``
(``points_to_evaluate``), at most ``resources.max_concurrent_trials`` at once; Tune stays the scheduler. What Tune
does with them (ray/tune/execution/tune_controller.py): ``TuneController._maybe_add_actors`` requests the resources
of every pending trial handed out (up to ``TUNE_MAX_PENDING_TRIALS_PG``; for this generator at least 200) and
``RayActorManager._try_start_actors`` starts whichever trial's resources are ready first, so no handed-out trial
waits behind another. But a multi-GPU trial's Tune actor holds next to nothing (``sweeps.driver``): its GPUs are
its Ray Train workers' placement group, which waits in Ray while the trial counts against the cap. In plain
longest-first order, multi-GPU trials waiting for GPUs would fill the cap while one-GPU trials that fit the free
GPUs were never handed out: hence the order. That holds for Ray Train trials (``resources.warm_trials: false``).
A warm trial's Tune actor holds its GPUs itself (a multi-GPU one its placement group: ``sweeps.warm_group``), so
Tune starts it only when its GPUs are free, and reuses a finished trial's actor for a pending trial of the same
resources at once. There a cap on trials handed out only delays: with the cap at the 3 trials 3 GPUs hold, a
one-GPU trial waited 24 s on a free GPU behind the simulated order (its actor was gone when it came). So a warm
grid on GPUs whose cap the GPUs already hold (``hand_out_cap``: the launcher's default) is handed out whole, in
plain longest-first order, and Tune and Ray place each trial as GPUs free up: on 3 GPUs the 2-GPU and the one-GPU
trials each ran back to back, 0.1 s apart (tests/sweeps/test_trial_order.py).
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import os
from typing import Any

from sweeps.config import SweepConfig, TrialPoint


def search_space(sweep: SweepConfig) -> dict[str, Any]:
    """Tune's space for (family, learning_rate, label_smoothing, seed): grid_search lists (the axes: each trial is
    one of ``search_algorithm``'s points, which sets all four), or Optuna domains.

    Optuna: families categorical; a learning-rate list spans log-uniform [min, max]; a beta list uniform [min, max];
    a single value stays fixed; the seed is the sweep's one seed (``SweepConfig.point``).
    """
    from ray import tune

    if sweep.search.method == "grid":
        return {"family": tune.grid_search(list(sweep.families)),
                "learning_rate": tune.grid_search(list(sweep.learning_rates)),
                "label_smoothing": tune.grid_search(list(sweep.label_smoothing)),
                "seed": tune.grid_search(list(sweep.trial_seeds))}
    lrs, betas = sweep.learning_rates, sweep.label_smoothing
    return {"family": tune.choice(list(sweep.families)),
            "learning_rate": tune.loguniform(min(lrs), max(lrs)) if len(set(lrs)) > 1 else lrs[0],
            "label_smoothing": tune.uniform(min(betas), max(betas)) if len(set(betas)) > 1 else betas[0]}


def trial_hours(sweep: SweepConfig, family: str) -> float | None:
    """Predicted wall-clock hours of one trial of ``family``: ``trainable.layout.gpu_hours`` of its tokens over its
    layout's GPUs; None where the family's shape cannot be read. Without a known count of examples (epochs, no
    ``sft.max_examples``) every family trains on the same examples, so one example's tokens rank them alike."""
    from sweeps.layout_report import trial_tokens
    from trainable.layout import gpu_hours

    shape, layout = sweep.shape(family), sweep.layout(family)
    if shape is None:
        return None
    seq_len = sweep.row_length
    tokens = trial_tokens(sweep, family, None) or float(sweep.train.epochs * seq_len)
    return gpu_hours(shape, layout, tokens, seq_len) / layout.workers


def trial_order(sweep: SweepConfig, gpus: float = 0) -> list[TrialPoint]:
    """The grid's points in the order Tune is to hand them out. By priority the longest trials first
    (``trial_hours``; equal ones with more GPUs first; families of unknown length last; then the grid's order,
    ``trial_points``); without the cluster's ``gpus`` (0, or a dry run), in that order.

    With ``gpus`` (and ``resources.gpus_per_worker`` set) and a cap on trials handed out (``hand_out_cap``: none for
    a warm grid whose cap the GPUs hold anyway), Tune's hand-out is simulated (``_hand_out``): whenever fewer than
    that many trials are out, the next is the first by priority that fits the
    GPUs free then, else the first by priority (it waits, first in line). So a one-GPU trial fills a GPU that a
    waiting multi-GPU trial cannot use, and no one-GPU trial is handed out to take the GPUs of a multi-GPU trial
    whose Ray Train workers are still starting (their request reaches Ray seconds after the trial starts)."""
    hours = {family: trial_hours(sweep, family) for family in sweep.families}
    per_worker = _gpus_per_worker(sweep)
    width = {family: sweep.layout(family).workers * per_worker for family in sweep.families}
    priority = sorted(sweep.trial_points(), key=lambda p: (hours[p.family] is None, -(hours[p.family] or 0.0),
                                                           -width[p.family]))
    cap = hand_out_cap(sweep, gpus)
    if not gpus or not per_worker or (sweep.resources.warm_trials and not cap):
        return priority
    return _hand_out(priority, width, {f: hours[f] or 0.0 for f in sweep.families}, float(gpus), cap or len(priority))


def _gpus_per_worker(sweep: SweepConfig) -> float:
    per_worker = sweep.resources.gpus_per_worker
    return per_worker if isinstance(per_worker, float | int) else 0  # "auto" until the launcher's probe


def hand_out_cap(sweep: SweepConfig, gpus: float = 0) -> int:
    """How many grid trials Tune may hold at once, running or waiting for resources (0: no cap):
    ``resources.max_concurrent_trials``, except for warm trials on the cluster's ``gpus`` when that many of the
    narrowest trials fill the GPUs anyway (the launcher's default): then the GPUs are the only cap (module
    docstring)."""
    cap, per_worker = sweep.resources.max_concurrent_trials or 0, _gpus_per_worker(sweep)
    if sweep.resources.warm_trials and gpus and per_worker and cap:
        narrowest = min(sweep.layout(family).workers for family in sweep.families) * per_worker
        if cap * narrowest >= gpus - 1e-9:
            return 0
    return cap


def _hand_out(priority: list[TrialPoint], gpus_of: dict[str, float], hours_of: dict[str, float], gpus: float,
              cap: int) -> list[TrialPoint]:
    """The order in which the trials of ``priority`` are handed out (``trial_order``) on ``gpus`` GPUs, at most
    ``cap`` out at once, a family's trial taking ``gpus_of`` GPUs for ``hours_of`` hours. A handed-out trial starts
    as soon as its GPUs are free (waiting ones in hand-out order: their requests are with Ray already; one wider
    than the GPUs alone), and holds its slot until it ends."""
    pending, order, waiting = list(priority), [], []
    running: list[tuple[float, int, float]] = []  # (end, hand-out index, GPUs)
    now, free = 0.0, gpus

    def fits(point: TrialPoint) -> bool:
        return gpus_of[point.family] <= free + 1e-9

    while pending:
        for point in list(waiting):
            if fits(point) or not running:
                waiting.remove(point)
                free -= gpus_of[point.family]
                heapq.heappush(running, (now + hours_of[point.family], order.index(point), gpus_of[point.family]))
        if len(running) + len(waiting) < cap:
            point = next((p for p in pending if fits(p)), pending[0])
            pending.remove(point)
            order.append(point)
            waiting.append(point)
        else:
            now, _, freed = heapq.heappop(running)
            free += freed
    return order


def optuna_storage_url(sweep: SweepConfig) -> str:
    """The study's storage: the config's URL, else a SQLite file beside the local results store."""
    if sweep.search.storage:
        return sweep.search.storage
    if "://" in sweep.results_dir:
        raise ValueError(f"search.storage: expected an Optuna storage URL when results_dir is remote "
                         f"({sweep.results_dir!r}), got null")
    directory = os.path.join(sweep.results_dir, "optuna")
    os.makedirs(directory, exist_ok=True)
    return f"sqlite:///{os.path.join(directory, sweep.name)}.db"


def _sampler(name: str, seed: int):
    import optuna

    samplers = {"tpe": optuna.samplers.TPESampler, "random": optuna.samplers.RandomSampler,
                "cmaes": optuna.samplers.CmaEsSampler, "nsga2": optuna.samplers.NSGAIISampler,
                "gp": optuna.samplers.GPSampler}
    return samplers[name](seed=seed)


def search_algorithm(sweep: SweepConfig, gpus: float = 0):
    """The grid: Tune's ``BasicVariantGenerator`` handing out ``trial_order``'s points for the cluster's ``gpus``,
    at most ``hand_out_cap`` at once; optuna: an ``OptunaSearch`` on a persistent study, warm-started with the grid
    once (in that order), at most ``resources.max_concurrent_trials`` at once (it samples each trial as it hands it
    out). TuneConfig's own cap is left unset."""
    if sweep.search.method == "grid":
        from ray.tune.search import BasicVariantGenerator

        return BasicVariantGenerator(points_to_evaluate=[p._asdict() for p in trial_order(sweep, gpus)],
                                     max_concurrent=hand_out_cap(sweep, gpus))
    import optuna
    from ray.tune.search import ConcurrencyLimiter
    from ray.tune.search.sample import Domain
    from ray.tune.search.optuna import OptunaSearch

    url = optuna_storage_url(sweep)
    storage = optuna.storages.RDBStorage(url)
    study_exists = sweep.name in optuna.study.get_all_study_names(storage)
    done = len(optuna.load_study(study_name=sweep.name, storage=storage).trials) if study_exists else 0
    varied = [key for key, value in search_space(sweep).items() if isinstance(value, Domain)]
    points = [{key: point._asdict()[key] for key in varied} for point in trial_order(sweep, gpus)]
    objectives = sweep.search.objectives
    searcher = OptunaSearch(
        metric=list(objectives) if len(objectives) > 1 else next(iter(objectives)),
        mode=list(objectives.values()) if len(objectives) > 1 else next(iter(objectives.values())),
        points_to_evaluate=points if sweep.search.seed_with_grid and not study_exists else None,
        # a continued study's sampler is seeded past the trials it holds: with the sweep's seed alone it would draw
        # the first launch's points again (the random sampler exactly), trials already stored
        sampler=_sampler(sweep.search.sampler, sweep.trial_seeds[0] + done), study_name=sweep.name, storage=storage,
        seed=sweep.trial_seeds[0] + done)
    return ConcurrencyLimiter(searcher, max_concurrent=sweep.resources.max_concurrent_trials or 1)


def trial_steps(sweep: SweepConfig, sft_rows: int | None) -> int | None:
    """The most optimiser steps a trial of the sweep takes: ``train.max_steps``, else ``train.epochs`` over the SFT
    examples a trial keeps (``sft.max_examples`` or ``sft_rows``, less the held-out rows) on one worker (more
    workers take fewer steps); None when neither the examples nor the rows are known."""
    train, examples = sweep.train, sweep.sft.max_examples
    if train.max_steps is not None:
        return train.max_steps
    if sft_rows is not None:
        examples = sft_rows if examples is None else min(examples, sft_rows)
    if examples is None:
        return None
    micro_batches = max(0, examples - train.val_examples) // train.micro_batch_size
    return max(1, math.ceil(train.epochs * max(1, micro_batches // train.gradient_accumulation_steps)))


def asha_problems(sweep: SweepConfig, steps: int | None) -> list[str]:
    """ASHA's ``max_t`` against the trials' ``steps``: ASHA stops a trial once its reported step reaches max_t,
    before the trial's final (scored) report, so max_t must exceed every trial's steps; a grace period of max_t
    or more would never stop a trial early."""
    asha = sweep.search.asha
    if asha is None or asha.max_t is None:
        return []
    if steps is not None and asha.max_t <= steps:
        return [f"search.asha.max_t: {asha.max_t} stops every trial of {steps} steps before it is scored (ASHA "
                f"ends a trial at step max_t); expected > {steps}, or null to derive it"]
    if asha.grace_period >= asha.max_t:
        return [f"search.asha.grace_period: {asha.grace_period} steps leave nothing to stop early in trials of "
                f"max_t {asha.max_t}; expected < {asha.max_t}"]
    return []


def with_max_t(sweep: SweepConfig, steps: int | None) -> SweepConfig:
    """``sweep`` with a null ASHA ``max_t`` set to ``steps + 1`` (so no trial is cut short at its last step)."""
    asha = sweep.search.asha
    if asha is None or asha.max_t is not None:
        return sweep
    if steps is None:
        raise ValueError("search.asha.max_t: cannot be derived without train.max_steps or a readable SFT source; "
                         "expected an integer")
    search = dataclasses.replace(sweep.search, asha=dataclasses.replace(asha, max_t=steps + 1))
    return dataclasses.replace(sweep, search=search)


def scheduler(sweep: SweepConfig):
    """ASHA on the configured metric (reported every ``train.val_every`` steps), or None; ``max_t`` must be set
    (``with_max_t``)."""
    asha = sweep.search.asha
    if asha is None:
        return None
    from ray.tune.schedulers import ASHAScheduler

    if asha.max_t is None:
        raise ValueError("search.asha.max_t: expected an integer (with_max_t derives it), got None")
    return ASHAScheduler(time_attr="step", metric=asha.metric, mode=asha.mode, grace_period=asha.grace_period,
                         reduction_factor=asha.reduction_factor, max_t=asha.max_t)


def num_samples(sweep: SweepConfig) -> int:
    """The trials Tune runs: grid, one per point (each a point of ``search_algorithm``); optuna, the study's budget."""
    return len(sweep.trial_points()) if sweep.search.method == "grid" else sweep.search.num_samples
