"""benchmarks/sft_kernel_parity.py on the CPU: the curves of every implementation, their differences, JSON and PNG."""

from __future__ import annotations

import json

import pytest


@pytest.mark.slow
def test_curves_of_torch_fused_and_loose_on_a_tiny_model(benchmark_script, tiny_llama_config, data_dir, tmp_path,
                                                         capsys) -> None:
    custom = {"tiny": {"architecture": "llama", "tokenizer": "smollm2-135m", "config": tiny_llama_config}}
    out = tmp_path / "parity.json"
    benchmark_script("sft_kernel_parity").main([
        "--family", "tiny", "--custom-models", json.dumps(custom), "--impls", "torch", "fused", "loose",
        "--steps", "3", "--micro-batch", "2", "--seq-len", "64", "--precision", "fp32", "--zero-stage", "0",
        "--data-dir", data_dir, "--out", str(out)])
    result = json.loads(out.read_text())
    assert list(result["curves"]) == ["torch", "fused", "loose"]
    assert all(len(c["loss"]) == 3 for c in result["curves"].values())
    assert set(result["diffs"]) == {"fused - torch", "loose - torch", "loose - fused"}
    # fp32 on the CPU: the chunked path is exact, and the loose filter is a GPU-only skip (exact here)
    assert result["diffs"]["fused - torch"]["max_abs"] < 1e-4
    assert result["diffs"]["loose - fused"]["max_abs"] == 0.0
    assert out.with_suffix(".png").stat().st_size > 0
    assert "loose - fused" in capsys.readouterr().out
