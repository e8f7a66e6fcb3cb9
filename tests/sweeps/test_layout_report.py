"""What the launcher says of layouts: the dry run's table (GPU-hours from tokens) and the GPU probe's check."""

from pathlib import Path

import pytest

from sweeps.config import load_sweep
from sweeps.layout_report import layout_table, trial_tokens
from sweeps.gpu_sharing import layout_check

PAPER = Path(__file__).resolve().parents[2] / "sweeps" / "configs" / "paper_alpaca.yaml"


def test_table_lists_each_family_and_sums_gpu_hours():
    sweep = load_sweep(PAPER)
    text = layout_table(sweep, sft_rows=52_002)
    # FSDP2 with accumulation keeps 10% of an H100 free (no peak recorded yet): micro-batch 1, 5 layers recomputed
    assert "llama-3.1-8b: 2 GPUs, FSDP2 (ZeRO-3 layout), micro-batch 1 x 64, 5/32 layers checkpointed" in text
    assert "llama-3.2-1b: 1 GPU, FSDP2, micro-batch 2 x 64" in text  # the default: one GPU on FSDP2
    hours = [float(line.split("trial(s), ")[1].split(" GPU-hours")[0]) for line in text.splitlines()[1:-1]]
    total = float(text.splitlines()[-1].split("sweep: ")[1].split()[0])
    assert total == pytest.approx(sum(hours), rel=0.005)  # each printed to 3 digits
    assert trial_tokens(sweep, "llama-3.2-1b", 52_002) == 52_002 * 2048  # one epoch of full rows
    steps = load_sweep(PAPER, {}, ["train.max_steps=10"])
    assert trial_tokens(steps, "llama-3.1-8b", None) == 10 * 128 * 2048  # 10 steps of 128 sequences on 2 GPUs
    fsdp2 = layout_table(load_sweep(PAPER, {}, ["train.engine=fsdp2"]), sft_rows=52_002)
    assert "llama-3.2-1b: 1 GPU, FSDP2, micro-batch 2 x 64" in fsdp2
    deepspeed = layout_table(load_sweep(PAPER, {}, ["train.engine=deepspeed"]), sft_rows=52_002)
    assert "llama-3.2-1b: 1 GPU, ZeRO-0, micro-batch 2 x 64" in deepspeed
    assert "llama-3.1-8b: 2 GPUs, ZeRO-3, micro-batch 1 x 64, 21/32 layers checkpointed" in deepspeed


def test_probe_peak_is_checked_against_the_layout():
    sweep = load_sweep(PAPER)
    predicted = sweep.layout("llama-3.2-1b").peak_bytes
    assert layout_check(sweep, "llama-3.2-1b", 0.95 * predicted).endswith("(-5%)")
    assert layout_check(sweep, "llama-3.2-1b", 1.2 * predicted).endswith("by more than 10%")
    assert "not one GPU's" in layout_check(sweep, "llama-3.1-8b", 1.0)
