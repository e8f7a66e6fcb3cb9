"""Sweep configuration: a YAML file -> a validated, frozen ``SweepConfig``.

A sweep is families x learning_rates x label_smoothing (grid), each point one trial whose settings are the
shared ``sft``/``train``/``eval`` sections. Every problem in the file is reported at once, one per line item.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from trainable.config import (ConfigError, CustomModel, EvalConfig, SFTConfig, TrainConfig, TrialConfig, build,
                              check_label_smoothing, check_learning_rate)

SAMPLERS = ("tpe", "random", "cmaes", "nsga2", "gp")
DEFAULT_CONFIG = Path(__file__).parent / "configs" / "default.yaml"


@dataclass(frozen=True)
class ResourcesConfig:
    """How trials map onto the cluster. ``null`` means decide from the cluster and the model."""

    workers_per_trial: int | None = 1  # null: from the model's size (ZeRO-3 memory estimate, see workers_for)
    gpu_memory_gb: float = 80.0  # per GPU, for that estimate
    cpus_per_worker: float | None = None  # null: the cluster's CPUs shared among concurrent trials' workers
    gpus_per_worker: float | None = None  # null: 1 when the cluster has GPUs, else 0; a fraction packs small trials
    max_concurrent_trials: int | None = None  # null: GPUs // gpus per trial (at least 1)
    max_failures: int = 1  # Ray Train retries of a crashed trial before it is recorded as failed


@dataclass(frozen=True)
class AshaConfig:
    """ASHA early stopping on a metric the workers report during training (e.g. the validation loss)."""

    metric: str = "val_loss"
    mode: str = "min"
    grace_period: int = 2  # reports before a trial can be stopped
    reduction_factor: int = 2
    max_t: int = 100


@dataclass(frozen=True)
class SearchConfig:
    """How the grid is explored: every point (grid) or an Optuna study over the same ranges (optuna).

    For optuna, ``learning_rates`` spans a log-uniform range [min, max] and ``label_smoothing`` a uniform range
    [min, max] (a single value is held fixed); ``families`` is categorical.
    """

    method: str = "grid"  # grid | optuna
    num_samples: int = 16  # optuna: trials in the study (grid seeds included)
    sampler: str = "tpe"  # tpe | random | cmaes | nsga2 | gp
    objectives: dict[str, str] = field(default_factory=lambda: {"mmlu_ece": "min"})  # metric -> min | max
    seed_with_grid: bool = True  # optuna: evaluate the grid points first (points_to_evaluate)
    storage: str | None = None  # optuna storage URL; null: sqlite:///<results_dir>/optuna/<name>.db (resumable)
    asha: AshaConfig | None = None


@dataclass(frozen=True)
class SweepConfig:
    """The whole sweep: what to vary, and the settings shared by every trial."""

    name: str = "default"
    seed: int = 0
    data_dir: str | None = None  # local data root; null: $CALSWEEP_DATA_DIR, else the Hugging Face hub
    results_dir: str = "results"  # Parquet store root (local path or pyarrow.fs URI such as s3://bucket/x)
    families: tuple[str, ...] = ("smollm2-135m", "gemma3-270m")
    learning_rates: tuple[float, ...] = (2e-5,)
    label_smoothing: tuple[float, ...] = (0.0, 0.1)
    custom_models: dict[str, CustomModel] = field(default_factory=dict)
    sft: SFTConfig = field(default_factory=SFTConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    resources: ResourcesConfig = field(default_factory=ResourcesConfig)
    search: SearchConfig = field(default_factory=SearchConfig)

    def trial_points(self) -> list[tuple[str, float, float]]:
        """The grid in a fixed order: (family, learning_rate, label_smoothing)."""
        return [(f, lr, b) for f in self.families for lr in self.learning_rates for b in self.label_smoothing]

    def trial(self, family: str, learning_rate: float, label_smoothing: float) -> TrialConfig:
        """The ``TrialConfig`` of one grid point."""
        return TrialConfig(run_name=self.name, trial_id=trial_id(family, learning_rate, label_smoothing, self.seed),
                           family=family, learning_rate=learning_rate, label_smoothing=label_smoothing,
                           seed=self.seed, data_dir=self.data_dir, results_dir=self.results_dir,
                           custom_models=self.custom_models, sft=self.sft, train=self.train, eval=self.eval)


def workers_for(sweep: "SweepConfig", family: str) -> int:
    """Workers (one GPU each) a trial of ``family`` gets: the config's number, or from the model size.

    ZeRO-3 with bf16 weights and gradients plus fp32 master weights and AdamW moments holds ~16 bytes per
    parameter across the workers; budget 60% of each GPU for it (the rest: activations, buffers) and round up
    to a power of two. Models of unknown size get 1.
    """
    if sweep.resources.workers_per_trial is not None:
        return sweep.resources.workers_per_trial
    from trainable.models import REGISTRY

    params = REGISTRY[family].params if family in REGISTRY and REGISTRY[family].params else None
    if params is None:
        return 1
    needed = math.ceil(16 * params / (0.6 * sweep.resources.gpu_memory_gb * 1e9))
    return 1 << max(0, needed - 1).bit_length()


def trial_id(family: str, learning_rate: float, label_smoothing: float, seed: int) -> str:
    """Deterministic, readable trial id: same point and seed -> same id (resume and retries reuse it)."""
    key = json.dumps([family, float(learning_rate), float(label_smoothing), seed])
    digest = hashlib.sha1(key.encode()).hexdigest()[:6]
    return f"{family}_lr{learning_rate:g}_ls{label_smoothing:g}_s{seed}_{digest}".replace("/", "-")


def _check_sweep(config: SweepConfig) -> list[str]:
    from trainable.models import resolve_model

    problems = []
    for value in config.label_smoothing:
        problems += [f"label_smoothing: {p}" for p in check_label_smoothing(value)]
    for value in config.learning_rates:
        problems += [f"learning_rates: {p}" for p in check_learning_rate(value)]
    for name, values in (("families", config.families), ("learning_rates", config.learning_rates),
                         ("label_smoothing", config.label_smoothing)):
        if not values:
            problems.append(f"{name}: expected at least one value, got []")
    search = config.search
    if search.method not in ("grid", "optuna"):
        problems.append(f"search.method: expected 'grid' or 'optuna', got {search.method!r}")
    if search.sampler not in SAMPLERS:
        problems.append(f"search.sampler: expected one of {list(SAMPLERS)}, got {search.sampler!r}")
    if search.num_samples < 1:
        problems.append(f"search.num_samples: expected an integer >= 1, got {search.num_samples!r}")
    if not search.objectives or any(mode not in ("min", "max") for mode in search.objectives.values()):
        problems.append(f"search.objectives: expected a mapping metric -> 'min' | 'max', got {search.objectives!r}")
    if search.asha and search.asha.mode not in ("min", "max"):
        problems.append(f"search.asha.mode: expected 'min' or 'max', got {search.asha.mode!r}")
    gpus = config.resources.gpus_per_worker
    if gpus is not None and (gpus < 0 or (gpus > 1 and gpus != int(gpus))):
        problems.append(f"resources.gpus_per_worker: expected a fraction in [0, 1] or a whole number, got {gpus!r}")
    custom = {n: None for n in config.custom_models}
    for family in config.families:
        if family in custom:
            continue
        try:
            resolve_model(family)
        except ValueError as exc:
            problems.append(f"families: {exc}")
    return problems


def sweep_from_dict(data: dict[str, Any], where: str = "config") -> SweepConfig:
    """Validate and build; raises ``ConfigError`` listing every problem."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a YAML mapping of sweep settings, got {type(data).__name__}")
    errors: list[str] = []
    data = dict(data)
    models = data.get("custom_models") or {}
    if isinstance(models, dict):
        data["custom_models"] = {name: build(CustomModel, spec, f"{where}.custom_models.{name}", errors)
                                 for name, spec in models.items()}
    config = build(SweepConfig, data, where, errors)
    if not errors:
        errors += [f"{where}.{p}" for p in _check_sweep(config)]
    if errors:
        raise ConfigError("; ".join(errors))
    return config


def load_sweep(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> SweepConfig:
    """Read a sweep YAML (the packaged default when ``path`` is None) and apply top-level overrides."""
    path = Path(path) if path else DEFAULT_CONFIG
    if not path.is_file():
        raise ConfigError(f"--config {str(path)!r}: expected an existing YAML file")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if isinstance(data, dict):
        data.update({k: v for k, v in (overrides or {}).items() if v is not None})
    return sweep_from_dict(data, where=path.name)
