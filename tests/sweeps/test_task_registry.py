"""A task is declared once, in ``calibration.task_config.TASKS``: one entry there makes it sweepable (the sweep
config accepts it), stored (the trial table has its metric columns and the driver's row keeps them), shown on the
console and analysed (``load_results`` reads it, Table 1 names it by its title)."""

import datetime as dt
from pathlib import Path

import numpy as np
import pytest
from ray.tune.experiment import Trial

from calibration.records import build_records
from calibration.summary import TASK_METRICS, flat_metrics, summarize
from calibration.task_config import TASKS, TaskConfig, load_prompts
from sweeps import store
from sweeps.analyze import analyze
from sweeps.analysis.load import load_results, parse_filter
from sweeps.config import load_sweep
from sweeps.driver import trial_row
from sweeps.progress import TrialProgress
from common.config import ConfigError

TINY = Path(__file__).with_name("tiny_sweep.yaml")
NEW = TaskConfig("arc_easy_copy", "arc_easy", "arc_lettered", split="test", fewshot_split="train", title="ARC copy")
N_QUESTIONS = 12


def _sweep(results_dir: Path):
    return load_sweep(TINY, {"results_dir": str(results_dir)}, [f"eval.tasks=[{NEW.name}]"])


def test_an_unregistered_task_is_refused_with_the_registered_ones(tmp_path):
    with pytest.raises(ConfigError, match=f"tasks: expected a subset of .*'arc_easy_lettered'.*got \\['{NEW.name}'\\]"):
        _sweep(tmp_path)


def test_a_registered_task_is_sweepable_stored_shown_and_analysed(monkeypatch, data_dir, tmp_path, capsys):
    monkeypatch.setitem(TASKS, NEW.name, NEW)
    root = tmp_path / "results"
    sweep = _sweep(root)
    assert sweep.eval.tasks == (NEW.name,)
    assert {f"{NEW.name}_{metric}" for metric in TASK_METRICS} <= set(store.trial_schema().names)

    questions, prompts = load_prompts(NEW, data_dir=data_dir, limit=N_QUESTIONS)
    rng = np.random.default_rng(0)
    points = sweep.trial_points()
    for point in points:  # beta 0 and 0.1, each scored on the task's real questions (log-likelihoods drawn)
        loglik = [rng.normal(size=len(q.choices)) * (2.0 - 10 * point.label_smoothing) for q in questions]
        records = build_records(NEW.name, NEW.split, questions, prompts, loglik)
        summary, _ = summarize(records, split_of={NEW.name: NEW.split})
        metrics = {"phase": "done", "train_steps": 2, "train_loss": 2.0, "vocab_size": 49152,
                   "hidden_size": 64, "n_params": 10**6} | flat_metrics(summary)
        row = trial_row(sweep, point._asdict(), metrics, "ok", None, dt.datetime.now(dt.timezone.utc), {})
        assert row[f"{NEW.name}_ece"] == summary[NEW.name]["ece"]
        store.write_trial(str(root), row)
        store.write_questions(str(root), sweep.name, row["trial_id"], records)

    progress = TrialProgress(sweep, total=1, every_s=0.0)
    trial = Trial("trainable", config=points[0]._asdict(), stub=True)
    progress.on_trial_start(0, [trial], trial)
    trial.update_last_result(metrics)
    progress.on_trial_complete(0, [trial], trial)
    assert f"{NEW.name} acc {metrics[f'{NEW.name}_accuracy']:.3f}" in capsys.readouterr().out

    results = load_results(str(root))
    assert results.tasks == (NEW.name,) and len(results.trials) == len(points)
    assert len(results.questions) == N_QUESTIONS * len(points) and set(results.questions["task"]) == {NEW.name}
    analyze(str(root), parse_filter(f"task={NEW.name}"), tmp_path / "analysis", n_boot=5)
    table = (tmp_path / "analysis" / "table1.md").read_text()
    assert "ARC copy Acc" in table and "ARC copy ECE" in table

