"""The DeepSpeed config that calsweep builds, as DeepSpeed itself parses it, and the learning-rate schedule."""

import math
import os

import pytest
from deepspeed.runtime.config import DeepSpeedConfig

from trainable.config import TrainConfig
from trainable.deepspeed_setup import deepspeed_config, lr_lambda, sanitize_cuda_arch_list


def test_bf16_config_has_no_per_step_host_syncs():
    train = TrainConfig(micro_batch_size=4, gradient_accumulation_steps=2, zero_stage=2, max_grad_norm=1.0)
    parsed = DeepSpeedConfig(deepspeed_config(train, "bf16", world_size=1))
    assert parsed.bfloat16_config.enabled and not parsed.bfloat16_config.check_grad_overflow
    assert not parsed.timers_config.enabled
    assert (parsed.zero_optimization_stage, parsed.gradient_clipping, parsed.train_batch_size) == (2, 1.0, 8)


def test_researcher_overrides_merge_into_nested_entries():
    train = TrainConfig(deepspeed={"bf16": {"check_grad_overflow": True}, "zero_optimization": {"overlap_comm": True}})
    config = deepspeed_config(train, "bf16", world_size=2)
    assert config["bf16"] == {"enabled": True, "check_grad_overflow": True}
    assert config["zero_optimization"] == {"stage": 2, "overlap_comm": True}  # 'auto' across ranks: ZeRO-2


def test_zero3_buckets_follow_the_layer_and_parse():
    train = TrainConfig(zero_stage=3, micro_batch_size=2)
    config = deepspeed_config(train, "bf16", world_size=1, layer_params=218_112_128)
    zero = DeepSpeedConfig(config).zero_config
    assert zero.prefetch_bucket_size == 218_112_128 and zero.max_live_parameters == 3 * 218_112_128
    assert zero.reduce_bucket_size == 218_112_128 and zero.param_persistence_threshold == 100_000
    assert zero.overlap_comm


def test_auto_stage_without_a_layout_is_zero0_alone_and_zero2_across_ranks():
    assert deepspeed_config(TrainConfig(), "fp32", world_size=1)["zero_optimization"]["stage"] == 0
    assert deepspeed_config(TrainConfig(), "fp32", world_size=4)["zero_optimization"]["stage"] == 2


@pytest.mark.parametrize("schedule, at_end", [("cosine", 0.0), ("linear", 0.0), ("constant", 1.0)])
def test_schedule_warms_up_then_decays(schedule, at_end):
    factor = lr_lambda(schedule, total_steps=100, warmup_steps=10)
    assert [factor(s) for s in (0, 4, 9)] == [0.1, 0.5, 1.0]
    assert math.isclose(factor(100), at_end, abs_tol=1e-12)
    assert factor(55) == {"cosine": 0.5 * (1 + math.cos(math.pi * 0.5)), "linear": 0.5, "constant": 1.0}[schedule]


def test_cuda_arch_suffixes_are_dropped(monkeypatch):
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.0 9.0a")
    sanitize_cuda_arch_list()
    assert os.environ["TORCH_CUDA_ARCH_LIST"] == "8.0;9.0"
