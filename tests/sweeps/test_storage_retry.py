"""Retries of the store through an outage (sweeps.storage_retry): a stopped S3 server's failure is waited out, one
line per retry, within the budget; a local disk's error and a refused request are raised at once."""

import errno

import pytest

from sweeps import store
from sweeps.storage_retry import retried, transient


def test_a_stopped_server_is_waited_for_and_each_retry_is_one_line(s3_store, capsys):
    root = f"s3://{s3_store.bucket}/retry"
    s3_store.stop()
    waits = []

    def sleep(seconds: float) -> None:  # the server is back after the first wait
        waits.append(seconds)
        s3_store.start()

    fs, base = store.filesystem(root)
    retried("write trials/r__t1.parquet", lambda: store.write_file(fs, f"{base}/trials/r__t1.parquet", b"row"),
            sleep=sleep)
    assert waits == [1.0]
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("[calsweep] storage: write trials/r__t1.parquet failed (")
    assert "NETWORK_CONNECTION" in lines[0] and lines[0].endswith("retry 1 in 1 s (0 of 120 s waited)")
    assert s3_store.keys("retry/") == ["retry/trials/r__t1.parquet"]


def test_the_budget_ends_the_waiting_and_other_failures_are_not_retried(s3_store):
    s3_store.stop()
    waits = []
    fs, base = store.filesystem(f"s3://{s3_store.bucket}/x")
    with pytest.raises(OSError, match="NETWORK_CONNECTION"):
        retried("read trials", lambda: fs.get_file_info(f"{base}/trials"), budget_s=0.5, sleep=waits.append)
    assert waits == []  # the first wait (1 s) would pass the budget
    disk_full = OSError(errno.ENOSPC, "No space left on device")
    assert not transient(disk_full) and not transient(ValueError("NETWORK_CONNECTION"))
    calls = []
    with pytest.raises(OSError):
        retried("write", lambda: calls.append(1) or (_ for _ in ()).throw(disk_full), sleep=waits.append)
    assert calls == [1]
