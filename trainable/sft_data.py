"""Alpaca-format instruction data -> token ids with the loss on response tokens only.

Each example becomes ``input_ids`` and ``labels`` of equal length, where ``labels`` is -100 on prompt
tokens (and padding) and equals ``input_ids`` on response tokens (and the closing EOS). The prompt is
the tokenizer's chat template when it has one (``prompt_template: auto``), else Alpaca's plain template.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import torch

from calibration.datasource import DataSourceError, load_hub_dataset, resolve_data_dir
from trainable.config import SFTConfig

IGNORE_INDEX = -100

PLAIN_PROMPT = ("Below is an instruction that describes a task{with_input}. "
                "Write a response that appropriately completes the request.\n\n"
                "### Instruction:\n{instruction}\n\n{input_block}### Response:\n")


@dataclass(frozen=True)
class Example:
    """One instruction-following example."""

    instruction: str
    input: str
    output: str


def _parse_rows(rows: list[Any], source: str) -> list[Example]:
    examples = []
    for index, row in enumerate(rows):
        if not isinstance(row, dict) or not isinstance(row.get("instruction"), str) \
                or not isinstance(row.get("output"), str) or not isinstance(row.get("input", ""), str):
            raise DataSourceError(f"{source}: row {index + 1} is malformed; expected an object with string "
                                  f"'instruction', 'output' and optional 'input', got {str(row)[:120]!r}")
        examples.append(Example(row["instruction"], row.get("input", ""), row["output"]))
    return examples


def load_alpaca(config: SFTConfig, data_dir: str | None = None) -> list[Example]:
    """Alpaca examples from ``<data root>/<local_file>`` when a data root is set, else from the hub."""
    root = resolve_data_dir(data_dir)
    if root is not None:
        path = root / config.local_file
        if not path.is_file():
            raise DataSourceError(f"SFT data file {str(path)!r} does not exist; expected a JSON list of "
                                  f"{{instruction, input, output}} under the data root {str(root)!r}")
        try:
            rows = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise DataSourceError(f"{path}:{exc.lineno}: malformed JSON ({exc.msg})") from None
        if not isinstance(rows, list):
            raise DataSourceError(f"{path}: expected a JSON list of examples, got {type(rows).__name__}")
        return _parse_rows(rows, str(path))
    dataset = load_hub_dataset(config.hub_id, name=None, split="train",
                               local_hint=f"{config.local_file} (Alpaca JSON)")
    return _parse_rows(list(dataset), config.hub_id)


def _uses_chat_template(tokenizer, template: str) -> bool:
    has_template = bool(getattr(tokenizer, "chat_template", None))
    if template == "chat" and not has_template:
        raise ValueError("prompt_template: expected 'auto' or 'plain' for a tokenizer without a chat template, "
                         "got 'chat'")
    return template == "chat" or (template == "auto" and has_template)


def prompt_text(example: Example, tokenizer, template: str) -> str:
    """The text that precedes the response (no loss is taken on it)."""
    if _uses_chat_template(tokenizer, template):
        user = example.instruction + (f"\n\n{example.input}" if example.input else "")
        return tokenizer.apply_chat_template([{"role": "user", "content": user}], tokenize=False,
                                             add_generation_prompt=True)
    return PLAIN_PROMPT.format(
        with_input=", paired with an input that provides further context" if example.input else "",
        instruction=example.instruction,
        input_block=f"### Input:\n{example.input}\n\n" if example.input else "")


def tokenize_example(example: Example, tokenizer, template: str, max_seq_len: int) -> dict[str, list[int]]:
    """``input_ids`` = prompt + response + EOS, truncated to ``max_seq_len``; labels mask the prompt."""
    prompt = prompt_text(example, tokenizer, template)
    chat = _uses_chat_template(tokenizer, template)
    prompt_ids = tokenizer(prompt, add_special_tokens=not chat)["input_ids"]
    response_ids = tokenizer(example.output, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    input_ids = (prompt_ids + response_ids)[:max_seq_len]
    labels = ([IGNORE_INDEX] * len(prompt_ids) + response_ids)[:max_seq_len]
    return {"input_ids": input_ids, "labels": labels}


def build_sft_examples(config: SFTConfig, tokenizer, seed: int, data_dir: str | None = None) -> list[dict]:
    """Tokenised examples in a seeded order; examples with no response token left are dropped."""
    examples = load_alpaca(config, data_dir)
    random.Random(seed).shuffle(examples)
    if config.max_examples is not None:
        examples = examples[: config.max_examples]
    tokenized = [tokenize_example(e, tokenizer, config.prompt_template, config.max_seq_len) for e in examples]
    return [t for t in tokenized if any(label != IGNORE_INDEX for label in t["labels"][1:])]


def collate(batch: list[dict[str, list[int]]], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Right-pad a batch; padding gets attention 0 and label -100."""
    width = max(len(item["input_ids"]) for item in batch)
    input_ids = torch.full((len(batch), width), pad_token_id, dtype=torch.long)
    labels = torch.full((len(batch), width), IGNORE_INDEX, dtype=torch.long)
    attention_mask = torch.zeros((len(batch), width), dtype=torch.long)
    for row, item in enumerate(batch):
        n = len(item["input_ids"])
        input_ids[row, :n] = torch.tensor(item["input_ids"])
        labels[row, :n] = torch.tensor(item["labels"])
        attention_mask[row, :n] = 1
    return {"input_ids": input_ids, "labels": labels, "attention_mask": attention_mask}


def iterate_batches(examples: list[dict], micro_batch_size: int, pad_token_id: int, seed: int,
                    rank: int = 0, world_size: int = 1) -> Iterator[dict[str, torch.Tensor]]:
    """Endless micro-batches: each epoch reshuffles with ``seed + epoch``; ranks take disjoint strides."""
    epoch = 0
    while True:
        order = list(range(len(examples)))
        random.Random(seed + epoch).shuffle(order)
        mine = order[rank::world_size]
        for start in range(0, len(mine) - micro_batch_size + 1, micro_batch_size):
            yield collate([examples[i] for i in mine[start:start + micro_batch_size]], pad_token_id)
        epoch += 1


def steps_per_epoch(n_examples: int, micro_batch_size: int, gradient_accumulation_steps: int,
                    world_size: int = 1) -> int:
    """Optimiser steps in one pass over the data (at least 1)."""
    micro_batches = (n_examples // world_size) // micro_batch_size
    return max(1, micro_batches // gradient_accumulation_steps)


def data_root_label(data_dir: str | None) -> str:
    """Human-readable source of the SFT data, for the results store."""
    root = resolve_data_dir(data_dir)
    return str(Path(root)) if root else "hub"
