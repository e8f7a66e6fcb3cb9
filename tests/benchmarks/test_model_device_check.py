"""The device check runs end to end on the CPU (its device there is the CPU: every float32 variant equals the
reference, the GPU-only kernels report that they cannot run) and writes its JSON."""

from __future__ import annotations

import json


def test_the_check_agrees_with_itself_on_the_cpu(benchmark_script, model_dir, shared_data, tmp_path, capsys):
    check = benchmark_script("model_device_check")
    out = tmp_path / "check.json"
    report = check.main(["--model", str(model_dir), "--data-dir", str(shared_data), "--device", "cpu",
                         "--examples", "2", "--arc-limit", "4", "--out", str(out)])
    assert json.loads(out.read_text()) == report
    reference = report["cpu_float32"]
    assert abs(report["float32_pad1_sdpa_choice"] - reference) < 1e-5
    assert abs(report["float32_pad64_math"] - reference) < 1e-5  # padding is masked: same loss
    assert report["float32_pad64_cudnn"].startswith("fails:")  # no cuDNN kernel on the CPU
    assert report["agrees"] is True and report["attention_check"]["kept"] == "default"
    assert report["arc_easy"]["n_questions"] == 4
    assert "agrees with the CPU" in capsys.readouterr().out
