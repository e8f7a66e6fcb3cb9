"""The FSDP2 engine (train.engine: fsdp2) steps as DeepSpeed ZeRO-0 does: same losses, learning rates and weights
after accumulated, clipped steps, also with compiled and recomputed decoder layers; its gathered copy holds the
trained weights (tied or not); a whole trial trains, scores and exports under it. Checkpoint and resume:
tests/trainable/test_checkpointing.py."""

import math

import pytest
import torch
from torch._dynamo.utils import counters
from transformers import AutoConfig, AutoModelForCausalLM

from sweeps import store
from trainable.compiled import compiled_decoder_layers
from trainable.config import TrainConfig, TrialConfig
from trainable.lm_head import CausalLMWithFusedLoss
from trainable.recompute import recomputed_layers
from trainable.step_accounting import global_mean_loss, optimizer_step
from trainable.worker import run_trial

SMALL = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=300, head_dim=8, attn_implementation="sdpa")
STEPS, ACCUMULATION = 3, 2


def _batches() -> list[list[dict[str, torch.Tensor]]]:
    generator = torch.Generator().manual_seed(1)
    steps = []
    for _ in range(STEPS):
        ids = [torch.randint(0, 300, (2, 12), generator=generator) for _ in range(ACCUMULATION)]
        steps.append([{"input_ids": i, "attention_mask": torch.ones_like(i), "labels": i} for i in ids])
    return steps


def _trained(engine_name: str, tied: bool, compiled: bool, recomputed: int):
    """(losses, lrs, trained weights by name, engine) of STEPS accumulated, clipped steps on one rank."""
    from trainable import deepspeed_setup, fsdp2_engine, fsdp2_weights

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model("llama", **SMALL, tie_word_embeddings=tied))
    wrapped = CausalLMWithFusedLoss(model, label_smoothing=0.1)
    train = TrainConfig(micro_batch_size=2, gradient_accumulation_steps=ACCUMULATION, precision="fp32",
                        warmup_ratio=0.34, max_grad_norm=0.05, weight_decay=0.1, engine=engine_name,
                        zero_stage=0 if engine_name == "deepspeed" else 3)
    build = fsdp2_engine.build_engine if engine_name == "fsdp2" else deepspeed_setup.build_engine
    engine, _ = build(wrapped, train, 1e-2, STEPS, torch.device("cpu"), 1)
    torch._dynamo.reset()
    counters.clear()
    losses, lrs = [], []
    with recomputed_layers(model, recomputed), compiled_decoder_layers(model, compiled, backend="aot_eager"):
        for micro_batches in _batches():
            losses.append(global_mean_loss(optimizer_step(engine, micro_batches, torch.device("cpu"), 1),
                                           ACCUMULATION, 1))
            lrs.append(engine.get_lr()[0])
    assert sum(counters["graph_break"].values()) == 0
    if engine_name == "fsdp2":
        copy = fsdp2_weights.gathered_copy(model, torch.device("cpu"), 0, torch.float32)
        assert (copy.get_output_embeddings().weight is copy.get_input_embeddings().weight) == tied
        return losses, lrs, dict(copy.named_parameters()), engine
    return losses, lrs, {k: v.detach().clone() for k, v in model.named_parameters()}, engine


@pytest.mark.parametrize("tied, compiled, recomputed", [(True, False, 0), (False, True, 2)])
def test_fsdp2_steps_like_deepspeed_zero0(one_rank_process_group, tied, compiled, recomputed):
    want_losses, want_lrs, want, reference = _trained("deepspeed", tied, False, 0)
    reference.destroy()
    losses, lrs, got, engine = _trained("fsdp2", tied, compiled, recomputed)
    assert engine.zero_optimization_stage() == 3 and engine.gradient_accumulation_steps() == ACCUMULATION
    assert engine.train_micro_batch_size_per_gpu() == 2 and lrs == want_lrs  # warmup, then cosine, stepped alike
    # float32 on the CPU, one rank, same AdamW and clipping: losses equal to a few ulps (sums may run in another
    # order; compiled layers fuse differently). Weights within 1e-5 (a thousandth of a step at lr 1e-2): AdamW divides
    # by sqrt(v) + eps, so an entry whose gradients are near 0 turns a few ulps of them into more (one embedding entry
    # of 9,600 moves 2.6e-6 apart, eager too)
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(want_losses), rtol=1e-5, atol=1e-6)
    assert losses[-1] < losses[0]
    assert got.keys() == want.keys()
    for name, weight in want.items():
        torch.testing.assert_close(got[name], weight, rtol=1e-5, atol=1e-5, msg=name)


def test_a_zero3_trial_trains_scores_and_exports_under_fsdp2(tiny_llama_config, data_dir, tmp_path,
                                                           one_rank_process_group):
    # the default engine ('auto') runs a ZeRO-3 layout on FSDP2
    from trainable.evaluate import main as evaluate

    trial = TrialConfig.from_dict(dict(
        run_name="unit", trial_id="t0", family="tiny", learning_rate=1e-3, label_smoothing=0.1, seed=3,
        data_dir=data_dir, results_dir=str(tmp_path / "results"), custom_models={"tiny": {"config": tiny_llama_config}},
        sft={"max_examples": 12, "max_seq_len": 96},
        train={"max_steps": 2, "micro_batch_size": 2, "gradient_accumulation_steps": 2, "dropout": 0.1,
               "log_every": 1, "zero_stage": 3, "save_model": True, "val_examples": 2},
        eval={"limit": 3, "batch_size": 4, "tasks": ["arc_easy"]}))
    reports = []
    final = run_trial(trial, torch.device("cpu"), rank=0, world_size=1, report=reports.append,
                      writers=store.trial_writers())
    assert [r["phase"] for r in reports] == ["train", "train", "done"]
    assert final["engine"] == "fsdp2" and final["zero_stage"] == 3 and final["attention"] == "default"
    assert math.isfinite(final["train_loss"]) and math.isfinite(final["val_loss"])
    assert final["arc_easy_n_questions"] == 3
    assert 0 <= final["arc_easy_ece"] <= 1 and final["entropy_floor"] <= final["mean_entropy"]
    ours = evaluate(["--model", final["model_path"], "--tasks", "arc_easy", "--limit", "3", "--data-dir", data_dir,
                     "--no-heldout", "--n-boot", "0", "--out", str(tmp_path / "eval")]).summary["arc_easy"]
    for metric in ("accuracy", "ece", "nll"):  # the exported folder is the model the trial scored
        assert ours[metric] == pytest.approx(final[f"arc_easy_{metric}"], abs=1e-6), metric
