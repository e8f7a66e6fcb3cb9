"""One trial on one Ray Train worker: seeded SFT through DeepSpeed (or FSDP2, ``train.engine``), then calibration
scoring.

``train_fn_per_worker(config)`` is what ``ray.train.torch.TorchTrainer`` runs on every worker. It reports
training metrics every ``log_every`` steps and, at the end, the per-task calibration metrics (names
``{task}_{metric}``) with model facts and wall times; rank 0 writes the per-question records. Mid-trial
checkpoints (``trainable.checkpointing``) go through Ray Train's reports; a retried or resumed trial continues
from the latest one.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import os
import tempfile
import random
import time
from pathlib import Path
from dataclasses import dataclass
from typing import Any, Callable, Iterator, NamedTuple

import numpy as np
import torch

from calibration.summary import flat_metrics
from calibration.task_config import TASKS
from trainable import checkpointing
from trainable.ats import trial_ats_head
from trainable.attention_check import AttentionChoice, choose_attention_once
from trainable.compiled import compile_wanted, compiled_decoder_layers, decoder_layers
from trainable.export import Gather, save_hf_model
from trainable.config import TrialConfig, engine_for, resolved_stage
from trainable.fault_injection import die_if_due, oom_if_due
from trainable import fsdp2_engine, fsdp2_weights, trial_memory, zero3_scoring
from trainable.deepspeed_setup import resolve_precision
from trainable.lm_head import CausalLMWithFusedLoss, head_shape, precompile_fused_head
from trainable.result import TrialResult
from trainable.scoring_shard import scoring_shard
from common.models import (ModelSpec, cache_dir, load_model, load_tokenizer, model_facts, random_init_config,
                           resolve_model)
from trainable.node_setup import compile_counts, compile_counts_since, prepare_node, ray_node_id
from trainable.recompute import checkpointed_count, recomputed_layers
from trainable.sharded_load import sharded_model
from trainable.sequence_packing import (iterate_packed_batches, packed_row_count, pad_multiple,
                                        trial_pack_width)
from trainable.sft_data import build_sft_examples, collate, iterate_batches, steps_per_epoch
from trainable.step_accounting import PendingLoss, StepClock, global_mean_loss, optimizer_step, warmup_step_count
from trainable.throughput import model_flops_utilization, training_flops_per_token


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

    NAMES = ("train_loss", "val_loss", "tokens_per_s", "confidence")  # and <task>_ece of every registered task

    def __init__(self, trial_id: str):
        from ray.util.metrics import Gauge

        self.tags = {"trial_id": trial_id}
        self.gauges = {name: Gauge(f"calsweep_{name}", description=f"calsweep trial {name}", tag_keys=("trial_id",))
                       for name in self.NAMES + tuple(f"{task}_ece" for task in TASKS)}

    def set(self, metrics: dict[str, Any]) -> None:
        for name, gauge in self.gauges.items():
            value = metrics.get(name)
            if isinstance(value, (int, float)) and math.isfinite(value):
                gauge.set(float(value), tags=self.tags)


Report = Callable[[dict[str, Any]], None]
ReportCheckpoint = Callable[[dict[str, Any], Path | None], None]


class TrialWriters(NamedTuple):
    """Where a trial's outputs go, handed down by the layer that owns the results store (``sweeps.store``'s
    functions): each takes (results root, run name, trial id, the output) and returns where it was stored."""

    write_questions: Callable[[str, str, str, Any], str]  # the per-question records (a pyarrow Table)
    write_model: Callable[[str, str, str, str], str]  # a local Hugging Face folder, moved into the store


def _report_finished(trial: TrialConfig, directory: Path, rank: int, report: Report,
                     writers: TrialWriters) -> dict[str, Any]:
    """A trial whose final checkpoint exists: its questions stored again (rank 0) and its final metrics reported."""
    import pyarrow.parquet as pq

    final = json.loads((directory / checkpointing.FINAL_FILE).read_text())
    if rank == 0 and (directory / checkpointing.QUESTIONS_FILE).is_file():
        writers.write_questions(trial.results_dir, trial.run_name, trial.trial_id,
                                pq.read_table(directory / checkpointing.QUESTIONS_FILE))
    report(final)
    return final


def run_trial(trial: TrialConfig, device: torch.device, rank: int, world_size: int, report: Report,
              report_checkpoint: ReportCheckpoint | None = None, resume_from: Path | None = None, *,
              writers: TrialWriters) -> dict[str, Any]:
    """Train and score one configuration; ``report`` receives progress and final metrics, which are returned;
    ``writers`` store the per-question records (rank 0) and, with ``train.save_model``, the trained model.

    With ``report_checkpoint``, checkpoints are taken as ``train.checkpoint_every_*`` say: every rank writes its
    part into a local folder and hands it with the step's metrics to ``report_checkpoint`` instead of ``report``;
    the final metrics go the same way (rank 0's folder holds them and the per-question records, other ranks hand
    None). ``resume_from``: a checkpoint folder (every rank's files) to continue from, with the same data order,
    learning-rate schedule, optimizer state and RNG states; a final one is reported again without training.
    torch.distributed must be initialised (Ray Train does it; tests use a one-rank gloo group).
    The final metrics are ``TrialResult.metrics()`` (trainable.result) with phase "done".
    """
    if resume_from is not None and (resume_from / checkpointing.FINAL_FILE).is_file():
        return _report_finished(trial, resume_from, rank, report, writers)
    started, compiled = time.time(), compile_counts()
    peaks = trial_memory.PhasePeaks(device)
    with trial_memory.peak_on_out_of_memory(device):  # an out-of-memory error carries this rank's peak
        setup = set_up(trial, device, rank, world_size, resume_from, peaks)
        try:
            with peaks.phase("train"):
                trained = train(trial, setup, device, rank, world_size, report, report_checkpoint)
            if isinstance(setup.engine, fsdp2_engine.Fsdp2Engine):
                setup.engine.drop_optimizer_state()  # training is over: the export's and scoring's gathers need room
            with peaks.phase("export"):
                model_path = save_model(setup.model, setup.tokenizer, trial, rank, writers.write_model,
                                        gather_for(setup.engine)) if trial.train.save_model else None
            with peaks.phase("score"):
                scored = score(trial, setup, device, rank, world_size, writers, trained.recomputed)
            result = trial_result(trial, setup, trained, scored, device, world_size, model_path,
                                  time.time() - started, peaks, compile_counts_since(compiled))
        finally:  # ZeRO's gradient hooks live in autograd's C++ nodes: until removed, the engine outlives the
            # trial (FSDP2's engine frees its optimizer states)
            setup.engine.destroy()
    final = {"phase": "done", "step": setup.total_steps, "total_steps": setup.total_steps, **result.metrics()}
    if report_checkpoint is None:
        report(final)
    elif rank != 0:
        report_checkpoint(final, None)
    else:  # the final metrics travel with a checkpoint (what Ray's Result.metrics keeps), the questions with them
        with tempfile.TemporaryDirectory(prefix="calsweep-final-") as directory:
            _write_final(Path(directory), final, scored.records, trial, world_size)
            report_checkpoint(final, Path(directory))
    return final


@dataclass
class TrialSetup:
    """What ``set_up`` hands the training and scoring phases."""

    spec: ModelSpec
    tokenizer: Any
    model: torch.nn.Module  # the Hugging Face model (inside ``wrapped``, inside ``engine``)
    facts: dict[str, int]  # common.models.model_facts, taken before ZeRO-3 partitions the weights
    wrapped: CausalLMWithFusedLoss
    engine: Any  # deepspeed.DeepSpeedEngine, or trainable.fsdp2_engine.Fsdp2Engine (train.engine)
    precision: str
    batches: Iterator[dict[str, torch.Tensor]]  # this rank's micro-batches from the resumed step on
    held_out: list[dict]  # validation examples
    pad_to: int  # rows padded to a multiple of this
    row_width: int  # tokens per row at most: the packed width, else sft.max_seq_len
    total_steps: int
    start: int  # the step training resumes after (0: from the start)
    resumed: checkpointing.LoopState | None
    attention: AttentionChoice
    load_s: float  # seconds to load, check and restore
    first_batch: dict[str, torch.Tensor]  # this rank's first micro-batch (the attention check's probe)
    precompiled: Callable[[], None]  # joins the head's kernels' compilation, started as the model loaded
    check_s: float = 0.0  # of ``load_s``: seconds of the attention check


def set_up(trial: TrialConfig, device: torch.device, rank: int, world_size: int,
           resume_from: Path | None, peaks: trial_memory.PhasePeaks) -> TrialSetup:
    """Seed, load the model and the SFT data, build the engine (``train.engine``) and this rank's batches, check the
    attention kernels on the first batch's first row and restore ``resume_from``'s checkpoint (after the check:
    whatever its probe draws, training goes on with the checkpoint's RNGs). ``peaks`` records the GPU peaks of the
    load (and restore) and of the check."""
    started = time.time()
    with peaks.phase("load"):
        setup = _loaded(trial, device, rank, world_size, resume_from)
        setup.precompiled()
    if trial.train.attention_check:
        checking = time.time()
        with peaks.phase("attention_check"):
            setup.attention = _checked_attention(setup, device, rank)
        setup.check_s = time.time() - checking
    if setup.resumed:
        with peaks.phase("load"):
            setup.wrapped.head.plan_history = checkpointing.restore(setup.engine, resume_from, rank)
        if rank == 0:
            print(f"[calsweep] trial {trial.trial_id} resumes at step {setup.start}/{setup.total_steps} from "
                  f"{resume_from}", flush=True)
    setup.load_s = time.time() - started
    return setup


def _loaded(trial: TrialConfig, device: torch.device, rank: int, world_size: int,
            resume_from: Path | None) -> TrialSetup:
    """``set_up``'s model, data, engine and batches (attention unchecked)."""
    resumed = checkpointing.loop_state(resume_from) if resume_from is not None else None
    start = resumed.step if resumed else 0
    prepare_node(cache_dir(), device)  # compiled graphs shared by the node's trials; no DeepSpeed op built
    seed_everything(trial.seed)
    spec = resolve_model(trial.family, trial.custom_specs())
    tokenizer = load_tokenizer(spec, trial.custom_specs())
    fsdp2 = engine_for(trial.train, world_size, device.type) == "fsdp2"
    overrides = _dropout_overrides(trial.train.dropout)
    pack_width = trial_pack_width(trial.train, trial.sft.max_seq_len, device.type)
    precompile = functools.partial(  # the head's kernels compile beside the load, the data and the engine
        precompile_fused_head, device=device, precision=resolve_precision(trial.train.precision, device),
        tokens=trial.train.micro_batch_size * (pack_width or trial.sft.max_seq_len),
        label_smoothing=trial.label_smoothing, loss_impl=trial.train.loss_impl, loss_filter=trial.train.loss_filter)
    early = head_shape(random_init_config(spec, **overrides)) if spec.source == "random_init" else None
    compiling = [precompile(early)] if early else []  # a stored model's shape is known once loaded
    if fsdp2:  # over several ranks built on the meta device: each rank then allocates only its shards
        model, materialise = sharded_model(spec, seed=trial.seed, device=device, rank=rank, world_size=world_size,
                                           **overrides)
    else:
        model, materialise = load_model(spec, seed=trial.seed, device=device, **overrides), None
    facts = model_facts(model)
    if head_shape(model.config) != early:
        compiling.append(precompile(head_shape(model.config)))
    examples, held_out = _sft_examples(trial, tokenizer)
    pad_to = pad_multiple(trial.train, device.type)
    total_steps = _total_steps(trial, examples, pack_width, world_size)
    if resumed and resumed.total_steps != total_steps:
        raise ValueError(f"expected a checkpoint of a {total_steps}-step trial to resume, got one of "
                         f"{resumed.total_steps} steps at {resume_from}")
    wrapped = CausalLMWithFusedLoss(model, trial.label_smoothing, trial.train.loss_impl, trial.train.loss_filter)

    from trainable import deepspeed_setup

    oom_if_due(rank, trial.results_dir, trial.run_name, trial.trial_id)
    if fsdp2:
        engine, precision = fsdp2_engine.build_engine(wrapped, trial.train, trial.learning_rate, total_steps, device,
                                                      world_size, materialise)
    else:
        engine, precision = deepspeed_setup.build_engine(wrapped, trial.train, trial.learning_rate, total_steps,
                                                         device, world_size)
    skip = start * trial.train.gradient_accumulation_steps
    if pack_width:
        batches = iterate_packed_batches(examples, trial.train.micro_batch_size, pack_width, tokenizer.pad_token_id,
                                         trial.seed, rank, world_size, skip=skip)
    else:
        batches = iterate_batches(examples, trial.train.micro_batch_size, tokenizer.pad_token_id, trial.seed,
                                  rank, world_size, pad_to, skip=skip)
    first_batch = next(batches)
    unchecked = AttentionChoice("unchecked", None, {})  # SDPA's own choice, not compared with the math kernel

    def compiled() -> None:
        for join in compiling:
            join()

    return TrialSetup(spec, tokenizer, model, facts, wrapped, engine, precision,
                      itertools.chain([first_batch], batches), held_out, pad_to, pack_width or trial.sft.max_seq_len,
                      total_steps, start, resumed, unchecked, 0.0, first_batch, compiled)


def _checked_attention(setup: TrialSetup, device: torch.device, rank: int) -> AttentionChoice:
    """The attention kernels to train with (``trainable.attention_check``), checked on the first batch's first row
    (SDPA picks by head size, length, dtype and mask, not by rows; one row keeps the check's memory small)."""
    model, engine = setup.model, setup.engine
    probe = {k: v[:1].to(device) for k, v in setup.first_batch.items()}
    key = json.dumps([model.config.to_json_string(), {k: [list(v.shape), str(v.dtype)] for k, v in probe.items()},
                      type(engine).__name__, setup.precision, device.type, device_name(device)])
    attention = choose_attention_once(key, model, lambda: engine.module(**probe), cache_dir() / "attention")
    if attention.name != "default" and rank == 0:  # a fallback is worth a line in the sweep log
        print(f"[calsweep] attention kernels: {attention.name} ({attention.report})", flush=True)
    return attention


def _sft_examples(trial: TrialConfig, tokenizer: Any) -> tuple[list[dict], list[dict]]:
    """The trial's SFT examples: (training, held out for validation: the last ``train.val_examples``)."""
    examples = build_sft_examples(trial.sft, tokenizer, trial.seed, trial.data_dir, cache=cache_dir() / "sft")
    held_out = examples[len(examples) - trial.train.val_examples:] if trial.train.val_examples else []
    examples = examples[: len(examples) - len(held_out)]
    if not examples:
        raise ValueError(f"expected at least one SFT example with response tokens, got 0 "
                         f"(max_examples={trial.sft.max_examples}, max_seq_len={trial.sft.max_seq_len})")
    return examples, held_out


def _total_steps(trial: TrialConfig, examples: list[dict], pack_width: int | None, world_size: int) -> int:
    """``train.max_steps``, else ``train.epochs`` epochs of optimiser steps over the (packed) rows."""
    rows = packed_row_count(examples, pack_width, trial.seed) if pack_width else len(examples)
    per_epoch = steps_per_epoch(rows, trial.train.micro_batch_size, trial.train.gradient_accumulation_steps,
                                world_size)
    return trial.train.max_steps or max(1, math.ceil(trial.train.epochs * per_epoch))


@dataclass
class DeferredStep:
    """A queued step whose loss is read after the next step is queued: its loss, its learning rate, and for a log
    step what it reports besides, copied behind its kernels: the plain loss (over the ranks), this rank's confidence."""

    step: int
    loss: PendingLoss
    lr: float
    plain: PendingLoss | None = None
    confidence: PendingLoss | None = None


@dataclass
class Training:
    """What the training phase measured: the last step's losses and confidence, the last validation loss, tokens."""

    step_loss: float
    plain_loss: float  # of the last reported step
    first_loss: float | None
    confidence: float
    val_loss: float | None
    prior_tokens: int  # this rank's tokens before a resumed attempt
    clock: StepClock  # this attempt's tokens and times (stopped)
    recomputed: int  # decoder layers that recomputed their activations (train.activation_checkpointing)


def train(trial: TrialConfig, setup: TrialSetup, device: torch.device, rank: int, world_size: int, report: Report,
          report_checkpoint: ReportCheckpoint | None) -> Training:
    """The optimiser steps from ``setup.start`` to ``setup.total_steps``: one line per step below, its schedules
    (fault injection, validation, logging, checkpoints) written out in the loop. The host waits for the GPU only
    to read a loss: a step's loss, and a log step's report, are read after the next step is queued; a step that
    validates, checkpoints, ends the warm-up or is the last reads its own at once."""
    engine, wrapped, total_steps, start, resumed = (setup.engine, setup.wrapped, setup.total_steps, setup.start,
                                                    setup.resumed)
    accumulation = trial.train.gradient_accumulation_steps
    engine.train()
    clock = StepClock(world_size, warmup_step_count(total_steps - start))
    schedule = checkpointing.CheckpointSchedule(trial.train.checkpoint_every_steps,
                                                trial.train.checkpoint_every_minutes, world_size, device)
    first_loss, step_loss = (resumed.train_loss_first, resumed.train_loss) if resumed else (None, math.nan)
    plain_loss = math.nan  # of the last reported step
    confidence = resumed.confidence if resumed else math.nan
    val_loss: float | None = resumed.val_loss if resumed else None
    prior_tokens = resumed.tokens if resumed else 0
    recomputed = checkpointed_count(trial.train.activation_checkpointing, len(decoder_layers(setup.model)))
    deferred: DeferredStep | None = None  # the previous step, read once this one is queued

    def settled(step: int, loss: PendingLoss) -> float:
        """Step ``step``'s loss, once its kernels are done: checked finite, the first kept, the clock told."""
        nonlocal first_loss
        value = loss.value()
        if not math.isfinite(value):
            raise NonFiniteLossError(f"training loss is {value} at step {step}; "
                                     f"expected a finite loss (lower the learning rate {trial.learning_rate})")
        clock.step_done(step - start)
        first_loss = value if first_loss is None else first_loss
        return value

    def progress(step: int, lr: float) -> dict[str, Any]:
        """The report of step ``step``, from the losses and confidence last read."""
        return {"phase": "train", "step": step, "total_steps": total_steps, "train_loss": step_loss,
                "train_loss_plain": plain_loss, "confidence": confidence, "lr": lr, "tokens_per_s": clock.rate(),
                "resumed_from_step": start}

    with setup.attention.context(), recomputed_layers(setup.model, recomputed), \
            compiled_decoder_layers(setup.model, compile_wanted(trial.train.compile, device)):
        for step in range(start + 1, total_steps + 1):
            micro_batches = [next(setup.batches) for _ in range(accumulation)]
            clock.tokens += sum(int(batch["attention_mask"].sum()) for batch in micro_batches)
            clock.rows += sum(len(batch["attention_mask"]) for batch in micro_batches)
            loss = PendingLoss(optimizer_step(engine, micro_batches, device, world_size), accumulation, world_size)
            plain_summed = wrapped.take_plain_loss()
            if deferred is not None:  # the previous step, read now that this step is queued behind it
                step_loss = settled(deferred.step, deferred.loss)
                if deferred.plain is not None:
                    plain_loss, confidence = deferred.plain.value(), deferred.confidence.value()
                    report(progress(deferred.step, deferred.lr))
            die_if_due(step, rank, trial.results_dir, trial.run_name, trial.trial_id)
            every = trial.train.val_every
            validate = setup.held_out and (step == total_steps or (every and step % every == 0))
            save = report_checkpoint is not None and schedule.due(step)
            at_once = validate or save or step == total_steps
            logged = at_once or step % trial.train.log_every == 0
            if not (at_once or step - start == clock.warmup_steps):
                deferred = DeferredStep(step, loss, engine.get_lr()[0])
                if logged:  # copied behind this step's kernels, read with its loss
                    deferred.plain = PendingLoss(plain_summed.to(device), accumulation, world_size)
                    deferred.confidence = PendingLoss(wrapped.last_confidence, 1, 1)
                continue
            deferred = None
            step_loss = settled(step, loss)
            if not logged:  # the warm-up's last step, read at once: the steady rate starts at its end
                continue
            confidence = float(wrapped.last_confidence)  # of this training batch: validation overwrites it
            if validate:
                with clock.paused():
                    val_loss = validation_loss(engine, setup.held_out, trial.train.micro_batch_size,
                                               setup.tokenizer.pad_token_id, device, setup.pad_to)
            plain_loss = global_mean_loss(plain_summed.to(device), accumulation, world_size)
            metrics = {**progress(step, engine.get_lr()[0]), **({"val_loss": val_loss} if validate else {})}
            if not save:
                report(metrics)
                continue
            state = checkpointing.LoopState(step, total_steps, first_loss, step_loss, confidence, val_loss,
                                            prior_tokens + clock.tokens)
            with clock.paused(), tempfile.TemporaryDirectory(prefix="calsweep-ckpt-") as directory:
                checkpointing.save(engine, Path(directory), state, trial.to_dict(), rank, world_size,
                                   wrapped.head.plan_history)
                report_checkpoint(metrics, Path(directory))
    clock.stop()
    return Training(step_loss, plain_loss, first_loss, confidence, val_loss, prior_tokens, clock, recomputed)


@dataclass
class Scores:
    """What the scoring phase measured (every rank that scored; under DeepSpeed's ZeRO-3 the other ranks help gather
    and get empty ones)."""

    summary: dict[str, dict[str, float]]  # task -> metric -> value (calibration.summary)
    records: Any  # the per-question records (pyarrow Table), or None
    entropy: dict[str, float]  # calibration.entropy.statistics.STATS, or {}
    eval_s: float


def score(trial: TrialConfig, setup: TrialSetup, device: torch.device, rank: int, world_size: int,
          writers: TrialWriters, recomputed: int) -> Scores:
    """Calibration of the trained model on ``eval.tasks`` (with an ATS head where ``eval.ats`` says), its questions
    stored (rank 0), and the entropy floor's inputs on the evaluation prompts (rank 0's scorer alone: no
    collective, ``calibration.entropy.prompt_states``). Across GPUs each rank scores its share of the questions
    (``trainable.scoring_shard``): under ZeRO-0/1/2 with the model it trained, under FSDP2 with its gathered plain
    copy, made after the optimizer's states are freed (training is over); under DeepSpeed's ZeRO-3 rank 0 scores
    them all. Forwards take ``trial_memory.scoring_batch`` rows and padded tokens at most (the layout that trained,
    ``recomputed`` layers)."""
    from calibration.entropy.prompt_states import evaluation_entropy_stats
    from calibration.evaluate import evaluate_model

    started = time.time()
    if not trial.eval.tasks:
        return Scores({}, None, {}, time.time() - started)
    setup.engine.eval()
    fsdp2, stage = isinstance(setup.engine, fsdp2_engine.Fsdp2Engine), resolved_stage(trial.train, world_size)
    shard = scoring_shard(rank, world_size, stage, fsdp2)
    if fsdp2:  # its optimizer states already freed (run_trial)
        scorer = fsdp2_weights.gathered_copy(setup.model, device, rank, setup.engine.compute_dtype,
                                             everywhere=shard is not None)
    else:
        scorer = zero3_scoring.scoring_model(setup.model, stage, device, rank, world_size)
    if scorer is None:
        return Scores({}, None, {}, time.time() - started)
    tokenizer, backends = setup.tokenizer, setup.attention.backends
    rows, tokens = trial_memory.scoring_batch(trial_memory.loaded_shape(setup.model.config, setup.facts["n_params"]),
                                              trial, trial_engine(setup.engine), setup.engine.zero_optimization_stage(),
                                              world_size, setup.row_width, recomputed, device.type)
    ats_head = trial_ats_head(scorer, tokenizer, trial, progress=rank == 0) if trial.eval.ats.enabled else None
    result = evaluate_model(scorer, tokenizer, tasks=trial.eval.tasks, data_dir=trial.data_dir, limit=trial.eval.limit,
                            batch_size=rows, batch_tokens=tokens,
                            n_bins=trial.eval.n_bins, heldout=trial.eval.temperature_scaling, progress=rank == 0,
                            attention=backends, prompt_cache=cache_dir() / "prompts", ats_head=ats_head,
                            shard=shard)
    entropy = {}
    if rank == 0:
        writers.write_questions(trial.results_dir, trial.run_name, trial.trial_id, result.records)
        entropy = evaluation_entropy_stats(scorer, tokenizer, trial.eval.tasks, data_dir=trial.data_dir,
                                           limit=trial.eval.limit, batch_size=rows, batch_tokens=tokens,
                                           attention=backends)
    del scorer
    return Scores(result.summary, result.records, entropy, time.time() - started)


def trial_result(trial: TrialConfig, setup: TrialSetup, trained: Training, scored: Scores, device: torch.device,
                 world_size: int, model_path: str | None, total_s: float, peaks: trial_memory.PhasePeaks,
                 compiled: dict[str, float]) -> TrialResult:
    """The phases' measurements as one ``TrialResult``; throughput counts every rank's tokens; ``compiled`` is
    ``node_setup.compile_counts_since`` the trial's start."""
    clock, facts, engine = trained.clock, setup.facts, setup.engine
    predicted = trial_memory.predicted_phase_peaks_gib(
        setup.model.config, facts["n_params"], trial, trial_engine(engine), engine.zero_optimization_stage(),
        world_size, setup.row_width, trained.recomputed, setup.precision, device)
    peak, peak_phase = peaks.peak()
    train_s = clock.stopped - clock.started
    steady = clock.steady_rate()
    flops = training_flops_per_token(facts["n_params"], facts["n_layers"], facts["hidden_size"],
                                     clock.mean_row_tokens() or setup.row_width)
    return TrialResult(
        model_source=setup.spec.source, model_location=setup.spec.location, **facts,
        train_loss=trained.step_loss, train_loss_plain=trained.plain_loss, train_loss_first=trained.first_loss,
        val_loss=trained.val_loss, train_confidence=trained.confidence, train_steps=setup.total_steps,
        resumed_from_step=setup.start, train_tokens=(trained.prior_tokens + clock.tokens) * world_size,
        tokens_per_s=clock.tokens * world_size / max(train_s, 1e-9), tokens_per_s_steady=steady,
        wall_warmup_s=clock.warmup_s(),
        mfu=model_flops_utilization(None if steady is None else steady / world_size, flops, device_name(device)),
        engine=trial_engine(engine), precision=setup.precision, attention=setup.attention.name,
        device=str(device.type), world_size=world_size,
        zero_stage=engine.zero_optimization_stage(), micro_batch_size=engine.train_micro_batch_size_per_gpu(),
        gradient_accumulation_steps=engine.gradient_accumulation_steps(),
        activation_checkpointing=trained.recomputed, gpu_peak_gib=peak, gpu_peak_phase=peak_phase,
        gpu_peak_predicted_gib=max(predicted.values()) if predicted else None,
        gpu_phase_peaks=trial_memory.phase_table(peaks.gib, predicted), gpu_alloc_retries=peaks.alloc_retries(),
        host_rss_gib=trial_memory.host_rss_gib(),
        wall_load_s=setup.load_s, wall_check_s=setup.check_s, wall_train_s=train_s, wall_eval_s=scored.eval_s, wall_total_s=total_s,
        model_path=model_path, node_id=ray_node_id(), **compiled,
        task_metrics=flat_metrics(scored.summary), entropy=scored.entropy)


def _write_final(directory: Path, final: dict[str, Any], records, trial: TrialConfig, world_size: int) -> None:
    import pyarrow.parquet as pq

    (directory / checkpointing.FINAL_FILE).write_text(json.dumps(final))
    checkpointing.write_trial_record(directory, trial.to_dict(), world_size)
    if records is not None:
        pq.write_table(records, directory / checkpointing.QUESTIONS_FILE)


def gather_for(engine: Any) -> Gather:
    """How the ranks gather ``engine``'s trained weights into rank 0's plain copy: FSDP2's full state dict (in its
    compute dtype), else DeepSpeed's gathered parameters."""
    if isinstance(engine, fsdp2_engine.Fsdp2Engine):
        return functools.partial(fsdp2_weights.gathered_copy, dtype=engine.compute_dtype)
    return zero3_scoring.gathered_copy


def device_name(device: torch.device) -> str | None:
    """The GPU's name (``torch.cuda.get_device_name``), None on the CPU."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else None


def trial_engine(engine: Any) -> str:
    """The ``train.engine`` name of the engine that ran: fsdp2 or deepspeed."""
    return "fsdp2" if isinstance(engine, fsdp2_engine.Fsdp2Engine) else "deepspeed"


def save_model(model: torch.nn.Module, tokenizer: Any, trial: TrialConfig, rank: int,
               write_model: Callable[[str, str, str, str], str], gather: Gather) -> str | None:
    """The trained model as a Hugging Face folder in the trial's place of the results store (rank 0 returns it,
    other ranks None; collective), its weights gathered by ``gather``. Written in a temporary folder first, then
    handed whole to ``write_model``."""
    with tempfile.TemporaryDirectory() as directory:
        saved = save_hf_model(model, tokenizer, rank, directory, gather)
        return write_model(trial.results_dir, trial.run_name, trial.trial_id, saved) if saved else None


def train_fn_per_worker(config: dict[str, Any], writers: TrialWriters) -> None:
    """Ray Train entry point (with ``writers`` bound: ``functools.partial``): rebuild the ``TrialConfig`` and run it
    on this worker's device, from the run's latest checkpoint if it has one (a retried or resumed trial)."""
    import ray.train
    import ray.train.torch
    from ray.train import CheckpointConsistencyMode

    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    context = ray.train.get_context()
    trial = TrialConfig.from_dict(config)
    rank = context.get_world_rank()
    gauges = LiveMetrics(trial.trial_id) if rank == 0 else None

    def report(metrics: dict[str, Any]) -> None:
        if gauges:
            gauges.set(metrics)
        ray.train.report(metrics)

    def report_checkpoint(metrics: dict[str, Any], directory: Path | None) -> None:
        if gauges:
            gauges.set(metrics)
        ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(directory) if directory else None)
        if metrics["phase"] == "train":  # training goes on once Ray Train has the checkpoint: a death from here on
            ray.train.get_all_reported_checkpoints(consistency_mode=CheckpointConsistencyMode.COMMITTED)  # resumes it

    device, world_size = ray.train.torch.get_device(), context.get_world_size()
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is None:
        run_trial(trial, device, rank, world_size, report, report_checkpoint, writers=writers)
        return
    with checkpoint.as_directory() as directory:
        run_trial(trial, device, rank, world_size, report, report_checkpoint, resume_from=Path(directory),
                  writers=writers)
