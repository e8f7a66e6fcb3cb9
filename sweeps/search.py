"""What Ray Tune explores: the grid, or an Optuna study over the same ranges, and optional ASHA early stopping."""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any

from sweeps.config import SweepConfig


def search_space(sweep: SweepConfig) -> dict[str, Any]:
    """Tune's space for (family, learning_rate, label_smoothing, seed): grid_search lists, or Optuna domains.

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


def search_algorithm(sweep: SweepConfig):
    """None for the grid; for optuna an ``OptunaSearch`` on a persistent study, warm-started with the grid once."""
    if sweep.search.method == "grid":
        return None
    import optuna
    from ray.tune.search import ConcurrencyLimiter
    from ray.tune.search.sample import Domain
    from ray.tune.search.optuna import OptunaSearch

    url = optuna_storage_url(sweep)
    storage = optuna.storages.RDBStorage(url)
    study_exists = sweep.name in optuna.study.get_all_study_names(storage)
    done = len(optuna.load_study(study_name=sweep.name, storage=storage).trials) if study_exists else 0
    varied = [key for key, value in search_space(sweep).items() if isinstance(value, Domain)]
    points = [{key: point._asdict()[key] for key in varied} for point in sweep.trial_points()]
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
    """Grid: one pass over the grid; optuna: the study's trial budget."""
    return 1 if sweep.search.method == "grid" else sweep.search.num_samples
