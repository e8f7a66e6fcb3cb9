"""Hidden states of the evaluation prompts are the decoder's final ones, and the trial's entropy-floor statistics
come from them and the model's own (softcapped) head."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from calibration.entropy.statistics import STATS
from calibration.entropy.prompt_states import context_rows, evaluation_entropy_stats, prompt_hidden_states
from calibration.requests import encode_prompts
from calibration.task_config import DEFAULT_TASKS, TASKS, load_prompts


@pytest.fixture(scope="module")
def prompts(mini_data):
    return [p for task in DEFAULT_TASKS for p in load_prompts(TASKS[task], data_dir=mini_data, limit=3)[1]]


def _reference_states(model, rows) -> torch.Tensor:
    """hidden_states[-1] of one unpadded forward per row (the model's own output, after the final norm)."""
    with torch.no_grad():
        return torch.cat([model(input_ids=torch.tensor([row]), output_hidden_states=True).hidden_states[-1][0]
                          for row in rows])


@pytest.mark.parametrize("model_name", ["llama", "gemma"])
def test_states_are_the_decoders_final_ones_without_padding(request, tokenizer, prompts, model_name):
    model = request.getfixturevalue(model_name).eval()
    rows = context_rows(tokenizer, prompts, 10_000)
    assert len({len(r) for r in rows}) > 3  # batches of 3 rows of different lengths: padding to leave out
    got = prompt_hidden_states(model, rows, batch_size=3)
    expected = _reference_states(model, rows)
    assert got.shape == (sum(map(len, rows)), model.config.hidden_size)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
    assert not model.training


def test_context_rows_are_the_scorers_contexts_cut_to_the_budget(tokenizer, prompts):
    contexts = [ctx for ctx, _ in encode_prompts(tokenizer, [(p.prefix + p.query, p.continuations) for p in prompts])]
    budget = len(contexts[0]) + len(contexts[1]) + 5
    assert context_rows(tokenizer, prompts, budget) == [contexts[0], contexts[1], contexts[2][:5]]
    assert context_rows(tokenizer, prompts, 10 ** 6) == contexts
    with pytest.raises(ValueError, match="max_tokens >= 1, got 0"):
        context_rows(tokenizer, prompts, 0)


def test_stats_use_the_softcapped_head_on_each_tasks_first_contexts(gemma, tokenizer, mini_data):
    """Mean entropy against a float64 one from the model's own logits (Gemma's softcap 30 included), over the same
    budgeted contexts; sigma_c against torch's spectral norm; the floor below the entropy."""
    stats = evaluation_entropy_stats(gemma, tokenizer, DEFAULT_TASKS, data_dir=mini_data, limit=2, max_tokens=300)
    assert tuple(stats) == STATS
    rows = [row for task in DEFAULT_TASKS
            for row in context_rows(tokenizer, load_prompts(TASKS[task], data_dir=mini_data, limit=2)[1], 100)]
    assert sum(map(len, rows)) <= 300
    with torch.no_grad():
        logits = torch.cat([gemma(input_ids=torch.tensor([row])).logits[0] for row in rows]).double()
    log_p = logits.log_softmax(-1)
    assert stats["mean_entropy"] == pytest.approx(float(-(log_p.exp() * log_p).sum(-1).mean()), rel=1e-5)
    hidden = _reference_states(gemma, rows)
    assert stats["sigma_h_max"] == pytest.approx(float(hidden.abs().max()), rel=1e-6)
    weight = gemma.get_output_embeddings().weight.detach().double()
    assert stats["sigma_c"] == pytest.approx(float(torch.linalg.matrix_norm(weight, ord=2)), rel=1e-9)
    assert stats["rho"] == pytest.approx(stats["sigma_c"] * stats["sigma_h_max"], rel=1e-12)
    assert 0 < stats["entropy_floor"] <= stats["mean_entropy"] <= math.log(gemma.config.vocab_size)
    assert stats["sigma_h_p999"] <= stats["sigma_h_max"]


def test_a_head_that_is_no_plain_linear_gives_nothing_and_runs_no_forward(tokenizer, mini_data):
    from transformers import LlamaConfig, LlamaForCausalLM

    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2))
    model.set_output_embeddings(nn.Linear(32, len(tokenizer), bias=True))  # a bias: not softcap(h W^T)
    calls = []
    model.get_decoder().register_forward_hook(lambda *_: calls.append(1))
    assert evaluation_entropy_stats(model, tokenizer, ["arc_easy"], data_dir=mini_data, limit=2) == {}
    assert calls == []  # what a lone rank may call on a ZeRO-3-partitioned scorer: no collective forward
    with pytest.raises(ValueError, match="max_tokens >= one per task, got 3 tasks and max_tokens=2"):
        evaluation_entropy_stats(model, tokenizer, DEFAULT_TASKS, data_dir=mini_data, max_tokens=2)
