"""One trial on one Ray Train worker: seeded SFT through DeepSpeed, then calibration scoring.

``train_fn_per_worker(config)`` is what ``ray.train.torch.TorchTrainer`` runs on every worker. It reports
training metrics every ``log_every`` steps and, at the end, the per-task calibration metrics (names
``{task}_{metric}``) with model facts and wall times; rank 0 writes the per-question records.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import tempfile
import random
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from trainable.ats import trial_ats_head
from trainable.attention_check import AttentionChoice, choose_attention
from trainable.compiled import compile_wanted, compiled_decoder_layers
from trainable.config import TrialConfig
from trainable.lm_head import CausalLMWithFusedLoss
from trainable.models import cache_dir, load_model, load_tokenizer, model_facts, resolve_model
from trainable.node_setup import compile_cache_counts, prepare_node
from trainable.packing import iterate_packed_batches, pack_wanted, packed_row_count, packed_width
from trainable.sft_data import build_sft_examples, collate, iterate_batches, steps_per_epoch
from trainable.step_accounting import StepClock, global_mean_loss, optimizer_step, warmup_step_count
from trainable.zero3_scoring import scoring_model


class NonFiniteLossError(RuntimeError):
    """The training loss became NaN or infinite; the trial stops early with this status."""


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (CPU and CUDA) RNGs: data order, new weights, dropout."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)


def _dropout_overrides(dropout: float | None) -> dict[str, float]:
    return {} if dropout is None else {"attention_dropout": dropout}


def validation_loss(engine, examples: list[dict], micro_batch_size: int, pad_token_id: int,
                    device: torch.device, pad_to_multiple: int = 1) -> float:
    """Mean of the per-batch training loss over the held-out examples (no gradient, eval mode)."""
    engine.eval()
    losses = []
    with torch.no_grad():
        for start in range(0, len(examples), micro_batch_size):
            batch = collate(examples[start:start + micro_batch_size], pad_token_id, pad_to_multiple)
            losses.append(float(engine(**{k: v.to(device) for k, v in batch.items()})))
    engine.train()
    return sum(losses) / len(losses)


class LiveMetrics:
    """Ray metrics gauges (tagged by trial) for the dashboard's Metrics view: loss, tokens/s, confidence, ECE."""

    NAMES = ("train_loss", "val_loss", "tokens_per_s", "confidence", "mmlu_ece", "arc_easy_ece", "hellaswag_ece")

    def __init__(self, trial_id: str):
        from ray.util.metrics import Gauge

        self.tags = {"trial_id": trial_id}
        self.gauges = {name: Gauge(f"calsweep_{name}", description=f"calsweep trial {name}", tag_keys=("trial_id",))
                       for name in self.NAMES}

    def set(self, metrics: dict[str, Any]) -> None:
        for name, gauge in self.gauges.items():
            value = metrics.get(name)
            if isinstance(value, (int, float)) and math.isfinite(value):
                gauge.set(float(value), tags=self.tags)


def run_trial(trial: TrialConfig, device: torch.device, rank: int, world_size: int,
              report: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """Train and score one configuration; ``report`` receives progress and final metrics, which are returned.

    torch.distributed must be initialised (Ray Train does it; tests use a one-rank gloo group).
    """
    from calibration.evaluate import evaluate_model
    from sweeps.store import write_questions

    started = time.time()
    prepare_node(cache_dir(), device)  # compiled graphs shared by the node's trials; no DeepSpeed op built
    seed_everything(trial.seed)
    spec = resolve_model(trial.family, trial.custom_specs())
    tokenizer = load_tokenizer(spec, trial.custom_specs())
    model = load_model(spec, seed=trial.seed, device=device, **_dropout_overrides(trial.train.dropout))
    facts = model_facts(model)
    examples = build_sft_examples(trial.sft, tokenizer, trial.seed, trial.data_dir, cache=cache_dir() / "sft")
    held_out = examples[len(examples) - trial.train.val_examples:] if trial.train.val_examples else []
    examples = examples[: len(examples) - len(held_out)]
    if not examples:
        raise ValueError(f"expected at least one SFT example with response tokens, got 0 "
                         f"(max_examples={trial.sft.max_examples}, max_seq_len={trial.sft.max_seq_len})")
    pad_to = trial.train.pad_to_multiple or (64 if device.type == "cuda" else 1)
    pack_width = (packed_width(trial.sft.max_seq_len, trial.train.pack_length, pad_to)
                  if pack_wanted(trial.train.pack, device) else None)
    epoch_batches = (packed_row_count(examples, pack_width, trial.seed) if pack_width else len(examples))
    per_epoch = steps_per_epoch(epoch_batches, trial.train.micro_batch_size,
                                trial.train.gradient_accumulation_steps, world_size)
    total_steps = trial.train.max_steps or max(1, math.ceil(trial.train.epochs * per_epoch))
    wrapped = CausalLMWithFusedLoss(model, trial.label_smoothing, trial.train.loss_impl)

    from trainable.deepspeed_setup import build_engine

    engine, precision = build_engine(wrapped, trial.train, trial.learning_rate, total_steps, device, world_size)
    if pack_width:
        batches = iterate_packed_batches(examples, trial.train.micro_batch_size, pack_width, tokenizer.pad_token_id,
                                         trial.seed, rank, world_size)
    else:
        batches = iterate_batches(examples, trial.train.micro_batch_size, tokenizer.pad_token_id, trial.seed,
                                  rank, world_size, pad_to)
    first_batch = next(batches)
    attention = AttentionChoice("unchecked", None, {})  # SDPA's own choice, not compared with the math kernel
    if trial.train.attention_check:
        probe = {k: v.to(device) for k, v in first_batch.items()}
        attention = choose_attention(model, lambda: engine.module(**probe))
        if attention.name != "default" and rank == 0:  # a fallback is worth a line in the sweep log
            print(f"[calsweep] attention kernels: {attention.name} ({attention.report})", flush=True)
    batches = itertools.chain([first_batch], batches)
    load_s = time.time() - started

    engine.train()
    accumulation = trial.train.gradient_accumulation_steps
    clock = StepClock(world_size, warmup_step_count(total_steps))
    losses: list[float] = []
    val_loss: float | None = None
    with attention.context(), compiled_decoder_layers(model, compile_wanted(trial.train.compile, device)):
        for step in range(1, total_steps + 1):
            micro_batches = [next(batches) for _ in range(accumulation)]
            clock.tokens += sum(int(batch["attention_mask"].sum()) for batch in micro_batches)
            summed = optimizer_step(engine, micro_batches, device, world_size)
            step_loss = global_mean_loss(summed, accumulation, world_size)  # the step's one host sync
            if not math.isfinite(step_loss):
                raise NonFiniteLossError(f"training loss is {step_loss} at step {step}; "
                                         f"expected a finite loss (lower the learning rate {trial.learning_rate})")
            clock.step_done(step)
            losses.append(step_loss)
            confidence = wrapped.last_confidence  # of the last training batch: validation overwrites the attribute
            every = trial.train.val_every
            validate = held_out and (step == total_steps or (every and step % every == 0))
            if validate:
                val_loss = validation_loss(engine, held_out, trial.train.micro_batch_size, tokenizer.pad_token_id,
                                           device, pad_to)
            if validate or step % trial.train.log_every == 0 or step == total_steps:
                report({"phase": "train", "step": step, "total_steps": total_steps, "train_loss": step_loss,
                        "confidence": float(confidence), "lr": engine.get_lr()[0],
                        "tokens_per_s": clock.rate(), **({"val_loss": val_loss} if validate else {})})
    clock.stop()
    train_s = clock.stopped - clock.started

    eval_started = time.time()
    summary: dict[str, dict[str, float]] = {}
    if trial.eval.tasks:
        engine.eval()
        scorer = scoring_model(model, trial.train.zero_stage, device, rank, world_size)
        if scorer is not None:
            ats_head = trial_ats_head(scorer, tokenizer, trial, progress=rank == 0) if trial.eval.ats.enabled else None
            result = evaluate_model(scorer, tokenizer, tasks=trial.eval.tasks, data_dir=trial.data_dir,
                                    limit=trial.eval.limit, batch_size=trial.eval.batch_size,
                                    batch_tokens=trial.eval.batch_tokens, n_bins=trial.eval.n_bins,
                                    heldout=trial.eval.temperature_scaling, progress=rank == 0,
                                    attention=attention.backends, plan_cache=cache_dir() / "plans",
                                    ats_head=ats_head)
            summary = result.summary
            if rank == 0:
                write_questions(trial.results_dir, trial.run_name, trial.trial_id, result.records)
            del scorer
    eval_s = time.time() - eval_started

    final: dict[str, Any] = {
        "phase": "done", "step": total_steps, "total_steps": total_steps,
        "train_loss": losses[-1], "train_loss_first": losses[0], "train_steps": total_steps,
        "val_loss": val_loss, "train_confidence": float(confidence),
        "train_tokens": clock.tokens * world_size, "tokens_per_s": clock.tokens * world_size / max(train_s, 1e-9),
        "tokens_per_s_steady": clock.steady_rate(), "wall_warmup_s": clock.warmup_s(),
        "precision": precision, "attention": attention.name, "device": str(device.type), "world_size": world_size,
        **{f"model_{k}": v for k, v in facts.items()},
        "model_source": spec.source, "model_location": spec.location,
        "wall_load_s": load_s, "wall_train_s": train_s, "wall_eval_s": eval_s,
        "wall_total_s": time.time() - started, **compile_cache_counts(),
    }
    for task, metrics in summary.items():
        final.update({f"{task}_{name}": float(value) for name, value in metrics.items()})
    report(final)
    return final


def train_fn_per_worker(config: dict[str, Any]) -> None:
    """Ray Train entry point: rebuild the ``TrialConfig`` and run it on this worker's device."""
    import ray.train
    import ray.train.torch

    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    context = ray.train.get_context()
    trial = TrialConfig.from_dict(config)
    rank = context.get_world_rank()
    gauges = LiveMetrics(trial.trial_id) if rank == 0 else None

    def report(metrics: dict[str, Any]) -> None:
        if gauges:
            gauges.set(metrics)
        if metrics.get("phase") != "done" or rank != 0:
            ray.train.report(metrics)
            return
        with tempfile.TemporaryDirectory() as directory:  # the final metrics travel with a checkpoint, which
            Path(directory, "final_metrics.json").write_text(json.dumps(metrics))  # is what Result.metrics keeps
            ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(directory))

    run_trial(trial, ray.train.torch.get_device(), rank, context.get_world_size(), report)
