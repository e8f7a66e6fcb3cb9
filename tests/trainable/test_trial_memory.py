"""trainable.trial_memory: a trial row's memory columns."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import LlamaConfig

from trainable import trial_memory
from trainable.config import TrainConfig
from trainable.layout import GIB, ModelShape, plan_layout, with_layout

LLAMA_8B = LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                       num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=False, head_dim=128)
LLAMA_1B = LlamaConfig(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                       num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=True, head_dim=64)
CUDA = torch.device("cuda")  # only its type is read: no GPU needed


@pytest.mark.parametrize("config, gpu_gib, sequences, micro, engine, held", [
    (LLAMA_8B, 79.6, 4, 2, "fsdp2", {}),  # 2 GPUs, FSDP2, micro-batch 2
    (LLAMA_8B, 139.8, 4, 2, "fsdp2", {}),  # 2 GPUs, ZeRO-2
    (LLAMA_8B, 79.6, 8, 2, "deepspeed", {"workers": 2, "stage": 3}),  # ZeRO-3 on DeepSpeed, 21 layers recomputed
    (LLAMA_1B, 79.6, 4, 4, "fsdp2", {}),  # 1 GPU, FSDP2
    (LLAMA_1B, 32.0, 16, 4, "fsdp2", {"workers": 1}),  # 1 GPU, FSDP2 with accumulation
])
def test_a_trials_predicted_peak_is_its_planned_layouts(config, gpu_gib, sequences, micro, engine, held):
    """What the row predicts for the layout a trial ran with is what the planner predicted when it chose it."""
    shape = ModelShape.from_config(config)
    layout = plan_layout(shape, 2048, sequences, micro, gpu_gib * GIB, preferred_engine=engine, **held)
    train = with_layout(TrainConfig(), layout, shape)
    predicted = trial_memory.predicted_peak_gib(config, shape.params, train, layout.engine, layout.zero_stage,
                                                layout.workers, 2048, layout.checkpointed, "bf16", CUDA)
    assert predicted == pytest.approx(layout.peak_gib, rel=1e-12)


def test_no_prediction_off_cuda_or_outside_bf16():
    shape = ModelShape.from_config(LLAMA_1B)
    args = (LLAMA_1B, shape.params, TrainConfig(), "deepspeed", 0, 1, 2048, 0)
    assert trial_memory.predicted_peak_gib(*args, "bf16", torch.device("cpu")) is None
    assert trial_memory.predicted_peak_gib(*args, "fp32", CUDA) is None
    assert trial_memory.predicted_peak_gib(*args, "bf16", CUDA) > 0


def test_host_rss_counts_what_the_process_holds():
    before = trial_memory.host_rss_gib()
    held = np.ones(2**28 // 8)  # 256 MiB, touched
    assert trial_memory.host_rss_gib() - before > 0.2
    del held


def test_no_gpu_peak_on_the_cpu():
    trial_memory.reset_gpu_peak(torch.device("cpu"))
    assert trial_memory.gpu_peak_gib(torch.device("cpu")) is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_peak_is_the_allocators_since_the_reset():
    device = torch.device("cuda")
    big = torch.empty(2**28, dtype=torch.uint8, device=device)  # 256 MiB
    del big
    trial_memory.reset_gpu_peak(device)
    small = torch.empty(2**26, dtype=torch.uint8, device=device)  # 64 MiB
    assert 1 / 16 <= trial_memory.gpu_peak_gib(device) < 0.25
    del small
