"""The ATS calibration head: one Llama decoder layer over the frozen model's last hidden states, then a linear map
to one number per token, the log-temperature log tau_i; token i's logits are divided by tau_i.

Architecture, as the authors' ``TransformerHead`` (``src/llmtuner/model/calibration/head.py`` and
``calibration_configs/transformer_hidden_states/config.json`` of github.com/Johnathan-Xie/adaptive-temperature-
scaling): RMSNorm -> causal self-attention with rotary positions (theta 10^4) -> residual -> RMSNorm -> SwiGLU MLP
-> residual -> Linear(D, 1), with the base model's hidden size D, MLP width and attention-head count, as many
key/value heads as heads, no dropout, RMSNorm eps 1e-6. Their inverse temperature exp(out) is clipped at 10, i.e.
tau >= 0.1 here (``MIN_LOG_TEMPERATURE``). One change: the last linear map starts at zero, so a new head is the
identity (tau = 1, the ``init_temperature: 1.0`` of their config, which their transformer head ignores).

Scoring reuses a prefix shared by many rows: ``context`` turns the prefix's hidden states into the layer's keys
and values (``HeadContext``), which rows then attend to besides their own tokens, as the base model does with its
KV cache; the result equals running the head on prefix + row.
"""

from __future__ import annotations

import json
import math
import os
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

MIN_LOG_TEMPERATURE = -math.log(10.0)  # the authors clip the inverse temperature at 10
_METADATA_KEY = "calsweep_ats_head"


@dataclass(frozen=True)
class HeadSpec:
    """Sizes of the head's decoder layer."""

    hidden_size: int
    intermediate_size: int
    num_heads: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6

    @classmethod
    def for_model(cls, model: Any) -> "HeadSpec":
        """The authors' sizing: the base model's hidden size, MLP width and attention heads."""
        config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        return cls(int(config.hidden_size), int(config.intermediate_size), int(config.num_attention_heads))

    def __post_init__(self) -> None:
        if self.hidden_size < 1 or self.intermediate_size < 1 or self.num_heads < 1 \
                or self.hidden_size % self.num_heads or (self.hidden_size // self.num_heads) % 2:
            raise ValueError(f"expected positive sizes with hidden_size divisible by num_heads into an even head "
                             f"dimension, got {self}")


class HeadContext(NamedTuple):
    """Keys and values of a left-padded prefix batch (batch, heads, width, head_dim), and its mask (batch, width)."""

    keys: torch.Tensor
    values: torch.Tensor
    mask: torch.Tensor

    def select(self, owner: torch.Tensor) -> "HeadContext":
        """Row i gets prefix ``owner[i]``."""
        return HeadContext(self.keys[owner], self.values[owner], self.mask[owner])


class _RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


def _rotate(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding (Llama's half-split form) of x (B, H, L, d) at positions (B, L)."""
    half = x.shape[-1] // 2
    inv_freq = theta ** (-torch.arange(half, device=x.device, dtype=torch.float32) / half)
    angles = positions.to(torch.float32)[:, None, :, None] * inv_freq  # (B, 1, L, d/2)
    cos, sin = torch.cat([angles.cos()] * 2, -1).to(x.dtype), torch.cat([angles.sin()] * 2, -1).to(x.dtype)
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class TemperatureHead(nn.Module):
    """``forward(hidden, mask, positions, context=None) -> log tau`` (B, L), at least float32, >= MIN_LOG_TEMPERATURE.

    hidden (B, L, D): the base model's last hidden states; mask (B, L): 1 on real tokens; positions (B, L): rotary
    positions; context: the keys and values of a prefix that precedes every row (``context``). Attention is
    causal within the rows and sees the whole (unmasked) prefix.
    """

    def __init__(self, spec: HeadSpec):
        super().__init__()
        self.spec = spec
        d, width, self.n_heads = spec.hidden_size, spec.intermediate_size, spec.num_heads
        self.input_norm = _RMSNorm(d, spec.rms_norm_eps)
        self.q_proj, self.k_proj = nn.Linear(d, d, bias=False), nn.Linear(d, d, bias=False)
        self.v_proj, self.o_proj = nn.Linear(d, d, bias=False), nn.Linear(d, d, bias=False)
        self.post_attention_norm = _RMSNorm(d, spec.rms_norm_eps)
        self.gate_proj, self.up_proj = nn.Linear(d, width, bias=False), nn.Linear(d, width, bias=False)
        self.down_proj = nn.Linear(width, d, bias=False)
        self.out = nn.Linear(d, 1)
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, d = x.shape
        return x.view(batch, length, self.n_heads, d // self.n_heads).transpose(1, 2)

    def _keys_values(self, normed: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return _rotate(self._split(self.k_proj(normed)), positions, self.spec.rope_theta), \
            self._split(self.v_proj(normed))

    def context(self, hidden: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor) -> HeadContext:
        """Keys and values of a prefix batch (its hidden states, mask and positions) for ``forward``."""
        keys, values = self._keys_values(self.input_norm(self._features(hidden)), positions)
        return HeadContext(keys, values, mask.bool())

    def _features(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden.to(self.out.weight.dtype)

    def forward(self, hidden: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor,
                context: HeadContext | None = None) -> torch.Tensor:
        x = self._features(hidden)
        length = x.shape[1]
        normed = self.input_norm(x)
        queries = _rotate(self._split(self.q_proj(normed)), positions, self.spec.rope_theta)
        keys, values = self._keys_values(normed, positions)
        own = torch.ones(length, length, dtype=torch.bool, device=x.device).tril()
        allowed = own[None] & mask.bool()[:, None, :]  # (B, L, L): causal, real keys only
        allowed |= torch.eye(length, dtype=torch.bool, device=x.device)  # a padded query sees itself, never NaN
        if context is not None:
            keys, values = torch.cat([context.keys, keys], 2), torch.cat([context.values, values], 2)
            allowed = torch.cat([context.mask[:, None, :].expand(-1, length, -1), allowed], 2)
        attended = F.scaled_dot_product_attention(queries, keys, values, attn_mask=allowed[:, None])
        x = x + self.o_proj(attended.transpose(1, 2).reshape(x.shape))
        normed = self.post_attention_norm(x)
        x = x + self.down_proj(F.silu(self.gate_proj(normed)) * self.up_proj(normed))
        log_temperature = self.out(x).squeeze(-1)
        return log_temperature.to(torch.promote_types(x.dtype, torch.float32)).clamp_min(MIN_LOG_TEMPERATURE)


def save_head(head: TemperatureHead, path: str | Path) -> Path:
    """Write the head's weights and spec to a safetensors file, atomically (a temporary file, then a rename)."""
    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {name: tensor.detach().cpu().contiguous() for name, tensor in head.state_dict().items()}
    temporary = path.parent / f".{path.name}.{uuid.uuid4().hex}.tmp"
    try:
        save_file(state, str(temporary), metadata={_METADATA_KEY: json.dumps(asdict(head.spec))})
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
    return path


def load_head(path: str | Path, device: str | torch.device = "cpu") -> TemperatureHead:
    """A head written by ``save_head``; a file without its spec is a ValueError naming it."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    with safe_open(str(path), framework="pt") as handle:
        spec = (handle.metadata() or {}).get(_METADATA_KEY)
    if spec is None:
        raise ValueError(f"expected an ATS head written by calibration.ats.save_head in {str(path)!r}, "
                         f"got a safetensors file without {_METADATA_KEY!r} metadata")
    head = TemperatureHead(HeadSpec(**json.loads(spec)))
    head.load_state_dict(load_file(str(path)))
    return head.to(device).eval()

