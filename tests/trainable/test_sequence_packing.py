"""Packed rows train exactly like the same examples unpacked, and keep compiled layers at one or two graphs."""

import random

import pytest
import torch
from torch._dynamo.utils import counters
from transformers import AutoConfig, AutoModelForCausalLM

from trainable.compiled import compiled_decoder_layers
from trainable.lm_head import CausalLMWithFusedLoss
from trainable.sequence_packing import (collate_packed, iterate_packed_batches, pack_rows, packed_causal_mask,
                                       packed_width)
from trainable.sft_data import collate

SMALL = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=300, head_dim=8)


def _examples(n: int, seed: int = 0, low: int = 3, high: int = 14) -> list[dict[str, list[int]]]:
    """Examples of varied length; a random-length prompt (label -100), the rest labelled."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        length = rng.randint(low, high)
        ids = [rng.randrange(1, 300) for _ in range(length)]
        prompt = rng.randint(1, length - 1)
        out.append({"input_ids": ids, "labels": [-100] * prompt + ids[prompt:]})
    return out


def test_pack_rows_places_every_example_once_within_the_width():
    lengths = [5, 9, 3, 7, 2, 8, 4]
    rows = pack_rows(lengths, range(len(lengths)), width=10)
    assert sorted(i for row in rows for i in row) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in row) <= 10 for row in rows)
    assert rows == [[0, 2, 4], [1], [3], [5], [6]]  # first fit in the order given
    with pytest.raises(ValueError, match="fit a row of 10 tokens, got one of 11"):
        pack_rows([11], [0], width=10)


def test_collate_packed_restarts_positions_and_masks_example_starts():
    examples = [{"input_ids": [5, 6, 7], "labels": [5, 6, 7]}, {"input_ids": [8, 9], "labels": [-100, 9]}]
    batch = collate_packed(examples, [[0, 1]], width=8, pad_token_id=0)
    assert batch["input_ids"].tolist() == [[5, 6, 7, 8, 9, 0, 0, 0]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 0, 1, 0, 1, 2]]
    assert batch["labels"].tolist() == [[-100, 6, 7, -100, 9, -100, -100, -100]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1, 1, 0, 0, 0]]
    assert packed_width(160, None, 64) == 192 and packed_width(160, 300, 64) == 300


@pytest.mark.parametrize("arch", ["llama", "gemma3_text"])
def test_packed_loss_and_gradients_equal_unpacked(arch):
    """Sum of per-token losses and its gradients, float64: packing changes nothing but the layout."""
    config = dict(SMALL, **({"sliding_window": 4, "layer_types": ["sliding_attention", "full_attention"]}
                            if arch == "gemma3_text" else {}))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(arch, **config, attn_implementation="sdpa"),
                                             dtype=torch.float64)
    wrapped = CausalLMWithFusedLoss(model, label_smoothing=0.1)
    examples = _examples(9)
    one = torch.tensor(1.0, dtype=torch.float64)

    def loss_and_grads(batches):
        wrapped.zero_grad()
        total = sum(wrapped(**batch, loss_divisor=one) for batch in batches)
        total.backward()
        return total.detach(), {name: p.grad.clone() for name, p in wrapped.named_parameters()}

    unpacked = [collate([example], pad_token_id=0) for example in examples]
    rows = pack_rows([len(e["input_ids"]) for e in examples], range(len(examples)), width=32)
    assert len(rows) < len(examples) and any(len(row) > 1 for row in rows)
    packed = [collate_packed(examples, rows, width=32, pad_token_id=0)]
    want_loss, want_grads = loss_and_grads(unpacked)
    got_loss, got_grads = loss_and_grads(packed)
    # float64: the two layouts differ only in summation order. Gemma3's RMSNorm computes in float32 whatever the
    # model's dtype, so its norm weights' gradients carry float32 rounding (seen: 3e-8 of 0.3).
    torch.testing.assert_close(got_loss, want_loss, rtol=1e-12, atol=1e-12)
    for name, want in want_grads.items():
        float32_norm = arch == "gemma3_text" and "norm" in name
        torch.testing.assert_close(got_grads[name], want, rtol=1e-5 if float32_norm else 1e-10,
                                   atol=1e-7 if float32_norm else 1e-12,
                                   msg=lambda message: f"{name}: {message}")


def test_the_packed_mask_is_the_one_the_decoder_builds():
    """Where calsweep builds the packed rows' mask (SDPA, full attention) it equals transformers' own, bit for bit;
    elsewhere (sliding-window layers, eager attention) the decoder builds its own."""
    from transformers.masking_utils import create_causal_mask

    examples = _examples(9)
    rows = pack_rows([len(e["input_ids"]) for e in examples], range(len(examples)), width=32)
    position_ids = collate_packed(examples, rows, width=32, pad_token_id=0)["position_ids"]
    config = AutoConfig.for_model("llama", **SMALL, attn_implementation="sdpa")
    want = create_causal_mask(config=config, inputs_embeds=torch.zeros(*position_ids.shape, 32), attention_mask=None,
                              past_key_values=None, position_ids=position_ids)
    got = packed_causal_mask(position_ids, config)
    assert got.dtype == want.dtype == torch.bool and torch.equal(got, want)
    sliding = AutoConfig.for_model("gemma3_text", **SMALL, sliding_window=4, attn_implementation="sdpa",
                                   layer_types=["sliding_attention", "full_attention"])
    assert packed_causal_mask(position_ids, sliding) is None
    assert packed_causal_mask(position_ids, AutoConfig.for_model("llama", **SMALL, attn_implementation="eager")) is None


def test_packed_batches_over_varied_lengths_compile_to_few_graphs():
    """40 micro-batches of examples from 2 to 60 tokens: one row shape, so Dynamo compiles at most two graphs
    (where the decoder builds the mask, rows holding one example have none) and never approaches its recompile
    limit."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model("llama", **SMALL, attn_implementation="sdpa"))
    wrapped = CausalLMWithFusedLoss(model, label_smoothing=0.1)
    examples = _examples(200, seed=1, low=2, high=60)
    batches = iterate_packed_batches(examples, micro_batch_size=2, width=64, pad_token_id=0, seed=0)
    counters.clear()
    with compiled_decoder_layers(model, backend="eager"):
        for _ in range(40):
            wrapped(**next(batches)).backward()
    assert counters["stats"]["unique_graphs"] <= 2
    assert not counters["unimplemented"]
    assert torch._dynamo.config.recompile_limit > counters["stats"]["unique_graphs"]


def test_ranks_get_disjoint_rows_of_equal_count():
    examples = _examples(50, seed=2)
    per_rank = [list(b["input_ids"] for _, b in zip(range(4), iterate_packed_batches(examples, 1, 32, 0, 0, r, 3)))
                for r in range(3)]
    seen = [tuple(row.tolist()) for rank in per_rank for batch in rank for row in batch]
    assert len(seen) == len(set(seen)) == 12
    with pytest.raises(ValueError, match="at least micro_batch_size=64 packed rows per rank"):
        next(iterate_packed_batches(examples, 64, 32, 0, 0))


def test_skipped_micro_batches_are_the_first_of_the_same_stream():
    """A resumed trial skips the micro-batches it has trained on: across epoch boundaries, on every rank."""
    examples = _examples(50, seed=3)
    for rank in range(2):
        stream = iterate_packed_batches(examples, 2, 32, 0, 5, rank, 2)
        whole = [next(stream)["input_ids"] for _ in range(30)]
        resumed = iterate_packed_batches(examples, 2, 32, 0, 5, rank, 2, skip=17)
        assert all(torch.equal(next(resumed)["input_ids"], batch) for batch in whole[17:])
