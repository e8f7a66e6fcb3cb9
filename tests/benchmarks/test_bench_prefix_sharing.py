"""The GPU benchmark script runs on CPU at toy size and reports the same answers for both modes."""

from __future__ import annotations

import json


def test_benchmark_runs_and_both_modes_agree(benchmark_script, model_dir, mini_data, tmp_path, capsys):
    bench = benchmark_script("bench_prefix_sharing")
    out = tmp_path / "bench.json"
    report = bench.main(["--model", str(model_dir), "--limit", "6", "--batch-size", "4", "--device", "cpu",
                         "--data-dir", str(mini_data), "--warmup", "2", "--prompt-cache", str(tmp_path / "plans"),
                         "--out", str(out)])
    assert json.loads(out.read_text())["n_questions"] == 6 and report["subjects"] == ["anatomy", "high_school_physics"]
    assert report["predictions_differ"] == 0 and report["max_abs_loglik_diff"] < 1e-3
    assert report["shared_prefix"]["accuracy"] == report["no_sharing"]["accuracy"]
    assert report["shared_prefix"]["tokens"] < report["no_sharing"]["tokens"]
    assert len(list((tmp_path / "plans").glob("run-*/*.pkl"))) == 2  # one plan per mode, read by the second passes
    assert report["shared_prefix_cached_plan"]["accuracy"] == report["shared_prefix"]["accuracy"]
    assert report["speedup_cached_plan"] > 0 and "speed-up" in capsys.readouterr().out
