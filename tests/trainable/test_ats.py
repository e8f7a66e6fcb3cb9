"""eval.ats: its config, and a whole trial (no Ray) that trains a head on Alpaca-GPT4 and stores *_ats metrics."""

import math

import pyarrow.compute as pc
import pytest
import torch

from calibration.ats.head import load_head
from common.config import ConfigError
from sweeps import store
from trainable.ats import ats_steps, trial_head_path
from trainable.config import TrialConfig
from trainable.worker import run_trial


def _trial(tiny_llama_config, data_dir, tmp_path, **ats) -> TrialConfig:
    return TrialConfig.from_dict(dict(
        run_name="unit", trial_id="t0", family="tiny", learning_rate=1e-3, label_smoothing=0.1, seed=3,
        data_dir=data_dir, results_dir=str(tmp_path), custom_models={"tiny": {"config": tiny_llama_config}},
        sft={"max_examples": 8, "max_seq_len": 64},
        train={"max_steps": 1, "micro_batch_size": 2, "attention_check": False},
        eval={"limit": 3, "batch_size": 4, "tasks": ["arc_easy", "mmlu"], "ats": ats}))


def test_ats_config_defaults_are_the_authors_and_bad_values_are_named(tiny_llama_config, tmp_path):
    default = _trial(tiny_llama_config, None, tmp_path).eval.ats
    assert not default.enabled and default.local_file == "alpaca/alpaca_gpt4_en_demo_llamafactory.json"
    assert (default.alpha, default.learning_rate, default.epochs, default.batch_size) == (0.5, 5e-5, 2.0, 8)
    assert ats_steps(999, default) == 248 and ats_steps(999, default.__class__(max_steps=7)) == 7
    with pytest.raises(ConfigError) as error:
        _trial(tiny_llama_config, None, tmp_path, alpah=0.2, alpha=2, batch_size=0)
    assert error.value.problems == [
        "trial.eval.ats.alpah: unknown key (did you mean 'alpha'?); expected one of ['alpha', 'balanced', 'batch_size', "
        "'enabled', 'epochs', 'hub_id', 'learning_rate', 'local_file', 'max_examples', 'max_grad_norm', "
        "'max_seq_len', 'max_steps']",
        "trial.eval.ats.batch_size: expected a number > 0, got 0",
        "trial.eval.ats.alpha: expected a number in [0, 1], got 2.0"]


def test_trial_with_ats_trains_a_head_and_reports_every_metric_again(tiny_llama_config, data_dir, tmp_path,
                                                                      one_rank_process_group):
    """balanced=False: the tiny random model's top token is almost never right, and the authors' balanced weights
    give a batch without right tokens loss 0."""
    trial = _trial(tiny_llama_config, data_dir, tmp_path, enabled=True, max_examples=16, max_seq_len=64,
                   batch_size=4, max_steps=3, learning_rate=1e-2, balanced=False)
    final = run_trial(trial, torch.device("cpu"), rank=0, world_size=1, report=lambda metrics: None,
                      writers=store.trial_writers())
    for task in ("arc_easy", "mmlu"):
        assert 0 <= final[f"{task}_ece_ats"] <= 1 and math.isfinite(final[f"{task}_nll_ats"])
        assert final[f"{task}_ece_ats"] != final[f"{task}_ece"]  # a trained head moved the confidences
        assert {name for name in final if name.startswith(task) and name.endswith("_ats")} <= set(store.metric_columns())
    assert final["mmlu_accuracy_ats"] == final["mmlu_accuracy"]  # one-letter choices: ranking kept
    head = load_head(trial_head_path(str(tmp_path), "unit", "t0"))
    assert head.spec.hidden_size == tiny_llama_config["hidden_size"] and float(head.out.weight.abs().sum()) > 0
    questions = store.read_questions(str(tmp_path), "unit")
    splits = set(pc.unique(questions["split"]).to_pylist())
    assert splits == {"test", "test+ats"}
