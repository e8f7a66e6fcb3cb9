"""The fused head computes the same loss and gradients as the model's own logits path."""

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from trainable.lm_head import CausalLMWithFusedLoss


def _model(arch: str, **config):
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(AutoConfig.for_model(arch, **config), dtype=torch.float64)


def _batch(vocab: int):
    g = torch.Generator().manual_seed(1)
    input_ids = torch.randint(0, vocab, (2, 12), generator=g)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 9:] = 0
    labels = input_ids.clone()
    labels[:, :4] = -100  # prompt
    labels[attention_mask == 0] = -100
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


SMALL = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=300, head_dim=8)


def test_beta_zero_matches_the_hf_model_loss_and_keeps_tied_weights():
    model = _model("llama", **SMALL, tie_word_embeddings=True)
    batch = _batch(300)
    expected = model(**batch).loss
    wrapped = CausalLMWithFusedLoss(model, label_smoothing=0.0)
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    torch.testing.assert_close(wrapped(**batch), expected.double(), rtol=1e-6, atol=1e-7)  # HF upcasts to fp32
    assert torch.equal(model(input_ids=batch["input_ids"]).logits,
                       model.get_output_embeddings()(model.get_decoder()(input_ids=batch["input_ids"])[0]))


@pytest.mark.parametrize("arch, extra", [("llama", {}), ("gemma2", {"final_logit_softcapping": 5.0})])
def test_fused_equals_torch_logits_path_with_smoothing(arch, extra):
    """Value and gradient of every parameter, float64; gemma2 exercises the softcap path."""
    batch = _batch(300)
    results = []
    for impl in ("fused", "torch"):
        model = _model(arch, **SMALL, **extra)
        loss = CausalLMWithFusedLoss(model, label_smoothing=0.1, loss_impl=impl)(**batch)
        loss.backward()
        results.append((loss.detach(), [p.grad.clone() for p in model.parameters()]))
    (fused, fused_grads), (reference, reference_grads) = results
    torch.testing.assert_close(fused, reference, rtol=1e-9, atol=1e-10)
    for a, b in zip(fused_grads, reference_grads):
        torch.testing.assert_close(a, b, rtol=1e-7, atol=1e-10)


def test_the_loss_filter_reaches_the_kernel(tiny_llama_config) -> None:
    import transformers

    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**tiny_llama_config))
    ids = torch.randint(0, tiny_llama_config["vocab_size"], (1, 8))
    batch = dict(input_ids=ids, attention_mask=torch.ones_like(ids), labels=ids)
    CausalLMWithFusedLoss(model, 0.1, loss_filter="loose")(**batch)  # accepted (exact on the CPU path)
    with pytest.raises(ValueError, match="expected filter in \\('exact', 'loose', 'none'\\), got 'fast'"):
        CausalLMWithFusedLoss(model, 0.1, loss_filter="fast")(**batch)


@pytest.mark.parametrize("loss_impl", ["fused", "torch"])
def test_the_plain_loss_is_the_unsmoothed_cross_entropy_scaled_like_the_loss(tiny_llama_config, loss_impl) -> None:
    import torch.nn.functional as F
    import transformers

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**tiny_llama_config)).double()
    wrapped = CausalLMWithFusedLoss(model, 0.3, loss_impl=loss_impl)
    ids = torch.randint(0, tiny_llama_config["vocab_size"], (2, 9))
    labels = ids.clone()
    labels[:, :3] = -100  # a prompt
    batches = [dict(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels)] * 2
    logits = model(input_ids=ids).logits[:, :-1].flatten(0, 1)
    want = F.cross_entropy(logits, labels[:, 1:].flatten(), ignore_index=-100)  # float64 truth, no smoothing
    divisor = torch.tensor(0.5)
    for batch in batches:  # two micro-batches of the training loop: sums / divisor accumulate
        wrapped(**batch, loss_divisor=divisor)
    tokens = int((labels[:, 1:] != -100).sum())
    torch.testing.assert_close(wrapped.take_plain_loss(), 2 * want.float() * tokens / divisor, rtol=1e-6, atol=0)
    assert float(wrapped.take_plain_loss()) == 0.0  # taken and reset
    wrapped.eval()
    wrapped(**batches[0])  # evaluation forwards (validation) are not training losses
    assert float(wrapped.take_plain_loss()) == 0.0
    wrapped.train()
    wrapped(**batches[0])  # without a divisor: the batch's mean
    torch.testing.assert_close(wrapped.take_plain_loss().double(), want, rtol=1e-6, atol=0)


def test_the_attention_checks_probes_add_no_plain_loss(tiny_llama_config) -> None:
    import transformers

    from trainable.attention_check import choose_attention

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**tiny_llama_config))
    wrapped = CausalLMWithFusedLoss(model, 0.0).train()
    batch = _batch(tiny_llama_config["vocab_size"])
    choose_attention(model, lambda: wrapped(**batch))  # the trial loop's probes, before step 1
    assert float(wrapped.take_plain_loss()) == 0.0
    loss = wrapped(**batch)  # step 1 at beta 0: plain and smoothed are the same number
    torch.testing.assert_close(wrapped.take_plain_loss(), loss.detach(), rtol=1e-5, atol=0)
