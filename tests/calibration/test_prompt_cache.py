"""The on-disk plan cache returns what ``plan`` returns, reads what it stored, and keys on everything that matters."""

from __future__ import annotations

import copy
import dataclasses
import pickle

import pytest

from calibration.prompt_cache import cached_groups, prompts_key, tokenizer_fingerprint
from calibration.requests import Group, plan
from calibration.task_config import TASKS, load_prompts


@pytest.fixture(scope="module")
def prompts(mini_data):
    return load_prompts(TASKS["mmlu"], data_dir=mini_data, limit=4)[1]


@pytest.mark.parametrize("share_prefix", [True, False])
def test_a_miss_computes_and_stores_the_plan_and_a_hit_reads_the_file(tokenizer, prompts, tmp_path, share_prefix):
    expected = plan(tokenizer, prompts, share_prefix=share_prefix)
    assert cached_groups(tokenizer, prompts, share_prefix=share_prefix, directory=tmp_path) == expected
    (stored,) = tmp_path.glob("*.pkl")
    assert pickle.loads(stored.read_bytes()) == expected and not list(tmp_path.glob(".*partial"))
    sentinel = [Group([1, 2, 3], [])]  # a hit returns the file's content, not a recomputation
    stored.write_bytes(pickle.dumps(sentinel))
    assert cached_groups(tokenizer, prompts, share_prefix=share_prefix, directory=tmp_path) == sentinel


def test_without_a_directory_nothing_is_stored(tokenizer, prompts, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cached_groups(tokenizer, prompts) == plan(tokenizer, prompts)
    assert not list(tmp_path.rglob("*.pkl"))


def test_the_key_changes_with_the_tokenizer_the_prompts_and_sharing(tokenizer, prompts):
    fingerprint = tokenizer_fingerprint(tokenizer)
    key = prompts_key(fingerprint, prompts, True)
    assert prompts_key(fingerprint, prompts, True) == key
    assert prompts_key(fingerprint, prompts, False) != key
    assert prompts_key(fingerprint, prompts[:-1], True) != key
    edited = [dataclasses.replace(prompts[0], query=prompts[0].query + " ")] + list(prompts[1:])
    assert prompts_key(fingerprint, edited, True) != key
    other = copy.deepcopy(tokenizer)
    other.add_tokens(["<calsweep-new-token>"])
    assert tokenizer_fingerprint(other) != fingerprint


@pytest.mark.parametrize("damage", [b"", b"\x80\x05garbage", None])
def test_an_unreadable_or_truncated_plan_file_is_tokenised_again(tokenizer, prompts, tmp_path, damage):
    expected = plan(tokenizer, prompts)
    cached_groups(tokenizer, prompts, directory=tmp_path)
    (stored,) = tmp_path.glob("*.pkl")
    stored.write_bytes(stored.read_bytes()[:20] if damage is None else damage)
    assert cached_groups(tokenizer, prompts, directory=tmp_path) == expected
    assert pickle.loads(stored.read_bytes()) == expected
