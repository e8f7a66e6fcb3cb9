"""save_hf_model: the trained weights (ZeRO-3 partitioned or not) and the tokenizer as a folder that Hugging Face
reloads to the very logits the trained model computes."""

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from trainable.config import TrainConfig
from trainable.export import save_hf_model
from trainable.lm_head import CausalLMWithFusedLoss


def _tiny(config: dict) -> torch.nn.Module:
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(AutoConfig.for_model("llama", **config, attn_implementation="sdpa"))


@pytest.mark.parametrize("stage", [2, 3])
def test_saved_folder_reloads_to_the_trained_logits(tiny_llama_config, smollm2_tokenizer, one_rank_process_group,
                                                     tmp_path, stage):
    from trainable.deepspeed_setup import build_engine

    model = _tiny(tiny_llama_config)
    engine, _ = build_engine(CausalLMWithFusedLoss(model, label_smoothing=0.1),
                             TrainConfig(micro_batch_size=2, zero_stage=stage, precision="fp32", warmup_ratio=0.0),
                             1e-2, 2, torch.device("cpu"), 1)
    ids = torch.randint(0, tiny_llama_config["vocab_size"], (2, 12), generator=torch.Generator().manual_seed(1))
    for _ in range(2):
        engine.backward(engine(input_ids=ids, attention_mask=torch.ones_like(ids), labels=ids))
        engine.step()
    engine.eval()
    with torch.no_grad():
        trained = model(input_ids=ids).logits
        untrained = _tiny(tiny_llama_config).eval()(input_ids=ids).logits
    assert not torch.allclose(trained, untrained, atol=1e-3)  # two steps at lr 1e-2 moved the weights

    saved = save_hf_model(model, smollm2_tokenizer, 0, tmp_path / "model")
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in saved.iterdir()}
    reloaded = AutoModelForCausalLM.from_pretrained(saved, attn_implementation="sdpa").eval()
    assert {p.dtype for p in reloaded.parameters()} == {torch.float32}  # the dtype it trained in
    with torch.no_grad():
        torch.testing.assert_close(reloaded(input_ids=ids).logits, trained, rtol=0, atol=0)
    text = "Label smoothing, then calibration."
    assert AutoTokenizer.from_pretrained(saved)(text).input_ids == smollm2_tokenizer(text).input_ids
    assert save_hf_model(model, smollm2_tokenizer, 1, tmp_path / "rank1") is None  # only rank 0 writes
    assert not (tmp_path / "rank1").exists()
