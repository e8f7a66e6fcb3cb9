"""trainable.trial_memory: a trial row's memory columns."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
from transformers import LlamaConfig

from trainable import trial_memory
from trainable.config import TrialConfig
from trainable.layout import GIB, SCORING_TOKENS_MAX, ModelShape, plan_layout, planned_scoring_tokens, with_layout

LLAMA_8B = LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                       num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=False, head_dim=128)
LLAMA_1B = LlamaConfig(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                       num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=True, head_dim=64)
CUDA = torch.device("cuda")  # only its type is read: no GPU needed
TRIAL = TrialConfig.from_dict(dict(run_name="a", trial_id="t", family="llama", learning_rate=1e-5, label_smoothing=0.1))


@pytest.mark.parametrize("config, gpu_gib, sequences, micro, engine, held", [
    (LLAMA_8B, 79.6, 4, 2, "fsdp2", {}),  # 2 GPUs, FSDP2, micro-batch 2
    (LLAMA_8B, 139.8, 4, 2, "fsdp2", {}),  # 2 GPUs, ZeRO-2
    (LLAMA_8B, 79.6, 8, 2, "deepspeed", {"workers": 2, "stage": 3}),  # ZeRO-3 on DeepSpeed, 21 layers recomputed
    (LLAMA_1B, 79.6, 4, 4, "fsdp2", {}),  # 1 GPU, FSDP2
    (LLAMA_1B, 32.0, 16, 4, "fsdp2", {"workers": 1}),  # 1 GPU, FSDP2 with accumulation
])
def test_a_trials_predicted_peak_is_its_planned_layouts(config, gpu_gib, sequences, micro, engine, held):
    """What the row predicts for the layout a trial ran with is what the planner predicted when it chose it: the
    load, the attention check and the training steps (planned), the export and scoring below them in these layouts."""
    shape = ModelShape.from_config(config)
    layout = plan_layout(shape, 2048, sequences, micro, gpu_gib * GIB, preferred_engine=engine, **held)
    trial = dataclasses.replace(TRIAL, train=with_layout(dataclasses.replace(TRIAL.train, save_model=True), layout,
                                                         shape))
    predicted = trial_memory.predicted_phase_peaks_gib(config, shape.params, trial, layout.engine, layout.zero_stage,
                                                       layout.workers, 2048, layout.checkpointed, "bf16", CUDA)
    assert list(predicted) == ["load", "attention_check", "train", "export", "score"]
    assert max(predicted["load"], predicted["attention_check"], predicted["train"]) == \
        pytest.approx(layout.peak_gib, rel=1e-12)
    # neither the load nor the check is the trial's largest allocation
    assert max(predicted["load"], predicted["attention_check"]) < predicted["train"]
    # DeepSpeed's ZeRO-3 (8B, 2 GPUs, 21 layers recomputed) keeps its states while the export gathers a bf16 copy
    # and while scoring: those phases peak above its training steps; FSDP2 frees its optimizer states first
    below = layout.engine == "fsdp2" or layout.zero_stage < 3
    assert (max(predicted["export"], predicted["score"]) < predicted["train"]) == below


def test_scoring_batch_is_the_configs_or_the_devices_and_the_layouts_under_auto():
    """``eval.batch_size``: a number as set, ``auto`` (the default) 256 rows on a GPU and 8 on the CPU;
    ``eval.batch_tokens``: a number as set, None no cap, ``auto`` (the default) the layout's ``planned_scoring_tokens``.
    The memory model counts the cap, else the GPU's rows of the row width; no tasks, nothing."""
    shape = ModelShape.from_config(LLAMA_8B)
    args = (shape, "deepspeed", 3, 2, 2048, 32)  # ZeRO-3 keeps its states: less room than the cap

    def trial(**eval_keys):
        return dataclasses.replace(TRIAL, eval=dataclasses.replace(TRIAL.eval, **eval_keys))

    planned = planned_scoring_tokens(shape, 3, 2, TRIAL.train.micro_batch_size, 2048, 32,
                                     trial_memory._layout_args(shape, TRIAL, "deepspeed", 3, 2, 2048, 32)["zero"])
    assert (TRIAL.eval.batch_size, TRIAL.eval.batch_tokens) == ("auto", "auto") and 2048 < planned < SCORING_TOKENS_MAX
    assert trial_memory.scoring_batch(args[0], TRIAL, *args[1:], "cuda") == (256, planned)
    assert trial_memory.scoring_batch(args[0], TRIAL, *args[1:], "cpu") == (8, planned)
    assert trial_memory.scoring_batch(args[0], trial(batch_size=32, batch_tokens=None), *args[1:], "cpu") == (32, None)
    assert trial_memory.scoring_tokens(args[0], TRIAL, *args[1:]) == planned
    assert trial_memory.scoring_tokens(args[0], trial(batch_tokens=4096), *args[1:]) == 4096
    assert trial_memory.scoring_tokens(args[0], trial(batch_tokens=None), *args[1:]) == 256 * 2048
    assert trial_memory.scoring_tokens(args[0], trial(batch_tokens=None, batch_size=8), *args[1:]) == 8 * 2048
    assert trial_memory.scoring_tokens(args[0], trial(tasks=()), *args[1:]) == 0


def test_no_prediction_off_cuda_or_outside_bf16():
    shape = ModelShape.from_config(LLAMA_1B)
    args = (LLAMA_1B, shape.params, TRIAL, "deepspeed", 0, 1, 2048, 0)
    assert trial_memory.predicted_phase_peaks_gib(*args, "bf16", torch.device("cpu")) is None
    assert trial_memory.predicted_phase_peaks_gib(*args, "fp32", CUDA) is None
    assert set(trial_memory.predicted_phase_peaks_gib(*args, "bf16", CUDA)) == \
        {"load", "attention_check", "train", "score"}


def test_phase_peaks_keep_each_phases_largest_and_name_the_trials():
    peaks = trial_memory.PhasePeaks(torch.device("cpu"))
    with peaks.phase("train"):
        pass
    assert peaks.gib == {} and peaks.peak() == (None, None) and trial_memory.phase_table(peaks.gib, None) is None
    peaks.gib.update(load=2.0, train=20.0, score=5.0)
    assert peaks.peak() == (20.0, "train")
    assert json.loads(trial_memory.phase_table(peaks.gib, {"train": 21.0, "score": 6.0})) == {
        "load": [2.0, None], "train": [20.0, 21.0], "score": [5.0, 6.0]}


def test_host_rss_counts_what_the_process_holds():
    before = trial_memory.host_rss_gib()
    held = np.ones(2**28 // 8)  # 256 MiB, touched
    assert trial_memory.host_rss_gib() - before > 0.2
    del held


def test_no_gpu_peak_on_the_cpu():
    trial_memory.reset_gpu_peak(torch.device("cpu"))
    assert trial_memory.gpu_peak_gib(torch.device("cpu")) is None
    assert trial_memory.PhasePeaks(torch.device("cpu")).alloc_retries() is None


def test_the_workers_allocator_settings_are_the_users_else_pytorchs_default(monkeypatch):
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    assert trial_memory.alloc_conf() == "expandable_segments:False"
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:256")
    assert trial_memory.alloc_conf() == "max_split_size_mb:256"
    trial_memory.use_alloc_conf("expandable_segments:True")  # before CUDA starts: the environment it reads
    assert trial_memory.alloc_conf() == "expandable_segments:True"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_allocator_retries_count_from_the_trials_start():
    device = torch.device("cuda")
    before = trial_memory.alloc_retries(device)
    peaks = trial_memory.PhasePeaks(device)
    assert before >= 0 and peaks.alloc_retries() == trial_memory.alloc_retries(device) - before


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


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_phase_peaks_are_each_phases_own():
    device = torch.device("cuda")
    peaks = trial_memory.PhasePeaks(device)
    with peaks.phase("load"):
        big = torch.empty(2**28, dtype=torch.uint8, device=device)  # 256 MiB
        del big
    with peaks.phase("train"):
        small = torch.empty(2**26, dtype=torch.uint8, device=device)  # 64 MiB
        del small
    assert peaks.peak()[1] == "load" and 1 / 16 <= peaks.gib["train"] < 0.25
