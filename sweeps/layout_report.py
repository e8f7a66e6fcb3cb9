"""What ``--dry-run`` says of each family's layout: GPUs, ZeRO stage, micro-batch, recomputed layers, the memory
model's peak per GPU and the sweep's predicted GPU-hours (``trainable.layout.gpu_hours``: the trials' tokens x
FLOPs per token at the MFU recorded for the layout)."""

from __future__ import annotations

import math

from sweeps.config import SweepConfig


def trial_tokens(sweep: SweepConfig, family: str, sft_rows: int | None) -> float | None:
    """Tokens one trial of ``family`` trains on (upper bound: full rows of ``max_seq_len``): ``train.max_steps``
    steps of the layout's sequences, else ``train.epochs`` over the examples; None when neither is known."""
    layout, seq_len = sweep.layout(family), sweep.train.pack_length or sweep.sft.max_seq_len
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


def layout_table(sweep: SweepConfig, sft_rows: int | None = None) -> str:
    """One line per family and a total: layout, predicted peak GiB per GPU, trials, GPU-hours."""
    from trainable.layout import gpu_hours

    seq_len = sweep.train.pack_length or sweep.sft.max_seq_len
    trials = {f: sum(1 for p in sweep.trial_points() if p.family == f) for f in sweep.families}
    if sweep.search.method == "optuna":
        trials = {f: math.ceil(sweep.search.num_samples / len(sweep.families)) for f in sweep.families}
    lines = [f"Layouts on {sweep.resources.planned_gpu_memory_gb:g} GiB GPUs (trainable/layout.py; GPU-hours at the "
             f"recorded MFU of each layout, 989 TFLOP/s bf16 peak):"]
    total, known = 0.0, True
    for family in sweep.families:
        layout, shape = sweep.layout(family), sweep.shape(family)
        problem = sweep.layout_problem(family)
        if shape is None or problem:
            why = problem or "shape unknown (no readable model config)"
            lines.append(f"  {family}: {layout.describe()} as configured; {why}")
            known = False
            continue
        tokens = trial_tokens(sweep, family, sft_rows)
        hours = None if tokens is None else trials[family] * gpu_hours(shape, layout, tokens, seq_len)
        total += hours or 0.0
        known = known and hours is not None
        cost = f"{hours:.3g} GPU-hours" if hours is not None else "GPU-hours unknown (steps unknown)"
        lines.append(f"  {family}: {layout.describe(shape.layers)}; peak {layout.peak_gib:.1f} GiB "
                     f"per GPU; {trials[family]} trial(s), {cost}")
    lines.append(f"  sweep: {total:.3g} GPU-hours" + ("" if known else " for the families above that are known"))
    return "\n".join(lines)
