"""`search: optuna` end to end on a tiny model: a multi-objective TPE study warm-started with the grid, kept in
SQLite, continued by a second launch (which adds trials instead of starting over), with ASHA on validation loss;
with `tracking` on, each trial is an MLflow run (read back with MLflow's client) and has TensorBoard event files."""

import os
import struct
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import yaml

from sweeps import store

REPO = Path(__file__).resolve().parents[2]


def _config(tmp_path: Path, num_samples: int) -> Path:
    config = yaml.safe_load((Path(__file__).with_name("tiny_sweep.yaml")).read_text())
    config.update(name="study", label_smoothing=[0.0, 0.3], results_dir=str(tmp_path / "results"))
    config["train"].update(val_examples=4, val_every=1)
    config["eval"].update(tasks=["arc_easy"], limit=3)
    config["search"] = {"method": "optuna", "num_samples": num_samples, "sampler": "tpe",
                        "objectives": {"arc_easy_ece": "min", "arc_easy_accuracy": "max"},
                        "asha": {"metric": "val_loss", "mode": "min", "grace_period": 1, "max_t": 10}}
    config["tracking"] = {"tensorboard": True, "mlflow": {"tags": {"purpose": "test"}}}
    path = tmp_path / f"study_{num_samples}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _launch(config: Path, data_dir: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "CALSWEEP_DATA_DIR": data_dir, "RAY_USAGE_STATS_ENABLED": "0"}
    return subprocess.run([sys.executable, str(REPO / "sweeps" / "launch.py"), "--config", str(config)],
                          capture_output=True, text=True, timeout=900, env=env)


@pytest.mark.slow
def test_optuna_study_persists_and_continues(tmp_path, data_dir):
    storage = f"sqlite:///{tmp_path / 'results' / 'optuna' / 'study.db'}"
    out = _launch(_config(tmp_path, num_samples=1), data_dir)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "A new study created" not in out.stderr and "mlflow" not in out.stderr  # their INFO lines: --verbose only
    study = optuna.load_study(study_name="study", storage=storage)
    assert len(study.directions) == 2
    first = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(first) == 1 and first[0].params["label_smoothing"] in (0.0, 0.3)  # a grid seed point comes first

    out = _launch(_config(tmp_path, num_samples=1), data_dir)  # a second launch continues the same study
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    study = optuna.load_study(study_name="study", storage=storage)
    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(complete) == 2
    rows = store.read_trials(str(tmp_path / "results"), "study").to_pylist()
    assert len(rows) == 2 and all(r["status"] == "ok" for r in rows)
    assert all(0 <= r["arc_easy_ece"] <= 1 for r in rows)
    _check_tracking(tmp_path / "results", rows)


def _check_tracking(results: Path, rows: list[dict]) -> None:
    """Both launches' trials are runs of one MLflow experiment holding what the store holds; each trial's Tune
    folder has TensorBoard scalars."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{results / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("study").experiment_id])
    assert len(runs) == 2 and {run.info.status for run in runs} == {"FINISHED"}
    by_beta = {float(run.data.params["label_smoothing"]): run for run in runs}
    for row in rows:
        run = by_beta[row["label_smoothing"]]
        assert run.data.params["family"] == "tiny-llama" and run.data.tags["purpose"] == "test"
        assert run.data.metrics["arc_easy_ece"] == row["arc_easy_ece"]
        steps = client.get_metric_history(run.info.run_id, "train_loss")
        assert len(steps) >= 2 and steps[-1].value == row["train_loss"]  # every report, the final one last
        events = list((results / "ray" / "study" / row["trial_id"]).glob("events.out.tfevents.*"))
        assert len(events) == 1 and {"ray/tune/arc_easy_ece", "ray/tune/train_loss"} <= _scalar_tags(events[0])


def _scalar_tags(path: Path) -> set[str]:
    """The scalar tags of a TensorBoard event file (TFRecord framing: length, CRC, Event protobuf, CRC)."""
    from tensorboardX.proto import event_pb2

    data, offset, tags = path.read_bytes(), 0, set()
    while offset < len(data):
        (length,) = struct.unpack("<Q", data[offset:offset + 8])
        event = event_pb2.Event.FromString(data[offset + 12:offset + 12 + length])
        tags |= {value.tag for value in event.summary.value}
        offset += 12 + length + 4
    return tags


def test_shipped_optuna_config_runs_as_it_is(tmp_path, data_dir, capsys):
    from sweeps.launch import main

    shipped = REPO / "sweeps" / "configs" / "smollm2_optuna.yaml"
    assert main(["--config", str(shipped), "--results-dir", str(tmp_path), "--data-dir", data_dir, "--dry-run"]) == 0
    lines = capsys.readouterr().out.split("\nLayouts on ")[0].splitlines()  # the layout table follows the trials
    assert lines[0] == "Optuna study 'smollm2_optuna' (tpe): 4 trials this launch, the grid's points first:"
    assert [line.split("_")[2] for line in lines[1:]] == ["ls0", "ls0.3"]  # beta's range ends, then sampled points


def test_a_continued_study_draws_new_points(tmp_path):
    """A second launch of a study seeds its sampler past the trials the study holds: with the sweep's seed alone
    the random sampler would draw the first launch's points again (trials already stored, re-run as stopped ones)."""
    from sweeps.config import load_sweep
    from sweeps.search import search_algorithm, search_space

    sweep = load_sweep(_config(tmp_path, num_samples=4), {}, ["search.sampler=random", "search.seed_with_grid=false",
                                                              "search.asha=null", "resources.max_concurrent_trials=2"])

    def draw(n: int) -> list[float]:
        searcher = search_algorithm(sweep)
        searcher.set_search_properties(None, None, search_space(sweep))
        points = [searcher.suggest(f"t{i}")["label_smoothing"] for i in range(n)]
        for i in range(n):
            searcher.on_trial_complete(f"t{i}", {"arc_easy_ece": 0.1, "arc_easy_accuracy": 0.5})
        return points

    first, again = draw(2), draw(2)
    assert len(set(first + again)) == 4
    storage = f"sqlite:///{tmp_path / 'results' / 'optuna' / 'study.db'}"
    assert len(optuna.load_study(study_name="study", storage=storage).trials) == 4  # one study, continued
