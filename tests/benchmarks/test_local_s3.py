"""The local S3 server of the object-store tests (benchmarks/local_s3.py): the store writes and reads through it
over HTTP with the endpoint from the environment, and it keeps the bucket's objects across an outage."""

import pyarrow.fs as pafs
import pytest

from sweeps import store


def test_store_round_trip_through_the_local_server_and_an_outage(s3_store):
    root = f"s3://{s3_store.bucket}/unit"
    store.write_trial(root, {"run_name": "r", "trial_id": "t1", "status": "ok"})
    assert s3_store.keys("unit/") == ["unit/trials/r__t1.parquet"]  # no directory markers, no temporaries
    s3_store.stop()
    with pytest.raises(OSError):
        pafs.FileSystem.from_uri(root)[0].get_file_info(f"{s3_store.bucket}/unit/trials/r__t1.parquet")
    s3_store.start()
    assert store.stored_trial(root, "r", "t1")["status"] == "ok"
    assert any(r.method == "PUT" for r in s3_store.requests)
