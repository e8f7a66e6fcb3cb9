"""The final hidden states of a model on its evaluation prompts, and the entropy-floor statistics measured on them.

``evaluation_entropy_stats`` is what a trial stores (``calibration.entropy.statistics.STATS``): the prompts are the
contexts (few-shot prefix + query, tokenised as the scorer does, ``calibration.requests.encode_prompts``) of the
first ``QUESTIONS`` questions (fewer with the evaluation's own ``limit``) of each task's reported split, at most
``max_tokens // len(tasks)`` tokens per task (the last context cut short to fit); every real (non-padding)
position's decoder output, after the final norm, is one hidden state. Contexts sharing a few-shot prefix repeat its states, as scoring sees them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from calibration.entropy.statistics import entropy_floor_stats
from calibration.prompts import Prompt
from calibration.requests import Group, Row, encode_prompts
from calibration.scoring import SCORING_ATTENTION, batches, checked_output_layer
from calibration.task_config import TaskConfig, load_prompts, resolve_task

QUESTIONS = 64  # first questions of each task whose contexts are sampled
MAX_TOKENS = 16384  # hidden states per trial, at most (shared evenly among the tasks)


def context_rows(tokenizer: Any, prompts: Sequence[Prompt], max_tokens: int) -> list[list[int]]:
    """The prompts' context token ids in order, cut to ``max_tokens`` in all (the last one shortened to fit)."""
    if max_tokens < 1:
        raise ValueError(f"expected max_tokens >= 1, got {max_tokens}")
    rows, left = [], max_tokens
    encoded = encode_prompts(tokenizer, [(p.prefix + p.query, p.continuations) for p in prompts])
    for ctx, _ in encoded:
        if left <= 0:
            break
        rows.append(ctx[:left])
        left -= len(rows[-1])
    return rows


def prompt_hidden_states(model: Any, rows: Sequence[Sequence[int]], *, batch_size: int = 8,
                         batch_tokens: int | None = None,
                         attention: Sequence[SDPBackend] | None = None) -> torch.Tensor:
    """(sum of row lengths, D): the decoder's last hidden state at every position of every row, rows in order.

    Rows are batched longest first, at most ``batch_size`` rows and ``batch_tokens`` padded tokens a forward
    (right-padded, padding masked and dropped). Runs without gradients on the model's device, in eval mode
    (restored after); ``attention`` narrows the SDPA kernels as the scorer does.
    """
    if not rows or any(len(row) == 0 for row in rows) or batch_size < 1:
        raise ValueError(f"expected non-empty token rows and batch_size >= 1, got {len(rows)} rows "
                         f"(lengths {sorted({len(r) for r in rows})[:5]}) and batch_size {batch_size}")
    device = next(model.parameters()).device
    decoder = model.get_decoder()
    states: list[torch.Tensor | None] = [None] * len(rows)
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode(), sdpa_kernel([k for k in SCORING_ATTENTION if attention is None or k in attention]):
            for batch in batches(list(enumerate(rows)), batch_size, batch_tokens, length=lambda item: len(item[1])):
                width = len(batch[0][1])
                ids = torch.zeros(len(batch), width, dtype=torch.long)
                mask = torch.zeros(len(batch), width, dtype=torch.long)
                for i, (_, row) in enumerate(batch):
                    ids[i, :len(row)] = torch.tensor(row)
                    mask[i, :len(row)] = 1
                hidden = decoder(input_ids=ids.to(device), attention_mask=mask.to(device),
                                 use_cache=False).last_hidden_state
                for i, (index, row) in enumerate(batch):
                    states[index] = hidden[i, :len(row)].clone()
    finally:
        model.train(was_training)
    return torch.cat(states)  # type: ignore[arg-type]


def evaluation_entropy_stats(model: Any, tokenizer: Any, tasks: Sequence[str | TaskConfig], *,
                             data_dir: str | Path | None = None, limit: int | None = None,
                             max_tokens: int = MAX_TOKENS, batch_size: int = 8, batch_tokens: int | None = None,
                             attention: Sequence[SDPBackend] | None = None) -> dict[str, float]:
    """``entropy_floor_stats`` of the model's output head over its hidden states on the evaluation prompts (module
    doc), or {} where the head cannot be read as a plain bias-free weight and softcap whose logits are the model's
    own (a ZeRO-3-partitioned head: no forward runs then, so a rank calling it alone starts no collective)."""
    configs = [resolve_task(t) for t in tasks]
    if not configs or max_tokens < len(configs):
        raise ValueError(f"expected tasks and max_tokens >= one per task, got {len(configs)} tasks and "
                         f"max_tokens={max_tokens}")
    questions = QUESTIONS if limit is None else min(QUESTIONS, limit)
    rows = []
    for config in configs:
        _, prompts = load_prompts(config, data_dir=data_dir, limit=questions)
        rows += context_rows(tokenizer, prompts, max_tokens // len(configs))
    head = checked_output_layer(model, [Group([], [Row(list(rows[0]))])])  # no forward for a ZeRO-3 head
    if head is None:
        return {}
    cap = min(batch_tokens or max_tokens, max_tokens)  # a forward's padded tokens: no more than the whole pass's
    hidden = prompt_hidden_states(model, rows, batch_size=batch_size, batch_tokens=cap, attention=attention)
    return entropy_floor_stats(head.weight, hidden, softcap=head.softcap)

