"""The paper's grid ships as three sweep configs (Alpaca, Tulu-3, OpenHermes-2.5) that load and agree."""

from pathlib import Path

import pytest

from sweeps.config import load_sweep, workers_for

CONFIGS = Path(__file__).resolve().parents[2] / "sweeps" / "configs"
FAMILIES = ("llama-3.2-1b", "llama-3.2-3b", "llama-3.1-8b", "gemma-2-2b", "mistral-7b-v0.3", "qwen2.5-7b")


@pytest.mark.parametrize("dataset", ["alpaca", "tulu3", "openhermes"])
def test_paper_config_is_the_144_point_grid_at_batch_128(dataset):
    sweep = load_sweep(CONFIGS / f"paper_{dataset}.yaml")
    assert sweep.families == FAMILIES
    assert sweep.learning_rates == (5e-6, 2e-5, 5e-5, 2e-4)
    assert sweep.label_smoothing == (0.0, 0.1, 0.2, 0.3, 0.4, 0.5)
    assert len(sweep.trial_points()) == 144 and len({sweep.trial(p).trial_id for p in sweep.trial_points()}) == 144
    assert sweep.sft.dataset == dataset and sweep.sft.max_examples is None and sweep.sft.max_seq_len == 2048
    train = sweep.train
    for family in FAMILIES:  # the batch DeepSpeed gets, whatever the layout: micro x accumulation x workers
        planned = sweep.trial(sweep.trial_points()[FAMILIES.index(family) * 24]).train
        assert planned.micro_batch_size * planned.gradient_accumulation_steps * workers_for(sweep, family) == 128
    # H100s: the 1-3B families on one GPU (FSDP2, nothing to shard), the 7-8B on two with ZeRO-3 on FSDP2 (Mistral's
    # ZeRO-2 on DeepSpeed stopped being the cheapest once DeepSpeed's ZeRO-0/1/2 peaks were scaled by 1.06)
    assert [(workers_for(sweep, f), sweep.layout(f).zero_stage, sweep.layout(f).engine) for f in FAMILIES] == [
        (1, 0, "fsdp2"), (1, 0, "fsdp2"), (2, 3, "fsdp2"), (1, 0, "fsdp2"), (2, 3, "fsdp2"), (2, 3, "fsdp2")]
    assert (train.dropout, train.precision, train.zero_stage) == (0.1, "bf16", "auto")
    assert (train.epochs, train.max_steps) == (1.0, None)
    assert sweep.eval.limit is None and set(sweep.eval.tasks) == {"mmlu", "arc_easy", "hellaswag"}
