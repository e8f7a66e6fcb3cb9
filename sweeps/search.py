"""What Ray Tune explores: the grid, or an Optuna study over the same ranges, and optional ASHA early stopping."""

from __future__ import annotations

import os
from typing import Any

from sweeps.config import SweepConfig


def search_space(sweep: SweepConfig) -> dict[str, Any]:
    """Tune's space for (family, learning_rate, label_smoothing): grid_search lists, or Optuna domains.

    Optuna: families categorical; a learning-rate list spans log-uniform [min, max]; a beta list uniform [min, max];
    a single value stays fixed.
    """
    from ray import tune

    if sweep.search.method == "grid":
        return {"family": tune.grid_search(list(sweep.families)),
                "learning_rate": tune.grid_search(list(sweep.learning_rates)),
                "label_smoothing": tune.grid_search(list(sweep.label_smoothing))}
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
    varied = [key for key, value in search_space(sweep).items() if isinstance(value, Domain)]
    points = [dict(zip(("family", "learning_rate", "label_smoothing"), point)) for point in sweep.trial_points()]
    points = [{key: point[key] for key in varied} for point in points]
    objectives = sweep.search.objectives
    searcher = OptunaSearch(
        metric=list(objectives) if len(objectives) > 1 else next(iter(objectives)),
        mode=list(objectives.values()) if len(objectives) > 1 else next(iter(objectives.values())),
        points_to_evaluate=points if sweep.search.seed_with_grid and not study_exists else None,
        sampler=_sampler(sweep.search.sampler, sweep.seed), study_name=sweep.name, storage=storage,
        seed=sweep.seed)
    return ConcurrencyLimiter(searcher, max_concurrent=sweep.resources.max_concurrent_trials or 1)


def scheduler(sweep: SweepConfig):
    """ASHA on the configured metric (reported every ``train.val_every`` steps), or None."""
    asha = sweep.search.asha
    if asha is None:
        return None
    from ray.tune.schedulers import ASHAScheduler

    return ASHAScheduler(time_attr="step", metric=asha.metric, mode=asha.mode, grace_period=asha.grace_period,
                         reduction_factor=asha.reduction_factor, max_t=asha.max_t)


def num_samples(sweep: SweepConfig) -> int:
    """Grid: one pass over the grid; optuna: the study's trial budget."""
    return 1 if sweep.search.method == "grid" else sweep.search.num_samples
