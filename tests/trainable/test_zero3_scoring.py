"""After ZeRO-3, the gathered plain copy computes what the partitioned model computes."""

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from trainable.config import TrainConfig
from trainable.lm_head import CausalLMWithFusedLoss
from trainable.zero3_scoring import scoring_model

SMALL = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=300, head_dim=8)


@pytest.mark.parametrize("tied", [False, True])
def test_gathered_copy_scores_like_the_partitioned_model(one_rank_process_group, tied):
    from trainable.deepspeed_setup import build_engine

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model("llama", **SMALL, tie_word_embeddings=tied,
                                                                  attn_implementation="sdpa"))
    wrapped = CausalLMWithFusedLoss(model, label_smoothing=0.1)
    engine, _ = build_engine(wrapped, TrainConfig(micro_batch_size=1, zero_stage=3, precision="fp32"), 1e-3, 1,
                             torch.device("cpu"), 1)
    assert all(p.numel() == 0 for p in model.model.layers.parameters())  # partitioned: weights live in ZeRO-3
    ids = torch.randint(0, 300, (2, 11), generator=torch.Generator().manual_seed(1))
    engine.eval()
    with torch.no_grad():
        want = model(input_ids=ids).logits
    copy = scoring_model(model, 3, torch.device("cpu"), rank=0, world_size=1)
    assert copy is not model and all(p.numel() > 0 for p in copy.parameters())
    assert (copy.get_output_embeddings().weight is copy.get_input_embeddings().weight) == tied
    with torch.no_grad():
        got = copy(input_ids=ids).logits
    torch.testing.assert_close(got, want, rtol=0, atol=0)  # same weights, same float32 kernels: bit-identical
    assert scoring_model(model, 2, torch.device("cpu"), rank=0, world_size=1) is model
