"""The driver's one-line error: the innermost cause, or for a Ray worker error the error raised in the worker."""

from ray.train import WorkerGroupError

from sweeps.driver import one_line


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
