"""The scoring-batch benchmark runs on the CPU at toy size: same answers at every batch, fewer forwards for larger."""

from __future__ import annotations

import json

import pytest

from trainable.layout import SCORING_TOKENS_MAX


def test_benchmark_scores_every_batch_alike_with_fewer_forwards_for_larger(benchmark_script, model_dir, shared_data,
                                                                             tmp_path, capsys):
    bench = benchmark_script("bench_scoring_batch")
    out = tmp_path / "bench.json"
    report = bench.main(["--model", str(model_dir), "--tasks", "arc_easy,mmlu", "--limit", "6", "--batches",
                         "1:none,4:600,256:plan", "--data-dir", str(shared_data), "--out", str(out)])
    assert json.loads(out.read_text()) == report
    one, four, planned = report["entries"]
    assert (four["batch_size"], four["batch_tokens"], planned["planned"]) == (4, 600, True)
    assert planned["batch_tokens"] == SCORING_TOKENS_MAX  # a tiny model leaves room for the cap
    assert one["score_forwards"] > four["score_forwards"] > planned["score_forwards"]
    assert one["entropy_forwards"] >= four["entropy_forwards"] >= planned["entropy_forwards"] >= 1
    for entry in (four, planned):  # float32 on the CPU: batching changes nothing beyond rounding
        assert entry["max_abs_loglik_diff"] < 1e-4 and entry["accuracy"] == one["accuracy"]
        assert entry["score_peak_gib"] is None and entry["entropy_predicted_gib"] > 0
    assert "score GiB" in capsys.readouterr().out


@pytest.mark.parametrize("text", ["8", "8:lots", "0:none", "8:0", "8:none,,"])
def test_a_bad_batches_entry_is_one_line_naming_it(benchmark_script, text):
    with pytest.raises(ValueError, match="expected ROWS"):
        benchmark_script("bench_scoring_batch").parse_batches(text)
