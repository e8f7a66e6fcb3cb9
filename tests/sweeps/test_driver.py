"""The driver's one-line error: the innermost cause, or for a Ray worker error the error raised in the worker; the
trial row keeps every metric a trial reports and refuses one the store has no column for."""

import datetime as dt
from pathlib import Path

import pytest
from ray.train import WorkerGroupError

from sweeps.config import load_sweep
from sweeps.driver import one_line, trial_row

TINY = Path(__file__).with_name("tiny_sweep.yaml")


def test_one_line_is_the_innermost_cause():
    try:
        try:
            raise KeyError("tokenizer")
        except KeyError as exc:
            raise RuntimeError("loading\nfailed") from exc
    except RuntimeError as exc:
        assert one_line(exc) == "KeyError: 'tokenizer'"
    assert one_line(ValueError("two\n  lines")) == "ValueError: two lines"


def test_one_line_of_a_worker_group_error_is_the_workers_own_error():
    error = WorkerGroupError("[Rank 0 Error Snippet]:\nTraceback (most recent call last):\n  File \"w.py\", line 3\n"
                             "common.datasource.DataSourceError: missing /data/hellaswag/hellaswag_val.jsonl\n",
                             {})
    assert one_line(error) == "common.datasource.DataSourceError: missing /data/hellaswag/hellaswag_val.jsonl"


def test_trial_row_keeps_every_task_metric_and_refuses_an_unknown_one(tmp_path):
    sweep = load_sweep(TINY, {"results_dir": str(tmp_path)}, ["eval.tasks=[arc_easy,arc_easy_lettered]"])
    params, now = sweep.trial_points()[0]._asdict(), dt.datetime.now(dt.timezone.utc)
    metrics = {"arc_easy_ece": 0.1, "arc_easy_lettered_ece": 0.2, "arc_easy_lettered_ece_ats": 0.3, "train_loss": 2.0}
    row = trial_row(sweep, params, metrics, "ok", None, now, {})
    assert (row["arc_easy_ece"], row["arc_easy_lettered_ece"], row["arc_easy_lettered_ece_ats"]) == (0.1, 0.2, 0.3)
    with pytest.raises(ValueError, match=r"TASK_METRICS, got \['arc_easy_ece_bootstrap'\]"):
        trial_row(sweep, params, metrics | {"arc_easy_ece_bootstrap": 0.4}, "ok", None, now, {})
