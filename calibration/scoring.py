"""Run a plan of shared-prefix rows through a causal LM and sum the continuation log-likelihoods.

Per group: one forward over the prefix gives its KV cache; every batch of rows (right-padded, so padding only
follows real tokens and needs no mask) runs off a copy of that cache repeated to the batch size. A batch holds
at most ``batch_size`` rows and, with ``batch_tokens``, at most that many padded row tokens (rows x width), so
short rows (a question after a cached 5-shot prefix) batch many to a forward and long rows few.

Log-likelihoods come from the decoder's last hidden states at the (row, position) pairs some ``Read`` needs,
through ``kernels.linear_cross_entropy(h, W, target, reduction="none", softcap=s)`` = -log softmax(s tanh(h W^T
/ s))[target]: no (batch x positions x vocabulary) logits are formed, so a 262k vocabulary costs nothing extra.
That rests on logits = softcap(hidden @ W^T) with W the output embedding; it is checked once per call against
the model's own logits, and a model for which it does not hold (extra logit scaling) is scored through its own
forward with ``logits_to_keep`` instead.
"""

from __future__ import annotations

import copy
import inspect
from typing import Any, Iterator, NamedTuple, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from tqdm.auto import tqdm

import kernels
from calibration.prompts import Prompt
from calibration.requests import Group, Read, Row, plan

# cuDNN attention builds an execution plan for every new (batch, query, key) shape, ~0.2 s each on an H100, and
# scoring rows vary in length batch to batch: the other kernels take any shape at no setup cost
SCORING_ATTENTION = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


class OutputLayer(NamedTuple):
    """logits = softcap * tanh(hidden @ weight^T / softcap) (no softcap: hidden @ weight^T)."""

    weight: torch.Tensor
    softcap: float | None

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = F.linear(hidden, self.weight)
        return logits if self.softcap is None else self.softcap * torch.tanh(logits / self.softcap)


def score_prompts(model: Any, tokenizer: Any, prompts: Sequence[Prompt], *, batch_size: int = 8,
                  batch_tokens: int | None = None, share_prefix: bool = True, progress: bool = False,
                  desc: str = "scoring", attention: Sequence[SDPBackend] | None = None) -> list[np.ndarray]:
    """Summed log-likelihood of every continuation of every prompt: ``[array(n_choices) per prompt]``."""
    groups = plan(tokenizer, prompts, share_prefix=share_prefix)
    return score_plan(model, groups, [len(p.continuations) for p in prompts], batch_size=batch_size,
                      batch_tokens=batch_tokens, progress=progress, desc=desc, attention=attention)


def score_plan(model: Any, groups: Sequence[Group], n_choices: Sequence[int], *, batch_size: int = 8,
               batch_tokens: int | None = None, progress: bool = False, desc: str = "scoring",
               attention: Sequence[SDPBackend] | None = None) -> list[np.ndarray]:
    """``score_prompts`` of an already tokenised plan (``calibration.requests.plan``). Attention runs on the
    kernels of SCORING_ATTENTION that are also in ``attention`` (None: all of them)."""
    if batch_size < 1:
        raise ValueError(f"expected batch_size >= 1, got {batch_size}")
    if batch_tokens is not None and batch_tokens < 1:
        raise ValueError(f"expected batch_tokens >= 1 or None, got {batch_tokens}")
    kernels_kept = [k for k in SCORING_ATTENTION if attention is None or k in attention]
    if not kernels_kept:
        raise ValueError(f"expected attention kernels among {SCORING_ATTENTION}, got {list(attention or [])}")
    loglik = [np.zeros(n) for n in n_choices]
    was_training = model.training
    model.eval()
    try:
        rows = sum(len(g.rows) for g in groups)
        with torch.inference_mode(), sdpa_kernel(kernels_kept), \
                tqdm(total=rows, desc=desc, unit="row", disable=not progress, leave=False) as bar:
            head = checked_output_layer(model, groups)
            for group in groups:
                _score_group(model, head, group, loglik, batch_size, batch_tokens, bar)
    finally:
        model.train(was_training)
    return loglik


def output_layer(model: Any) -> OutputLayer | None:
    """The model's bias-free output embedding and final-logit softcap (a fused head's own, else the config's)."""
    head = model.get_output_embeddings() if hasattr(model, "get_decoder") else None
    if head is None or not isinstance(getattr(head, "weight", None), torch.Tensor) \
            or getattr(head, "bias", None) is not None or hasattr(head.weight, "ds_id"):
        return None  # ds_id: ZeRO-3 partitioned the weight, which its hooks gather only inside module forwards
    if hasattr(head, "softcap"):  # trainable.lm_head.FusedLMHead applies its own
        return OutputLayer(head.weight, head.softcap)
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    return OutputLayer(head.weight, getattr(config, "final_logit_softcapping", None))


def checked_output_layer(model: Any, groups: Sequence[Group]) -> OutputLayer | None:
    """``output_layer(model)`` if its logits of one real row's last position equal the model's own (within
    2^-6 of their largest magnitude, a few bf16 ulps), else None (score through the model's logits)."""
    head = output_layer(model)
    group = next((g for g in groups if g.rows), None)
    if head is None or group is None:
        return head
    device = next(model.parameters()).device
    ids = torch.tensor([group.prefix + min(group.rows, key=lambda r: len(r.tokens)).tokens], device=device)
    with torch.inference_mode():
        expected = model(input_ids=ids, **_keep(model, 1)).logits[0, -1].float()
        got = head.logits(model.get_decoder()(input_ids=ids).last_hidden_state[0, -1]).float()
    return head if float((got - expected).abs().max()) <= 2 ** -6 * float(expected.abs().max()) + 1e-6 else None


def batches(rows: Sequence[Row], batch_size: int, batch_tokens: int | None) -> Iterator[list[Row]]:
    """Rows longest first, cut into batches of <= batch_size rows and <= batch_tokens padded tokens (a longer
    row runs alone)."""
    batch: list[Row] = []
    for row in sorted(rows, key=lambda r: len(r.tokens), reverse=True):
        width = len(batch[0].tokens) if batch else len(row.tokens)  # longest first: the first row sets the width
        if batch and (len(batch) == batch_size or (batch_tokens and (len(batch) + 1) * width > batch_tokens)):
            yield batch
            batch = []
        batch.append(row)
    if batch:
        yield batch


def _score_group(model: Any, head: OutputLayer | None, group: Group, loglik: list[np.ndarray], batch_size: int,
                 batch_tokens: int | None, bar: tqdm) -> None:
    device = next(model.parameters()).device
    cache = None
    if group.prefix:
        prefix = torch.tensor([group.prefix], device=device)
        cache = model(input_ids=prefix, use_cache=True, **_keep(model, 1)).past_key_values
    for batch in batches(group.rows, batch_size, batch_tokens):
        past = None
        if cache is not None:
            past = copy.deepcopy(cache)
            past.batch_repeat_interleave(len(batch))
        ids = _padded(batch).to(device)
        reads = [(i, read) for i, row in enumerate(batch) for read in row.reads]
        if head is None:
            values = _read_from_logits(model, ids, past, reads)
        else:
            values = _read_from_hidden(model, head, ids, past, reads)
        for (_, read), value in zip(reads, values.tolist()):
            loglik[read.question][read.choice] += value
        bar.update(len(batch))


def _padded(batch: list[Row]) -> torch.Tensor:
    ids = torch.zeros(len(batch), max(len(r.tokens) for r in batch), dtype=torch.long)
    for i, row in enumerate(batch):
        ids[i, : len(row.tokens)] = torch.tensor(row.tokens)
    return ids


def _read_from_hidden(model: Any, head: OutputLayer, ids: torch.Tensor, past: Any,
                      reads: list[tuple[int, Read]]) -> torch.Tensor:
    """log p(read.target) for every read, from the decoder's hidden states through the fused kernel."""
    hidden = model.get_decoder()(input_ids=ids, past_key_values=past, use_cache=past is not None).last_hidden_state
    rows = torch.tensor([i for i, _ in reads], device=ids.device)
    positions = torch.tensor([read.position for _, read in reads], device=ids.device)
    targets = torch.tensor([read.target for _, read in reads], device=ids.device)
    nll = kernels.linear_cross_entropy(hidden[rows, positions], head.weight, targets, reduction="none",
                                       softcap=head.softcap)
    return (-nll).double().cpu()


def _read_from_logits(model: Any, ids: torch.Tensor, past: Any, reads: list[tuple[int, Read]]) -> torch.Tensor:
    """log p(read.target) for every read, from the model's logits at the positions the batch reads."""
    columns = sorted({read.position for _, read in reads})
    column_of = {position: k for k, position in enumerate(columns)}
    kwargs = _keep(model, torch.tensor(columns, device=ids.device))
    logits = model(input_ids=ids, past_key_values=past, use_cache=past is not None, **kwargs).logits
    if "logits_to_keep" not in kwargs:  # the model computed every position: select the read ones here
        logits = logits[:, columns]
    rows = torch.tensor([i for i, _ in reads], device=ids.device)
    cols = torch.tensor([column_of[read.position] for _, read in reads], device=ids.device)
    targets = torch.tensor([read.target for _, read in reads], device=ids.device)
    logprobs = logits[rows, cols].float().log_softmax(-1)
    return logprobs.gather(1, targets[:, None]).squeeze(1).double().cpu()


def _keep(model: Any, keep: int | torch.Tensor) -> dict[str, Any]:
    """``logits_to_keep`` when the model's forward takes it (every recent Hugging Face causal LM)."""
    accepts = "logits_to_keep" in inspect.signature(model.forward).parameters
    return {"logits_to_keep": keep} if accepts else {}
