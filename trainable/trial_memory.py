"""What a trial held in memory: rank 0's GPU peak in each phase (load, attention check, training, export, scoring),
the layout model's prediction of each (``trainable.layout.phase_peaks``), and the host process's resident set at the
trial's end.

So every GPU trial checks the memory model of every phase (its row is a record like the benchmark's), and a warm
actor that keeps something of each trial shows as ``host_rss_gib`` growing from trial to trial. A trial that runs
out of GPU memory carries its peak on the error (``peak_on_out_of_memory``), for its failed row.
"""

from __future__ import annotations

import contextlib
import json
import re
from typing import Any, Iterator

import psutil
import torch

from trainable.config import TrialConfig
from trainable.layout import GIB, ModelShape, phase_peaks, planned_scoring_tokens

# the CUDA caching allocator's settings of a trial's workers unless the user sets PYTORCH_CUDA_ALLOC_CONF: PyTorch's
# own, said out loud. Expandable segments halved the 8B row on two H100s (3,062 against 6,160 tokens/s per GPU,
# 2026-11-28, docs/results.md) for fewer cudaMalloc retries (18 against 24), so they stay off
ALLOC_CONF_ENV, DEFAULT_ALLOC_CONF = "PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:False"
# eval.batch_size: auto, rows a scoring forward takes per device: many on a GPU, where forwards of 8 rows are bound by
# kernel launches (ARC-Easy 400 on an H200, 1B: 0.66 s at 256 rows against 4.78 at 8); 8 on the CPU, where 256 made
# the default sweep's scoring 1.5x slower (SmolLM2-135M; bench_scoring_batch.py, docs/results.md)
SCORING_ROWS = {"cuda": 256, "cpu": 8}
OOM_PEAK = "gpu_peak_gib"  # the attribute of an out-of-memory error that carries its rank's peak (GiB)
_ALLOCATED = re.compile(r"([\d.]+) (GiB|MiB) is allocated by PyTorch")  # the CUDA caching allocator's message


def alloc_conf() -> str:
    """The allocator settings workers run with: the user's ``PYTORCH_CUDA_ALLOC_CONF``, else ``DEFAULT_ALLOC_CONF``."""
    import os

    return os.environ.get(ALLOC_CONF_ENV) or DEFAULT_ALLOC_CONF


def use_alloc_conf(conf: str) -> None:
    """Run this process's CUDA allocator with ``conf``: in the environment (read when CUDA starts) and, where CUDA
    has started (a warm actor), in the running allocator (its next segments)."""
    import os

    if os.environ.get(ALLOC_CONF_ENV) == conf:  # a warm actor's later trials: as its first set it
        return
    os.environ[ALLOC_CONF_ENV] = conf
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.memory._set_allocator_settings(conf)


def alloc_retries(device: torch.device) -> int | None:
    """cudaMalloc retries of the caching allocator on ``device`` (it freed its cache and tried again) since the
    process started; None on the CPU."""
    return int(torch.cuda.memory_stats(device).get("num_alloc_retries", 0)) if device.type == "cuda" else None


def reset_gpu_peak(device: torch.device) -> None:
    """Start the allocator's peak afresh (a warm actor's previous trial set it); nothing on the CPU."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def gpu_peak_gib(device: torch.device) -> float | None:
    """The peak of PyTorch's allocator on ``device`` since ``reset_gpu_peak`` (GiB); None on the CPU."""
    return torch.cuda.max_memory_allocated(device) / GIB if device.type == "cuda" else None


class PhasePeaks:
    """The allocator's peak on ``device`` in each phase of a trial (GiB), phase by phase: ``with peaks.phase(name)``
    starts the peak afresh (a warm actor's previous trial, or the previous phase, set it) and keeps it at the end;
    and its retries over the trial. Nothing is measured on the CPU."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.gib: dict[str, float] = {}
        self.retries_before = alloc_retries(device)

    def alloc_retries(self) -> int | None:
        """The allocator's retries since this trial began (a warm actor's earlier trials left out); None on CPU."""
        now = alloc_retries(self.device)
        return None if now is None else now - (self.retries_before or 0)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        reset_gpu_peak(self.device)
        try:
            yield
        finally:
            peak = gpu_peak_gib(self.device)
            if peak is not None:
                self.gib[name] = max(peak, self.gib.get(name, 0.0))

    def peak(self) -> tuple[float | None, str | None]:
        """(the largest phase peak, its phase), (None, None) where nothing was measured."""
        if not self.gib:
            return None, None
        name = max(self.gib, key=self.gib.get)
        return self.gib[name], name


def predicted_phase_peaks_gib(model_config: Any, params: int, trial: TrialConfig, engine: str, zero_stage: int,
                              world_size: int, seq_len: int, checkpointed: int, precision: str,
                              device: torch.device) -> dict[str, float] | None:
    """``trainable.layout.phase_peaks`` of the layout that ran (GiB): the model's shape (``params`` real
    parameters), the engine's stage, micro-batch, accumulation and recomputed layers, ZeRO's buckets as
    ``deepspeed_config`` set them, the export (``train.save_model``) and scoring forwards of ``scoring_tokens``.
    None where the model does not apply: off CUDA, or in another precision than bf16."""
    return shape_phase_peaks_gib(loaded_shape(model_config, params), trial, engine, zero_stage, world_size, seq_len,
                                 checkpointed, precision, device.type)


def loaded_shape(model_config: Any, params: int) -> ModelShape:
    """The ``ModelShape`` of a loaded model's config (a multimodal one's text config) with ``params`` parameters."""
    config = model_config.get_text_config() if hasattr(model_config, "get_text_config") else model_config
    return ModelShape.from_config(config, params)


def shape_phase_peaks_gib(shape: ModelShape, trial: TrialConfig, engine: str, zero_stage: int, world_size: int,
                          seq_len: int, checkpointed: int, precision: str,
                          device_type: str) -> dict[str, float] | None:
    """``predicted_phase_peaks_gib`` of a model ``shape`` on a ``device_type`` device: what a trial's row predicts,
    from the loaded model or, for a trial that failed before it reported, from its family's shape."""
    if device_type != "cuda" or precision != "bf16":
        return None
    layout = _layout_args(shape, trial, engine, zero_stage, world_size, seq_len, checkpointed)
    tokens = scoring_tokens(shape, trial, engine, zero_stage, world_size, seq_len, checkpointed)
    return {name: value / GIB for name, value in phase_peaks(shape, **layout, scoring_tokens=tokens).items()}


def scoring_batch(shape: ModelShape, trial: TrialConfig, engine: str, zero_stage: int, world_size: int, seq_len: int,
                  checkpointed: int, device_type: str) -> tuple[int, int | None]:
    """(rows, padded tokens) a scoring forward of the trial takes at most on a ``device_type`` device:
    ``eval.batch_size`` as set, under ``auto`` the device's ``SCORING_ROWS``; ``eval.batch_tokens`` as set (None: no
    cap), under ``auto`` ``trainable.layout.planned_scoring_tokens`` of the layout that ran."""
    rows = SCORING_ROWS.get(device_type, SCORING_ROWS["cpu"]) if trial.eval.batch_size == "auto" \
        else trial.eval.batch_size
    tokens = trial.eval.batch_tokens
    if tokens == "auto":
        tokens = planned_scoring_tokens(shape, **_layout_args(shape, trial, engine, zero_stage, world_size, seq_len,
                                                              checkpointed))
    return rows, tokens


def scoring_tokens(shape: ModelShape, trial: TrialConfig, engine: str, zero_stage: int, world_size: int,
                   seq_len: int, checkpointed: int) -> int:
    """What the memory model counts for a trial's scoring forwards on a GPU (``scoring_batch``): its token cap, else
    its rows of ``seq_len``; 0 where the trial scores no task."""
    if not trial.eval.tasks:
        return 0
    rows, tokens = scoring_batch(shape, trial, engine, zero_stage, world_size, seq_len, checkpointed, "cuda")
    return rows * seq_len if tokens is None else tokens


def _layout_args(shape: ModelShape, trial: TrialConfig, engine: str, zero_stage: int, world_size: int, seq_len: int,
                 checkpointed: int) -> dict[str, Any]:
    """``phase_peaks``' layout arguments of a trial (ZeRO's buckets as ``deepspeed_config`` sets them)."""
    from trainable.deepspeed_setup import deepspeed_config

    train = trial.train
    zero = deepspeed_config(train, "bf16", world_size, shape.layer_params)["zero_optimization"]
    return dict(stage=zero_stage, workers=world_size, micro_batch=train.micro_batch_size, seq_len=seq_len,
                checkpointed=checkpointed, zero=zero, engine=engine, accumulation=train.gradient_accumulation_steps,
                export=train.save_model, replicas=train.fsdp_replicas if engine == "fsdp2" else 1)


def phase_table(measured: dict[str, float], predicted: dict[str, float] | None) -> str | None:
    """Measured and predicted peaks per phase as JSON, {phase: [measured GiB, predicted GiB or null]}; None
    where nothing was measured."""
    if not measured:
        return None
    predicted = predicted or {}
    return json.dumps({name: [round(gib, 3), None if predicted.get(name) is None else round(predicted[name], 3)]
                       for name, gib in measured.items()})


def host_rss_gib() -> float:
    """This process's resident set (GiB)."""
    return psutil.Process().memory_info().rss / GIB


@contextlib.contextmanager
def peak_on_out_of_memory(device: torch.device) -> Iterator[None]:
    """Run the block; a ``torch.OutOfMemoryError`` leaves it carrying this rank's allocator peak as its
    ``gpu_peak_gib`` attribute (None on the CPU), which travels with it to Ray's driver (pickled)."""
    try:
        yield
    except torch.OutOfMemoryError as error:
        setattr(error, OOM_PEAK, gpu_peak_gib(device))
        raise


def out_of_memory_peak_gib(error: BaseException) -> float | None:
    """The measured GPU peak (GiB) of an out-of-memory error: the one ``peak_on_out_of_memory`` attached, else what
    the allocator's message says PyTorch had allocated; None where neither says (the CPU)."""
    attached = getattr(error, OOM_PEAK, None)
    if attached is not None:
        return attached
    said = _ALLOCATED.search(str(error))
    return None if said is None else float(said[1]) / (1 if said[2] == "GiB" else 1024)
