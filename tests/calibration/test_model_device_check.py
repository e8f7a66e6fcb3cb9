"""The device check runs end to end on the CPU (its device there is the CPU: every float32 variant equals the
reference, the GPU-only kernels report that they cannot run) and writes its JSON."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "model_device_check.py"


def test_the_check_agrees_with_itself_on_the_cpu(model_dir, shared_data, tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("model_device_check", SCRIPT)
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
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
