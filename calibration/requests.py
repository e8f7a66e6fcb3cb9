"""Turn prompts into token rows that share a cached prefix: the plan the scorer executes.

Tokenisation copies lm-evaluation-harness (``_encode_pair``): trailing spaces of the context move to the
continuation, ``ctx = enc(context)``, ``cont = enc(context + continuation)[len(ctx):]`` and the scored sequence
is ``ctx + cont``, with the tokenizer's default special tokens. The log-likelihood of choice c is
``sum_t log p(cont_t | ctx, cont_<t)``, read from the logits at the position before each continuation token.

Sharing. Questions are grouped by their text prefix (k-shot examples); a group's prefix is the longest common
*token* prefix of its contexts, so sharing never changes which tokens are scored. Within a group:
- all continuations one token (MMLU letters): one row per question, every choice read at its last position;
- otherwise one row per choice, the context suffix followed by the continuation.
The scorer batches rows across the questions of a group and across groups (``calibration.scoring``).
(Sharing each question's own context among its choices as well was measured and dropped: it halves HellaSwag's
tokens but needs two small forwards per question, and on 2 CPU cores it was no faster than batching whole rows.)
With ``share_prefix=False`` everything is one group with an empty prefix (the no-sharing baseline).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from calibration.prompts import Prompt


@dataclass(frozen=True)
class Read:
    """Add ``log p(target | row[:position + 1])`` to ``loglik[question][choice]``."""

    position: int  # index in the row (after the shared prefix)
    target: int
    question: int
    choice: int


@dataclass
class Row:
    tokens: list[int]
    reads: list[Read] = field(default_factory=list)


@dataclass
class Group:
    prefix: list[int]
    rows: list[Row]


def encode_prompt(tokenizer: Any, context: str, continuations: Sequence[str]) -> tuple[list[int], list[list[int]]]:
    """lm-eval's split of each ``context + continuation`` into context and continuation token ids."""
    return encode_prompts(tokenizer, [(context, continuations)])[0]


def encode_prompts(tokenizer: Any, pairs: Sequence[tuple[str, Sequence[str]]],
                   chunk: int = 4096) -> list[tuple[list[int], list[list[int]]]]:
    """``encode_prompt`` of every (context, continuations) pair, through few large tokenizer calls (a fast
    tokenizer encodes a batch on all its threads; one call per prompt cost ~3 ms of Python and Rust setup each)."""
    texts: list[str] = []
    for context, continuations in pairs:
        stripped = context.rstrip()
        spaces = context[len(stripped):]
        texts += [stripped] + [stripped + spaces + c for c in continuations]
    ids: list[list[int]] = []
    for start in range(0, len(texts), chunk):
        ids += tokenizer(texts[start:start + chunk])["input_ids"]
    encoded, at = [], 0
    for _, continuations in pairs:
        ctx = list(ids[at])
        encoded.append((ctx, [list(whole[len(ctx):]) for whole in ids[at + 1:at + 1 + len(continuations)]]))
        at += 1 + len(continuations)
    return encoded


def plan(tokenizer: Any, prompts: Sequence[Prompt], *, share_prefix: bool = True) -> list[Group]:
    """Group the prompts' (context, continuation) token sequences into rows under shared prefixes."""
    encoded = []
    pairs = [(prompt.prefix + prompt.query, prompt.continuations) for prompt in prompts]
    for index, (prompt, (ctx, conts)) in enumerate(zip(prompts, encode_prompts(tokenizer, pairs))):
        if not ctx or any(not cont for cont in conts):
            raise ValueError(f"expected a non-empty context and continuations for prompt {index}, "
                             f"got context {len(ctx)} tokens, continuations {[len(c) for c in conts]} tokens")
        encoded.append((prompt.prefix if share_prefix else "", index, ctx, conts))

    by_key: dict[str, list[tuple[int, list[int], list[list[int]]]]] = {}
    for key, index, ctx, conts in encoded:
        by_key.setdefault(key, []).append((index, ctx, conts))
    return [_group(members, share_prefix) for members in by_key.values()]


def _group(members: list[tuple[int, list[int], list[list[int]]]], share_prefix: bool) -> Group:
    n_prefix = _common_prefix_length([ctx for _, ctx, _ in members]) if share_prefix else 0
    # the logits at the last context token must come from a row, not from the cached prefix
    n_prefix = min([n_prefix] + [len(ctx) - 1 for _, ctx, _ in members])
    prefix = members[0][1][:n_prefix]
    rows = []
    for index, ctx, conts in members:
        suffix = ctx[n_prefix:]
        last = len(suffix) - 1
        if all(len(c) == 1 for c in conts):
            rows.append(Row(suffix, [Read(last, c[0], index, k) for k, c in enumerate(conts)]))
            continue
        for k, cont in enumerate(conts):
            reads = [Read(last + t, token, index, k) for t, token in enumerate(cont)]
            rows.append(Row(suffix + cont[:-1], reads))
    return Group(prefix, rows)


def _common_prefix_length(sequences: list[list[int]]) -> int:
    first = sequences[0]
    length = min(len(s) for s in sequences)
    for sequence in sequences[1:]:
        n = 0
        while n < length and sequence[n] == first[n]:
            n += 1
        length = n
    return length
