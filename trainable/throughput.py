"""Model FLOPs utilisation of a training run, with the one table of peak FLOP/s it needs.

    FLOPs per token = 6 N + 12 L d T     (N parameters, L layers, hidden size d, T tokens per row; PaLM's appendix B)
    MFU             = tokens/s per GPU x FLOPs per token / the GPU's dense bf16 peak
"""

from __future__ import annotations

PEAK_BF16_FLOPS = {  # torch.cuda.get_device_name() -> dense bf16 FLOP/s from the vendor's data sheet
    "NVIDIA H100 80GB HBM3": 989e12,  # H100 SXM5
    "NVIDIA H100 PCIe": 756e12,
    "NVIDIA H200": 989e12,
    "NVIDIA A100-SXM4-80GB": 312e12,
}


def training_flops_per_token(n_params: int, n_layers: int, hidden_size: int, tokens_per_row: float) -> float:
    """6 N (forward and backward of every weight) + 12 L d T (attention scores and values)."""
    return 6 * n_params + 12 * n_layers * hidden_size * tokens_per_row


def model_flops_utilization(tokens_per_s_per_gpu: float | None, flops_per_token: float,
                            device_name: str | None) -> float | None:
    """MFU in [0, 1], or None without a steady rate or on a device not in ``PEAK_BF16_FLOPS`` (CPUs among them)."""
    peak = PEAK_BF16_FLOPS.get(device_name or "")
    if peak is None or tokens_per_s_per_gpu is None:
        return None
    return tokens_per_s_per_gpu * flops_per_token / peak
