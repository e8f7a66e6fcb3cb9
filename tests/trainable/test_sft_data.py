"""SFT tokenisation: Alpaca, Tulu-3 and OpenHermes rows as conversations, loss on every assistant turn only."""

import copy
import json
import random

import pytest

from common.config import ConfigError
from common.datasource import DataSourceError
from sweeps.config import sweep_from_dict
from trainable.config import SFTConfig
from trainable.sft_data import (IGNORE_INDEX, alpaca_prompt, build_sft_examples, collate, load_conversations,
                                parse_row, steps_per_epoch, tokenize_conversation)

SYSTEM = "You are a terse maths tutor."
TULU_ROWS = [
    {"id": "a", "source": "test", "messages": [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "What is 2 + 3?"},
        {"role": "assistant", "content": "2 + 3 = 5."},
        {"role": "user", "content": "And times 4?"},
        {"role": "assistant", "content": "5 x 4 = 20, so the answer is 20."}]},
    {"id": "b", "source": "test", "messages": [
        {"role": "user", "content": "Name a prime."},
        {"role": "assistant", "content": "7"}]},
]
HERMES_ROWS = [
    {"conversations": [
        {"from": "system", "value": SYSTEM},
        {"from": "human", "value": "Is 9 prime?"},
        {"from": "gpt", "value": "No: 9 = 3 x 3."},
        {"from": "human", "value": "Is 11?"},
        {"from": "gpt", "value": "Yes, 11 is prime."}], "source": "test"},
]
ASSISTANT = {"tulu3": ["2 + 3 = 5.", "5 x 4 = 20, so the answer is 20."],
             "openhermes": ["No: 9 = 3 x 3.", "Yes, 11 is prime."]}


def write_rows(tmp_path, dataset, rows, jsonl):
    (tmp_path / dataset).mkdir(exist_ok=True)
    name = f"{dataset}/rows.{'jsonl' if jsonl else 'json'}"
    text = "\n".join(json.dumps(r) for r in rows) + "\n" if jsonl else json.dumps(rows, indent=1)
    (tmp_path / name).write_text(text)
    return SFTConfig(dataset=dataset, local_file=name)


def labelled_runs(item):
    """The labelled tokens as maximal runs of consecutive positions; labels must equal input_ids there."""
    runs, current = [], []
    for token, label in zip(item["input_ids"], item["labels"]):
        if label == IGNORE_INDEX:
            runs, current = (runs + [current] if current else runs), []
        else:
            assert label == token
            current.append(token)
    return runs + [current] if current else runs


def without_chat_template(tokenizer):
    plain = copy.deepcopy(tokenizer)
    plain.chat_template = None
    return plain


def test_real_alpaca_file_loads(data_dir):
    conversations = load_conversations(SFTConfig(), data_dir)
    assert len(conversations) == 5000
    assert all([r for r, _ in c.turns] == ["user", "assistant"] and c.plain_prompt for c in conversations[:50])


def test_dataset_defaults_and_validation():
    assert SFTConfig().hub_id == "tatsu-lab/alpaca"
    assert SFTConfig(dataset="tulu3").hub_id == "allenai/tulu-3-sft-mixture"
    assert SFTConfig(dataset="openhermes").hub_id == "teknium/OpenHermes-2.5"
    assert SFTConfig(dataset="tulu3", local_file="x/y.jsonl").local_file == "x/y.jsonl"
    with pytest.raises(ConfigError, match=r"expected one of \['alpaca', 'tulu3', 'openhermes'\], got 'sharegpt'"):
        sweep_from_dict({"sft": {"dataset": "sharegpt"}})
    with pytest.raises(ConfigError, match=r"local_file: expected a .json or .jsonl file, got 'a.parquet'"):
        sweep_from_dict({"sft": {"dataset": "tulu3", "local_file": "a.parquet"}})


def test_alpaca_chat_labels_cover_exactly_the_response(smollm2_tokenizer):
    conversation = parse_row("alpaca", {"instruction": "Name a colour.", "input": "", "output": "Blue."}, "t")
    item = tokenize_conversation(conversation, smollm2_tokenizer, "auto", 512)
    labels, ids = item["labels"], item["input_ids"]
    first = next(i for i, label in enumerate(labels) if label != IGNORE_INDEX)
    assert all(label == IGNORE_INDEX for label in labels[:first]) and labels[first:] == ids[first:]
    assert smollm2_tokenizer.decode(ids[first:]) == "Blue." + smollm2_tokenizer.eos_token
    assert "<|im_start|>assistant" in smollm2_tokenizer.decode(ids[:first])  # SmolLM2's chat template


def test_alpaca_plain_template_without_chat_template(smollm2_tokenizer):
    plain = without_chat_template(smollm2_tokenizer)
    conversation = parse_row("alpaca", {"instruction": "Add the numbers.", "input": "2 and 3", "output": "5"}, "t")
    item = tokenize_conversation(conversation, plain, "auto", 512)
    n_prompt = sum(label == IGNORE_INDEX for label in item["labels"])
    assert plain.decode(item["input_ids"][:n_prompt]) == alpaca_prompt("Add the numbers.", "2 and 3")
    assert "### Input:\n2 and 3" in alpaca_prompt("Add the numbers.", "2 and 3")
    assert plain.decode(item["input_ids"][n_prompt:]) == "5" + plain.eos_token
    with pytest.raises(ValueError, match="without a chat template"):
        tokenize_conversation(conversation, plain, "chat", 512)


@pytest.mark.parametrize("dataset, rows, jsonl", [("tulu3", TULU_ROWS, True), ("openhermes", HERMES_ROWS, False)])
def test_multi_turn_chat_template_labels_every_assistant_turn(smollm2_tokenizer, tmp_path, dataset, rows, jsonl):
    conversation = load_conversations(write_rows(tmp_path, dataset, rows, jsonl), str(tmp_path))[0]
    assert [role for role, _ in conversation.turns] == ["system", "user", "assistant", "user", "assistant"]
    item = tokenize_conversation(conversation, smollm2_tokenizer, "auto", 512)
    end = "<|im_end|>"
    assert [smollm2_tokenizer.decode(run) for run in labelled_runs(item)] == [a + end for a in ASSISTANT[dataset]]
    messages = [{"role": role, "content": content} for role, content in conversation.turns]
    rendered = smollm2_tokenizer.apply_chat_template(messages, tokenize=False)
    assert smollm2_tokenizer.decode(item["input_ids"]) == rendered.rstrip()  # system and user turns are all there
    assert SYSTEM in smollm2_tokenizer.decode([t for t, l in zip(item["input_ids"], item["labels"]) if l < 0])


@pytest.mark.parametrize("dataset, rows, jsonl", [("tulu3", TULU_ROWS, False), ("openhermes", HERMES_ROWS, True)])
def test_multi_turn_plain_template(smollm2_tokenizer, tmp_path, dataset, rows, jsonl):
    plain = without_chat_template(smollm2_tokenizer)
    conversation = load_conversations(write_rows(tmp_path, dataset, rows, jsonl), str(tmp_path))[0]
    item = tokenize_conversation(conversation, plain, "plain", 512)
    runs = labelled_runs(item)
    assert [plain.decode(run) for run in runs] == [a + plain.eos_token for a in ASSISTANT[dataset]]
    assert all(run[-1] == plain.eos_token_id for run in runs)
    user_1, user_2 = (c for r, c in conversation.turns if r == "user")
    a_1, a_2 = ASSISTANT[dataset]
    assert plain.decode(item["input_ids"]) == (
        f"### System:\n{SYSTEM}\n\n### User:\n{user_1}\n\n### Assistant:\n{a_1}{plain.eos_token}"
        f"\n\n### User:\n{user_2}\n\n### Assistant:\n{a_2}{plain.eos_token}")


def test_single_turn_chat_row_gets_alpacas_plain_prompt(smollm2_tokenizer, tmp_path):
    plain = without_chat_template(smollm2_tokenizer)
    conversation = load_conversations(write_rows(tmp_path, "tulu3", TULU_ROWS, True), str(tmp_path))[1]
    item = tokenize_conversation(conversation, plain, "auto", 512)
    assert plain.decode(item["input_ids"]) == alpaca_prompt("Name a prime.") + "7" + plain.eos_token
    assert [plain.decode(run) for run in labelled_runs(item)] == ["7" + plain.eos_token]


def test_template_without_system_role_gets_it_folded_into_the_user_turn(smollm2_tokenizer):
    no_system = copy.deepcopy(smollm2_tokenizer)
    no_system.chat_template = ("{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not "
                               "supported') }}{% endif %}" + smollm2_tokenizer.chat_template)
    conversation = parse_row("tulu3", TULU_ROWS[0], "t")
    item = tokenize_conversation(conversation, no_system, "auto", 512)
    assert f"<|im_start|>user\n{SYSTEM}\n\nWhat is 2 + 3?<|im_end|>" in no_system.decode(item["input_ids"])
    assert [no_system.decode(run) for run in labelled_runs(item)] == [a + "<|im_end|>" for a in ASSISTANT["tulu3"]]


def test_template_that_moves_the_system_turn_gets_it_folded(smollm2_tokenizer):
    # like Mistral's template: the system message goes in front of the *last* user message
    moving = copy.deepcopy(smollm2_tokenizer)
    moving.chat_template = (
        "{%- set ns = namespace(last=-1) %}{%- for m in messages %}{%- if m.role == 'user' %}"
        "{%- set ns.last = loop.index0 %}{%- endif %}{%- endfor %}{%- for m in messages %}{%- if m.role == 'user' %}"
        "<|im_start|>{% if loop.index0 == ns.last and messages[0].role == 'system' %}{{ messages[0].content }} "
        "{% endif %}{{ m.content }}<|im_end|>{%- elif m.role == 'assistant' %} {{ m.content }}<|endoftext|>"
        "{%- endif %}{%- endfor %}")
    item = tokenize_conversation(parse_row("tulu3", TULU_ROWS[0], "t"), moving, "auto", 512)
    assert moving.decode(item["input_ids"]).startswith(f"<|im_start|>{SYSTEM}\n\nWhat is 2 + 3?")
    assert [moving.decode(run) for run in labelled_runs(item)] == [f" {a}<|endoftext|>" for a in ASSISTANT["tulu3"]]


def test_template_that_rewrites_earlier_turns_is_refused(smollm2_tokenizer):
    unstable = copy.deepcopy(smollm2_tokenizer)
    unstable.chat_template = "{{ messages | length }}" + smollm2_tokenizer.chat_template
    with pytest.raises(ValueError, match=r"row-x: expected a conversation the chat template renders turn by turn, "
                                         r"got earlier turns rendered differently"):
        tokenize_conversation(parse_row("tulu3", TULU_ROWS[0], "row-x"), unstable, "auto", 512)


def test_truncation_and_seeded_order(smollm2_tokenizer, data_dir):
    config = SFTConfig(max_examples=8, max_seq_len=96)
    a = build_sft_examples(config, smollm2_tokenizer, seed=1, data_dir=data_dir)
    b = build_sft_examples(config, smollm2_tokenizer, seed=1, data_dir=data_dir)
    c = build_sft_examples(config, smollm2_tokenizer, seed=2, data_dir=data_dir)
    assert len(a) > 0 and a == b and a != c
    assert all(len(x["input_ids"]) <= 96 for x in a)


def test_seeded_sample_is_the_head_of_a_seeded_shuffle(tmp_path):
    rows = [{"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}]}
            for i in range(20)]
    config = write_rows(tmp_path, "tulu3", rows, True)
    everything = load_conversations(config, str(tmp_path))
    shuffled = list(everything)
    random.Random(3).shuffle(shuffled)  # the same permutation as the loader's shuffle of row indices
    sample = load_conversations(SFTConfig(dataset="tulu3", local_file=config.local_file, max_examples=5),
                                str(tmp_path), seed=3)
    assert sample == shuffled[:5] and sample[0].origin.endswith(f"rows.jsonl:{everything.index(sample[0]) + 1}")


def test_collate_pads_with_ignored_labels():
    batch = collate([{"input_ids": [5, 6, 7], "labels": [-100, 6, 7]}, {"input_ids": [8], "labels": [8]}], 0)
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0]]
    assert batch["labels"].tolist() == [[-100, 6, 7], [8, -100, -100]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    wide = collate([{"input_ids": [5, 6, 7], "labels": [-100, 6, 7]}], 0, pad_to_multiple=4)
    assert wide["input_ids"].tolist() == [[5, 6, 7, 0]] and wide["labels"].tolist() == [[-100, 6, 7, -100]]


def test_steps_per_epoch():
    assert steps_per_epoch(100, 4, 5) == 5
    assert steps_per_epoch(100, 4, 5, world_size=2) == 2
    assert steps_per_epoch(3, 4, 1) == 1


def test_malformed_alpaca_row_names_file_and_row(tmp_path):
    (tmp_path / "alpaca").mkdir()
    path = tmp_path / "alpaca" / "bad.json"
    path.write_text(json.dumps([{"instruction": "a", "output": "b"}, {"instruction": "c"}]))
    with pytest.raises(DataSourceError, match=r"bad.json: row 2 is malformed"):
        load_conversations(SFTConfig(local_file="alpaca/bad.json"), str(tmp_path))
    path.write_text('[{"instruction": "a",\n "output": }]')
    with pytest.raises(DataSourceError, match=r"bad.json:2: malformed JSON"):
        load_conversations(SFTConfig(local_file="alpaca/bad.json"), str(tmp_path))


@pytest.mark.parametrize("dataset, rows, jsonl, where, reason", [
    ("tulu3", TULU_ROWS + [{"messages": [{"role": "tool", "content": "x"}]}], True, "rows.jsonl:3", "turn 1"),
    ("tulu3", [{"messages": [{"role": "user", "content": "only a question"}]}], True, "rows.jsonl:1",
     "expected an assistant turn"),
    ("tulu3", [{"conversations": []}], False, "rows.json: row 1", "no non-empty 'messages' list"),
    ("openhermes", HERMES_ROWS + [{"conversations": [{"from": "human"}, {"from": "gpt", "value": "y"}]}], False,
     "rows.json: row 2", "turn 1"),
    ("openhermes", [{"conversations": [{"from": "gpt", "value": "hi"}, {"from": "human", "value": "x"}]}], True,
     "rows.jsonl:1", "expected an assistant turn after a system or user turn"),
])
def test_malformed_chat_rows_name_file_and_line(tmp_path, dataset, rows, jsonl, where, reason):
    with pytest.raises(DataSourceError) as info:
        load_conversations(write_rows(tmp_path, dataset, rows, jsonl), str(tmp_path))
    message = str(info.value)
    assert "\n" not in message and f"{where} is malformed" in message and reason in message


def test_malformed_jsonl_line_names_file_and_line(tmp_path):
    (tmp_path / "tulu3").mkdir()
    (tmp_path / "tulu3" / "rows.jsonl").write_text(json.dumps(TULU_ROWS[0]) + "\n\n{not json\n")
    with pytest.raises(DataSourceError, match=r"rows.jsonl:3: malformed JSON"):
        load_conversations(SFTConfig(dataset="tulu3", local_file="tulu3/rows.jsonl"), str(tmp_path))


@pytest.mark.parametrize("name, text", [("rows.json", "[]"), ("rows.jsonl", "\n\n")])
def test_a_local_file_without_examples_is_named(tmp_path, name, text):
    (tmp_path / name).write_text(text)
    with pytest.raises(DataSourceError) as info:
        load_conversations(SFTConfig(local_file=name), str(tmp_path), seed=0)
    assert str(info.value) == (f"SFT data file {str(tmp_path / name)!r} (sft.local_file) holds no examples; expected "
                               f"a JSON list or JSON Lines file of at least one alpaca row")


def test_missing_local_file_and_unreachable_hub(tmp_path, monkeypatch):
    with pytest.raises(DataSourceError, match="does not exist"):
        load_conversations(SFTConfig(local_file="alpaca/none.json"), str(tmp_path))
    monkeypatch.delenv("CALSWEEP_DATA_DIR", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(DataSourceError) as info:
        load_conversations(SFTConfig(dataset="tulu3"), None)
    message = str(info.value)
    assert "\n" not in message and "CALSWEEP_DATA_DIR" in message and "allenai/tulu-3-sft-mixture" in message


def test_skipped_micro_batches_are_the_first_of_the_same_stream():
    """A resumed trial skips the micro-batches it has trained on: across epoch boundaries, on every rank."""
    import torch

    from trainable.sft_data import iterate_batches

    examples = [{"input_ids": [i, i + 1], "labels": [-100, i + 1]} for i in range(11)]
    for rank in range(2):
        stream = iterate_batches(examples, 2, 0, seed=4, rank=rank, world_size=2)
        whole = [next(stream)["input_ids"] for _ in range(12)]
        resumed = iterate_batches(examples, 2, 0, seed=4, rank=rank, world_size=2, skip=7)
        assert all(torch.equal(next(resumed)["input_ids"], batch) for batch in whole[7:])
