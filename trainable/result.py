"""A trial's result, declared once: the worker fills ``TrialResult``; the store's trial columns, the driver's row,
the progress line and the closing table are derived from its fields.

Scalar fields are one column each, named as the field (``sweeps.store`` maps int -> int64, float -> float64,
str -> string, bool -> bool); ``task_metrics`` holds the ``<task>_<metric>`` columns (``calibration.summary``) and
``entropy`` the eq. 14 floor's inputs (``calibration.entropy.statistics.STATS``). The flat dict ``metrics()`` is
what the worker reports and what Ray hands the driver; ``from_metrics`` reads it back.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any

from calibration.entropy.statistics import STATS as ENTROPY_STATS
from calibration.summary import metric_columns
from calibration.task_config import TASKS

MAPPINGS = ("task_metrics", "entropy")  # the fields that are several columns each


@dataclass(frozen=True)
class TrialResult:
    """What one finished trial measured; None where it was not measured (or a row from older code lacks it)."""

    # the model
    model_source: str | None  # where the weights came from (common.models.ModelSpec.source)
    model_location: str | None
    n_params: int | None  # real parameters of the loaded model
    vocab_size: int | None  # rows of the output head
    hidden_size: int | None
    n_layers: int | None  # decoder layers
    # training
    train_loss: float | None  # label-smoothed loss of the last step (mean over its tokens and ranks)
    train_loss_plain: float | None  # -log p(target) of the last reported step's tokens: beta-free
    train_loss_first: float | None
    val_loss: float | None  # of the held-out examples at the last validation, None without them
    train_confidence: float | None  # mean max-probability of the last training batch
    train_steps: int | None
    resumed_from_step: int | None  # steps its last attempt took from a checkpoint (0: none)
    train_tokens: int | None  # real (non-padding) tokens over all ranks and steps
    tokens_per_s: float | None  # over every step of this attempt, all ranks
    tokens_per_s_steady: float | None  # after the warm-up steps, of training alone (StepClock: no validation, no
    # checkpoints)
    wall_warmup_s: float | None  # wall time of the warm-up steps
    mfu: float | None  # steady tokens/s per GPU x FLOPs per token (T: the rows' mean real length) / peak; None off
    # known GPUs (trainable.throughput)
    precision: str | None  # bf16 | fp16 | fp32 (trainable.deepspeed_setup)
    attention: str | None  # attention kernels the trial trained with (trainable.attention_check)
    device: str | None  # cpu | cuda
    # the layout the engine ran with
    world_size: int | None
    engine: str | None  # deepspeed | fsdp2: the engine that trained (train.engine; null in older rows)
    zero_stage: int | None  # ZeRO stage as the engine reports it (FSDP2 shards like ZeRO-3: 3)
    micro_batch_size: int | None  # per rank
    gradient_accumulation_steps: int | None
    activation_checkpointing: int | None  # decoder layers recomputed in the backward (0: none; the layout's choice)
    # memory (trainable.trial_memory), of rank 0
    gpu_peak_gib: float | None  # peak of PyTorch's allocator over the trial's phases; None on the CPU
    gpu_peak_phase: str | None  # the phase of that peak: load, attention_check, train, export or score
    gpu_peak_predicted_gib: float | None  # the largest of trainable.layout.phase_peaks; None off CUDA, non-bf16
    gpu_phase_peaks: str | None  # JSON {phase: [measured GiB, predicted GiB or null]} (trainable.trial_memory)
    gpu_alloc_retries: int | None  # the caching allocator's cudaMalloc retries (freed its cache, tried again) in
    # the trial, of rank 0; None on the CPU
    host_rss_gib: float | None  # the process's resident set at the trial's end (a warm actor's grows if trials leak)
    # wall times (seconds)
    wall_load_s: float | None  # load, attention check and restore
    wall_check_s: float | None  # of wall_load_s: the attention check (0 when train.attention_check is off)
    wall_train_s: float | None
    wall_eval_s: float | None
    wall_total_s: float | None
    model_path: str | None  # the trained model's Hugging Face folder (train.save_model), else None
    node_id: str | None  # the Ray node its rank 0 trained on (null in older files and failed rows)
    # this trial's compiled graphs read from (hits) or added to (misses) the node's caches, and the seconds torch
    # spent compiling them (trainable.node_setup.compile_counts_since its start)
    compile_fx_hits: int | None
    compile_fx_misses: int | None
    compile_autograd_hits: int | None
    compile_autograd_misses: int | None
    compile_s: float | None
    task_metrics: dict[str, float] = field(default_factory=dict)  # <task>_<metric> (calibration.summary)
    entropy: dict[str, float] = field(default_factory=dict)  # ENTROPY_STATS; {} where not measured

    def metrics(self) -> dict[str, Any]:
        """The flat dict a worker reports: every scalar field, then the task metrics and entropy statistics."""
        flat = {name: getattr(self, name) for name in scalar_columns()}
        return flat | self.task_metrics | self.entropy

    @classmethod
    def from_metrics(cls, metrics: dict[str, Any]) -> TrialResult:
        """The result in a flat metrics dict (``metrics()``, a stored row); absent fields are None."""
        return cls(**{name: metrics.get(name) for name in scalar_columns()},
                   task_metrics={k: metrics[k] for k in metric_columns(TASKS) if metrics.get(k) is not None},
                   entropy={k: metrics[k] for k in ENTROPY_STATS if metrics.get(k) is not None})


def scalar_columns() -> tuple[str, ...]:
    """The one-column fields of ``TrialResult``, in declaration order."""
    return tuple(f.name for f in dataclasses.fields(TrialResult) if f.name not in MAPPINGS)


def column_types() -> dict[str, type]:
    """Scalar field -> its Python type (int, float, str or bool; the ``| None`` dropped)."""
    hints = typing.get_type_hints(TrialResult)
    return {name: next(t for t in typing.get_args(hints[name]) if t is not type(None)) for name in scalar_columns()}
