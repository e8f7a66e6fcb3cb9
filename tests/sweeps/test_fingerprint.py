"""A stored ok row is reused only when it comes from the same result settings; otherwise the driver refuses it
(naming each differing key with both values) or re-runs it on request; rows of older stores still match."""

import json
from pathlib import Path

import pytest

from sweeps import fingerprint, store
from sweeps.config import load_sweep
from sweeps.driver import ChangedConfigError, needs_run

TINY = Path(__file__).with_name("tiny_sweep.yaml")


def _store_trial(root, sweep, point, status="ok", config=None, world_size=None):
    trial = sweep.trial(point)
    store.write_trial(str(root), {"run_name": sweep.name, "trial_id": trial.trial_id, "status": status,
                                  "family": point.family, "learning_rate": point.learning_rate,
                                  "label_smoothing": point.label_smoothing, "seed": point.seed,
                                  "config_json": store.config_json(config or trial.to_dict()),
                                  "world_size": world_size})
    return trial


def test_bookkeeping_is_not_a_result_setting_but_data_source_and_training_are():
    sweep = load_sweep(TINY)
    trial = sweep.trial(sweep.trial_points()[0]).to_dict()
    moved = {**trial, "results_dir": "/elsewhere", "data_dir": "/other/data", "run_name": "x",
             "train": {**trial["train"], "log_every": 1}, "eval": {**trial["eval"], "batch_size": 1}}
    assert fingerprint.differences(moved, {**trial, "data_dir": "/data"}) == {}
    assert fingerprint.differences({**trial, "data_dir": None}, {**trial, "data_dir": "/data"}) == {
        "data_source": ("hub", "local")}
    edited = {**trial, "sft": {**trial["sft"], "max_examples": 99}, "eval": {**trial["eval"], "limit": None}}
    changed = fingerprint.differences(trial, edited)
    assert changed == {"eval.limit": (4, None), "sft.max_examples": (16, 99)}
    assert fingerprint.describe(changed) == "eval.limit: stored 4, now null; sft.max_examples: stored 16, now 99"


def test_only_the_trials_own_random_init_model_counts():
    sweep = load_sweep(TINY)
    trial = sweep.trial(sweep.trial_points()[0]).to_dict()
    extra = {**trial, "custom_models": {**trial["custom_models"], "other": {"architecture": "llama"}}}
    assert fingerprint.differences(trial, extra) == {}
    model = trial["custom_models"]["tiny-llama"]
    wider = {**trial, "custom_models": {"tiny-llama": {**model, "config": {**model["config"], "hidden_size": 128}}}}
    assert fingerprint.differences(trial, wider) == {"custom_model.config.hidden_size": (64, 128)}


def test_driver_skips_the_same_config_refuses_another_and_reruns_it_on_request(tmp_path):
    sweep = load_sweep(TINY, {"results_dir": str(tmp_path)})
    point, other = sweep.trial_points()
    trial = _store_trial(tmp_path, sweep, point)
    assert not needs_run(sweep, trial, rerun_changed=False)
    edited = load_sweep(TINY, {"results_dir": str(tmp_path)}, ["train.max_steps=5"])
    current = edited.trial(point)
    assert current.trial_id == trial.trial_id  # same point, same id: the stored row is checked, not bypassed
    with pytest.raises(ChangedConfigError, match="train.max_steps: stored 2, now 5.*--rerun-changed"):
        needs_run(edited, current, rerun_changed=False)
    assert store.stored_trial(str(tmp_path), "tiny", trial.trial_id)["status"] == "ok"  # refused: left as it was
    assert needs_run(edited, current, rerun_changed=True)
    assert store.stored_trial(str(tmp_path), "tiny", trial.trial_id) is None  # the stale row makes way for the run
    failed = _store_trial(tmp_path, sweep, other, status="failed")
    assert needs_run(sweep, failed, rerun_changed=False)
    assert store.read_trials(str(tmp_path)).num_rows == 0


def test_rows_of_an_older_store_without_newer_settings_still_match(tmp_path):
    sweep = load_sweep(TINY, {"results_dir": str(tmp_path)})
    point = sweep.trial_points()[0]
    old = json.loads(store.config_json(sweep.trial(point).to_dict()))
    del old["train"]["val_every"], old["eval"]["temperature_scaling"]  # written before these settings existed
    old["train"]["retired_setting"] = 1  # and with one that no longer exists
    trial = _store_trial(tmp_path, sweep, point, config=old)
    assert not needs_run(sweep, trial, rerun_changed=False)


def test_a_row_trained_on_another_number_of_workers_differs(tmp_path):
    sweep = load_sweep(TINY, {"results_dir": str(tmp_path)})
    point = sweep.trial_points()[0]
    trial = _store_trial(tmp_path, sweep, point, world_size=1)
    assert not needs_run(sweep, trial, rerun_changed=False)
    wider = load_sweep(TINY, {"results_dir": str(tmp_path)}, ["resources.workers_per_trial=2"])
    with pytest.raises(ChangedConfigError, match="workers: stored 1, now 2"):
        needs_run(wider, wider.trial(point), rerun_changed=False)
