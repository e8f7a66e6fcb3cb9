"""The allocator-peak breakdown: its replay on a hand-made allocator trace (the CPU has no allocator history), and the
breakdowns recorded on an H200, whose sites account for the peak they report."""

import json
from pathlib import Path

import pytest

from benchmarks import memory_at_peak

RECORDED = Path(__file__).resolve().parents[2] / "docs" / "measurements" / "2026-11-29c-h200x2"
GIB = 2**30


def _event(action: str, addr: int, gib: float, filename: str, line: int = 1) -> dict:
    return {"action": action, "addr": addr, "size": int(gib * GIB),
            "frames": [{"filename": "/x/site-packages/torch/nn/modules/module.py", "line": 9, "name": "_call_impl"},
                       {"filename": filename, "line": line, "name": "forward"}]}


def test_the_peak_is_the_largest_live_total_and_a_stream_free_counts_when_completed():
    trace = [_event("alloc", 1, 4.0, "/repo/trainable/fsdp2_engine.py", 66),     # 4
             _event("alloc", 2, 2.0, "/tmp/torchinductor_root/ab/cab.py", 698),  # 6
             _event("alloc", 3, 2.0, "/tmp/torchinductor_root/ab/cab.py", 698),  # 8
             _event("free_requested", 2, 2.0, "/tmp/torchinductor_root/ab/cab.py", 698),  # still 8: not completed
             _event("alloc", 4, 1.0, "/repo/kernels/backward.py", 253),          # 9: the peak
             _event("free_completed", 2, 2.0, "/tmp/torchinductor_root/ab/cab.py", 698),  # 7
             _event("alloc", 5, 1.5, "/repo/trainable/lm_head.py", 135)]         # 8.5
    summary = memory_at_peak.at_peak({"device_traces": [[], trace]}, 1)
    assert summary["peak_gib"] == pytest.approx(9.0) and not summary["truncated"] and summary["events"] == 7
    assert [(s["site"], s["gib"], s["blocks"]) for s in summary["sites"]] == [
        ("trainable/fsdp2_engine.py:66 forward", 4.0, 1), ("ab/cab.py:698 forward", 4.0, 2),
        ("kernels/backward.py:253 forward", 1.0, 1)]
    assert memory_at_peak.table(summary).splitlines()[0].startswith("allocated at the peak: 9.00 GiB over 7")


@pytest.mark.parametrize("name", ["memory_at_peak_1b_mb4_h200.json", "memory_at_peak_1b_mb8_h200.json"])
def test_the_recorded_breakdowns_account_for_their_peaks(name):
    """1B under FSDP2 on an H200 at micro-batch 4 and 8 (bench_sft_throughput.py --memory-at-peak): the sites sum
    to the peak within 0.1% and the peak is the row's allocator peak; the compiled layers' saved tensors grow with
    the micro-batch, the optimizer's states do not."""
    (record,) = json.loads((RECORDED / name).read_text())
    summary = record["memory_at_peak"]
    assert sum(s["gib"] for s in summary["sites"]) == pytest.approx(summary["peak_gib"], rel=1e-3)
    assert summary["peak_gib"] == pytest.approx(record["peak_gib"], rel=1e-3) and not summary["truncated"]
    sites = {s["site"]: s["gib"] for s in summary["sites"]}
    assert sites["trainable/fsdp2_engine.py:66 step"] == pytest.approx(8 * 1_235_814_400 / GIB, rel=1e-3)
    saved = sum(gib for site, gib in sites.items() if site.endswith(" call"))  # Inductor output code
    assert saved == pytest.approx(2.62 * record["micro_batch"], rel=0.01)
