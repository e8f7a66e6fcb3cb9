"""SFT data (Alpaca, Tulu-3 SFT mixture, OpenHermes-2.5) -> token ids with the loss on assistant turns only.

Every row becomes a ``Conversation``: (role, content) turns with roles system | user | assistant. Each
tokenised example has ``input_ids`` and ``labels`` of equal length; ``labels`` equals ``input_ids`` on the
tokens of every assistant turn (its content and end-of-turn marker) and is -100 on everything else.

``prompt_template`` picks the rendering: ``auto`` is ``chat`` when the tokenizer has a chat template, else
``plain``.
- chat: the template renders the conversation. Assistant turn ``i`` is the text between the rendering of
  turns[:i] with the generation prompt and the rendering of turns[:i+1], less trailing whitespace (the
  separator before the next turn). A template that rejects a leading system turn, or moves it as turns are
  added, gets it folded into the first user turn. The sequence ends with the last assistant turn.
- plain: a single user -> assistant exchange gets Alpaca's prompt (Alpaca rows keep their Input block);
  anything else is ``### System:`` / ``### User:`` / ``### Assistant:`` blocks. Assistant content + EOS is
  labelled.
The whole text is tokenised once and tokens are labelled by their character offsets, so the ids are those
the tokenizer gives the rendered conversation (no per-segment tokenisation artefacts).

``build_sft_examples(..., cache=DIR)`` keeps its result in ``DIR/<key>.pkl`` (``common.disk_cache``: atomic,
an unreadable file is rebuilt), so the trials of a node tokenise each (family, data, SFT config, seed) once; the
key is ``sft_cache_key``.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch
from jinja2 import TemplateError

from common.datasource import DataSourceError, load_hub_dataset, resolve_data_dir
from common.disk_cache import cache_key, cached_pickle, file_sha256
from calibration.prompt_cache import tokenizer_fingerprint
from trainable.config import SFTConfig

IGNORE_INDEX = -100
ROLES = ("system", "user", "assistant")

PLAIN_PROMPT = ("Below is an instruction that describes a task{with_input}. "
                "Write a response that appropriately completes the request.\n\n"
                "### Instruction:\n{instruction}\n\n{input_block}### Response:\n")
PLAIN_HEADERS = {"system": "### System:\n", "user": "### User:\n", "assistant": "### Assistant:\n"}
PLAIN_SEPARATOR = "\n\n"

# dataset -> (key of the turn list, role key, content key, source role -> role); alpaca rows are parsed apart
CHAT_FORMATS = {
    "tulu3": ("messages", "role", "content", {"system": "system", "user": "user", "assistant": "assistant"}),
    "openhermes": ("conversations", "from", "value", {"system": "system", "human": "user", "gpt": "assistant"}),
}


@dataclass(frozen=True)
class Conversation:
    """One SFT example: (role, content) turns, a non-assistant turn first and at least one assistant turn.

    ``origin`` names the row ("file: row N", "file:LINE" or "hub_id: row N") for error messages.
    ``plain_prompt`` is set for Alpaca rows only: Alpaca's own prompt with its Input block, which the plain
    template uses instead of one built from the user turn.
    """

    turns: tuple[tuple[str, str], ...]
    origin: str
    plain_prompt: str | None = None


def alpaca_prompt(instruction: str, input_text: str = "") -> str:
    """Alpaca's plain prompt (text before the response) for an instruction and optional input."""
    return PLAIN_PROMPT.format(
        with_input=", paired with an input that provides further context" if input_text else "",
        instruction=instruction,
        input_block=f"### Input:\n{input_text}\n\n" if input_text else "")


def _malformed(origin: str, dataset: str, reason: str, row: Any) -> DataSourceError:
    expected = {
        "alpaca": "an object with string 'instruction', 'output' and optional 'input'",
        "tulu3": "an object with 'messages': a list of {role: system|user|assistant, content: string}",
        "openhermes": "an object with 'conversations': a list of {from: system|human|gpt, value: string}",
    }[dataset]
    return DataSourceError(f"{origin} is malformed ({reason}); expected {expected}, got {str(row)[:120]!r}")


def _alpaca_conversation(row: Any, origin: str) -> Conversation:
    if not isinstance(row, dict) or not isinstance(row.get("instruction"), str) \
            or not isinstance(row.get("output"), str) or not isinstance(row.get("input", ""), str):
        raise _malformed(origin, "alpaca", "missing or non-string field", row)
    instruction, input_text = row["instruction"], row.get("input", "")
    user = instruction + (f"\n\n{input_text}" if input_text else "")
    return Conversation((("user", user), ("assistant", row["output"])), origin,
                        plain_prompt=alpaca_prompt(instruction, input_text))


def _chat_conversation(dataset: str, row: Any, origin: str) -> Conversation:
    list_key, role_key, content_key, role_map = CHAT_FORMATS[dataset]
    items = row.get(list_key) if isinstance(row, dict) else None
    if not isinstance(items, list) or not items:
        raise _malformed(origin, dataset, f"no non-empty '{list_key}' list", row)
    turns = []
    for number, item in enumerate(items, 1):
        role = role_map.get(item.get(role_key)) if isinstance(item, dict) else None
        if role is None or not isinstance(item.get(content_key), str):
            raise _malformed(origin, dataset, f"turn {number} is {str(item)[:60]!r}", row)
        turns.append((role, item[content_key]))
    if turns[0][0] == "assistant" or all(role != "assistant" for role, _ in turns):
        raise _malformed(origin, dataset, "expected an assistant turn after a system or user turn", row)
    return Conversation(tuple(turns), origin)


def parse_row(dataset: str, row: Any, origin: str) -> Conversation:
    """One raw row of ``dataset`` as a ``Conversation``; a malformed row raises a one-line DataSourceError."""
    if dataset == "alpaca":
        return _alpaca_conversation(row, origin)
    return _chat_conversation(dataset, row, origin)


def _read_local(path: Path) -> tuple[list[Any], Callable[[int], str]]:
    """Rows of a JSON list file, or of a JSON Lines file (``.jsonl``, blank lines skipped), and their origins."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".jsonl":
        rows, lines = [], []
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise DataSourceError(f"{path}:{number}: malformed JSON ({exc.msg})") from None
            lines.append(number)
        return rows, lambda i: f"{path}:{lines[i]}"
    try:
        rows = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataSourceError(f"{path}:{exc.lineno}: malformed JSON ({exc.msg})") from None
    if not isinstance(rows, list):
        raise DataSourceError(f"{path}: expected a JSON list of examples, got {type(rows).__name__}")
    return rows, lambda i: f"{path}: row {i + 1}"


def _local_path(config: SFTConfig, data_dir: str | None) -> Path | None:
    """``<data root>/<local_file>`` when a data root is set (it must exist), else None (the hub)."""
    root = resolve_data_dir(data_dir)
    if root is None:
        return None
    path = root / config.local_file
    if not path.is_file():
        raise DataSourceError(f"SFT data file {str(path)!r} does not exist; expected a {config.dataset} "
                              f"JSON or JSONL file under the data root {str(root)!r}")
    return path


def _hub_rows(config: SFTConfig) -> Any:
    return load_hub_dataset(config.hub_id, name=None, split="train",
                            local_hint=f"{config.local_file} ({config.dataset} JSON or JSONL)")


def _rows(config: SFTConfig, data_dir: str | None) -> tuple[Sequence[Any], Callable[[int], str]]:
    """Raw rows (a list, or a lazily indexed hub dataset) and the origin of row ``i``; a local file without rows
    raises a one-line DataSourceError naming it."""
    path = _local_path(config, data_dir)
    if path is not None:
        rows, origin = _read_local(path)
        if not rows:
            raise DataSourceError(f"SFT data file {str(path)!r} (sft.local_file) holds no examples; expected a JSON "
                                  f"list or JSON Lines file of at least one {config.dataset} row")
        return rows, origin
    return _hub_rows(config), lambda i: f"{config.hub_id}: row {i + 1}"


def load_conversations(config: SFTConfig, data_dir: str | None = None, seed: int | None = None) -> list[Conversation]:
    """The configured dataset as conversations, from ``<data root>/<local_file>`` if a root is set, else the hub.

    ``seed`` None: every row in source order. Otherwise the first ``config.max_examples`` rows (all if None)
    after a shuffle seeded with ``seed``; only those rows are read and checked, so a hub mixture of a million
    rows is not parsed whole.
    """
    rows, origin = _rows(config, data_dir)
    order = list(range(len(rows)))
    if seed is not None:
        random.Random(seed).shuffle(order)
        order = order[: config.max_examples]
    return [parse_row(config.dataset, rows[i], origin(i)) for i in order]


def _uses_chat_template(tokenizer, template: str) -> bool:
    has_template = bool(getattr(tokenizer, "chat_template", None))
    if template == "chat" and not has_template:
        raise ValueError("prompt_template: expected 'auto' or 'plain' for a tokenizer without a chat template, "
                         "got 'chat'")
    return template == "chat" or (template == "auto" and has_template)


def _render(tokenizer, turns: Sequence[tuple[str, str]], generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template([{"role": role, "content": content} for role, content in turns],
                                         tokenize=False, add_generation_prompt=generation_prompt)


def _chat_spans(turns: tuple[tuple[str, str], ...], tokenizer) -> tuple[str, list[tuple[int, int]]] | None:
    """(text, assistant spans) of ``turns`` via the template; None if a longer conversation re-renders earlier
    turns differently (then no prefix marks where an assistant turn starts)."""
    last = max(i for i, (role, _) in enumerate(turns) if role == "assistant")
    full = _render(tokenizer, turns[: last + 1], False)
    spans = []
    for i, (role, _) in enumerate(turns[: last + 1]):
        if role != "assistant":
            continue
        prompt = _render(tokenizer, turns[:i], True)
        upto = _render(tokenizer, turns[: i + 1], False)
        if not (upto.startswith(prompt) and full.startswith(upto)):
            return None
        spans.append((len(prompt), max(len(prompt), len(upto.rstrip()))))
    return full[: spans[-1][1]], spans


def chat_text(conversation: Conversation, tokenizer) -> tuple[str, list[tuple[int, int]]]:
    """(text up to the end of the last assistant turn, character spans of the assistant turns) via the template.

    A template that rejects a leading system turn (Gemma) or moves it as the conversation grows (Mistral) gets
    the conversation with the system content folded into the first user turn instead.
    """
    turns = conversation.turns
    candidates = [turns]
    if len(turns) > 1 and turns[0][0] == "system" and turns[1][0] == "user":
        candidates.append((("user", f"{turns[0][1]}\n\n{turns[1][1]}"),) + turns[2:])
    problem = ""
    for candidate in candidates:
        try:
            rendered = _chat_spans(candidate, tokenizer)
        except TemplateError as exc:
            problem = f"the template error {str(exc)[:160]!r}"
            continue
        if rendered is not None:
            return rendered
        problem = "earlier turns rendered differently as the conversation grows"
    raise ValueError(f"{conversation.origin}: expected a conversation the chat template renders turn by turn, "
                     f"got {problem}; use prompt_template: plain")


def plain_text(conversation: Conversation, eos_token: str | None) -> tuple[str, list[tuple[int, int]]]:
    """(text, character spans of the assistant turns) in the plain template; each span ends with ``eos_token``."""
    if not eos_token:
        raise ValueError("expected a tokenizer with an EOS token for the plain template, got none")
    turns = conversation.turns
    if [role for role, _ in turns] == ["user", "assistant"]:
        segments = [(conversation.plain_prompt or alpaca_prompt(turns[0][1]), False), (turns[1][1] + eos_token, True)]
    else:
        last = max(i for i, (role, _) in enumerate(turns) if role == "assistant")
        segments = []
        for i, (role, content) in enumerate(turns[: last + 1]):
            head = (PLAIN_SEPARATOR if i else "") + PLAIN_HEADERS[role]
            if role == "assistant":
                segments += [(head, False), (content + eos_token, True)]
            else:
                segments.append((head + content, False))
    text, spans = "", []
    for piece, labelled in segments:
        if labelled:
            spans.append((len(text), len(text) + len(piece)))
        text += piece
    return text, spans


def tokenize_conversation(conversation: Conversation, tokenizer, template: str,
                          max_seq_len: int) -> dict[str, list[int]]:
    """``input_ids`` of the rendered conversation truncated to ``max_seq_len``; ``labels`` keep only the tokens
    that start inside an assistant span (needs a fast tokenizer, for character offsets)."""
    chat = _uses_chat_template(tokenizer, template)
    text, spans = chat_text(conversation, tokenizer) if chat else plain_text(conversation, tokenizer.eos_token)
    encoded = tokenizer(text, add_special_tokens=not chat, truncation=True, max_length=max_seq_len,
                        return_offsets_mapping=True)
    labels, span = [], 0
    for token, (start, end) in zip(encoded["input_ids"], encoded["offset_mapping"]):
        while span < len(spans) and start >= spans[span][1]:
            span += 1
        inside = span < len(spans) and spans[span][0] <= start and end > start
        labels.append(token if inside else IGNORE_INDEX)
    return {"input_ids": list(encoded["input_ids"]), "labels": labels}


def sft_cache_key(config: SFTConfig, tokenizer, seed: int, data_dir: str | None, memo_dir: Path) -> str | None:
    """sha256 over what decides ``build_sft_examples``' output: the tokenizer (``tokenizer_fingerprint`` and its
    chat template), the data (the local file's sha256, memoised in ``memo_dir``; or the hub dataset's
    fingerprint), the SFT config, the seed, this module's source and the transformers version (which renders chat
    templates). None when the tokenizer or the hub dataset has no fingerprint (then nothing is cached)."""
    import transformers

    fingerprint = tokenizer_fingerprint(tokenizer)
    path = _local_path(config, data_dir)
    data = file_sha256(path, memo_dir) if path is not None else getattr(_hub_rows(config), "_fingerprint", None)
    if fingerprint is None or data is None:
        return None
    return cache_key(fingerprint, repr(getattr(tokenizer, "chat_template", None)), data,
                     repr((config.dataset, config.hub_id if path is None else config.local_file, config.max_examples,
                           config.max_seq_len, config.prompt_template, seed)),
                     file_sha256(Path(__file__)), transformers.__version__)


def build_sft_examples(config: SFTConfig, tokenizer, seed: int, data_dir: str | None = None,
                       cache: str | Path | None = None) -> list[dict]:
    """Tokenised examples in a seeded order; examples with no labelled token left (after position 0) are dropped.

    With ``cache`` (a directory) the examples are read from ``<cache>/<sft_cache_key>.pkl`` when it holds them,
    else built and stored there.
    """
    def build() -> list[dict]:
        conversations = load_conversations(config, data_dir, seed=seed)
        tokenized = [tokenize_conversation(c, tokenizer, config.prompt_template, config.max_seq_len)
                     for c in conversations]
        return [t for t in tokenized if any(label != IGNORE_INDEX for label in t["labels"][1:])]

    key = sft_cache_key(config, tokenizer, seed, data_dir, Path(cache) / ".sha256") if cache is not None else None
    return build() if key is None else cached_pickle(Path(cache) / f"{key}.pkl", build)


def collate(batch: list[dict[str, list[int]]], pad_token_id: int, pad_to_multiple: int = 1) -> dict[str, torch.Tensor]:
    """Right-pad a batch to a multiple of ``pad_to_multiple`` tokens; padding gets attention 0 and label -100.

    Few distinct widths keep compiled graphs and cuDNN attention plans (one per shape) reusable on a GPU.
    """
    width = max(len(item["input_ids"]) for item in batch)
    width = -(-width // pad_to_multiple) * pad_to_multiple
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
                    rank: int = 0, world_size: int = 1, pad_to_multiple: int = 1,
                    skip: int = 0) -> Iterator[dict[str, torch.Tensor]]:
    """Endless micro-batches: each epoch reshuffles with ``seed + epoch``; ranks take disjoint strides. The first
    ``skip`` micro-batches are passed over without being built (a resumed trial continues the same order)."""
    epoch = 0
    while True:
        order = list(range(len(examples)))
        random.Random(seed + epoch).shuffle(order)
        mine = order[rank::world_size]
        for start in range(0, len(mine) - micro_batch_size + 1, micro_batch_size):
            if skip:
                skip -= 1
                continue
            yield collate([examples[i] for i in mine[start:start + micro_batch_size]], pad_token_id, pad_to_multiple)
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
