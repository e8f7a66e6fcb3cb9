"""The S3 checkpoint benchmark's CPU path: the tiny shape's trial checkpoint saved, uploaded to the script's own
local S3 server (rclone's, the default, and moto's), downloaded whole, restored; its JSON and table (the 1B numbers
need the GPU machine)."""

import json
import os

import pytest


@pytest.mark.parametrize("server", ["rclone", "moto"])
def test_tiny_checkpoint_goes_through_the_bucket_and_back(benchmark_script, tmp_path, capsys, server):
    out = tmp_path / "checkpoint.json"
    result = benchmark_script("bench_s3_checkpoint").main(["--shape", "tiny", "--server", server, "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(result)) and result["complete"]
    assert result["engine"] == "deepspeed zero-0" and result["checkpoint_files"] >= 5
    params = result["parameters"]
    assert result["checkpoint_bytes"] > 12 * params  # float32 weights and Adam's two moments at least
    assert result["upload"]["bytes_sent"] >= result["checkpoint_bytes"]  # every byte went over HTTP, both ways
    assert result["download"]["bytes_received"] >= result["checkpoint_bytes"]
    assert result["server"] == server and (result["upload"]["requests"] is None) == (server == "rclone")
    assert all(result[phase] > 0 for phase in ("save_local_s", "upload_s", "download_s", "restore_s"))
    assert "AWS_ENDPOINT_URL" not in os.environ  # the script's own server's settings are gone with it
    table = capsys.readouterr().out
    for phase in ("save", "upload", "download", "restore"):  # each phase said (and written) as it ended
        assert f"[bench_s3_checkpoint] {phase} done in " in table
    assert "upload (persist)" in table and "download (latest)" in table and "restore (into the engine)" in table
