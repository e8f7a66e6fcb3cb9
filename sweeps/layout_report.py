"""What ``--dry-run`` says of each family's layout: GPUs, ZeRO stage, micro-batch, recomputed layers, the memory
model's peak per GPU and the sweep's predicted GPU-hours: training (``trainable.layout.gpu_hours``: the trials'
tokens x FLOPs per token at the MFU recorded for the layout) plus what each trial and each actor spends around it
(``sweeps.trial_cost``: load, start, compile, scoring, export); and what the end of a sweep says of them: the
predicted GPU-hours beside the measured ones, each trial's wall time x the GPUs it held (``gpu_hours_line``)."""

from __future__ import annotations

import math
from typing import Any

from sweeps.config import SweepConfig
from sweeps.trial_cost import fixed_gpu_hours, started_processes


def trial_tokens(sweep: SweepConfig, family: str, sft_rows: int | None) -> float | None:
    """Tokens one trial of ``family`` trains on (upper bound: full rows of ``max_seq_len``): ``train.max_steps``
    steps of the layout's sequences, else ``train.epochs`` over the examples; None when neither is known."""
    layout, seq_len = sweep.layout(family), sweep.row_length
    if sweep.train.max_steps is not None:
        sequences = layout.workers * layout.micro_batch_size * layout.gradient_accumulation_steps
        return float(sweep.train.max_steps * sequences * seq_len)
    examples = sweep.sft.max_examples if sft_rows is None else min(sweep.sft.max_examples or sft_rows, sft_rows)
    return None if examples is None else float(sweep.train.epochs * examples * seq_len)


def sft_row_count(sweep: SweepConfig) -> int | None:
    """The SFT rows a trial could read, counted only when steps depend on them (no max_steps, no max_examples)."""
    if sweep.train.max_steps is not None or sweep.sft.max_examples is not None:
        return None
    from trainable.sft_data import load_conversations

    return len(load_conversations(sweep.sft, sweep.data_dir))


def family_trials(sweep: SweepConfig) -> dict[str, int]:
    """Trials planned per family: its grid points, or a study's samples shared evenly among the families."""
    if sweep.search.method == "optuna":
        return {f: math.ceil(sweep.search.num_samples / len(sweep.families)) for f in sweep.families}
    return {f: sum(1 for p in sweep.trial_points() if p.family == f) for f in sweep.families}


def scored_questions(sweep: SweepConfig) -> float:
    """Questions a trial scores, in zero-shot question texts: each task's ``eval.limit`` or its published size
    (``TaskConfig.questions``), x (1 + its shots), a k-shot prompt holding k + 1 questions' texts."""
    from calibration.task_config import TASKS

    def size(task: str) -> int:
        known, limit = TASKS[task].questions, sweep.eval.limit
        if limit is None:
            return known or 0
        return min(limit, known) if known else limit

    return float(sum(size(t) * (1 + TASKS[t].k_shot) for t in sweep.eval.tasks))


def family_gpu_hours(sweep: SweepConfig, family: str, sft_rows: int | None, gpus: int | None = None) -> float | None:
    """Predicted GPU-hours of the family's planned trials, each run to its end: training plus load, scoring and
    export per trial, start per process it starts and compile per actor it runs on (``sweeps.trial_cost``, its
    actors from the cluster's ``gpus``); None without a readable shape, a fitting layout or known steps."""
    from trainable.layout import gpu_hours

    shape, tokens = sweep.shape(family), trial_tokens(sweep, family, sft_rows)
    if shape is None or tokens is None or sweep.layout_problem(family):
        return None
    seq_len, layout, trials = sweep.row_length, sweep.layout(family), family_trials(sweep)[family]
    fixed = fixed_gpu_hours(shape, layout, trials, scored_questions(sweep), sweep.train.save_model, gpus,
                            sweep.resources.warm_trials, family_processes(sweep, gpus)[family])
    return trials * gpu_hours(shape, layout, tokens, seq_len) + fixed


def family_processes(sweep: SweepConfig, gpus: int | None) -> dict[str, int]:
    """Processes each family starts (``sweeps.trial_cost.started_processes``), the families in the order their
    first trials are handed out (``sweeps.search.trial_order``: the longest first)."""
    from sweeps.search import trial_order

    order = list(dict.fromkeys(point.family for point in trial_order(sweep)))
    trials = family_trials(sweep)
    return started_processes(((f, sweep.layout(f).workers, trials[f]) for f in order), gpus,
                             sweep.resources.warm_trials)


def sweep_gpus(sweep: SweepConfig) -> int | None:
    """The GPUs the launcher planned the sweep's concurrency for (``launch.plan_resources``: concurrent trials x
    the fewest workers a trial has x GPUs per worker); None before it has."""
    r = sweep.resources
    if not r.max_concurrent_trials or not isinstance(r.gpus_per_worker, (int, float)) or not r.gpus_per_worker:
        return None
    workers = min(sweep.layout(family).workers for family in sweep.families)
    return round(r.max_concurrent_trials * workers * r.gpus_per_worker)


def layout_table(sweep: SweepConfig, sft_rows: int | None = None, gpus: int | None = None) -> str:
    """One line per family and a total: layout, predicted peak GiB per GPU, trials, GPU-hours (actors for the
    cluster's ``gpus``, one per family when unknown)."""
    trials = family_trials(sweep)
    node = f"{gpus} GPUs" if gpus else "no GPUs seen: one actor per family"
    lines = [f"Layouts on {sweep.resources.planned_gpu_memory_gb:g} GiB GPUs (trainable/layout.py; GPU-hours: "
             f"training at the recorded MFU of each layout, 989 TFLOP/s bf16 peak, plus load, start, compile, "
             f"scoring and export, sweeps/trial_cost.py, for {node}):"]
    total, known = 0.0, True
    for family in sweep.families:
        layout, shape = sweep.layout(family), sweep.shape(family)
        problem = sweep.layout_problem(family)
        if shape is None or problem:
            why = problem or "shape unknown (no readable model config)"
            lines.append(f"  {family}: {layout.describe()} as configured; {why}")
            known = False
            continue
        hours = family_gpu_hours(sweep, family, sft_rows, gpus)
        total += hours or 0.0
        known = known and hours is not None
        cost = f"{hours:.3g} GPU-hours" if hours is not None else "GPU-hours unknown (steps unknown)"
        lines.append(f"  {family}: {layout.describe(shape.layers)}; peak {layout.peak_gib:.1f} GiB "
                     f"per GPU; {trials[family]} trial(s), {cost}")
    lines.append(f"  sweep: {total:.3g} GPU-hours" + ("" if known else " for the families above that are known"))
    return "\n".join(lines)


def measured_gpu_hours(sweep: SweepConfig, rows: list[dict[str, Any]]) -> float:
    """GPU-hours the stored trials held: each row's wall time (``started_at`` to ``finished_at``, its stored
    attempt) x its workers (``world_size``, else its family's layout's) x ``resources.gpus_per_worker``."""
    held = 0.0
    for row in rows:
        workers = row.get("world_size") or sweep.layout(row["family"]).workers
        seconds = (row["finished_at"] - row["started_at"]).total_seconds()
        held += seconds * workers * float(sweep.resources.gpus_per_worker or 0)
    return held / 3600


def predicted_gpu_hours(sweep: SweepConfig, sft_rows: int | None) -> float | None:
    """The dry run's GPU-hours of the whole sweep (``family_gpu_hours``, actors for the GPUs the launcher planned
    for: ``sweep_gpus``); None where a family's are unknown."""
    hours = [family_gpu_hours(sweep, family, sft_rows, sweep_gpus(sweep)) for family in sweep.families]
    return None if None in hours else sum(hours)


def gpu_hours_line(sweep: SweepConfig, rows: list[dict[str, Any]], sft_rows: int | None) -> str | None:
    """The end of a sweep's line: predicted GPU-hours (the dry run's) beside those its stored ``rows`` held; None
    for a sweep on CPUs (``resources.gpus_per_worker`` 0, as the launcher resolved it)."""
    if not sweep.resources.gpus_per_worker:
        return None
    hours = predicted_gpu_hours(sweep, sft_rows)
    predicted = "unknown" if hours is None else f"{hours:.3g}"
    return (f"GPU-hours: {predicted} predicted (training, load, start, compile, scoring and export, every planned "
            f"trial to its end), {measured_gpu_hours(sweep, rows):.3g} measured ({len(rows)} stored trial(s): "
            f"wall time x GPUs held)")


def alternatives_table(sweep: SweepConfig, sft_rows: int | None = None) -> str | None:
    """For each family whose planned layout recomputes layers, the layout the planner priced next with fewer
    recomputed layers (``SweepConfig.layout_with_less_recompute``: more GPUs, as a rule) and why the plan won: both
    layouts' planner cost (GPU-seconds per token, relative) and GPU-hours; and for a layout across nodes without
    HSDP, the peak HSDP would have (``hsdp_line``). None when there is nothing to say."""
    lines = []
    for family in sweep.families:
        shape, planned = sweep.shape(family), sweep.layout(family)
        if shape is None or sweep.layout_problem(family):
            continue
        other = sweep.layout_with_less_recompute(family)
        if other is not None:
            lines.append(f"  {family}: the plan above at cost {planned.cost:.3g}, "
                         f"{_hours(sweep, family, planned, sft_rows)}; or {other.describe(shape.layers)}; peak "
                         f"{other.peak_gib:.1f} GiB per GPU, cost {other.cost:.3g}, "
                         f"{_hours(sweep, family, other, sft_rows)}")
        hsdp = hsdp_line(sweep, family)
        if hsdp:
            lines.append(f"  {family}: {hsdp}")
    return "\n".join(["Alternatives (planner cost: GPUs / (MFU x recompute factor), lower wins):", *lines]) \
        if lines else None


def _hours(sweep: SweepConfig, family: str, layout: Any, sft_rows: int | None) -> str:
    """'N GPU-hours' of the family's trials on ``layout`` (``trainable.layout.gpu_hours``), or 'GPU-hours unknown'."""
    from trainable.layout import gpu_hours

    tokens = trial_tokens(sweep, family, sft_rows)
    if tokens is None:
        return "GPU-hours unknown (steps unknown)"
    seq_len = sweep.row_length
    return f"{family_trials(sweep)[family] * gpu_hours(sweep.shape(family), layout, tokens, seq_len):.3g} GPU-hours of training"


def hsdp_line(sweep: SweepConfig, family: str) -> str | None:
    """For a family planned as a full FSDP2 shard over more GPUs than a node has: the smallest peak per GPU of HSDP
    (replica groups of whole nodes) on the same GPUs, every layer recomputed, against the budget; else None."""
    from trainable.layout import GIB, budget_bytes, hsdp_replicas, phase_peaks

    layout, shape = sweep.layout(family), sweep.shape(family)
    options = [r for r in hsdp_replicas(layout.workers, sweep.resources.gpus_per_node) if r > 1]
    if layout.engine != "fsdp2" or layout.replicas > 1 or not options or shape is None:
        return None
    seq_len = sweep.row_length
    share = layout.micro_batch_size * layout.gradient_accumulation_steps
    peaks = {r: max(phase_peaks(shape, 3, layout.workers, 1, seq_len, True, engine="fsdp2", accumulation=share,
                                replicas=r).values()) for r in options}
    r = min(peaks, key=peaks.get)
    budget = budget_bytes(sweep.resources.planned_gpu_memory_gb * GIB, "fsdp2")
    return (f"not HSDP: {r} replicas x {layout.workers // r} shards would peak at {peaks[r] / GIB:.1f} GiB per GPU "
            f"at micro-batch 1 with every layer recomputed, over the {budget / GIB:.1f} GiB PyTorch may allocate; "
            f"a full shard over {layout.workers} GPUs")
