"""Run a plan of shared-prefix rows through a causal LM and sum the continuation log-likelihoods.

Per group: one forward over the prefix gives its KV cache; every batch of rows (right-padded, so padding only
follows real tokens and needs no mask) runs off a copy of that cache repeated to the batch size. Logits are
computed only where a ``Read`` needs them (``logits_to_keep`` as a boolean mask), then
``log_softmax`` in float32, so a 262k vocabulary costs one row of logits per scored token, not per token.
"""

from __future__ import annotations

import copy
import inspect
from typing import Any, Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from calibration.prompts import Prompt
from calibration.requests import Group, Row, plan


def score_prompts(model: Any, tokenizer: Any, prompts: Sequence[Prompt], *, batch_size: int = 8,
                  share_prefix: bool = True, progress: bool = False, desc: str = "scoring") -> list[np.ndarray]:
    """Summed log-likelihood of every continuation of every prompt: ``[array(n_choices) per prompt]``."""
    if batch_size < 1:
        raise ValueError(f"expected batch_size >= 1, got {batch_size}")
    groups = plan(tokenizer, prompts, share_prefix=share_prefix)
    loglik = [np.zeros(len(p.continuations)) for p in prompts]
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode(), tqdm(total=sum(len(g.rows) for g in groups), desc=desc, unit="row",
                                          disable=not progress, leave=False) as bar:
            for group in groups:
                _score_group(model, group, loglik, batch_size, bar)
    finally:
        model.train(was_training)
    return loglik


def _score_group(model: Any, group: Group, loglik: list[np.ndarray], batch_size: int, bar: tqdm) -> None:
    device = next(model.parameters()).device
    cache = None
    if group.prefix:
        prefix = torch.tensor([group.prefix], device=device)
        cache = model(input_ids=prefix, use_cache=True, **_keep(model, 1)).past_key_values
    rows = sorted(group.rows, key=lambda r: len(r.tokens), reverse=True)
    for start in range(0, len(rows), batch_size):
        batch = rows[start:start + batch_size]
        past = None
        if cache is not None:
            past = copy.deepcopy(cache)
            past.batch_repeat_interleave(len(batch))
        _score_batch(model, batch, past, loglik, device)
        bar.update(len(batch))


def _score_batch(model: Any, batch: list[Row], past: Any, loglik: list[np.ndarray], device: torch.device) -> None:
    width = max(len(r.tokens) for r in batch)
    ids = torch.zeros(len(batch), width, dtype=torch.long)
    keep = torch.zeros(len(batch), width, dtype=torch.bool)
    for i, row in enumerate(batch):
        ids[i, : len(row.tokens)] = torch.tensor(row.tokens)
        keep[i, [read.position for read in row.reads]] = True
    # boolean-mask order is row-major: the k-th kept position of the batch becomes logprobs[k]
    offsets = torch.cumsum(keep.flatten().long(), 0).view_as(keep) - 1
    ids, keep = ids.to(device), keep.to(device)
    logits = model(input_ids=ids, past_key_values=past, use_cache=past is not None, **_keep(model, keep)).logits
    if logits.dim() == 3 and logits.shape[:2] == keep.shape:  # the model ignored logits_to_keep: select here
        logits = logits[keep]
    logprobs = logits.reshape(-1, logits.shape[-1]).float().log_softmax(-1)
    where, targets, owners = [], [], []
    for i, row in enumerate(batch):
        for read in row.reads:
            where.append(int(offsets[i, read.position]))
            targets.append(read.target)
            owners.append((read.question, read.choice))
    values = logprobs[torch.tensor(where, device=device), torch.tensor(targets, device=device)].double().cpu()
    for (question, choice), value in zip(owners, values.tolist()):
        loglik[question][choice] += value


def _keep(model: Any, keep: int | torch.Tensor) -> dict[str, Any]:
    """``logits_to_keep`` when the model's forward takes it (every recent Hugging Face causal LM)."""
    accepts = "logits_to_keep" in inspect.signature(model.forward).parameters
    return {"logits_to_keep": keep} if accepts else {}
