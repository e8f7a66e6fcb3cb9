"""Alpaca tokenisation: loss on response tokens only, chat or plain template, clear errors for bad rows."""

import copy
import json

import pytest

from calibration.datasource import DataSourceError
from trainable.config import SFTConfig
from trainable.sft_data import (IGNORE_INDEX, PLAIN_PROMPT, Example, build_sft_examples, collate, load_alpaca,
                                steps_per_epoch, tokenize_example)


def test_real_alpaca_file_loads(data_dir):
    examples = load_alpaca(SFTConfig(), data_dir)
    assert len(examples) == 5000 and all(e.instruction and e.output for e in examples[:50])


def test_labels_cover_exactly_the_response(smollm2_tokenizer):
    example = Example("Name a colour.", "", "Blue.")
    item = tokenize_example(example, smollm2_tokenizer, "auto", 512)
    labels, ids = item["labels"], item["input_ids"]
    first = next(i for i, label in enumerate(labels) if label != IGNORE_INDEX)
    assert all(label == IGNORE_INDEX for label in labels[:first])
    assert labels[first:] == ids[first:]
    assert smollm2_tokenizer.decode(ids[first:]) == "Blue." + smollm2_tokenizer.eos_token
    assert "<|im_start|>assistant" in smollm2_tokenizer.decode(ids[:first])  # SmolLM2's chat template


def test_plain_template_without_chat_template(smollm2_tokenizer):
    plain = copy.deepcopy(smollm2_tokenizer)
    plain.chat_template = None
    example = Example("Add the numbers.", "2 and 3", "5")
    item = tokenize_example(example, plain, "auto", 512)
    prompt = PLAIN_PROMPT.format(with_input=", paired with an input that provides further context",
                                 instruction="Add the numbers.", input_block="### Input:\n2 and 3\n\n")
    n_prompt = sum(label == IGNORE_INDEX for label in item["labels"])
    assert prompt.strip() in plain.decode(item["input_ids"][:n_prompt])
    assert plain.decode(item["input_ids"][n_prompt:]) == "5" + plain.eos_token
    with pytest.raises(ValueError, match="without a chat template"):
        tokenize_example(example, plain, "chat", 512)


def test_truncation_and_seeded_order(smollm2_tokenizer, data_dir):
    config = SFTConfig(max_examples=8, max_seq_len=96)
    a = build_sft_examples(config, smollm2_tokenizer, seed=1, data_dir=data_dir)
    b = build_sft_examples(config, smollm2_tokenizer, seed=1, data_dir=data_dir)
    c = build_sft_examples(config, smollm2_tokenizer, seed=2, data_dir=data_dir)
    assert len(a) > 0 and a == b and a != c
    assert all(len(x["input_ids"]) <= 96 for x in a)


def test_collate_pads_with_ignored_labels():
    batch = collate([{"input_ids": [5, 6, 7], "labels": [-100, 6, 7]}, {"input_ids": [8], "labels": [8]}], 0)
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0]]
    assert batch["labels"].tolist() == [[-100, 6, 7], [8, -100, -100]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]


def test_steps_per_epoch():
    assert steps_per_epoch(100, 4, 5) == 5
    assert steps_per_epoch(100, 4, 5, world_size=2) == 2
    assert steps_per_epoch(3, 4, 1) == 1


def test_malformed_row_names_file_and_row(tmp_path):
    (tmp_path / "alpaca").mkdir()
    path = tmp_path / "alpaca" / "bad.json"
    path.write_text(json.dumps([{"instruction": "a", "output": "b"}, {"instruction": "c"}]))
    with pytest.raises(DataSourceError, match=r"bad.json: row 2 is malformed"):
        load_alpaca(SFTConfig(local_file="alpaca/bad.json"), str(tmp_path))
    path.write_text('[{"instruction": "a",\n "output": }]')
    with pytest.raises(DataSourceError, match=r"bad.json:2: malformed JSON"):
        load_alpaca(SFTConfig(local_file="alpaca/bad.json"), str(tmp_path))


def test_missing_local_file_and_unreachable_hub(tmp_path, monkeypatch):
    with pytest.raises(DataSourceError, match="does not exist"):
        load_alpaca(SFTConfig(local_file="alpaca/none.json"), str(tmp_path))
    monkeypatch.delenv("CALSWEEP_DATA_DIR", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(DataSourceError) as info:
        load_alpaca(SFTConfig(), None)
    message = str(info.value)
    assert "\n" not in message and "CALSWEEP_DATA_DIR" in message and "hub" in message
