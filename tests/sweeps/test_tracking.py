"""The ``tracking`` section: off by default, validated like the rest of the config, and turned into Ray Tune's own
logger callbacks (the runs they write are read back in tests/sweeps/test_optuna_search.py)."""

import importlib.util
from pathlib import Path

import pytest
from ray.air.integrations.mlflow import MLflowLoggerCallback
from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback, TBXLoggerCallback

from sweeps.config import ConfigError, load_sweep
from sweeps.tracking import callbacks, mlflow_uri, tracking_problems

TINY = Path(__file__).with_name("tiny_sweep.yaml")


def test_off_by_default_tune_keeps_its_csv_and_json_results(tmp_path):
    sweep = load_sweep(TINY, {"results_dir": str(tmp_path)})
    assert (sweep.tracking.tensorboard, sweep.tracking.mlflow, sweep.tracking.wandb) == (False, None, None)
    assert [type(c) for c in callbacks(sweep)] == [CSVLoggerCallback, JsonLoggerCallback]
    assert tracking_problems(sweep) == []


def test_tensorboard_and_mlflow_from_the_command_line(tmp_path):
    sweep = load_sweep(TINY, {"results_dir": str(tmp_path)}, ["tracking.tensorboard=true", "tracking.mlflow={}"])
    chosen = callbacks(sweep)
    assert [type(c) for c in chosen] == [CSVLoggerCallback, JsonLoggerCallback, TBXLoggerCallback,
                                         MLflowLoggerCallback]
    mlflow = chosen[-1]
    assert mlflow.tracking_uri == f"sqlite:///{tmp_path.resolve()}/mlflow.db" == mlflow_uri(sweep)
    assert mlflow.experiment_name == "tiny" and mlflow.tags == {"calsweep_run": "tiny"}
    named = load_sweep(TINY, {"results_dir": str(tmp_path)}, ["tracking.mlflow.experiment=ls",
                                                             "tracking.mlflow.tags={team: nlp}",
                                                             "tracking.mlflow.tracking_uri=http://h:5000"])
    mlflow = callbacks(named)[-1]
    assert (mlflow.tracking_uri, mlflow.experiment_name) == ("http://h:5000", "ls")
    assert mlflow.tags == {"calsweep_run": "tiny", "team": "nlp"}


@pytest.mark.parametrize("assignment,message", [
    ("tracking.mlfow={}", r"tracking.mlfow: unknown key \(did you mean 'mlflow'\?\)"),
    ("tracking.tensorboard=yes please", r"tracking.tensorboard: expected bool, got 'yes please'"),
    ("tracking.wandb.mode=ofline", r"tracking.wandb.mode: expected one of \['online', 'offline', 'disabled'\] or "
                                   r"null, got 'ofline' \(did you mean 'offline'\?\)"),
    ("results_dir=s3://bucket/results", r"tracking.mlflow.tracking_uri: expected an MLflow tracking URI when "
                                        r"results_dir is remote \('s3://bucket/results'\), got null"),
])
def test_bad_tracking_entries_are_named(assignment, message):
    with pytest.raises(ConfigError, match=message):
        load_sweep(TINY, None, [assignment, "tracking.mlflow.experiment=x", "tracking.wandb.project=p"])


def test_a_tracker_whose_package_is_missing_is_a_preflight_line(tmp_path):
    sweep = load_sweep(TINY, {"results_dir": str(tmp_path)}, ["tracking.wandb.mode=offline", "tracking.mlflow={}"])
    missing = [name for name in ("mlflow", "wandb") if importlib.util.find_spec(name) is None]
    assert tracking_problems(sweep) == [f"tracking.{name}: needs the {name!r} package, not installed; pip install "
                                        f"{'mlflow-skinny' if name == 'mlflow' else 'wandb'}" for name in missing]
