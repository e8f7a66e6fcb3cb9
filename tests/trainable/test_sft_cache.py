"""Tokenised SFT examples cached per node: a hit reads the file, and every input of the tokenisation is in the key."""

from __future__ import annotations

import copy
import dataclasses
import json
import pickle

import pytest

from trainable.config import SFTConfig
from trainable.sft_data import build_sft_examples, sft_cache_key

ROWS = [{"instruction": f"Add {i} and {i + 1}.", "input": "", "output": f"{i} + {i + 1} = {2 * i + 1}."}
        for i in range(6)]


@pytest.fixture
def data(tmp_path):
    root = tmp_path / "data"
    (root / "alpaca").mkdir(parents=True)
    (root / "alpaca" / "rows.json").write_text(json.dumps(ROWS))
    return root


CONFIG = SFTConfig(local_file="alpaca/rows.json", max_examples=4, max_seq_len=64)


def test_a_miss_builds_and_stores_and_a_hit_reads_the_file(smollm2_tokenizer, data, tmp_path):
    cache = tmp_path / "sft"
    expected = build_sft_examples(CONFIG, smollm2_tokenizer, 0, str(data))
    assert build_sft_examples(CONFIG, smollm2_tokenizer, 0, str(data), cache=cache) == expected
    (stored,) = cache.glob("*.pkl")
    assert pickle.loads(stored.read_bytes()) == expected
    sentinel = [{"input_ids": [1, 2], "labels": [-100, 2]}]  # a hit returns the file, not a new tokenisation
    stored.write_bytes(pickle.dumps(sentinel))
    assert build_sft_examples(CONFIG, smollm2_tokenizer, 0, str(data), cache=cache) == sentinel
    assert not [p for p in cache.iterdir() if p.name.endswith(".partial")]


@pytest.mark.parametrize("damage", [b"", b"\x80\x05\x95garbage", "truncate"])
def test_a_damaged_file_is_tokenised_again(smollm2_tokenizer, data, tmp_path, damage):
    cache = tmp_path / "sft"
    expected = build_sft_examples(CONFIG, smollm2_tokenizer, 0, str(data), cache=cache)
    (stored,) = cache.glob("*.pkl")
    stored.write_bytes(stored.read_bytes()[:30] if damage == "truncate" else damage)
    assert build_sft_examples(CONFIG, smollm2_tokenizer, 0, str(data), cache=cache) == expected
    assert pickle.loads(stored.read_bytes()) == expected


def test_the_key_changes_with_the_config_seed_data_and_tokenizer(smollm2_tokenizer, data, tmp_path):
    memo = tmp_path / "memo"

    def key(config=CONFIG, tokenizer=smollm2_tokenizer, seed=0):
        return sft_cache_key(config, tokenizer, seed, str(data), memo)

    base = key()
    assert base is not None and key() == base
    changed = [key(seed=1)] + [key(dataclasses.replace(CONFIG, **change)) for change in
                               ({"max_seq_len": 32}, {"max_examples": 3}, {"prompt_template": "plain"})]
    plain = copy.deepcopy(smollm2_tokenizer)
    plain.chat_template = None
    grown = copy.deepcopy(smollm2_tokenizer)
    grown.add_tokens(["<calsweep-new-token>"])
    changed += [key(tokenizer=plain), key(tokenizer=grown)]
    (data / "alpaca" / "rows.json").write_text(json.dumps(ROWS[::-1]))  # same name, other content
    changed.append(key())
    assert len({base, *changed}) == len(changed) + 1
