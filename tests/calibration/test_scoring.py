"""The shared-prefix scorer must equal plain full-sequence scoring, token for token."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from calibration.requests import Group, Row, encode_prompt, plan
from calibration.scoring import batches, checked_output_layer, score_prompts
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
@pytest.mark.parametrize("share_prefix, batch_size, batch_tokens", [(True, 1, None), (True, 3, None), (False, 4, None),
                                                                    (True, 64, 120), (False, 64, 300)])
def test_matches_full_sequence_scoring(request, tokenizer, prompts, expected, model_name, share_prefix, batch_size,
                                       batch_tokens):
    model = request.getfixturevalue(model_name)
    got = score_prompts(model, tokenizer, prompts, batch_size=batch_size, batch_tokens=batch_tokens,
                        share_prefix=share_prefix)
    for e, g in zip(expected[model_name], got):
        np.testing.assert_allclose(g, e, rtol=0, atol=2e-4)


@pytest.mark.parametrize("model_name", ["llama", "gemma"])
@pytest.mark.parametrize("batch_size, batch_tokens", [(64, None), (2, 4000)])
def test_rows_of_several_subjects_share_one_forward_off_left_padded_prefixes(request, tokenizer, shared_data,
                                                                              model_name, batch_size, batch_tokens):
    """Real 5-shot MMLU prompts of three subjects (prefixes of different lengths, all far longer than the tiny
    Gemma's sliding window of 8): one chunk of prefixes, rows of every subject in each batch; and chunks cut by
    batch_size."""
    model = request.getfixturevalue(model_name)
    every = load_prompts(TASKS["mmlu"], data_dir=shared_data, limit=400)[1]
    chosen = [every[i] for i in (0, 1, 100, 101, 250, 251)]
    groups = plan(tokenizer, chosen)
    assert len({len(g.prefix) for g in groups}) == 3
    chunks = list(batches(groups, batch_size, batch_tokens, length=lambda group: len(group.prefix)))
    assert len(chunks) == (1 if batch_tokens is None else 2)
    got = score_prompts(model, tokenizer, chosen, batch_size=batch_size, batch_tokens=batch_tokens)
    for prompt, g in zip(chosen, got):
        np.testing.assert_allclose(g, reference_loglik(model, tokenizer, prompt), rtol=0, atol=2e-4)


def test_prefixes_are_cut_into_forwards_like_rows():
    groups = [Group(list(range(n)), []) for n in (5, 9, 3, 30, 2, 2)]
    prefix_length = lambda group: len(group.prefix)  # noqa: E731
    assert [[len(g.prefix) for g in c] for c in batches(groups, 2, None, prefix_length)] == [[30, 9], [5, 3], [2, 2]]
    assert [[len(g.prefix) for g in c] for c in batches(groups, 10, 20, prefix_length)] == [[30], [9, 5], [3, 2, 2]]


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
    with pytest.raises(ValueError, match="expected batch_tokens >= 1 or None, got 0"):
        score_prompts(llama, tokenizer, prompts[:1], batch_tokens=0)


def test_reads_come_from_hidden_states_where_the_head_is_a_plain_softcapped_linear(llama, gemma, tokenizer, prompts):
    groups = plan(tokenizer, prompts)
    assert checked_output_layer(llama, groups).softcap is None
    assert checked_output_layer(gemma, groups).softcap == 30.0  # Gemma's final-logit softcap, from its config


def test_a_model_with_extra_logit_scaling_is_scored_through_its_own_logits(tokenizer, prompts):
    from transformers import GraniteConfig, GraniteForCausalLM

    torch.manual_seed(0)
    granite = GraniteForCausalLM(GraniteConfig(  # logits = lm_head(h) / logits_scaling: not softcap(h W^T)
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, logits_scaling=4.0, max_position_embeddings=4096)).eval()
    assert checked_output_layer(granite, plan(tokenizer, prompts)) is None
    got = score_prompts(granite, tokenizer, prompts, batch_size=3)
    for e, g in zip([reference_loglik(granite, tokenizer, p) for p in prompts], got):
        np.testing.assert_allclose(g, e, rtol=0, atol=2e-4)


def test_batches_hold_at_most_batch_size_rows_and_batch_tokens_padded_tokens():
    rows = [Row(list(range(n))) for n in (3, 40, 7, 7, 12, 1, 25, 9, 2, 2, 60)]
    for batch_size, batch_tokens in ((4, None), (100, 50), (3, 30), (1, 1)):
        got = list(batches(rows, batch_size, batch_tokens))
        assert sorted(len(r.tokens) for b in got for r in b) == sorted(len(r.tokens) for r in rows)
        lengths = [len(r.tokens) for b in got for r in b]
        assert lengths == sorted(lengths, reverse=True)  # longest first: a batch's first row sets its width
        for batch in got:
            assert len(batch) <= batch_size
            assert len(batch) == 1 or batch_tokens is None or len(batch) * len(batch[0].tokens) <= batch_tokens
    assert [len(b) for b in batches(rows, 100, 50)] == [1, 1, 2, 5, 2]  # 60 | 40 | 25,12 | 9,7,7,3,2 | 2,1


def test_a_row_batch_counts_the_prefix_each_row_gathers_against_batch_tokens(llama, tokenizer, shared_data):
    """Each row runs off a copy of its group's prefix cache: a forward of R rows off a prefix W wide holds R x (W +
    row width) tokens of keys and values, and batch_tokens caps that (here: at most 3 of 8 questions, one row each,
    off their subject's 5-shot prefix, where counting the rows alone would put all 8 in one forward)."""
    chosen = load_prompts(TASKS["mmlu"], data_dir=shared_data, limit=8)[1]
    groups = plan(tokenizer, chosen)
    prefix, row = len(groups[0].prefix), max(len(r.tokens) for r in groups[0].rows)
    cap = 3 * (prefix + row)
    held = []

    def record(module, args, kwargs):
        mask = kwargs.get("attention_mask")
        if kwargs.get("past_key_values") is not None:  # a row batch (a chunk's prefix runs without a cache)
            held.append(mask.shape[0] * mask.shape[1])

    hook = llama.get_decoder().register_forward_pre_hook(record, with_kwargs=True)
    try:
        got = score_prompts(llama, tokenizer, chosen, batch_size=64, batch_tokens=cap)
    finally:
        hook.remove()
    assert len(groups) == 1 and sum(len(g.rows) for g in groups) == 8 and 8 * row <= cap
    assert len(held) >= 3 and max(held) <= cap
    for prompt, g in zip(chosen, got):
        np.testing.assert_allclose(g, reference_loglik(llama, tokenizer, prompt), rtol=0, atol=2e-4)
