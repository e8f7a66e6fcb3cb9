"""The pre-training attention check against PyTorch's math kernel, on a real model and batch (CPU)."""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention import SDPBackend

from trainable.attention_check import MATH, agreement, choose_attention, choose_attention_once, loss_and_input_grad
from trainable.lm_head import CausalLMWithFusedLoss
from common.models import load_model, load_tokenizer, resolve_model
from trainable.sft_data import build_sft_examples, collate
from trainable.config import SFTConfig, TrialConfig


@pytest.fixture(scope="module")
def wrapped_and_batch(tiny_llama_config, data_dir):
    specs = TrialConfig.from_dict(dict(run_name="a", trial_id="t", family="tiny", learning_rate=1e-3,
                                       label_smoothing=0.1, custom_models={"tiny": {"config": tiny_llama_config}}
                                       )).custom_specs()
    spec = resolve_model("tiny", specs)
    tokenizer = load_tokenizer(spec, specs)
    model = load_model(spec, seed=0, attention_dropout=0.5)  # dropout on: the check must switch it off
    examples = build_sft_examples(SFTConfig(max_examples=6, max_seq_len=96), tokenizer, 0, data_dir)
    return CausalLMWithFusedLoss(model, 0.1), collate(examples[:4], tokenizer.pad_token_id, 8)


def test_sdpa_s_own_kernel_agrees_with_math_and_is_kept(wrapped_and_batch):
    wrapped, batch = wrapped_and_batch
    wrapped.train()
    choice = choose_attention(wrapped.model, lambda: wrapped(**batch))
    assert choice.name == "default" and choice.backends is None and choice.report["default"].startswith("agrees")
    assert wrapped.training and all(p.grad is None for p in wrapped.parameters())  # mode restored, no .grad


def test_a_kernel_set_that_cannot_run_is_skipped_for_the_next(wrapped_and_batch):
    wrapped, batch = wrapped_and_batch
    candidates = (("cudnn_only", (SDPBackend.CUDNN_ATTENTION,)), ("math", MATH))  # no cuDNN kernel on CPU
    choice = choose_attention(wrapped.model, lambda: wrapped(**batch), candidates)
    assert choice.name == "math" and choice.backends == MATH
    assert choice.report["cudnn_only"].startswith("fails:") and choice.report["math"] == "reference"


def test_the_ranks_keep_a_candidate_only_if_it_agrees_on_all_of_them(wrapped_and_batch, one_rank_process_group):
    wrapped, batch = wrapped_and_batch  # a one-rank gloo group: the and-reduction runs and keeps the agreement
    assert choose_attention(wrapped.model, lambda: wrapped(**batch)).name == "default"


def test_one_rank_checks_each_key_once(wrapped_and_batch):
    """A warm process's later trial of the same key takes the first check's choice: no forward runs."""
    wrapped, batch = wrapped_and_batch
    forwards = []

    def loss():
        forwards.append(1)
        return wrapped(**batch)

    first = choose_attention_once("test-key", wrapped.model, loss)
    checked = len(forwards)
    assert first.name == "default" and checked >= 2  # the math reference and SDPA's own choice
    assert choose_attention_once("test-key", wrapped.model, loss) is first and len(forwards) == checked
    assert choose_attention_once("test-other-key", wrapped.model, loss).name == "default" and len(forwards) > checked


def test_the_input_gradient_matches_autograd_through_the_whole_model(wrapped_and_batch):
    wrapped, batch = wrapped_and_batch
    wrapped.eval()
    embeds = wrapped.model.get_input_embeddings()(batch["input_ids"]).detach().requires_grad_(True)
    hidden = wrapped.model.get_decoder()(inputs_embeds=embeds, attention_mask=batch["attention_mask"]).last_hidden_state
    targets = torch.cat([batch["labels"][:, 1:], torch.full_like(batch["labels"][:, :1], -100)], dim=1)
    loss, _, _ = wrapped.head(hidden, targets, label_smoothing=0.1)
    loss.backward()
    got_loss, got_grad = loss_and_input_grad(lambda: wrapped(**batch), wrapped.model.get_input_embeddings(), MATH)
    assert got_loss == pytest.approx(float(loss), rel=1e-6)
    torch.testing.assert_close(got_grad, embeds.grad.float().flatten(), rtol=1e-4, atol=1e-7)


def test_agreement_tolerates_rounding_and_rejects_a_wrong_kernel():
    g = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    noise = 1e-3 * torch.randn(1000, generator=torch.Generator().manual_seed(1))
    assert agreement(2.2450, g + noise, 2.2437, g)[0]  # bf16-size differences
    assert not agreement(5.19, g, 2.24, g)[0]  # the loss of a forward that sees the wrong tokens
    assert not agreement(2.24, torch.randn(1000, generator=torch.Generator().manual_seed(2)), 2.24, g)[0]
