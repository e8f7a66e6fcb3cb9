"""ATS (calibration.ats): the kernel loss against materialised float64 logits, the head's prefix context, scoring
with ATS against full-sequence logits divided by tau, ranking, save / load, and ECE on an over-confident task."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from calibration.ats.config import ATSConfig
from calibration.ats.head import MIN_LOG_TEMPERATURE, HeadSpec, TemperatureHead, load_head, save_head
from calibration.ats.loss import IGNORE_INDEX, reference_selective_smoothing_loss, selective_smoothing_loss
from calibration.ats.train import train_head
from calibration.metrics import expected_calibration_error
from calibration.requests import encode_prompt
from calibration.scoring import score_prompts, score_prompts_with_ats
from calibration.task_config import TASKS, load_prompts


def random_head(hidden_size: int, seed: int = 0, scale: float = 0.3, dtype=torch.float32) -> TemperatureHead:
    """A head whose output layer is not the zero of a new head, so tau varies from token to token."""
    torch.manual_seed(seed)
    head = TemperatureHead(HeadSpec(hidden_size, 2 * hidden_size, 2))
    torch.nn.init.normal_(head.out.weight, std=scale / hidden_size ** 0.5)
    torch.nn.init.normal_(head.out.bias, std=scale)
    return head.to(dtype).eval()


def loss_inputs(dtype: torch.dtype, seed: int = 0, vocab: int = 300, batch: int = 3, length: int = 17, d: int = 16):
    """Hidden states, mask, positions, weight and targets: a third of the targets are the top token (right), a few
    ignored, padding at the end of row 1."""
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(batch, length, d, generator=g, dtype=dtype)
    weight = torch.randn(vocab, d, generator=g, dtype=dtype) / 2
    targets = torch.randint(0, vocab, (batch, length), generator=g)
    top = (hidden @ weight.T).argmax(-1)
    targets = torch.where(torch.rand(batch, length, generator=g) < 0.35, top, targets)
    targets[:, :2] = IGNORE_INDEX
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[1, -4:] = 0
    targets[1, -5:] = IGNORE_INDEX
    positions = torch.arange(length).expand(batch, length)
    return hidden, mask, positions, weight, targets


@pytest.mark.parametrize("balanced", [True, False])
@pytest.mark.parametrize("softcap", [None, 4.0])
@pytest.mark.parametrize("dtype, tolerance", [(torch.float64, 1e-10), (torch.float32, 2e-5)])
def test_kernel_loss_and_head_gradients_equal_the_materialised_reference(balanced, softcap, dtype, tolerance):
    hidden, mask, positions, weight, targets = loss_inputs(dtype)
    losses, grads = [], []
    for fn, head_dtype in ((selective_smoothing_loss, dtype), (reference_selective_smoothing_loss, torch.float64)):
        head = random_head(hidden.shape[-1], dtype=head_dtype)
        log_tau = head(hidden.to(head_dtype), mask, positions).reshape(-1)
        out = fn(hidden.reshape(-1, hidden.shape[-1]), log_tau, weight, targets.reshape(-1), alpha=0.3,
                 balanced=balanced, softcap=softcap)
        loss = out[0] if isinstance(out, tuple) else out
        loss.backward()
        losses.append(loss.double())
        grads.append([p.grad.double() for p in head.parameters()])
    right = selective_smoothing_loss(hidden.reshape(-1, hidden.shape[-1]), torch.zeros(targets.numel(), dtype=dtype),
                                     weight, targets.reshape(-1))[1]
    assert 0 < int(right.sum()) < int((targets != IGNORE_INDEX).sum())  # both terms are exercised
    scale = max(float(losses[1].abs()), 1.0)
    assert abs(float(losses[0] - losses[1])) <= tolerance * scale
    for got, want in zip(*grads):
        assert float((got - want).abs().max()) <= tolerance * max(float(want.abs().max()), 1e-3)
    assert any(float(g.abs().max()) > 0 for g in grads[1][:-2])  # gradients reach the decoder layer, not just out


def test_single_class_batch_has_zero_loss_as_the_authors_weights_give():
    hidden, _, _, weight, _ = loss_inputs(torch.float64)
    flat = hidden.reshape(-1, hidden.shape[-1])
    top = (flat @ weight.T).argmax(-1)
    log_tau = torch.zeros(len(flat), dtype=torch.float64, requires_grad=True)
    loss, right = selective_smoothing_loss(flat, log_tau, weight, top)
    assert bool(right.all()) and float(loss) == 0.0
    assert float(reference_selective_smoothing_loss(flat, log_tau, weight, top)) == 0.0


def test_bad_alpha_is_one_line_naming_it():
    hidden, _, _, weight, targets = loss_inputs(torch.float64)
    with pytest.raises(ValueError, match=r"expected alpha in \[0, 1\], got 1.5"):
        selective_smoothing_loss(hidden[0], torch.zeros(hidden.shape[1], dtype=torch.float64), weight, targets[0],
                                 alpha=1.5)


def test_new_head_is_the_identity_and_temperatures_are_clipped():
    hidden, mask, positions, _, _ = loss_inputs(torch.float32)
    head = TemperatureHead(HeadSpec(hidden.shape[-1], 32, 4))
    assert torch.equal(head(hidden, mask, positions), torch.zeros(mask.shape))
    torch.nn.init.constant_(head.out.bias, -50.0)
    assert torch.equal(head(hidden, mask, positions), torch.full(mask.shape, MIN_LOG_TEMPERATURE))


def test_prefix_context_equals_running_the_head_on_prefix_and_row():
    """A left-padded prefix batch as context + right-padded rows == the head on each unpadded prefix + row."""
    head = random_head(16, seed=1)
    g = torch.Generator().manual_seed(2)
    prefixes = [torch.randn(n, 16, generator=g) for n in (5, 2)]
    rows = [torch.randn(n, 16, generator=g) for n in (4, 6, 3)]
    owner = torch.tensor([0, 1, 0])
    width = max(len(p) for p in prefixes)
    prefix_hidden, prefix_mask = torch.zeros(2, width, 16), torch.zeros(2, width, dtype=torch.long)
    for i, p in enumerate(prefixes):
        prefix_hidden[i, width - len(p):], prefix_mask[i, width - len(p):] = p, 1
    lengths = prefix_mask.sum(1)
    prefix_positions = (torch.arange(width) - (width - lengths)[:, None]).clamp_min(0)
    row_width = max(len(r) for r in rows)
    row_hidden, row_mask = torch.zeros(3, row_width, 16), torch.zeros(3, row_width, dtype=torch.long)
    for i, r in enumerate(rows):
        row_hidden[i, :len(r)], row_mask[i, :len(r)] = r, 1
    with torch.no_grad():
        context = head.context(prefix_hidden, prefix_mask, prefix_positions).select(owner)
        got = head(row_hidden, row_mask, lengths[owner, None] + torch.arange(row_width), context)
        for i, r in enumerate(rows):
            whole = torch.cat([prefixes[owner[i]], r])
            want = head(whole[None], torch.ones(1, len(whole)), torch.arange(len(whole))[None])[0, -len(r):]
            torch.testing.assert_close(got[i, :len(r)], want, rtol=0, atol=1e-5)


def test_save_and_load_round_trip_atomically(tmp_path):
    head = random_head(16, seed=3)
    path = save_head(head, tmp_path / "heads" / "h.safetensors")
    assert sorted(p.name for p in path.parent.iterdir()) == ["h.safetensors"]  # no temporary file left
    loaded = load_head(path)
    assert loaded.spec == head.spec
    for (name, a), (_, b) in zip(head.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), name
    from safetensors.torch import save_file

    save_file({"w": torch.zeros(1)}, str(tmp_path / "other.safetensors"))
    with pytest.raises(ValueError, match="expected an ATS head written by calibration.ats.save_head"):
        load_head(tmp_path / "other.safetensors")


def reference_ats_loglik(model, head, tokenizer, prompt) -> np.ndarray:
    """sum_t log softmax(logits / tau)[pos_t, cont_t] from one full forward per choice, the head on the whole
    sequence's last hidden states."""
    ctx, conts = encode_prompt(tokenizer, prompt.prefix + prompt.query, prompt.continuations)
    values = []
    for cont in conts:
        ids = torch.tensor([ctx + cont])
        with torch.no_grad():
            out = model(ids, output_hidden_states=True)
            tau = torch.exp(head(out.hidden_states[-1], torch.ones_like(ids), torch.arange(ids.shape[1])[None]))
        logprobs = (out.logits[0] / tau[0, :, None]).double().log_softmax(-1)[len(ctx) - 1: -1]
        values.append(sum(logprobs[t, token].item() for t, token in enumerate(cont)))
    return np.array(values)


@pytest.fixture(scope="module")
def prompts(mini_data):
    out = []
    for task in ("mmlu", "arc_easy", "hellaswag"):
        out += load_prompts(TASKS[task], data_dir=mini_data, limit=2)[1]
    return out


@pytest.mark.parametrize("model_name", ["llama", "gemma"])
@pytest.mark.parametrize("share_prefix, batch_size, batch_tokens", [(True, 3, None), (False, 64, 300)])
def test_scoring_with_ats_equals_full_sequence_logits_divided_by_tau(request, tokenizer, prompts, model_name,
                                                                    share_prefix, batch_size, batch_tokens):
    """Both readings of one pass: the plain one equals score_prompts, the ATS one the full-sequence reference
    (Gemma: sliding window shorter than the prompts, final-logit softcap, so the logits path divides its logits)."""
    model = request.getfixturevalue(model_name)
    head = random_head(model.config.hidden_size, seed=4)
    plain, scaled = score_prompts_with_ats(model, tokenizer, prompts, head, batch_size=batch_size,
                                           batch_tokens=batch_tokens, share_prefix=share_prefix)
    for got, want in zip(plain, score_prompts(model, tokenizer, prompts, share_prefix=share_prefix)):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    differs = 0
    for prompt, got, base in zip(prompts, scaled, plain):
        np.testing.assert_allclose(got, reference_ats_loglik(model, head, tokenizer, prompt), rtol=0, atol=2e-4)
        differs += not np.allclose(got, base, atol=1e-3)
    assert differs == len(prompts)  # tau != 1 moved every question's log-likelihoods


def test_ats_keeps_the_ranking_of_tokens_and_of_single_token_choices(llama, tokenizer, mini_data):
    """MMLU's choices are one letter each, read at one position with one tau: argmax and order are unchanged (a
    multi-token choice sums tokens of different taus, whose order ATS may change)."""
    _, prompts = load_prompts(TASKS["mmlu"], data_dir=mini_data, limit=4)
    plain, scaled = score_prompts_with_ats(llama, tokenizer, prompts, random_head(32, seed=5, scale=1.0))
    for a, b in zip(plain, scaled):
        assert not np.allclose(a, b) and list(np.argsort(a)) == list(np.argsort(b))
    z = torch.randn(50, 100)
    assert torch.equal((z / torch.rand(50, 1).add(0.1)).argmax(-1), z.argmax(-1))


def overconfident_task(vocab: int = 48, batches: int = 24, batch: int = 16, length: int = 16):
    """A tiny Llama made confident (output embedding scaled up) on sequences of random tokens whose next-token label
    is the model's own top token after an input token < vocab / 2 ("easy") and another token after the rest
    ("hard"): confident everywhere, right on half the tokens. The selective smoothing loss is minimised by tau -> 0
    on easy tokens (one-hot target, always right) and tau -> infinity on hard ones (uniform target, always wrong),
    both calibrated, and the head can tell them apart from the hidden state; so ATS must lower the ECE."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False))
    with torch.no_grad():
        model.lm_head.weight.mul_(6 / model.lm_head.weight.std() / 32 ** 0.5)
    model.eval()
    g = torch.Generator().manual_seed(1)
    data = []
    for _ in range(batches):
        ids = torch.randint(0, vocab, (batch, length), generator=g)
        with torch.no_grad():
            top = model(ids).logits.argmax(-1)
        label = torch.where(ids < vocab // 2, top, (top + 1 + torch.randint(0, vocab - 1, top.shape, generator=g)) % vocab)
        labels = torch.cat([torch.full((batch, 1), IGNORE_INDEX), label[:, :-1]], dim=1)  # labels[t + 1] at t
        data.append({"input_ids": ids, "labels": labels, "attention_mask": torch.ones_like(ids)})
    return model, data


def token_ece(model, head, data) -> tuple[float, float]:
    """(ECE, accuracy) of the top next token over the data's target tokens, with ATS when ``head`` is given."""
    confidence, correct = [], []
    for batch in data:
        with torch.no_grad():
            out = model(batch["input_ids"], output_hidden_states=True)
            logits = out.logits[:, :-1]
            if head is not None:
                tau = torch.exp(head(out.hidden_states[-1], batch["attention_mask"],
                                     torch.arange(logits.shape[1] + 1).expand_as(batch["input_ids"])))[:, :-1]
                logits = logits / tau[..., None]
        probs = logits.softmax(-1)
        confidence.append(probs.max(-1).values.reshape(-1))
        correct.append((probs.argmax(-1) == batch["labels"][:, 1:]).reshape(-1))
    confidence, correct = torch.cat(confidence).numpy(), torch.cat(correct).numpy()
    return expected_calibration_error(confidence, correct, 15), float(correct.mean())


def test_ats_lowers_ece_on_an_overconfident_task():
    model, data = overconfident_task()
    train, held_out = data[:16], data[16:]
    before, accuracy = token_ece(model, None, held_out)
    head = TemperatureHead(HeadSpec.for_model(model))
    losses = train_head(model, head, iter(train * 2), 32, ATSConfig(learning_rate=1e-2), progress=False)
    after, accuracy_after = token_ece(model, head, held_out)
    assert before > 0.2 and 0.4 < accuracy < 0.6  # confident, right on about half the tokens
    assert accuracy_after == accuracy  # ATS never changes the top token
    assert after < 0.25 * before, (before, after)  # the margin: ATS removes at least three quarters of the ECE
    assert np.mean(losses[-4:]) < np.mean(losses[:4])
