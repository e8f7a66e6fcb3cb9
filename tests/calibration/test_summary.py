"""calibration.summary's one metric list: every name a summary can hold is in TASK_METRICS, and flattening a
summary refuses a metric outside it (the store would have no column for it)."""

import numpy as np
import pyarrow as pa
import pytest

from calibration.records import ats_split, records_table
from calibration.summary import TASK_METRICS, ats_metrics, fit_temperatures, flat_metrics, metric_columns, summarize


def _records(task: str, split: str, n: int, rng: np.random.Generator) -> pa.Table:
    loglik = rng.normal(size=(n, 4)) * 2.0
    return records_table(task, split, [str(i) for i in range(n)], ["s"] * n, rng.integers(0, 4, n).tolist(),
                         loglik.tolist(), [[1, 2, 3, 4]] * n)


def test_every_metric_a_summary_holds_is_in_the_one_list():
    rng = np.random.default_rng(0)
    records = pa.concat_tables([_records("t", "test", 30, rng), _records("t", "dev", 30, rng),
                                _records("t", ats_split("test"), 30, rng)])
    summary, _ = summarize(records, split_of={"t": "test"},
                           temperatures=fit_temperatures(records, fit_split_of={"t": "dev"}))
    summary["t"] |= ats_metrics(records, split_of={"t": "test"})["t"]
    assert set(summary["t"]) == set(TASK_METRICS)
    assert set(flat_metrics(summary)) == set(metric_columns(["t"]))


def test_a_metric_outside_the_list_is_refused():
    with pytest.raises(ValueError, match=r"TASK_METRICS, got unknown \['ece_bootstrap'\]"):
        flat_metrics({"t": {"ece": 0.1, "ece_bootstrap": 0.2}})
