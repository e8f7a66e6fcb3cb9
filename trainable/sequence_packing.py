"""Sequence packing for SFT: whole examples back to back in fixed-width rows, no attention across them.

A packed row holds several tokenised examples, then padding up to ``width``. ``position_ids`` restart at 0 at
every example (and at the padding tail): a Hugging Face decoder called with ``position_ids`` and no attention
mask takes each restart as a sequence boundary (transformers' ``find_packed_sequence_indices``) and builds a
block-diagonal causal mask, so no token sees another example and rotary positions are each example's own.
``packed_causal_mask`` builds that mask itself where the decoder's would be it (SDPA, no sliding-window layers):
the decoder's own check for packing reads a value back from the GPU every forward.
``labels`` are the examples' labels with the first token of each example set to -100: the loss shifts labels
by one, and an example's first token must not become the target of the previous example's last token.
``attention_mask`` marks real tokens (1) and the padding tail (0); it is for counting, not passed to the
model. Every row has the same width, so compiled layers see one shape.

Rows are filled first-fit in the order given (a seeded shuffle): each example goes to the oldest of the
last ``open_rows`` rows with room, else starts a new row. An example longer than ``width`` is an error
(``max_seq_len`` above the row width).
"""

from __future__ import annotations

import random
from typing import Any, Iterator, Sequence

import torch

IGNORE_INDEX = -100


def pack_rows(lengths: Sequence[int], order: Sequence[int], width: int, open_rows: int = 64) -> list[list[int]]:
    """Example indices of each row: first-fit in ``order`` over the last ``open_rows`` rows, total <= width."""
    rows: list[list[int]] = []
    room: list[int] = []
    for index in order:
        length = lengths[index]
        if length > width:
            raise ValueError(f"expected every packed example to fit a row of {width} tokens, got one of {length}; "
                             f"raise train.pack_length or lower sft.max_seq_len")
        first_open = max(0, len(rows) - open_rows)
        target = next((r for r in range(first_open, len(rows)) if room[r] >= length), None)
        if target is None:
            rows.append([])
            room.append(width)
            target = len(rows) - 1
        rows[target].append(index)
        room[target] -= length
    return rows


def collate_packed(examples: Sequence[dict[str, list[int]]], rows: Sequence[Sequence[int]], width: int,
                   pad_token_id: int) -> dict[str, torch.Tensor]:
    """Tensors of packed rows: input_ids, labels, position_ids and attention_mask (1 = real token), (B, width)."""
    input_ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long)
    labels = torch.full((len(rows), width), IGNORE_INDEX, dtype=torch.long)
    position_ids = torch.zeros((len(rows), width), dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for row, members in enumerate(rows):
        start = 0
        for index in members:
            ids, item_labels = examples[index]["input_ids"], examples[index]["labels"]
            end = start + len(ids)
            input_ids[row, start:end] = torch.tensor(ids)
            labels[row, start + 1:end] = torch.tensor(item_labels[1:], dtype=torch.long)
            position_ids[row, start:end] = torch.arange(len(ids))
            attention_mask[row, start:end] = 1
            start = end
        position_ids[row, start:] = torch.arange(width - start)
    return {"input_ids": input_ids, "labels": labels, "position_ids": position_ids, "attention_mask": attention_mask}


def epoch_rows(examples: Sequence[dict[str, list[int]]], width: int, seed: int, epoch: int) -> list[list[int]]:
    """The packed rows of one epoch: examples shuffled with ``seed + epoch``, then packed first-fit."""
    order = list(range(len(examples)))
    random.Random(seed + epoch).shuffle(order)
    return pack_rows([len(e["input_ids"]) for e in examples], order, width)


def iterate_packed_batches(examples: Sequence[dict[str, list[int]]], micro_batch_size: int, width: int,
                           pad_token_id: int, seed: int, rank: int = 0, world_size: int = 1,
                           skip: int = 0) -> Iterator[dict[str, torch.Tensor]]:
    """Endless micro-batches of packed rows; each epoch repacks a new shuffle; ranks take disjoint strides of
    equal length (so every rank runs the same number of micro-batches). The first ``skip`` micro-batches are
    passed over without being built (a resumed trial continues the same order)."""
    epoch = 0
    while True:
        rows = epoch_rows(examples, width, seed, epoch)
        per_rank = len(rows) // world_size
        mine = rows[rank::world_size][:per_rank]
        if len(mine) < micro_batch_size:
            raise ValueError(f"expected at least micro_batch_size={micro_batch_size} packed rows per rank, got "
                             f"{len(mine)} ({len(examples)} examples in {len(rows)} rows of {width} tokens over "
                             f"{world_size} ranks); use more SFT examples or a smaller micro-batch")
        for start in range(0, len(mine) - micro_batch_size + 1, micro_batch_size):
            if skip:
                skip -= 1
                continue
            yield collate_packed(examples, mine[start:start + micro_batch_size], width, pad_token_id)
        epoch += 1


def packed_row_count(examples: Sequence[dict[str, list[int]]], width: int, seed: int) -> int:
    """Rows in the first epoch's packing (the epoch length used to turn ``train.epochs`` into steps)."""
    return len(epoch_rows(examples, width, seed, 0))


def pack_wanted(setting: bool | None, device: "torch.device") -> bool:
    """``TrainConfig.pack``: True/False as given; None means on CUDA only."""
    return device.type == "cuda" if setting is None else setting


def packed_width(max_seq_len: int, pack_length: int | None, pad_to_multiple: int) -> int:
    """Row width: ``pack_length`` if set, else ``max_seq_len`` rounded up to a multiple of ``pad_to_multiple``."""
    return pack_length or -(-max_seq_len // pad_to_multiple) * pad_to_multiple


def pad_multiple(train: Any, device_type: str) -> int:
    """Rows are padded to a multiple of this: ``train.pad_to_multiple``, else 64 on CUDA and 1 elsewhere."""
    return train.pad_to_multiple or (64 if device_type == "cuda" else 1)


def trial_pack_width(train: Any, max_seq_len: int, device_type: str) -> int | None:
    """The packed row width a trial's ``train`` section gives on a ``device_type`` device, None where it does not
    pack (rows are then at most ``max_seq_len`` tokens)."""
    if not pack_wanted(train.pack, torch.device(device_type)):
        return None
    return packed_width(max_seq_len, train.pack_length, pad_multiple(train, device_type))


def packed_causal_mask(position_ids: torch.Tensor, config) -> torch.Tensor | None:
    """The mask a Hugging Face decoder builds for packed rows under SDPA, (B, 1, L, L) boolean, True = attend:
    token i sees token j <= i of its own example, an example starting wherever the position is not the previous
    one plus 1. Passed as the attention mask (a prepared 4D mask is used as it is), it spares the decoder its check
    for packing, which reads a value back from the GPU every forward, so the host cannot queue a step ahead.
    None where the decoder must build its own: attention other than SDPA, or sliding-window layers."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if getattr(config, "_attn_implementation", None) != "sdpa" or _has_sliding_layers(text):
        return None
    starts = torch.diff(position_ids, prepend=position_ids[:, :1] - 1, dim=-1) != 1
    example = starts.cumsum(-1)
    width = position_ids.shape[-1]
    causal = torch.ones(width, width, dtype=torch.bool, device=position_ids.device).tril()
    return ((example[:, :, None] == example[:, None, :]) & causal)[:, None]


def _has_sliding_layers(config) -> bool:
    """Whether any layer of ``config`` (a text config) attends within a sliding window."""
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        return any(kind != "full_attention" for kind in layer_types)
    return getattr(config, "sliding_window", None) is not None and getattr(config, "use_sliding_window", True)
