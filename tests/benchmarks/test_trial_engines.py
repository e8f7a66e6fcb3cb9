"""The trial-engines benchmark: one real tiny trial per engine on the CPU (the GPU rates need GPUs)."""

import json

import pytest


@pytest.mark.slow
def test_cpu_trials_of_both_engines_train_and_score_alike(benchmark_script, data_dir, tmp_path):
    bench = benchmark_script("trial_engines")
    out = tmp_path / "engines.json"
    bench.main(["--cpu", "--shape", "tiny", "--steps", "2", "--micro-batch", "2", "--seq-len", "128",
                "--eval-limit", "4", "--data-dir", data_dir, "--out", str(out)])
    fsdp2, deepspeed = json.loads(out.read_text())
    assert fsdp2["engine"] == "fsdp2" and deepspeed["engine"] == "deepspeed"
    for r in (fsdp2, deepspeed):
        assert r["zero_stage"] == 3 and r["tokens_per_s_per_gpu"] > 0 and r["wall_eval_s"] > 0
    # the same trial on the CPU in float32: both engines take the same steps and score the same questions
    assert fsdp2["train_loss"] == pytest.approx(deepspeed["train_loss"], rel=1e-4)
    assert fsdp2["arc_easy_accuracy"] == deepspeed["arc_easy_accuracy"]
