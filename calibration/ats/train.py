"""Train an ATS head on a frozen causal LM: each step runs the model without gradients, the head on its last hidden
states, and the selective smoothing loss through the fused kernel (``calibration.ats.loss``).

Batches are SFT batches (``input_ids``, ``labels``, ``attention_mask``; right-padded, labels -100 off the response):
position t's hidden state predicts ``labels[t + 1]``. AdamW (betas 0.9 / 0.999, eps 1e-8, no weight decay: the
Hugging Face Trainer's defaults the authors ran), a cosine decay from ``learning_rate`` to 0 without warmup and
gradient clipping at ``max_grad_norm``.
"""

from __future__ import annotations

import math
from typing import Any, Iterator

import torch
from tqdm.auto import tqdm

from calibration.ats.config import ATSConfig
from calibration.ats.head import TemperatureHead
from calibration.ats.loss import IGNORE_INDEX, selective_smoothing_loss
from calibration.scoring import output_layer
from kernels.plan_history import PlanHistory


def head_inputs(model: Any, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(last hidden states (B, L, D), positions (B, L), next-token targets (B, L)) of a right-padded batch, from
    the model's decoder without gradients."""
    with torch.no_grad():
        hidden = model.get_decoder()(input_ids=batch["input_ids"],
                                     attention_mask=batch["attention_mask"]).last_hidden_state
    labels = batch["labels"]
    targets = torch.cat([labels[:, 1:], torch.full_like(labels[:, :1], IGNORE_INDEX)], dim=1)
    positions = torch.arange(labels.shape[1], device=labels.device).expand_as(labels)
    return hidden, positions, targets


def train_head(model: Any, head: TemperatureHead, batches: Iterator[dict[str, torch.Tensor]], steps: int,
               config: ATSConfig, *, progress: bool = True) -> list[float]:
    """Train ``head`` for ``steps`` optimiser steps (one batch each) on ``model``, which stays frozen and in eval
    mode; returns the loss of every step. The model needs its output embedding as a plain weight
    (``calibration.scoring.output_layer``)."""
    layer = output_layer(model)
    if layer is None:
        raise ValueError("expected a model whose logits are its last hidden states times a bias-free output "
                         "embedding (calibration.scoring.output_layer), got one without")
    if steps < 1:
        raise ValueError(f"expected steps >= 1, got {steps}")
    device = layer.weight.device
    was_training = model.training
    model.eval()
    head.to(device).train()
    optimizer = torch.optim.AdamW(head.parameters(), lr=config.learning_rate, betas=(0.9, 0.999), eps=1e-8,
                                  weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5 * (1 + math.cos(math.pi * step / steps)))
    losses: list[float] = []
    plan_history = PlanHistory()  # this fit's own: the SFT head's history is the trial's (trainable.lm_head)
    try:
        with tqdm(total=steps, desc="ATS head", unit="step", disable=not progress, leave=False) as bar:
            for _ in range(steps):
                batch = {k: v.to(device) for k, v in next(batches).items()}
                hidden, positions, targets = head_inputs(model, batch)
                log_temperature = head(hidden, batch["attention_mask"], positions)
                keep = targets != IGNORE_INDEX
                loss, _ = selective_smoothing_loss(hidden[keep], log_temperature[keep], layer.weight.detach(),
                                                   targets[keep], alpha=config.alpha, balanced=config.balanced,
                                                   softcap=layer.softcap, plan_history=plan_history)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(head.parameters(), config.max_grad_norm)
                optimizer.step()
                schedule.step()
                losses.append(float(loss.detach()))
                bar.set_postfix(loss=f"{losses[-1]:.4f}")
                bar.update()
    finally:
        model.train(was_training)
        head.eval()
    if not all(math.isfinite(value) for value in losses):
        raise RuntimeError(f"ATS head loss became non-finite: {losses}")
    return losses
