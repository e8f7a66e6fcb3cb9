"""torchtitan's loss on a Hugging Face causal LM, for ``bench_sft_throughput.py``'s ``torchtitan_settings`` rows:
the LM head's bf16 logits of every position, cast to float32, and ``F.cross_entropy`` of the next token, no label
smoothing (torchtitan's ``cross_entropy_loss``), where calsweep's ``CausalLMWithFusedLoss`` never forms the logits.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from trainable.lm_head import IGNORE_INDEX
from trainable.sequence_packing import packed_causal_mask


class PlainCrossEntropyLM(nn.Module):
    """Called as ``CausalLMWithFusedLoss`` is (the trial loop's ``optimizer_step``): the mean cross-entropy over the
    labelled next tokens, or with ``loss_divisor`` their sum / ``loss_divisor``."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor,
                position_ids: torch.Tensor | None = None, loss_divisor: torch.Tensor | None = None) -> torch.Tensor:
        mask = attention_mask if position_ids is None else packed_causal_mask(position_ids, self.model.config)
        hidden = self.model.get_decoder()(input_ids=input_ids, attention_mask=mask, position_ids=position_ids,
                                          use_cache=False).last_hidden_state
        targets = torch.cat([labels[:, 1:], torch.full_like(labels[:, :1], IGNORE_INDEX)], dim=1)
        logits = self.model.lm_head(hidden).flatten(0, 1).float()  # (B T, V) in float32, as torchtitan's loss
        loss = F.cross_entropy(logits, targets.flatten(), ignore_index=IGNORE_INDEX,
                               reduction="mean" if loss_divisor is None else "sum")
        return loss if loss_divisor is None else loss / loss_divisor
