"""Trial configuration: frozen dataclasses built from plain dicts (YAML) by ``common.config.build``, validated all
at once; each section's ``problems()`` names its invalid values.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass, field
from typing import Any

from common.config import build, suggest
from kernels.api import FILTERS
from calibration.ats.config import ATSConfig
from calibration.task_config import DEFAULT_TASKS, TASKS
from trainable.layout import layout_engine


@dataclass(frozen=True)
class CustomModel:
    """A random-init model built from an architecture config (no download), e.g. for tests."""

    architecture: str = "llama"  # a transformers model type (AutoConfig.for_model)
    tokenizer: str = "smollm2-135m"  # model family whose tokenizer it uses
    config: dict[str, Any] = field(default_factory=dict)  # architecture config keys (hidden_size, ...)


@dataclass(frozen=True)
class SFTConfig:
    """Instruction data: Alpaca, Tulu-3 SFT mixture or OpenHermes-2.5, from the hub or a local file.

    ``hub_id`` and ``local_file`` left null become the dataset's defaults (``DATASETS``) on construction.
    With a data root set, ``<root>/<local_file>`` is read: a JSON list, or JSON Lines if it ends in .jsonl,
    of rows in the dataset's hub format; without one, the hub's train split.
    """

    DATASETS: typing.ClassVar[dict[str, tuple[str, str]]] = {  # name -> (hub id, local file under the data root)
        "alpaca": ("tatsu-lab/alpaca", "alpaca/alpaca_5000_pr152.json"),  # {instruction, input, output}
        "tulu3": ("allenai/tulu-3-sft-mixture", "tulu3/tulu-3-sft-mixture.jsonl"),  # {messages: [{role, content}]}
        "openhermes": ("teknium/OpenHermes-2.5", "openhermes/openhermes2_5.json"),  # {conversations: [{from, value}]}
    }

    dataset: str = "alpaca"  # alpaca | tulu3 | openhermes
    hub_id: str | None = None  # null: the dataset's hub id
    local_file: str | None = None  # null: the dataset's local file
    max_examples: int | None = None  # first N examples after a seeded shuffle; None = all
    max_seq_len: int = 512  # tokens per example; longer ones are cut
    prompt_template: str = "auto"  # auto (chat template if the tokenizer has one) | chat | plain

    def __post_init__(self) -> None:
        hub_id, local_file = self.DATASETS.get(self.dataset, (None, None))
        if self.hub_id is None:
            object.__setattr__(self, "hub_id", hub_id)
        if self.local_file is None:
            object.__setattr__(self, "local_file", local_file)

    def problems(self) -> list[str]:
        """Every invalid field as 'key: expected X, got Y' (``common.config.build`` prefixes the path)."""
        return _check_sft(self)


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation: the engine's settings (DeepSpeed or FSDP2) and the schedule (AdamW, warmup then decay)."""

    max_steps: int | None = None  # optimiser steps; None = run `epochs` epochs
    epochs: float = 1.0  # passes over the SFT data when max_steps is null
    micro_batch_size: int = 4  # sequences per worker per forward
    gradient_accumulation_steps: int = 1  # micro-batches per optimiser step
    precision: str = "auto"  # auto (bf16 on GPU, fp32 on CPU) | bf16 | fp16 | fp32
    engine: str = "auto"  # auto (ZeRO-3 and one-GPU layouts on FSDP2, the rest on DeepSpeed) | deepspeed | fsdp2
    zero_stage: int | str = "auto"  # 0-3, or auto: the cheapest that fits (trainable/layout.py); fsdp2: 3 or auto
    # FSDP2: HSDP replica groups, each sharding over world / this ranks (a sweep's layout sets it across nodes); 1: a
    # full shard over every rank
    fsdp_replicas: int = 1
    weight_decay: float = 0.0  # AdamW decoupled weight decay
    adam_betas: tuple[float, float] = (0.9, 0.999)  # AdamW (beta1, beta2)
    adam_eps: float = 1e-8  # AdamW epsilon
    warmup_ratio: float = 0.03  # fraction of the steps with a linear learning-rate warmup
    schedule: str = "cosine"  # cosine | linear | constant
    max_grad_norm: float = 1.0  # gradient clipping norm
    dropout: float | None = None  # the model config's attention_dropout when given (hidden dropout stays the model's)
    loss_impl: str = "fused"  # fused: kernels.linear_cross_entropy | torch: logits + F.cross_entropy
    loss_filter: str = "exact"  # the kernel's gradient filter (kernels/filter.py): exact (2^-10) | loose (2^-8) | none
    activation_checkpointing: bool | int | str = "auto"  # layers recomputed in backward: true, false, k, auto (fewest)
    compile: bool | None = None  # torch.compile each decoder layer; null: on CUDA only (CPU compiles take minutes)
    pad_to_multiple: int | None = None  # right-pad batches to a multiple of this width; null: 64 on CUDA, 1 on CPU
    pack: bool | None = None  # several examples per fixed-width row (trainable/sequence_packing.py); null: on CUDA only
    pack_length: int | None = None  # packed row width in tokens; null: sft.max_seq_len rounded up to pad_to_multiple
    attention_check: bool = True  # before step 1: train with attention kernels that match the math kernel
    log_every: int = 10  # optimiser steps between progress reports (each one syncs the workers with Ray Train)
    val_examples: int = 0  # held out from the SFT data for a validation loss (what ASHA watches)
    val_every: int | None = None  # optimiser steps between validation losses; null: only at the end if val_examples
    checkpoint_every_steps: int | None = None  # optimiser steps between mid-trial checkpoints; null: by time only
    checkpoint_every_minutes: float | None = 30.0  # minutes between checkpoints (checked after each step); null: off
    checkpoints_to_keep: int = 1  # newest checkpoints kept per trial in the results storage; older ones are deleted
    deepspeed: dict[str, Any] = field(default_factory=dict)  # merged last into the DeepSpeed config
    save_model: bool = False  # after training: a Hugging Face folder under <results_dir>/models/ (trainable.export)

    def problems(self) -> list[str]:
        """Every invalid field as 'key: expected X, got Y' (``common.config.build`` prefixes the path)."""
        return _check_train(self)


@dataclass(frozen=True)
class EvalConfig:
    """Calibration scoring after training."""

    tasks: tuple[str, ...] = DEFAULT_TASKS  # names in calibration.task_config.TASKS; [] trains without scoring
    limit: int | None = None  # first K questions of each task; None = all
    batch_size: int | str = "auto"  # rows a forward, at most; auto: 256 on a GPU, 8 on the CPU
    batch_tokens: int | str | None = "auto"  # padded tokens a forward at most; auto: what the peak leaves; None: no cap
    n_bins: int = 15  # confidence bins of ECE and the binned metrics
    temperature_scaling: bool = False  # also score each task's held-out split, fit T there, report *_ts metrics
    ats: ATSConfig = field(default_factory=ATSConfig)  # enabled: train an ATS head after SFT, report *_ats metrics

    def problems(self) -> list[str]:
        """Every invalid field as 'key: expected X, got Y' (``common.config.build`` prefixes the path)."""
        return _check_eval(self)


PRECISIONS = ("auto", "bf16", "fp16", "fp32")
ENGINES = ("auto", "deepspeed", "fsdp2")
SCHEDULES = ("cosine", "linear", "constant")


def _positive(name: str, value: float | int | None, allow_none: bool = False) -> list[str]:
    if value is None and allow_none:
        return []
    if value is None or not value > 0 or (isinstance(value, float) and not math.isfinite(value)):
        return [f"{name}: expected a number > 0, got {value!r}"]
    return []


def _check_train(c: TrainConfig) -> list[str]:
    problems = _positive("max_steps", c.max_steps, allow_none=True) + _positive("epochs", c.epochs)
    problems += _positive("micro_batch_size", c.micro_batch_size)
    problems += _positive("gradient_accumulation_steps", c.gradient_accumulation_steps)
    problems += _positive("fsdp_replicas", c.fsdp_replicas)
    if c.precision not in PRECISIONS:
        problems.append(f"precision: expected one of {list(PRECISIONS)}, got {c.precision!r}")
    if c.zero_stage not in (0, 1, 2, 3, "auto") or isinstance(c.zero_stage, bool):
        problems.append(f"zero_stage: expected 0, 1, 2, 3 or 'auto', got {c.zero_stage!r}")
    problems += _check_engine(c)
    ac = c.activation_checkpointing
    if not (isinstance(ac, bool) or ac == "auto" or (isinstance(ac, int) and ac >= 0)):
        problems.append(f"activation_checkpointing: expected true, false, a number of layers >= 0 or 'auto', "
                        f"got {ac!r}")
    if c.schedule not in SCHEDULES:
        problems.append(f"schedule: expected one of {list(SCHEDULES)}, got {c.schedule!r}")
    if not 0 <= c.warmup_ratio < 1:
        problems.append(f"warmup_ratio: expected a number in [0, 1), got {c.warmup_ratio!r}")
    if c.dropout is not None and not 0 <= c.dropout < 1:
        problems.append(f"dropout: expected a number in [0, 1) or null, got {c.dropout!r}")
    if c.pad_to_multiple is not None and c.pad_to_multiple < 1:
        problems.append(f"pad_to_multiple: expected an integer >= 1 or null, got {c.pad_to_multiple!r}")
    if c.pack_length is not None and c.pack_length < 2:
        problems.append(f"pack_length: expected an integer >= 2 or null, got {c.pack_length!r}")
    if c.loss_impl not in ("fused", "torch"):
        problems.append(f"loss_impl: expected 'fused' or 'torch', got {c.loss_impl!r}")
    if c.loss_filter not in FILTERS:
        problems.append(f"loss_filter: expected one of {list(FILTERS)}, got {c.loss_filter!r}")
    if c.val_examples < 0:
        problems.append(f"val_examples: expected an integer >= 0, got {c.val_examples!r}")
    problems += _positive("val_every", c.val_every, allow_none=True)
    if c.val_every is not None and c.val_examples == 0:
        problems.append(f"val_every: expected val_examples > 0 to validate every {c.val_every} steps, got 0")
    problems += _positive("checkpoint_every_steps", c.checkpoint_every_steps, allow_none=True)
    problems += _positive("checkpoint_every_minutes", c.checkpoint_every_minutes, allow_none=True)
    problems += _positive("checkpoints_to_keep", c.checkpoints_to_keep)
    if len(c.adam_betas) != 2:
        problems.append(f"adam_betas: expected two numbers, got {list(c.adam_betas)!r}")
    return problems


def preferred_engine(train: TrainConfig) -> str:
    """The engine of a ZeRO-3 layout and of a one-GPU one (``trainable.layout.layout_engine``): FSDP2 under
    ``engine: fsdp2``, and under ``auto`` unless the config asks for DeepSpeed's own (a ``deepspeed`` section, fp16
    loss scaling); FSDP2 trained those layouts faster in the same runs (docs/results.md)."""
    if train.engine == "auto":
        return "deepspeed" if train.deepspeed or train.precision == "fp16" else "fsdp2"
    return train.engine


def engine_for(train: TrainConfig, world_size: int, device_type: str) -> str:
    """The engine that trains ``train`` on ``world_size`` ranks of ``device_type``: ``layout_engine`` of its stage
    (``resolved_stage``); FSDP2 whenever ``engine: fsdp2``."""
    if train.engine == "fsdp2":
        return "fsdp2"
    return layout_engine(resolved_stage(train, world_size), world_size, preferred_engine(train),
                         on_gpu=device_type == "cuda")


def resolved_stage(train: TrainConfig, world_size: int) -> int:
    """The ZeRO stage: the config's, or for 'auto' (a trial config built without a sweep's layout) ZeRO-0 on one
    rank and ZeRO-2 across ranks."""
    if train.zero_stage != "auto":
        return int(train.zero_stage)
    return 0 if world_size == 1 else 2


def _check_engine(c: TrainConfig) -> list[str]:
    """``engine`` and what FSDP2 does not take: another ZeRO stage than 3, fp16 (no loss scaling), DeepSpeed config."""
    if c.engine not in ENGINES:
        return [f"engine: expected one of {list(ENGINES)}, got {c.engine!r}"]
    if c.engine != "fsdp2":
        return []
    problems = []
    if c.zero_stage not in (3, "auto") or isinstance(c.zero_stage, bool):
        problems.append(f"zero_stage: expected 3 or 'auto' with engine 'fsdp2' (it shards like ZeRO-3), "
                        f"got {c.zero_stage!r}")
    if c.precision == "fp16":
        problems.append("precision: expected auto, bf16 or fp32 with engine 'fsdp2' (no fp16 loss scaling), "
                        "got 'fp16'")
    if c.deepspeed:
        problems.append(f"deepspeed: expected no DeepSpeed config with engine 'fsdp2', got {c.deepspeed!r}")
    return problems


MIN_SEQ_LEN = 2  # a prompt token and a response token (the first token is never a target)


def _check_sft(c: SFTConfig) -> list[str]:
    problems = _positive("max_examples", c.max_examples, allow_none=True)
    if c.max_seq_len < MIN_SEQ_LEN:
        problems.append(f"max_seq_len: expected an integer >= {MIN_SEQ_LEN} (room for a prompt and a response "
                        f"token), got {c.max_seq_len!r}")
    if c.dataset not in SFTConfig.DATASETS:
        problems.append(f"dataset: expected one of {list(SFTConfig.DATASETS)}, got {c.dataset!r}")
    elif not c.local_file.endswith((".json", ".jsonl")):
        problems.append(f"local_file: expected a .json or .jsonl file, got {c.local_file!r}")
    if c.prompt_template not in ("auto", "chat", "plain"):
        problems.append(f"prompt_template: expected 'auto', 'chat' or 'plain', got {c.prompt_template!r}")
    return problems


def _check_eval(c: EvalConfig) -> list[str]:
    problems = _positive("limit", c.limit, allow_none=True)
    if not (c.batch_size == "auto" or type(c.batch_size) is int and c.batch_size > 0):
        problems.append(f"batch_size: expected 'auto' or a whole number > 0, got {c.batch_size!r}")
    tokens = c.batch_tokens
    if not (tokens is None or tokens == "auto" or type(tokens) is int and tokens > 0):
        problems.append(f"batch_tokens: expected 'auto', a whole number > 0 or null (no cap), got {c.batch_tokens!r}")
    problems += _positive("n_bins", c.n_bins)
    unknown = [t for t in c.tasks if not isinstance(t, str) or t not in TASKS]
    if unknown:
        problems.append(f"tasks: expected a subset of {list(TASKS)}, got {unknown!r}{suggest(str(unknown[0]), TASKS)}")
    return problems


def check_label_smoothing(value: Any) -> list[str]:
    """Problems with a label-smoothing value: it must be a number in [0, 1)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        return [f"expected a label smoothing beta in [0, 1), got {value!r}"]
    return []


def check_learning_rate(value: Any) -> list[str]:
    """Problems with a learning rate: it must be a finite number > 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (value > 0 and math.isfinite(value)):
        return [f"expected a learning rate > 0, got {value!r}"]
    return []


@dataclass(frozen=True)
class TrialConfig:
    """Everything one trial needs; travels to Ray workers as a plain dict (``to_dict``/``from_dict``)."""

    run_name: str
    trial_id: str
    family: str
    learning_rate: float
    label_smoothing: float
    seed: int = 0
    data_dir: str | None = None
    results_dir: str = "results"
    custom_models: dict[str, CustomModel] = field(default_factory=dict)
    sft: SFTConfig = field(default_factory=SFTConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TrialConfig":
        return build(cls, data, "trial")

    def custom_specs(self):
        """The config's random-init models as registry ``ModelSpec``s."""
        from common.models import ModelSpec

        return {name: ModelSpec(name, "random_init", m.architecture, tokenizer=m.tokenizer,
                                architecture_config=dict(m.config)) for name, m in self.custom_models.items()}
