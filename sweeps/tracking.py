"""Experiment tracking: the ``tracking`` section as Ray Tune's own logger callbacks (no logger of ours).

Tune adds CSV, JSON and TensorBoard loggers to every run unless ``TUNE_DISABLE_AUTO_CALLBACK_LOGGERS`` is set; the
launcher sets it and passes ``callbacks(sweep)`` instead, so that each trial folder keeps ``progress.csv`` and
``result.json`` and TensorBoard files only where ``tracking.tensorboard`` asks for them. MLflow and Weights & Biases
get one run per trial, opened and fed by Tune in the launching process from the trials' reports.
"""

from __future__ import annotations

import importlib.util
import os

from sweeps.config import SweepConfig

PACKAGES = {"mlflow": "mlflow-skinny (or mlflow, whose UI shows the runs)", "wandb": "wandb"}


def mlflow_uri(sweep: SweepConfig) -> str:
    """The MLflow tracking URI: the config's, else a SQLite file in the local results store (MLflow 3 refuses its
    plain-folder store unless told otherwise: a database file is its local store). A remote results_dir comes with a
    URI (the config's check)."""
    uri = sweep.tracking.mlflow.tracking_uri if sweep.tracking.mlflow else None
    if uri:
        return uri
    return f"sqlite:///{os.path.join(os.path.abspath(sweep.results_dir), 'mlflow.db')}"


def tracking_problems(sweep: SweepConfig) -> list[str]:
    """One line per tracker the config turns on whose package is not installed."""
    wanted = [name for name in PACKAGES if getattr(sweep.tracking, name) is not None]
    return [f"tracking.{name}: needs the {name!r} package, not installed; pip install {PACKAGES[name].split()[0]}"
            for name in wanted if importlib.util.find_spec(name) is None]


def callbacks(sweep: SweepConfig) -> list:
    """Tune's logger callbacks for ``sweep``: CSV and JSON always, then the trackers ``sweep.tracking`` turns on."""
    from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback, TBXLoggerCallback

    tracking = sweep.tracking
    chosen = [CSVLoggerCallback(), JsonLoggerCallback()]
    if tracking.tensorboard:
        chosen.append(TBXLoggerCallback())
    if tracking.mlflow is not None:
        from ray.air.integrations.mlflow import MLflowLoggerCallback

        chosen.append(MLflowLoggerCallback(tracking_uri=mlflow_uri(sweep),
                                           experiment_name=tracking.mlflow.experiment or sweep.name,
                                           tags={"calsweep_run": sweep.name, **tracking.mlflow.tags}))
    if tracking.wandb is not None:
        from ray.air.integrations.wandb import WandbLoggerCallback

        wandb = tracking.wandb
        options = {key: value for key, value in (("entity", wandb.entity), ("mode", wandb.mode)) if value}
        chosen.append(WandbLoggerCallback(project=wandb.project, group=wandb.group or sweep.name,
                                          tags=list(wandb.tags), **options))
    return chosen
