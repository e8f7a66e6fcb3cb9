"""Run a plan of shared-prefix rows through a causal LM and sum the continuation log-likelihoods.

Per group: one forward over the prefix gives its KV cache; every batch of rows (right-padded, so padding only
follows real tokens and needs no mask) runs off a copy of that cache repeated to the batch size. Logits are
computed only at the sequence positions some ``Read`` of the batch needs (``logits_to_keep`` as a 1-D index
tensor, its documented form in every transformers release that has it), then ``log_softmax`` in float32 of just
the (row, position) pairs read, so a 262k vocabulary costs about one row of logits per scored token.
"""

from __future__ import annotations

import copy
import inspect
from typing import Any, Sequence

import numpy as np
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from tqdm.auto import tqdm

from calibration.prompts import Prompt
from calibration.requests import Group, Row, plan


# cuDNN attention builds an execution plan for every new (batch, query, key) shape, ~0.2 s each on an H100, and
# scoring rows vary in length batch to batch: the other kernels take any shape at no setup cost
SCORING_ATTENTION = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


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
        rows = sum(len(g.rows) for g in groups)
        with torch.inference_mode(), sdpa_kernel(SCORING_ATTENTION), \
                tqdm(total=rows, desc=desc, unit="row", disable=not progress, leave=False) as bar:
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
    for i, row in enumerate(batch):
        ids[i, : len(row.tokens)] = torch.tensor(row.tokens)
    reads = [(i, read) for i, row in enumerate(batch) for read in row.reads]
    columns = sorted({read.position for _, read in reads})  # positions any row of the batch reads
    column_of = {position: k for k, position in enumerate(columns)}
    ids = ids.to(device)
    kwargs = _keep(model, torch.tensor(columns, device=device))
    logits = model(input_ids=ids, past_key_values=past, use_cache=past is not None, **kwargs).logits
    if "logits_to_keep" not in kwargs:  # the model computed every position: select the read ones here
        logits = logits[:, columns]
    rows = torch.tensor([i for i, _ in reads], device=device)
    cols = torch.tensor([column_of[read.position] for _, read in reads], device=device)
    targets = torch.tensor([read.target for _, read in reads], device=device)
    logprobs = logits[rows, cols].float().log_softmax(-1)
    values = logprobs.gather(1, targets[:, None]).squeeze(1).double().cpu()
    for (_, read), value in zip(reads, values.tolist()):
        loglik[read.question][read.choice] += value


def _keep(model: Any, keep: int | torch.Tensor) -> dict[str, Any]:
    """``logits_to_keep`` when the model's forward takes it (every recent Hugging Face causal LM)."""
    accepts = "logits_to_keep" in inspect.signature(model.forward).parameters
    return {"logits_to_keep": keep} if accepts else {}
