"""A whole trial in-process (no Ray): DeepSpeed SFT with the fused loss, then scoring; seeded and repeatable."""

import math
from pathlib import Path

import pytest
import torch

from calibration.entropy.statistics import STATS
from sweeps import store
from trainable.config import TrialConfig
from trainable.worker import NonFiniteLossError, run_trial


def _trial(tiny_llama_config, data_dir, tmp_path, **train) -> TrialConfig:
    return TrialConfig.from_dict(dict(
        run_name="unit", trial_id="t0", family="tiny", learning_rate=1e-3, label_smoothing=0.1, seed=3,
        data_dir=data_dir, results_dir=str(tmp_path),
        custom_models={"tiny": {"config": tiny_llama_config}},
        sft={"max_examples": 12, "max_seq_len": 96},
        train={"max_steps": 2, "micro_batch_size": 2, "gradient_accumulation_steps": 2, "dropout": 0.1, "log_every": 1,
               **train},
        eval={"limit": 3, "batch_size": 4, "tasks": ["arc_easy"]}))


def _run(trial):
    reports = []
    final = run_trial(trial, torch.device("cpu"), rank=0, world_size=1, report=reports.append,
                      writers=store.trial_writers())
    return final, reports


def test_same_config_same_numbers(tiny_llama_config, data_dir, tmp_path, one_rank_process_group):
    trial = _trial(tiny_llama_config, data_dir, tmp_path)
    first, reports = _run(trial)
    second, _ = _run(trial)
    assert [r["phase"] for r in reports] == ["train", "train", "done"]
    for key in ("train_loss", "train_loss_first", "arc_easy_ece", "arc_easy_accuracy", "arc_easy_nll", *STATS):
        assert first[key] == second[key], key
    assert math.isfinite(first["train_loss"]) and 0 <= first["arc_easy_ece"] <= 1
    assert first["train_tokens"] > 0 and first["vocab_size"] == 49152


@pytest.mark.parametrize("stage", [0, 3])
def test_zero_stages_train(tiny_llama_config, data_dir, tmp_path, one_rank_process_group, stage):
    final, _ = _run(_trial(tiny_llama_config, data_dir, tmp_path, zero_stage=stage, engine="deepspeed"))
    assert math.isfinite(final["train_loss"]) and final["arc_easy_n_questions"] == 3
    # beta = 0.1: the plain cross-entropy of the same tokens is another number than the smoothed objective
    assert 0 < final["train_loss_plain"] and abs(final["train_loss_plain"] - final["train_loss"]) > 1e-4
    assert final["val_loss"] is None and 0 < final["train_confidence"] <= 1
    assert final["attention"] == "default"  # the pre-training check ran (also under ZeRO-3) and kept SDPA's choice
    # the entropy floor's inputs, measured on the trained weights (under ZeRO-3 on the gathered scorer)
    assert all(math.isfinite(final[name]) and final[name] > 0 for name in STATS)
    assert final["rho"] == pytest.approx(final["sigma_c"] * final["sigma_h_max"], rel=1e-12)
    assert final["entropy_floor"] <= final["mean_entropy"] <= math.log(final["vocab_size"])


def test_quiet_steps_read_late_give_the_losses_read_at_once(tiny_llama_config, data_dir, tmp_path,
                                                           one_rank_process_group):
    # log_every 3: steps 1, 2 and 4 report nothing, their losses are read after the next step is queued
    every, _ = _run(_trial(tiny_llama_config, data_dir, tmp_path, max_steps=5, log_every=1))
    quiet, reports = _run(_trial(tiny_llama_config, data_dir, tmp_path, max_steps=5, log_every=3))
    assert [r["step"] for r in reports if r["phase"] == "train"] == [3, 5]
    for key in ("train_loss", "train_loss_first", "train_loss_plain", "train_confidence", "arc_easy_ece"):
        assert quiet[key] == every[key], key


def test_log_steps_reported_a_step_late_report_what_steps_read_at_once_report(tiny_llama_config, data_dir, tmp_path,
                                                                              one_rank_process_group):
    # without checkpoints steps 2-4 are reported after the next step is queued (1 ends the warm-up, 5 is the last);
    # a checkpoint every step reads each step at once
    trial = _trial(tiny_llama_config, data_dir, tmp_path, max_steps=5, log_every=1, checkpoint_every_steps=1)
    late, at_once = [], []
    run_trial(trial, torch.device("cpu"), 0, 1, late.append, writers=store.trial_writers())
    run_trial(trial, torch.device("cpu"), 0, 1, at_once.append, lambda metrics, _: at_once.append(metrics),
              writers=store.trial_writers())
    keys = ("step", "train_loss", "train_loss_plain", "confidence", "lr")
    late, at_once = ([tuple(r[k] for k in keys) for r in reports if r["phase"] == "train"] for reports in (late, at_once))
    assert [r[0] for r in late] == [1, 2, 3, 4, 5] and late == at_once


def test_a_loss_that_turns_non_finite_on_a_quiet_step_stops_the_trial_naming_it(tiny_llama_config, data_dir,
                                                                                tmp_path, one_rank_process_group):
    # a learning rate of 1e30 (Adam's step ~ lr): step 1's loss is finite, step 2's forward overflows
    trial = _trial(tiny_llama_config, data_dir, tmp_path, max_steps=4, log_every=10, precision="fp32")
    trial = TrialConfig.from_dict({**trial.to_dict(), "learning_rate": 1e30})
    with pytest.raises(NonFiniteLossError, match="at step 2;"):
        _run(trial)


def test_validation_loss_is_reported_on_schedule_and_at_the_end(tiny_llama_config, data_dir, tmp_path,
                                                                 one_rank_process_group):
    trial = _trial(tiny_llama_config, data_dir, tmp_path, max_steps=3, val_examples=4, val_every=2,
                   pad_to_multiple=8)
    final, reports = _run(trial)
    with_val = [r["step"] for r in reports if r["phase"] == "train" and "val_loss" in r]
    assert with_val == [2, 3] and math.isfinite(final["val_loss"]) and final["val_loss"] > 0
    assert final["val_loss"] == [r["val_loss"] for r in reports if "val_loss" in r][-1]


def test_reported_confidence_is_the_training_batch_s_not_the_validation_set_s(tiny_llama_config, data_dir, tmp_path,
                                                                            one_rank_process_group):
    # same data, weights and dropout draws (validation runs in eval mode, without gradients); only when it runs differs
    _, with_val = _run(_trial(tiny_llama_config, data_dir, tmp_path, max_steps=3, val_examples=4, val_every=2))
    _, without = _run(_trial(tiny_llama_config, data_dir, tmp_path, max_steps=3, val_examples=4))
    assert "val_loss" in with_val[1] and "val_loss" not in without[1]
    assert [r["confidence"] for r in with_val[:3]] == [r["confidence"] for r in without[:3]]
    assert with_val[-1]["train_confidence"] == without[-1]["train_confidence"] == with_val[2]["confidence"]


def test_without_the_attention_check_the_row_says_unchecked(tiny_llama_config, data_dir, tmp_path,
                                                           one_rank_process_group):
    final, _ = _run(_trial(tiny_llama_config, data_dir, tmp_path, attention_check=False))
    assert final["attention"] == "unchecked" and math.isfinite(final["train_loss"])


def test_saved_model_scores_like_the_trial_in_evaluate_and_lm_eval(tiny_llama_config, data_dir, tmp_path,
                                                                   one_rank_process_group):
    """train.save_model: the folder in the store is the model the trial scored (calibration.evaluate gives its
    metrics again), lm-evaluation-harness loads it, and calibration.rescore reads lm-eval's samples of it."""
    import json
    import os
    import subprocess
    import sys

    from calibration.agreement import write_task_yamls
    from trainable.evaluate import main as evaluate
    from calibration.rescore import rescore

    trial = _trial(tiny_llama_config, data_dir, tmp_path / "results", zero_stage=3, engine="deepspeed", save_model=True)
    final, _ = _run(trial)
    saved = tmp_path / "results" / "models" / "unit__t0"
    assert final["model_path"] == str(saved) and (saved / "model.safetensors").is_file()

    ours = evaluate(["--model", str(saved), "--tasks", "arc_easy", "--limit", "3", "--data-dir", data_dir,
                     "--no-heldout", "--n-boot", "0", "--out", str(tmp_path / "eval")]).summary["arc_easy"]
    for metric in ("accuracy", "ece", "nll", "accuracy_norm"):
        assert ours[metric] == pytest.approx(final[f"arc_easy_{metric}"], abs=1e-6), metric

    tasks = write_task_yamls(tmp_path / "lm_eval_tasks", Path(data_dir))
    command = [sys.executable, "-m", "lm_eval", "--model", "hf", "--model_args", f"pretrained={saved},dtype=float32",
               "--tasks", "calsweep_arc_easy", "--include_path", str(tasks), "--limit", "3", "--device", "cpu",
               "--output_path", str(tmp_path / "lm_eval"), "--log_samples"]
    alone = {k: v for k, v in os.environ.items()  # not a rank of this test's process group
             if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")}
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=alone)
    assert done.returncode == 0, done.stderr[-3000:]
    samples = list((tmp_path / "lm_eval").rglob("samples_calsweep_arc_easy_*.jsonl"))
    assert len(samples) == 1
    lines = [json.loads(line) for line in samples[0].read_text().splitlines()]
    rescored = rescore(samples[0], n_boot=0)["calsweep_arc_easy"]
    assert rescored["accuracy"] == sum(s["acc"] for s in lines) / 3  # lm-eval's own per-question acc
    assert rescored["accuracy_norm"] == sum(s["acc_norm"] for s in lines) / 3
    for metric in ("accuracy", "ece", "nll", "brier"):  # the same questions, scored by both tools
        assert rescored[metric] == pytest.approx(ours[metric], abs=1e-4), metric


def test_every_field_the_worker_computes_reaches_the_stored_row(tiny_llama_config, data_dir, tmp_path,
                                                                 one_rank_process_group):
    """The final report of a real trial, through the driver's row and the store, read back: every key but the report
    protocol's (phase, step, total_steps) is a column holding the same value."""
    import datetime as dt

    from sweeps.config import load_sweep
    from sweeps.driver import trial_row
    from trainable.result import TrialResult

    trial = _trial(tiny_llama_config, data_dir, tmp_path)
    final, _ = _run(trial)
    sweep = load_sweep(Path(__file__).parents[1] / "sweeps" / "tiny_sweep.yaml", {"results_dir": str(tmp_path)},
                       ["eval.tasks=[arc_easy]"])
    row = trial_row(sweep, sweep.trial_points()[0]._asdict(), final, "ok", None, dt.datetime.now(dt.timezone.utc), {})
    store.write_trial(str(tmp_path), row)
    stored = store.read_trials(str(tmp_path)).to_pylist()[0]
    computed = {k: v for k, v in final.items() if k not in ("phase", "step", "total_steps")}
    assert set(computed) <= set(stored), sorted(set(computed) - set(stored))
    assert {k: stored[k] for k in computed} == computed
    assert TrialResult.from_metrics(stored) == TrialResult.from_metrics(final)
    # the layout the engine ran with ('auto' on one rank: ZeRO-0, no layer recomputed), and the steady rate split
    # from the warm-up (no MFU on a CPU)
    assert (stored["zero_stage"], stored["world_size"], stored["micro_batch_size"],
            stored["gradient_accumulation_steps"], stored["activation_checkpointing"]) == (0, 1, 2, 2, 0)
    assert stored["tokens_per_s_steady"] > 0 and stored["wall_warmup_s"] > 0 and stored["mfu"] is None
    # memory: the process holds torch and a model (> 0.2 GiB); no GPU peak, nor its prediction, on a CPU
    assert stored["host_rss_gib"] > 0.2 and stored["gpu_peak_gib"] is None and stored["gpu_peak_predicted_gib"] is None


def test_a_finished_trial_leaves_no_engine_behind(tiny_llama_config, data_dir, tmp_path, one_rank_process_group):
    """A warm Tune actor runs trial after trial: ZeRO-2's gradient hooks (held by autograd, out of the garbage
    collector's sight) must not keep each trial's engine, model and optimizer alive (~110 MiB a tiny trial)."""
    import gc

    def engines() -> set[int]:
        gc.collect()
        return {id(o) for o in gc.get_objects() if type(o).__name__ == "DeepSpeedEngine"}

    before = engines()  # other tests' engines (a ZeRO-3 one still outlives its trial)
    _run(_trial(tiny_llama_config, data_dir, tmp_path, zero_stage=2, max_steps=1))
    assert engines() <= before
