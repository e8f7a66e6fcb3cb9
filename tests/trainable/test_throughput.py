"""Model FLOPs utilisation: the formula on numbers worked by hand, None where no peak is known."""

import pytest

from trainable.throughput import PEAK_BF16_FLOPS, model_flops_utilization, training_flops_per_token


def test_flops_per_token_is_6n_plus_the_attention_term():
    # SmolLM2-135M's shape: 134.5M parameters, 30 layers, d = 576, rows of 160 tokens
    assert training_flops_per_token(134_515_008, 30, 576, 160) == 6 * 134_515_008 + 12 * 30 * 576 * 160


def test_mfu_divides_by_the_device_s_peak_and_is_none_elsewhere():
    flops = 1e9
    assert model_flops_utilization(98_900.0, flops, "NVIDIA H100 80GB HBM3") == pytest.approx(0.1)
    assert PEAK_BF16_FLOPS["NVIDIA H100 PCIe"] < PEAK_BF16_FLOPS["NVIDIA H100 80GB HBM3"]
    assert model_flops_utilization(98_900.0, flops, None) is None  # a CPU
    assert model_flops_utilization(98_900.0, flops, "Some Future GPU") is None
    assert model_flops_utilization(None, flops, "NVIDIA H100 80GB HBM3") is None  # no steady step
