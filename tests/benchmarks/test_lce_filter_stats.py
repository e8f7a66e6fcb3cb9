"""benchmarks/lce_filter_stats.py on a small folder in lce_real_inputs.py's layout (an F32 "GGUF" head): the rows
it reports follow the loose rule's guarantees."""

from __future__ import annotations

import hashlib
import json

import torch

from kernels.testing import make_case


def _write_inputs(folder, hidden, weight, targets) -> None:  # noqa: ANN001
    raw = weight.float().numpy().tobytes()  # GGML type 0 (F32): the raw bytes are the tensor
    (folder / "head.00").write_bytes(raw)
    facts = {"family": "tiny", "vocab": weight.shape[0], "dim": weight.shape[1], "head_qtype": 0,
             "head_parts": ["head.00"], "head_sha256": hashlib.sha256(raw).hexdigest()}
    torch.save({"hidden": hidden.bfloat16(), "targets": targets, "facts": facts}, folder / "inputs.pt")


def test_rows_keep_the_budget_and_sorting_tokens_helps(benchmark_script, tmp_path, capsys) -> None:
    hidden, weight, targets = make_case(512, 3000, 32, torch.float32, ignore_frac=0.1, seed=2)
    hidden[::2] *= 3.0  # peaked and flat tokens interleaved: blocks of consecutive tokens mix them
    folder = tmp_path / "tiny"
    folder.mkdir()
    _write_inputs(folder, hidden, weight, targets)
    out = tmp_path / "stats.json"
    benchmark_script("lce_filter_stats").main([str(folder), "--out", str(out)])
    (result,) = json.loads(out.read_text())
    rows = {(r["rule"], r["tokens"]): r for r in result["rows"]}
    for budget, rule in ((-10, "2^-10 (exact)"), (-8, "2^-8 (loose)"), (-6, "2^-6")):
        sorted_row = rows[(rule, "sorted tokens")]
        natural_row = rows[(rule, "natural tokens")]
        for r in (sorted_row, natural_row):
            assert r["dropped max"] <= 2.0**budget and 0.0 < r["tiles computed"] <= r["piece work"] <= 1.0
        assert sorted_row["tiles computed"] < natural_row["tiles computed"]
    assert 0.0 < rows[("CCE (every p < 2^-12)", "natural tokens")]["tiles computed"] <= 1.0
    assert "| 2^-8 (loose) | sorted tokens |" in capsys.readouterr().out
