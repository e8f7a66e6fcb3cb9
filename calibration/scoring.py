"""Run a plan of shared-prefix rows through a causal LM and sum the continuation log-likelihoods.

Groups are taken in chunks whose prefixes run as one forward, left-padded to a common length (pads first, masked,
positions counted from each prefix's first real token), which gives the chunk's KV cache. Rows of every group
of the chunk are then batched together (right-padded: padding only follows real tokens), each row running off
its own group's prefix cache (gathered per batch) with the prefix's padding masked out. Left padding keeps the
distance between a row token and every prefix token the unpadded one, so sliding-window layers see what they
would see on the full sequence. A batch holds at most ``batch_size`` rows and, with ``batch_tokens``, at most
that many padded tokens: a chunk's prefixes (groups x width), a batch's rows with the prefix each gathers (rows x
(prefix width + row width)); short rows (a question after a cached 5-shot prefix) batch many to a forward, and
one forward serves many groups (MMLU: 57 subjects, each a few hundred questions).

Log-likelihoods come from the decoder's last hidden states at the (row, position) pairs some ``Read`` needs,
through ``kernels.linear_cross_entropy(h, W, target, reduction="none", softcap=s)`` = -log softmax(s tanh(h W^T
/ s))[target]: no (batch x positions x vocabulary) logits are formed, so a 262k vocabulary costs nothing extra.
That rests on logits = softcap(hidden @ W^T) with W the output embedding; it is checked once per call against
the model's own logits, and a model for which it does not hold (extra logit scaling) is scored through its own
forward with ``logits_to_keep`` instead. Values stay on the device until the end: two host syncs per call (that
check, and reading the values).

With an ATS head (``score_prompts_with_ats``, ``calibration.ats``) the same pass also reads every log-likelihood
with token i's logits divided by its temperature tau_i (its hidden row scaled by 1 / tau_i): the head runs on the
prefix's last hidden states once per chunk (its keys and values, like the model's cache) and on each batch's rows.
"""

from __future__ import annotations

import copy
import inspect
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, NamedTuple, Sequence, TypeVar

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from tqdm.auto import tqdm

import kernels
from calibration.prompts import Prompt
from calibration.prompt_cache import cached_groups
from calibration.requests import Group, Read, Row

if TYPE_CHECKING:  # calibration.ats imports this module
    from calibration.ats.head import HeadContext, TemperatureHead

T = TypeVar("T")

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
                  desc: str = "scoring", attention: Sequence[SDPBackend] | None = None,
                  prompt_cache: str | Path | None = None) -> list[np.ndarray]:
    """Summed log-likelihood of every continuation of every prompt: ``[array(n_choices) per prompt]``.
    ``prompt_cache``: a directory where tokenised plans are kept across calls (``calibration.prompt_cache``)."""
    groups = cached_groups(tokenizer, prompts, share_prefix=share_prefix, directory=prompt_cache)
    return score_plan(model, groups, [len(p.continuations) for p in prompts], batch_size=batch_size,
                      batch_tokens=batch_tokens, progress=progress, desc=desc, attention=attention)


def score_prompts_with_ats(model: Any, tokenizer: Any, prompts: Sequence[Prompt], head: "TemperatureHead", *,
                           batch_size: int = 8, batch_tokens: int | None = None, share_prefix: bool = True,
                           progress: bool = False, desc: str = "scoring",
                           attention: Sequence[SDPBackend] | None = None, prompt_cache: str | Path | None = None
                           ) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """``(score_prompts(...), the same with ATS)`` from one pass: each log-likelihood term also read with its
    token's logits divided by ``head``'s temperature."""
    groups = cached_groups(tokenizer, prompts, share_prefix=share_prefix, directory=prompt_cache)
    plain, scaled = _score(model, groups, [len(p.continuations) for p in prompts], batch_size, batch_tokens,
                           progress, desc, attention, head)
    return plain, scaled


def score_plan(model: Any, groups: Sequence[Group], n_choices: Sequence[int], *, batch_size: int = 8,
               batch_tokens: int | None = None, progress: bool = False, desc: str = "scoring",
               attention: Sequence[SDPBackend] | None = None) -> list[np.ndarray]:
    """``score_prompts`` of an already tokenised plan (``calibration.requests.plan``). Attention runs on the
    kernels of SCORING_ATTENTION that are also in ``attention`` (None: all of them)."""
    return _score(model, groups, n_choices, batch_size, batch_tokens, progress, desc, attention, None)[0]


def _score(model: Any, groups: Sequence[Group], n_choices: Sequence[int], batch_size: int, batch_tokens: int | None,
           progress: bool, desc: str, attention: Sequence[SDPBackend] | None,
           ats: "TemperatureHead | None") -> list[list[np.ndarray]]:
    """The log-likelihoods of the plan, and with ``ats`` those with ATS too (one list per reading)."""
    if batch_size < 1:
        raise ValueError(f"expected batch_size >= 1, got {batch_size}")
    if batch_tokens is not None and batch_tokens < 1:
        raise ValueError(f"expected batch_tokens >= 1 or None, got {batch_tokens}")
    kernels_kept = [k for k in SCORING_ATTENTION if attention is None or k in attention]
    if not kernels_kept:
        raise ValueError(f"expected attention kernels among {SCORING_ATTENTION}, got {list(attention or [])}")
    if ats is not None and not hasattr(model, "get_decoder"):
        raise ValueError(f"expected a model with get_decoder() for ATS scoring, got {type(model).__name__}")
    sink = _Sink(n_choices)
    was_training = model.training
    model.eval()
    try:
        rows = sum(len(g.rows) for g in groups)
        with torch.inference_mode(), sdpa_kernel(kernels_kept), \
                tqdm(total=rows, desc=desc, unit="row", disable=not progress, leave=False) as bar:
            head = checked_output_layer(model, groups)
            # prefixes batch like rows: <= batch_size per forward, <= batch_tokens left-padded prefix tokens
            for chunk in batches(groups, batch_size, batch_tokens, length=lambda group: len(group.prefix)):
                _score_chunk(model, head, chunk, sink, batch_size, batch_tokens, bar, ats)
            return sink.result()
    finally:
        model.train(was_training)


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


def batches(items: Sequence[T], batch_size: int, batch_tokens: int | None,
            length: Callable[[T], int] = lambda row: len(row.tokens)) -> Iterator[list[T]]:
    """Items (rows) longest first, cut into batches of <= batch_size items and <= batch_tokens padded tokens
    (a longer item runs alone)."""
    batch: list[T] = []
    for item in sorted(items, key=length, reverse=True):
        width = length(batch[0]) if batch else length(item)  # longest first: the first item sets the width
        if batch and (len(batch) == batch_size or (batch_tokens and (len(batch) + 1) * width > batch_tokens)):
            yield batch
            batch = []
        batch.append(item)
    if batch:
        yield batch


class PrefixCache(NamedTuple):
    """The KV cache of a chunk of group prefixes, left-padded to one length: pads come first, so the distance
    between a row token and every prefix token (what sliding-window attention limits) is the unpadded one."""

    cache: Any
    mask: torch.Tensor  # (groups, width), 0 over the left padding
    lengths: torch.Tensor  # (groups,) real prefix tokens
    ats: "HeadContext | None" = None  # the ATS head's keys and values over the prefix's last hidden states


def _score_chunk(model: Any, head: OutputLayer | None, groups: Sequence[Group], sink: "_Sink", batch_size: int,
                 batch_tokens: int | None, bar: tqdm, ats: "TemperatureHead | None" = None) -> None:
    """Run the chunk's prefixes in one forward, then its rows, batched across groups, off that cache."""
    device = next(model.parameters()).device
    prefix = _prefix_cache(model, groups, device, ats) if any(g.prefix for g in groups) else None
    items = [(g, row) for g, group in enumerate(groups) for row in group.rows]
    cached = 0 if prefix is None else prefix.mask.shape[1]  # each row's gathered prefix: the chunk's width
    for batch in batches(items, batch_size, batch_tokens, length=lambda item: cached + len(item[1].tokens)):
        ids, row_mask = _padded([row.tokens for _, row in batch])
        ids, row_mask = ids.to(device), row_mask.to(device)
        inputs: dict[str, Any] = {"input_ids": ids}
        positions = torch.arange(ids.shape[1], device=device).expand_as(ids)
        context = None
        if prefix is not None:
            owner = torch.tensor([g for g, _ in batch], device=device)
            past = _select_rows(prefix.cache, owner)
            positions = prefix.lengths[owner, None] + positions
            inputs.update(past_key_values=past, use_cache=True,
                          attention_mask=torch.cat([prefix.mask[owner], row_mask], dim=1), position_ids=positions)
            context = prefix.ats.select(owner) if prefix.ats is not None else None
        temperature = None if ats is None else _RowTemperature(ats, row_mask, positions, context)
        reads = [(i, read) for i, (_, row) in enumerate(batch) for read in row.reads]
        values = _read_from_logits(model, inputs, reads, temperature) if head is None else \
            _read_from_hidden(model, head, inputs, reads, temperature)
        sink.add(values, reads)
        bar.update(len(batch))


def _prefix_cache(model: Any, groups: Sequence[Group], device: torch.device,
                  ats: "TemperatureHead | None" = None) -> PrefixCache:
    ids, mask = _padded([g.prefix for g in groups], left=True)
    width = ids.shape[1]
    lengths = mask.sum(1)
    positions = (torch.arange(width) - (width - lengths)[:, None]).clamp_min(0)
    ids, mask, lengths, positions = ids.to(device), mask.to(device), lengths.to(device), positions.to(device)
    body = model.get_decoder() if hasattr(model, "get_decoder") else model
    keep = {} if body is not model else _keep(model, 1)
    out = body(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, **keep)
    context = None if ats is None else ats.context(out.last_hidden_state, mask, positions)
    return PrefixCache(out.past_key_values, mask, lengths, context)


def _select_rows(cache: Any, owner: torch.Tensor) -> Any:
    """A new cache whose row i is ``cache``'s row ``owner[i]``: a shallow copy with its own layer objects, whose
    tensors ``batch_select_indices`` replaces (gathers), so the chunk's cache is neither copied whole nor changed."""
    past = copy.copy(cache)
    past.layers = [copy.copy(layer) for layer in cache.layers]
    past.batch_select_indices(owner)
    return past


class _Sink:
    """Log-likelihood terms kept on the device and summed into per-question arrays once, at the end (no host
    sync per batch, so the host queues the next batch while the device runs this one)."""

    def __init__(self, n_choices: Sequence[int]):
        self.n_choices = list(n_choices)
        self.offsets = np.concatenate([[0], np.cumsum(self.n_choices)]).astype(np.int64)
        self.values: list[torch.Tensor] = []
        self.slots: list[np.ndarray] = []

    def add(self, values: torch.Tensor, reads: list[tuple[int, Read]]) -> None:
        """values: (reads, columns), one column per reading (plain, ATS)."""
        self.values.append(values)
        self.slots.append(np.array([self.offsets[r.question] + r.choice for _, r in reads], dtype=np.int64))

    def result(self) -> list[list[np.ndarray]]:
        """One list of per-question arrays per column of the added values."""
        columns = self.values[0].shape[1] if self.values else 1
        flat = np.zeros((int(self.offsets[-1]), columns))
        if self.values:
            np.add.at(flat, np.concatenate(self.slots), torch.cat(self.values).double().cpu().numpy())
        return [[flat[a:b, c] for a, b in zip(self.offsets[:-1], self.offsets[1:])] for c in range(columns)]


def _padded(sequences: list[list[int]], left: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids padded to the longest sequence (on the right, or the left) and their attention mask (1 over
    real tokens)."""
    width = max(len(tokens) for tokens in sequences)
    ids = torch.zeros(len(sequences), width, dtype=torch.long)
    mask = torch.zeros(len(sequences), width, dtype=torch.long)
    for i, tokens in enumerate(sequences):
        span = slice(width - len(tokens), width) if left else slice(0, len(tokens))
        ids[i, span] = torch.tensor(tokens, dtype=torch.long)
        mask[i, span] = 1
    return ids, mask


class _RowTemperature(NamedTuple):
    """What the ATS head needs besides a batch's last hidden states: the rows' mask and rotary positions, and the
    prefix's keys and values gathered for the rows."""

    head: "TemperatureHead"
    mask: torch.Tensor
    positions: torch.Tensor
    context: "HeadContext | None"

    def at(self, hidden: torch.Tensor, rows: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """tau (float32) at the read (row, position) pairs."""
        return torch.exp(self.head(hidden, self.mask, self.positions, self.context)[rows, positions])


def _read_from_hidden(model: Any, head: OutputLayer, inputs: dict[str, Any], reads: list[tuple[int, Read]],
                      temperature: _RowTemperature | None = None) -> torch.Tensor:
    """log p(read.target) for every read, (reads, 1) float32 on the device, from the decoder's hidden states through
    the fused kernel; with ``temperature`` a second column with the hidden row divided by its tau."""
    hidden = model.get_decoder()(**inputs).last_hidden_state
    device = hidden.device
    rows = torch.tensor([i for i, _ in reads], device=device)
    positions = torch.tensor([read.position for _, read in reads], device=device)
    targets = torch.tensor([read.target for _, read in reads], device=device)
    read = hidden[rows, positions]
    readings = [read] if temperature is None else \
        [read, (read.float() / temperature.at(hidden, rows, positions)[:, None]).to(read.dtype)]
    return torch.stack([-kernels.linear_cross_entropy(h, head.weight, targets, reduction="none",
                                                      softcap=head.softcap) for h in readings], dim=1)


def _read_from_logits(model: Any, inputs: dict[str, Any], reads: list[tuple[int, Read]],
                      temperature: _RowTemperature | None = None) -> torch.Tensor:
    """log p(read.target) for every read, (reads, 1) float32 on the device, from the model's logits at the positions
    the batch reads; with ``temperature`` a second column with those logits divided by tau."""
    device = inputs["input_ids"].device
    columns = sorted({read.position for _, read in reads})
    column_of = {position: k for k, position in enumerate(columns)}
    kwargs = _keep(model, torch.tensor(columns, device=device))
    out = model(**inputs, **kwargs, **({} if temperature is None else {"output_hidden_states": True}))
    logits = out.logits
    if "logits_to_keep" not in kwargs:  # the model computed every position: select the read ones here
        logits = logits[:, columns]
    rows = torch.tensor([i for i, _ in reads], device=device)
    cols = torch.tensor([column_of[read.position] for _, read in reads], device=device)
    targets = torch.tensor([read.target for _, read in reads], device=device)
    read = logits[rows, cols].float()
    scaled = [read] if temperature is None else \
        [read, read / temperature.at(out.hidden_states[-1], rows, torch.tensor([r.position for _, r in reads],
                                                                              device=device))[:, None]]
    return torch.stack([z.log_softmax(-1).gather(1, targets[:, None]).squeeze(1) for z in scaled], dim=1)


def _keep(model: Any, keep: int | torch.Tensor) -> dict[str, Any]:
    """``logits_to_keep`` when the model's forward takes it (every recent Hugging Face causal LM)."""
    accepts = "logits_to_keep" in inspect.signature(model.forward).parameters
    return {"logits_to_keep": keep} if accepts else {}
