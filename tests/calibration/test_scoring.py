"""The shared-prefix scorer must equal plain full-sequence scoring, token for token."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from calibration.requests import encode_prompt
from calibration.scoring import score_prompts
from calibration.task_config import TASKS, load_prompts


def reference_loglik(model, tokenizer, prompt) -> np.ndarray:
    """sum_t log softmax(model(ctx + cont))[pos_t, cont_t], one full forward per choice, no cache."""
    ctx, conts = encode_prompt(tokenizer, prompt.prefix + prompt.query, prompt.continuations)
    values = []
    for cont in conts:
        with torch.no_grad():
            logits = model(torch.tensor([ctx + cont])).logits[0, len(ctx) - 1: -1]
        logprobs = logits.double().log_softmax(-1)
        values.append(sum(logprobs[t, token].item() for t, token in enumerate(cont)))
    return np.array(values)


@pytest.fixture(scope="module")
def expected(request, tokenizer, prompts):
    """Reference log-likelihoods per model, computed once."""
    return {name: [reference_loglik(request.getfixturevalue(name), tokenizer, p) for p in prompts]
            for name in ("llama", "gemma")}


@pytest.fixture(scope="module")
def prompts(mini_data):
    out = []
    for task in ("mmlu", "arc_easy", "arc_easy_lettered", "hellaswag"):
        out += load_prompts(TASKS[task], data_dir=mini_data, limit=3)[1]
    return out


@pytest.mark.parametrize("model_name", ["llama", "gemma"])
@pytest.mark.parametrize("share_prefix, batch_size", [(True, 1), (True, 3), (False, 4)])
def test_matches_full_sequence_scoring(request, tokenizer, prompts, expected, model_name, share_prefix, batch_size):
    model = request.getfixturevalue(model_name)
    got = score_prompts(model, tokenizer, prompts, batch_size=batch_size, share_prefix=share_prefix)
    for e, g in zip(expected[model_name], got):
        np.testing.assert_allclose(g, e, rtol=0, atol=2e-4)


def test_gemma_prefix_is_longer_than_its_sliding_window(tokenizer, prompts):
    ctx, _ = encode_prompt(tokenizer, prompts[0].prefix + prompts[0].query, prompts[0].continuations)
    assert len(ctx) > 8 * 10  # the tiny Gemma's window is 8: the cache must drop and mask old positions


def test_restores_training_mode_and_checks_batch_size(llama, tokenizer, prompts):
    llama.train()
    score_prompts(llama, tokenizer, prompts[:1])
    assert llama.training
    llama.eval()
    score_prompts(llama, tokenizer, prompts[:1])
    assert not llama.training
    with pytest.raises(ValueError, match="expected batch_size >= 1"):
        score_prompts(llama, tokenizer, prompts[:1], batch_size=0)
