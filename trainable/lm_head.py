"""The causal LM's output layer with the label-smoothed loss fused in.

``FusedLMHead`` replaces ``model.lm_head`` and keeps its weight Parameter (so tied embeddings stay tied).
Called with hidden states only it returns logits, as the original head did (evaluation, generation);
called with ``targets`` it returns ``kernels.linear_cross_entropy(hidden, weight, targets, ...)`` and never
forms the logits. Because the loss is computed inside this module's forward, DeepSpeed ZeRO-3 gathers the
partitioned weight with its usual module hooks, in the forward and again in the backward.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

import kernels
from kernels.plan_history import PlanHistory
from trainable.sequence_packing import packed_causal_mask

IGNORE_INDEX = -100


class FusedLMHead(nn.Module):
    """logits = hidden @ W^T (optionally softcapped); with targets: the fused label-smoothed loss. The head owns
    its gradient filter's plan history (``plan_history``, kernels/plan_history.py), saved with a trial's checkpoint
    (trainable.checkpointing)."""

    def __init__(self, weight: nn.Parameter, bias: nn.Parameter | None = None, softcap: float | None = None):
        super().__init__()
        if bias is not None:
            raise ValueError("expected an lm_head without bias (the fused loss has no bias term), got a bias")
        self.weight = weight
        self.softcap = softcap
        self.plan_history = PlanHistory()

    def forward(self, hidden: torch.Tensor, targets: torch.Tensor | None = None, *, label_smoothing: float = 0.0,
                loss_impl: str = "fused", reduction: str = "mean", filter: str = "exact",
                ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Logits, or with targets (loss over non-ignored tokens, their mean max-probability, and the plain
        cross-entropy -log p(target) over the same tokens, detached, in the same ``reduction``: "mean" or "sum");
        ``filter`` the fused kernel's gradient filter."""
        if targets is None:
            logits = F.linear(hidden, self.weight)
            return logits if self.softcap is None else self.softcap * torch.tanh(logits / self.softcap)
        kept = targets.flatten() != IGNORE_INDEX
        if loss_impl == "fused":
            loss, stats = kernels.linear_cross_entropy(hidden, self.weight, targets, label_smoothing=label_smoothing,
                                                       ignore_index=IGNORE_INDEX, softcap=self.softcap,
                                                       reduction=reduction, return_stats=True, filter=filter,
                                                       plan_history=self.plan_history)
            plain = -torch.log(stats.target_prob.flatten())
            return loss, _masked_mean(stats.max_prob.flatten(), kept), _masked_reduce(plain, kept, reduction)
        logits = self.forward(hidden)
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32)).flatten(0, -2)
        loss = F.cross_entropy(logits, targets.flatten(), label_smoothing=label_smoothing, ignore_index=IGNORE_INDEX,
                               reduction=reduction)
        plain = F.cross_entropy(logits.detach(), targets.flatten(), ignore_index=IGNORE_INDEX, reduction="none")
        return loss, _masked_mean(logits.detach().softmax(-1).amax(-1), kept), _masked_reduce(plain, kept, reduction)


def _masked_mean(values: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
    """mean of ``values[kept]`` (NaN when nothing is kept), without a host sync."""
    values = torch.where(kept, values.float(), 0.0)
    return values.sum() / kept.sum()


def _masked_reduce(values: torch.Tensor, kept: torch.Tensor, reduction: str) -> torch.Tensor:
    """sum of ``values[kept]`` for "sum", else their mean (0 when nothing is kept, as the fused loss), detached."""
    total = torch.where(kept, values.detach().float(), 0.0).sum()
    return total if reduction == "sum" else total / kept.sum().clamp_min(1)


COMPUTE_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}  # per precision


def head_shape(config) -> tuple[int, int, float | None]:  # noqa: ANN001 - a transformers config
    """(vocabulary, hidden size, logit softcap) of the output layer a model of ``config`` has."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return text.vocab_size, text.hidden_size, getattr(text, "final_logit_softcapping", None)


def precompile_fused_head(shape: tuple[int, int, float | None], device: torch.device, precision: str, tokens: int,
                          label_smoothing: float, loss_impl: str, loss_filter: str) -> Callable[[], None]:
    """Start compiling the fused loss's Triton kernels for a head of ``shape`` (``head_shape``) ahead
    (``kernels.precompile``: a micro-batch of ``tokens`` rows, ``precision``'s compute dtype) where they will run,
    on a CUDA device with ``loss_impl`` fused; returns the join (nothing to join elsewhere)."""
    if device.type != "cuda" or loss_impl != "fused":
        return lambda: None
    from kernels.precompile import precompile

    vocab, dim, softcap = shape
    return precompile(vocab, dim, COMPUTE_DTYPES[precision], device, tokens, label_smoothing, softcap, loss_filter)


def install_fused_head(model: nn.Module) -> FusedLMHead:
    """Swap the model's output embedding for a ``FusedLMHead`` sharing its weight; return the new head."""
    old = model.get_output_embeddings()
    head = FusedLMHead(old.weight, getattr(old, "bias", None), head_shape(model.config)[2])
    model.set_output_embeddings(head)
    return head


class CausalLMWithFusedLoss(nn.Module):
    """Wraps a HF causal LM: forward(batch) -> label-smoothed loss over response tokens.

    targets[t] = labels[t + 1] (next-token prediction); the last position and prompt/padding are ignored.
    Without ``loss_divisor`` the loss is the mean over the batch's response tokens. With it, the loss is
    sum / loss_divisor: the trial loop passes (response tokens of the whole optimiser step, all micro-batches and
    ranks) / (micro-batches x ranks), so after DeepSpeed's averaging over both the gradient is that of the mean
    over every response token of the step, however they are spread over micro-batches.
    With ``position_ids`` (packed rows, ``trainable.sequence_packing``) the attention mask passed is
    ``packed_causal_mask``'s, or none where the decoder must build its own: either way the examples are kept apart.
    ``plain_loss`` accumulates, over training forwards, the plain cross-entropy -log p(target) (no smoothing) of
    the same tokens scaled like the returned loss, so that betas can be compared; ``take_plain_loss`` hands it over
    and starts again. ``last_confidence`` holds the mean max-probability of the last batch as a 0-d tensor on the model's device
    (training watches it without logits, and reads it only when it reports, so steps need no host sync).
    """

    def __init__(self, model: nn.Module, label_smoothing: float, loss_impl: str = "fused", loss_filter: str = "exact"):
        super().__init__()
        self.model = model
        self.head = install_fused_head(model)
        self.label_smoothing = label_smoothing
        self.loss_impl = loss_impl
        self.loss_filter = loss_filter
        self.last_confidence = torch.tensor(float("nan"))
        self.plain_loss: torch.Tensor | None = None

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor,
                position_ids: torch.Tensor | None = None, loss_divisor: torch.Tensor | None = None) -> torch.Tensor:
        decoder = self.model.get_decoder()
        mask = attention_mask if position_ids is None else packed_causal_mask(position_ids, self.model.config)
        hidden = decoder(input_ids=input_ids, attention_mask=mask, position_ids=position_ids,
                         use_cache=False).last_hidden_state
        targets = torch.cat([labels[:, 1:], torch.full_like(labels[:, :1], IGNORE_INDEX)], dim=1)
        loss, confidence, plain = self.head(hidden, targets, label_smoothing=self.label_smoothing,
                                            loss_impl=self.loss_impl, filter=self.loss_filter,
                                            reduction="mean" if loss_divisor is None else "sum")
        self.last_confidence = confidence.detach()
        if self.model.training:  # not validation, nor the attention check's probes (they put the inner model in eval)
            scaled = plain if loss_divisor is None else plain / loss_divisor
            self.plain_loss = scaled if self.plain_loss is None else self.plain_loss + scaled
        return loss if loss_divisor is None else loss / loss_divisor

    def take_plain_loss(self) -> torch.Tensor:
        """The plain losses accumulated since the last call (0-d, on the device; 0 without one), and reset."""
        taken, self.plain_loss = self.plain_loss, None
        return taken if taken is not None else torch.zeros(())
