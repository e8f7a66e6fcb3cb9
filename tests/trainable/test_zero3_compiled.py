"""ZeRO-3 with compiled decoder layers: each layer a ZeRO-3 leaf module, so its graph holds none of DeepSpeed's hooks
(no graph break, no recompile across layers or steps), and the losses match ZeRO-0's; the same with recomputed
(activation-checkpointed) layers."""

import pytest
import torch
from torch._dynamo.utils import counters
from transformers import AutoConfig, AutoModelForCausalLM

from trainable.compiled import compiled_decoder_layers
from trainable.config import TrainConfig
from trainable.lm_head import CausalLMWithFusedLoss
from trainable.recompute import checkpointed_count, recomputed_layers
from trainable.step_accounting import global_mean_loss, optimizer_step

SMALL = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=300, head_dim=8, attn_implementation="sdpa")
STEPS = 3


def _losses(stage: int, compiled: bool, recomputed: int) -> tuple[list[float], dict]:
    from trainable.deepspeed_setup import build_engine

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model("llama", **SMALL))
    wrapped = CausalLMWithFusedLoss(model, label_smoothing=0.1)
    train = TrainConfig(micro_batch_size=2, zero_stage=stage, precision="fp32", warmup_ratio=0.0)
    engine, _ = build_engine(wrapped, train, 1e-2, STEPS, torch.device("cpu"), 1)
    ids = torch.randint(0, 300, (2, 12), generator=torch.Generator().manual_seed(1))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}
    torch._dynamo.reset()
    counters.clear()
    losses = []
    with recomputed_layers(model, recomputed), compiled_decoder_layers(model, compiled, backend="aot_eager"):
        for _ in range(STEPS):
            losses.append(global_mean_loss(optimizer_step(engine, [batch], torch.device("cpu"), 1), 1, 1))
    seen = {"graphs": counters["stats"]["unique_graphs"], "breaks": sum(counters["graph_break"].values()),
            "recompiles": sum(counters["recompiles"].values()) if "recompiles" in counters else 0}
    engine.destroy()
    return losses, seen


@pytest.mark.parametrize("recomputed", [0, 2])
def test_zero3_compiled_layers_have_no_hooks_in_their_graphs(one_rank_process_group, recomputed):
    want, _ = _losses(0, compiled=False, recomputed=0)
    got, seen = _losses(3, compiled=True, recomputed=recomputed)
    print(f"ZeRO-3 compiled, {recomputed} recomputed layers: {seen}")
    assert seen["breaks"] == 0  # DeepSpeed's gather/release hooks run outside the layers' graphs
    # one graph for the plain layers; recomputed layers run another wrapper: one graph each of the two kinds
    assert seen["graphs"] == (2 if recomputed else 1)
    # float32 on CPU, same updates; ZeRO-3's flat fp32 partitions sum gradients in another order: a few ulps
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-5, atol=1e-6)
    assert got[-1] < got[0]  # it trains


def test_checkpointed_count_reads_the_setting():
    assert checkpointed_count(True, 16) == 16 and checkpointed_count(False, 16) == 0
    assert checkpointed_count("auto", 16) == 0 and checkpointed_count(4, 16) == 4 and checkpointed_count(40, 16) == 16
