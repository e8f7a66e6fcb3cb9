"""Sweep configuration: a YAML file -> a validated, frozen ``SweepConfig``.

A sweep is families x learning_rates x label_smoothing x seeds (grid), each point one trial whose settings are
the shared ``sft``/``train``/``eval`` sections. Every problem in the file is reported at once, one per line item.
YAML is read with YAML 1.2's numbers (``5e-5`` is a float, not a string); ``KEY.SUB=VALUE`` overrides from the
command line are parsed the same way and validated like the file.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import yaml

from common.config import ConfigError, build, suggest
from sweeps.cluster_gpus import NO_GPU_MEMORY_GB
from trainable.config import (CustomModel, EvalConfig, SFTConfig, TrainConfig, TrialConfig, check_label_smoothing,
                              check_learning_rate, preferred_engine)
from trainable.layout import (GIB, Layout, ModelShape, fitting_layouts, layout_engine, model_shape, planned_stage,
                              with_layout)

SAMPLERS = ("tpe", "random", "cmaes", "nsga2", "gp")
PROGRESS_METRICS = ("train_loss", "val_loss")  # in the workers' training reports: what ASHA can watch
FINAL_METRICS = ("train_loss", "val_loss", "tokens_per_s")  # besides <task>_<metric>: objectives a study can use
DEFAULT_CONFIG = Path(__file__).parent / "configs" / "default.yaml"


@dataclass(frozen=True)
class ResourcesConfig:
    """How trials map onto the cluster. ``null`` means decide from the cluster and the model."""

    workers_per_trial: int | str | None = "auto"  # GPUs (workers) per trial; auto (or null): the cheapest that fit
    max_workers_per_trial: int = 8  # auto: at most this many GPUs per trial (one node of 8)
    # GPUs of one node (cluster.yaml's p5.48xlarge: 8): a trial on more spans nodes, FSDP2 as HSDP where it fits
    # (sharded within a node, replicated across: trainable/layout.py); with max_workers_per_trial a cluster to plan for
    gpus_per_node: int = 8
    # GiB per GPU, for the layout's memory model (an H100 shows 79.6, an H200 139.8)
    # null: the least of the cluster's GPUs, by their Ray accelerator type (sweeps.cluster_gpus); 80 with no GPU
    gpu_memory_gb: float | None = None
    cpus_per_worker: float | None = None  # null: the cluster's CPUs shared among concurrent trials' workers
    # null: 1 when the cluster has GPUs, else 0; a fraction packs small trials; auto: from a one-step memory probe
    gpus_per_worker: float | str | None = None
    probe_margin: float = 1.3  # auto: the fraction asked is the probe's peak memory x this, over the GPU's memory
    max_concurrent_trials: int | None = None  # null: GPUs // gpus per trial (at least 1)
    # Ray Tune's retries of a failed or crashed trial (a worker, its driver or its node died) before it is recorded
    # as failed; each resumes from the trial's last checkpoint; -1: retry without end (never recorded as failed). An
    # error that recurs (bad input: sweeps.failures) is not retried
    max_failures: int = 1
    # trials run in Tune actors kept warm across trials (sweeps.warm_trial), those of several workers with helper
    # actors for their other ranks, kept too (sweeps.warm_group); false: a Ray Train worker group per trial, started
    # and stopped with it
    warm_trials: bool = True

    @property
    def planned_gpu_memory_gb(self) -> float:
        """The GiB per GPU layouts are planned for: ``gpu_memory_gb``, or ``NO_GPU_MEMORY_GB`` before the launcher
        has set it from the cluster (``sweeps.cluster_gpus``)."""
        return self.gpu_memory_gb or NO_GPU_MEMORY_GB


@dataclass(frozen=True)
class AshaConfig:
    """ASHA early stopping on a metric the workers report during training (e.g. the validation loss)."""

    metric: str = "val_loss"  # train_loss | val_loss (val_loss needs train.val_examples)
    mode: str = "min"  # min | max: which direction of the metric is better
    grace_period: int = 2  # steps before a trial can be stopped
    reduction_factor: int = 2  # ASHA keeps 1 / this of the trials at each rung
    max_t: int | None = None  # steps after which ASHA stops a trial; null: the trials' steps + 1 (never cut short)


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
class MlflowConfig:
    """Ray Tune's ``MLflowLoggerCallback``: one MLflow run per trial (its params and every report's metrics)."""

    tracking_uri: str | None = None  # null: sqlite:///<results_dir>/mlflow.db (a local results_dir only)
    experiment: str | None = None  # null: the sweep's name
    tags: dict[str, str] = field(default_factory=dict)  # set on every run of the sweep


@dataclass(frozen=True)
class WandbConfig:
    """Ray Tune's ``WandbLoggerCallback``: one Weights & Biases run per trial, grouped by sweep."""

    project: str = "calsweep"  # Weights & Biases project of the runs
    group: str | None = None  # null: the sweep's name
    entity: str | None = None  # team or user; null: the API key's default
    mode: str | None = None  # online | offline | disabled; null: wandb's own ($WANDB_MODE, else online)
    tags: tuple[str, ...] = ()  # set on every run of the sweep


@dataclass(frozen=True)
class TrackingConfig:
    """Experiment trackers fed by Ray Tune's own logger callbacks, each off unless set (``mlflow: {}`` turns MLflow
    on with its defaults); they run in the launching process and see every trial report."""

    tensorboard: bool = False  # TBXLoggerCallback: event files in each trial's folder under <results_dir>/ray/<name>
    mlflow: MlflowConfig | None = None
    wandb: WandbConfig | None = None


WANDB_MODES = ("online", "offline", "disabled")


@dataclass(frozen=True)
class SweepConfig:
    """The whole sweep: what to vary, and the settings shared by every trial."""

    name: str = "default"  # run name: trial ids, store files and the Ray experiment carry it
    seed: int = 0  # the trials' seed (data order, new weights, dropout) and the Optuna sampler's
    seeds: tuple[int, ...] | None = None  # a seeds axis: every grid point once per seed; null: [seed]
    data_dir: str | None = None  # local data root; null: $CALSWEEP_DATA_DIR, else the Hugging Face hub
    results_dir: str = "results"  # Parquet store root (local path or pyarrow.fs URI such as s3://bucket/x)
    families: tuple[str, ...] = ("smollm2-135m", "gemma3-270m")  # model axis: common.models names, hub ids or paths
    learning_rates: tuple[float, ...] = (5e-5,)  # learning-rate axis (AdamW peak)
    label_smoothing: tuple[float, ...] = (0.0, 0.1)  # label-smoothing beta axis, each in [0, 1)
    custom_models: dict[str, CustomModel] = field(default_factory=dict)
    sft: SFTConfig = field(default_factory=SFTConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    resources: ResourcesConfig = field(default_factory=ResourcesConfig)
    search: SearchConfig = field(default_factory=SearchConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)

    @property
    def trial_seeds(self) -> tuple[int, ...]:
        """The seeds each grid point runs with: ``seeds``, else ``(seed,)``."""
        return self.seeds or (self.seed,)

    def trial_points(self) -> list["TrialPoint"]:
        """The grid in a fixed order: family, then learning rate, then beta, then seed."""
        return [TrialPoint(f, lr, b, s) for f in self.families for lr in self.learning_rates
                for b in self.label_smoothing for s in self.trial_seeds]

    def point(self, params: dict[str, Any]) -> "TrialPoint":
        """The point of a Tune trial's ``params`` (a study varies no seed: it gets the sweep's first)."""
        return TrialPoint(params["family"], params["learning_rate"], params["label_smoothing"],
                          params.get("seed", self.trial_seeds[0]))

    def trial(self, point: "TrialPoint") -> TrialConfig:
        """The ``TrialConfig`` of one grid point, its ``train`` section resolved by the family's layout."""
        family, learning_rate, label_smoothing, seed = point
        return TrialConfig(run_name=self.name, trial_id=trial_id(family, learning_rate, label_smoothing, seed),
                           family=family, learning_rate=learning_rate, label_smoothing=label_smoothing,
                           seed=seed, data_dir=self.data_dir, results_dir=self.results_dir,
                           custom_models=self.custom_models, sft=self.sft,
                           train=with_layout(self.train, self.layout(family), self.shape(family)), eval=self.eval)

    @property
    def row_length(self) -> int:
        """Tokens of a training row: ``train.pack_length`` when rows are packed, else ``sft.max_seq_len``."""
        return self.train.pack_length or self.sft.max_seq_len

    def layout(self, family: str) -> Layout:
        """The family's layout (``trainable.layout.plan_layout``): the config's explicit workers, stage and
        checkpointing kept, the rest chosen for ``resources.gpu_memory_gb`` GPUs. With ``workers_per_trial: auto``
        the step's sequences are ``micro_batch_size x gradient_accumulation_steps`` however many GPUs share them;
        with a number of workers, each worker takes that many. A family whose shape cannot be read, or that fits
        nowhere (``layout_problem`` says why), keeps the config's settings (auto: 1 worker, ZeRO-0)."""
        return _layout(self.train, self.resources, self.sft, family, _custom_key(self.custom_models))

    def layout_with_less_recompute(self, family: str) -> Layout | None:
        """The cheapest fitting layout on more GPUs that recomputes fewer layers than the family's planned one, or
        None: the alternative the planner priced higher (``trainable.layout.fitting_layouts``)."""
        try:
            layouts = _planned(self.train, self.resources, self.sft, family, _custom_key(self.custom_models))
        except ValueError:
            return None
        return next((c for c in layouts or () if c.workers > layouts[0].workers
                     and c.checkpointed < layouts[0].checkpointed), None)

    def shape(self, family: str) -> ModelShape | None:
        """The family's ``trainable.layout.ModelShape`` (registry or custom model), None where it cannot be read."""
        return _shape(family, _custom_key(self.custom_models))

    def layout_problem(self, family: str) -> str | None:
        """Why no layout fits ``family`` (a one-line config problem), or None: none fits its GPUs, or a fraction of a
        GPU per worker would put two ranks of one of its trials on one GPU (NCCL refuses that)."""
        try:
            _planned(self.train, self.resources, self.sft, family, _custom_key(self.custom_models))
        except ValueError as exc:
            return f"families: {family}: {exc}"
        gpus, workers = self.resources.gpus_per_worker, self.layout(family).workers
        if isinstance(gpus, (int, float)) and 0 < gpus < 1 and workers > 1:
            return (f"resources.gpus_per_worker: {gpus:g} would put {family}'s {workers} workers per trial on one GPU "
                    f"(NCCL runs one rank of a trial per GPU); expected 1 or another whole number for a sweep with "
                    f"{family}, or resources.workers_per_trial: 1")
        return None


class TrialPoint(NamedTuple):
    """One trial of the sweep: what varies between trials."""

    family: str
    learning_rate: float
    label_smoothing: float
    seed: int


def workers_for(sweep: "SweepConfig", family: str) -> int:
    """Workers (one GPU each) a trial of ``family`` gets: its layout's."""
    return sweep.layout(family).workers


def _custom_key(custom_models: dict[str, CustomModel]) -> str:
    return json.dumps({name: dataclasses.asdict(model) for name, model in custom_models.items()}, sort_keys=True)


@functools.lru_cache(maxsize=256)
def _shape(family: str, custom_key: str) -> ModelShape | None:
    from common.models import ModelSpec, resolve_model

    custom = {name: ModelSpec(name, "random_init", m["architecture"], tokenizer=m["tokenizer"],
                              architecture_config=m["config"]) for name, m in json.loads(custom_key).items()}
    try:
        return model_shape(resolve_model(family, custom))
    except Exception:  # noqa: BLE001 - an unknown or unreadable family is preflight's to report
        return None


def _planned(train: TrainConfig, resources: "ResourcesConfig", sft: SFTConfig, family: str, custom_key: str
             ) -> tuple[Layout, ...] | None:
    """Every fitting layout, the planned one first; None without a readable shape; ValueError when nothing fits."""
    workers = resources.workers_per_trial if isinstance(resources.workers_per_trial, int) else None
    return _plan(family, custom_key, train.pack_length or sft.max_seq_len,
                 train.micro_batch_size * train.gradient_accumulation_steps * (workers or 1), train.micro_batch_size,
                 resources.planned_gpu_memory_gb, workers, resources.max_workers_per_trial,
                 planned_stage(train.engine, train.zero_stage),
                 None if train.activation_checkpointing == "auto" else train.activation_checkpointing,
                 preferred_engine(train), resources.gpus_per_node)


@functools.lru_cache(maxsize=256)
def _plan(family: str, custom_key: str, seq_len: int, sequences: int, micro_batch: int, gpu_memory_gb: float,
          workers: int | None, max_workers: int, stage: int | None, checkpointing: bool | int | None,
          engine: str, gpus_per_node: int) -> tuple[Layout, ...] | None:
    shape = _shape(family, custom_key)
    if shape is None:
        return None
    return tuple(fitting_layouts(shape, seq_len, sequences, micro_batch, gpu_memory_gb * GIB, workers=workers,
                                 max_workers=max_workers, stage=stage, checkpointing=checkpointing,
                                 preferred_engine=engine, gpus_per_node=gpus_per_node))


def _layout(train: TrainConfig, resources: "ResourcesConfig", sft: SFTConfig, family: str, custom_key: str) -> Layout:
    try:
        planned = _planned(train, resources, sft, family, custom_key)
    except ValueError:
        planned = None
    if planned is not None:
        return planned[0]
    ac, stage = train.activation_checkpointing, planned_stage(train.engine, train.zero_stage) or 0
    workers = resources.workers_per_trial if isinstance(resources.workers_per_trial, int) else 1
    return Layout(workers, stage, train.micro_batch_size, train.gradient_accumulation_steps,
                  False if ac == "auto" else ac, math.nan, math.nan,
                  engine=layout_engine(stage, workers, preferred_engine(train)))


def trial_id(family: str, learning_rate: float, label_smoothing: float, seed: int) -> str:
    """Deterministic, readable trial id: same point and seed -> same id (resume and retries reuse it)."""
    key = json.dumps([family, float(learning_rate), float(label_smoothing), seed])
    digest = hashlib.sha1(key.encode()).hexdigest()[:6]
    return f"{family}_lr{learning_rate:g}_ls{label_smoothing:g}_s{seed}_{digest}".replace("/", "-")


_RUN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+=-]*$")


def name_problems(name: Any, key: str = "name") -> list[str]:
    """Why ``name`` cannot name a run, as one line (or []): it names files (<results_dir>/trials/<name>__<trial>.parquet)
    and folders (runs/<name>, ray/<name>), so no path separator or '..', and no leading '.' or '_' (the store's
    readers skip such files as hidden)."""
    if isinstance(name, str) and _RUN_NAME.match(name):
        return []
    return [f"{key}: expected a run name of letters, digits and . _ - + = that starts with a letter or digit (no "
            f"path separator, no leading '.' or '_'), got {name!r}"]


def _check_sweep(config: SweepConfig) -> list[str]:
    from common.models import REGISTRY, resolve_model

    problems = name_problems(config.name)
    for value in config.label_smoothing:
        problems += [f"label_smoothing: {p}" for p in check_label_smoothing(value)]
    for value in config.learning_rates:
        problems += [f"learning_rates: {p}" for p in check_learning_rate(value)]
    for name, values in (("families", config.families), ("learning_rates", config.learning_rates),
                         ("label_smoothing", config.label_smoothing), ("seeds", config.trial_seeds)):
        if not values:
            problems.append(f"{name}: expected at least one value, got []")
        elif len(set(values)) != len(values):
            problems.append(f"{name}: expected distinct values, got {list(values)!r}")
    problems += [f"seeds: expected integers >= 0, got {s!r}" for s in config.trial_seeds if s < 0]
    search = config.search
    if search.method not in ("grid", "optuna"):
        problems.append(f"search.method: expected 'grid' or 'optuna', got {search.method!r}")
    if search.sampler not in SAMPLERS:
        problems.append(f"search.sampler: expected one of {list(SAMPLERS)}, got {search.sampler!r}")
    if search.num_samples < 1:
        problems.append(f"search.num_samples: expected an integer >= 1, got {search.num_samples!r}")
    if not search.objectives or any(mode not in ("min", "max") for mode in search.objectives.values()):
        problems.append(f"search.objectives: expected a mapping metric -> 'min' | 'max', got {search.objectives!r}")
    if search.method == "optuna":
        problems += _check_objectives(search.objectives, config.eval)
    if search.method == "optuna" and len(config.trial_seeds) > 1:
        problems.append(f"seeds: expected one seed with search.method 'optuna' (a study samples points, not "
                        f"repeats), got {list(config.trial_seeds)!r}")
    if search.asha:
        problems += [f"search.asha.{p}" for p in _check_asha(search.asha, config.train)]
    wandb = config.tracking.wandb
    if wandb and wandb.mode is not None and wandb.mode not in WANDB_MODES:
        problems.append(f"tracking.wandb.mode: expected one of {list(WANDB_MODES)} or null, got {wandb.mode!r}"
                        f"{suggest(str(wandb.mode), WANDB_MODES)}")
    mlflow = config.tracking.mlflow
    if mlflow and mlflow.tracking_uri is None and "://" in config.results_dir:
        problems.append(f"tracking.mlflow.tracking_uri: expected an MLflow tracking URI when results_dir is remote "
                        f"({config.results_dir!r}), got null")
    gpus = config.resources.gpus_per_worker
    if isinstance(gpus, str) and gpus != "auto" or not isinstance(gpus, str) and gpus is not None and (
            gpus < 0 or (gpus > 1 and gpus != int(gpus))):
        problems.append(f"resources.gpus_per_worker: expected a fraction in [0, 1], a whole number or 'auto', "
                        f"got {gpus!r}")
    workers = config.resources.workers_per_trial
    if not (workers in ("auto", None) or isinstance(workers, int) and not isinstance(workers, bool) and workers >= 1):
        problems.append(f"resources.workers_per_trial: expected an integer >= 1 or 'auto', got {workers!r}")
    if config.resources.max_workers_per_trial < 1:
        problems.append(f"resources.max_workers_per_trial: expected an integer >= 1, got "
                        f"{config.resources.max_workers_per_trial!r}")
    if config.resources.gpus_per_node < 1:
        problems.append(f"resources.gpus_per_node: expected an integer >= 1, got {config.resources.gpus_per_node!r}")
    if config.resources.probe_margin < 1:
        problems.append(f"resources.probe_margin: expected a number >= 1, got {config.resources.probe_margin!r}")
    memory = config.resources.gpu_memory_gb
    if memory is not None and not (memory > 0 and math.isfinite(memory)):
        problems.append(f"resources.gpu_memory_gb: expected GiB per GPU > 0, or null to detect it, got {memory!r}")
    if config.resources.max_failures < -1:
        problems.append(f"resources.max_failures: expected an integer >= 0 (retries of a failed trial) or -1 (retry "
                        f"without end), got {config.resources.max_failures!r}")
    custom = {n: None for n in config.custom_models}
    for family in config.families:
        if family in custom:
            continue
        try:
            resolve_model(family)
        except ValueError as exc:
            problems.append(f"families: {exc}{suggest(family, REGISTRY)}")
    return problems


def _check_objectives(objectives: dict[str, str], evaluation: EvalConfig) -> list[str]:
    """The study's objectives must be metrics a trial's final report carries (else the study learns nothing)."""
    from calibration.summary import metric_columns

    known = list(metric_columns(evaluation.tasks)) + list(FINAL_METRICS)
    return [f"search.objectives: {name!r} is no metric a trial reports{suggest(str(name), known)}; expected "
            f"<task>_<metric> of eval.tasks (e.g. {known[1]}) or one of {list(FINAL_METRICS)}"
            for name in objectives if name not in known]


def _check_asha(asha: AshaConfig, train: TrainConfig) -> list[str]:
    """What can be said of ASHA without the data (its ``max_t`` against the trials' steps: ``search.asha_problems``)."""
    problems = []
    if asha.mode not in ("min", "max"):
        problems.append(f"mode: expected 'min' or 'max', got {asha.mode!r}")
    if asha.metric not in PROGRESS_METRICS:
        problems.append(f"metric: expected one of {list(PROGRESS_METRICS)} (what trials report while training), got "
                        f"{asha.metric!r}{suggest(str(asha.metric), PROGRESS_METRICS)}")
    if asha.metric == "val_loss" and train.val_examples == 0:
        problems.append("metric: 'val_loss' is reported only with train.val_examples > 0, got 0")
    for name in ("grace_period", "reduction_factor", "max_t"):
        value = getattr(asha, name)
        if value is not None and value < (2 if name == "reduction_factor" else 1):
            problems.append(f"{name}: expected an integer >= {2 if name == 'reduction_factor' else 1}, got {value!r}")
    return problems


def sweep_from_dict(data: dict[str, Any], where: str = "config") -> SweepConfig:
    """Validate and build; raises ``ConfigError`` listing every problem."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a YAML mapping of sweep settings, got {type(data).__name__}")
    errors: list[str] = []
    if "seed" in data and data.get("seeds") is not None:
        errors.append(f"{where}.seeds: expected either `seed: N` or `seeds: [N, ...]`, got both")
    data = {**data, "custom_models": data.get("custom_models") or {}}  # `custom_models:` left empty in YAML: none
    config = build(SweepConfig, data, where, errors)
    if not errors:
        errors += [f"{where}.{p}" for p in _check_sweep(config)]
    if errors:
        raise ConfigError(*errors)
    return config


def sweep_to_dict(sweep: SweepConfig) -> dict[str, Any]:
    """The sweep as plain data that ``sweep_from_dict`` reads back (``seed`` or ``seeds``, whichever is in use)."""
    data = dataclasses.asdict(sweep)
    data.pop("seed" if sweep.seeds else "seeds")
    return data


class _Yaml12Loader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2's floats: an exponent needs no dot (``5e-5`` is a number)."""


_Yaml12Loader.add_implicit_resolver("tag:yaml.org,2002:float",
                                    re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
                                    list("-+0123456789"))


def read_yaml(text: str) -> Any:
    """Parse YAML text as sweep files are read (YAML 1.2 numbers)."""
    return yaml.load(text, Loader=_Yaml12Loader)  # noqa: S506 - a SafeLoader subclass


def apply_assignments(data: dict[str, Any], assignments: list[str]) -> dict[str, Any]:
    """``data`` with each ``KEY.SUB=VALUE`` set (VALUE parsed as YAML; missing mappings created; ``seed`` and
    ``seeds`` replace each other); a malformed assignment raises ``ConfigError`` naming it, all at once. Keys and
    values are validated afterwards, with the file's."""
    data = copy.deepcopy(data)
    problems = []
    for item in assignments:
        key, sep, text = item.partition("=")
        parts = key.strip().split(".")
        if not sep or not all(parts):
            problems.append(f"{item!r}: expected KEY=VALUE with a dotted KEY, e.g. train.max_steps=100")
            continue
        if not text.strip():  # YAML reads nothing as null: say so rather than guess
            problems.append(f"{item!r}: expected a VALUE after '=', got nothing (write {key.strip()}=null for none)")
            continue
        try:
            value = read_yaml(text)
        except yaml.YAMLError as exc:
            problems.append(f"{item!r}: the value is not valid YAML ({str(exc).splitlines()[0]})")
            continue
        node = data
        for depth, part in enumerate(parts[:-1]):
            if node.get(part) is None:
                node[part] = {}
            node = node[part]
            if not isinstance(node, dict):
                problems.append(f"{item!r}: {'.'.join(parts[:depth + 1])} is {node!r}, not a mapping of settings")
                break
        else:
            node[parts[-1]] = value
            if parts in (["seed"], ["seeds"]):  # one setting: the command line's replaces the file's
                data.pop("seeds" if parts == ["seed"] else "seed", None)
    if problems:
        raise ConfigError(*(f"override {problem}" for problem in problems))
    return data


def with_absolute_local_paths(sweep: SweepConfig) -> SweepConfig:
    """``sweep`` with each family and custom model's tokenizer that names an existing local path (not a registry or
    custom name) made absolute against the launch's working directory: Ray's workers run in other directories."""
    from common.models import REGISTRY

    known = {*REGISTRY, *sweep.custom_models}

    def absolute(name: str) -> str:
        path = Path(name).expanduser()
        return str(path.resolve()) if name not in known and path.exists() else name

    custom = {name: dataclasses.replace(model, tokenizer=absolute(model.tokenizer))
              for name, model in sweep.custom_models.items()}
    return dataclasses.replace(sweep, families=tuple(absolute(family) for family in sweep.families),
                               custom_models=custom)


def load_sweep(path: str | Path | None = None, overrides: dict[str, Any] | None = None,
               assignments: list[str] | None = None) -> SweepConfig:
    """Read a sweep YAML (the packaged default when ``path`` is None), apply top-level ``overrides`` (None values
    skipped) and then ``KEY.SUB=VALUE`` ``assignments``, and validate the result."""
    path = Path(path) if path else DEFAULT_CONFIG
    if not path.is_file():
        raise ConfigError(f"--config {str(path)!r}: expected an existing YAML file")
    try:
        data = read_yaml(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
    if isinstance(data, dict):
        data.update(overrides)
        data = apply_assignments(data, assignments or [])
    try:
        return sweep_from_dict(data, where=path.name)
    except ConfigError as exc:
        sources = {key: f"--{key.replace('_', '-')} {value!r}" for key, value in overrides.items()}
        sources.update({item.partition("=")[0].strip(): f"override {item!r}" for item in assignments or []})
        raise ConfigError(*(_blame(problem, path.name, sources) for problem in exc.problems)) from None


def _blame(problem: str, where: str, sources: dict[str, str]) -> str:
    """``problem`` ('<where>.<key>: ...') credited to the command-line setting of ``key`` (or a key above it) that
    set it, instead of the file; a problem of a setting the file made is returned as it is."""
    for key, source in sources.items():
        prefix = f"{where}.{key}"
        if problem.startswith(prefix) and problem[len(prefix):len(prefix) + 1] in (":", ".", "["):
            return f"{source}: {problem[len(where) + 1:]}"
    return problem
