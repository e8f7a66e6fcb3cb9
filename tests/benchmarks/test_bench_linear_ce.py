"""benchmarks/bench_linear_ce.py on the CPU: the round-robin harness, its rows, JSON and table (no timing asserted)."""

from __future__ import annotations

import json


def test_round_robin_rows_for_every_method_and_beta(benchmark_script, tmp_path, capsys) -> None:
    out = tmp_path / "bench.json"
    methods = ["ours exact", "ours loose", "torch eager"]
    benchmark_script("bench_linear_ce").main([
        "--n", "96", "--vocab", "300", "--dim", "32", "--device", "cpu", "--warmup", "1", "--iters", "3",
        "--inputs", "random", "peaked", "--only", *methods, "--out", str(out)])
    result = json.loads(out.read_text())
    rows = result["rows"]
    assert [(r["input"], r["beta"], r["method"]) for r in rows] == [
        (kind, beta, m) for kind in ("random", "peaked") for beta in (0.0, 0.1) for m in methods]
    for r in rows:
        assert "error" not in r, r
        for kind in ("fwd", "fwd+bwd"):
            assert r[f"{kind} ms min"] <= r[f"{kind} ms"] <= r[f"{kind} ms max"]
    assert result["iters"] == 3 and result["statistic"] == "median"
    table = capsys.readouterr().out
    assert table.count("| ours exact | random |") == 2 and "| torch eager | peaked | 0.1 |" in table


def test_a_failing_method_is_a_row_with_its_error(benchmark_script) -> None:
    bench = benchmark_script("bench_linear_ce")
    inputs = bench.make_inputs("random", 64, 128, 16, "cpu")

    def broken(h, w, y):  # noqa: ANN001, ANN202
        raise RuntimeError("out of memory (planted)")

    result = bench.measure_interleaved({"broken": broken, "torch eager": bench._eager(0.0)}, inputs, "cpu", 1, 2)
    assert result["broken"] == {"error": "RuntimeError: out of memory (planted)"}
    assert result["torch eager"]["fwd+bwd ms"] > 0
