"""The utilisation benchmark's arithmetic on a hand-made store and sample file (the GPU run itself needs GPUs)."""

import datetime as dt
import importlib.util
from pathlib import Path

import pytest

from sweeps import store

spec = importlib.util.spec_from_file_location(
    "sweep_gpu_utilization", Path(__file__).resolve().parents[2] / "benchmarks" / "sweep_gpu_utilization.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)

T0 = dt.datetime(2026, 11, 23, 10, 0, 0, tzinfo=dt.timezone.utc)


def _row(trial_id: str, start: float, end: float) -> dict:
    return {"run_name": "gpu_utilization", "trial_id": trial_id, "status": "ok",
            "started_at": T0 + dt.timedelta(seconds=start), "finished_at": T0 + dt.timedelta(seconds=end),
            "wall_load_s": 8.0, "wall_train_s": 30.0, "wall_eval_s": 5.0, "wall_total_s": 44.0}


def test_busy_fraction_first_step_and_slot_gaps(tmp_path):
    # two slots: a [0, 50] then c [53, 103]; b [1, 51] then d [55, 105]
    for trial_id, start, end in [("a", 0, 50), ("b", 1, 51), ("c", 53, 103), ("d", 55, 105)]:
        store.write_trial(str(tmp_path), _row(trial_id, start, end))
    stamp = lambda s: (T0 + dt.timedelta(seconds=s)).timestamp()  # noqa: E731
    samples = [(stamp(s), gpu, 80.0 if s < 100 else 0.0) for s in range(0, 106, 5) for gpu in (0, 1)]
    result = bench.summarise(tmp_path, samples)
    assert result["trials"] == 4 and result["sweep_s"] == pytest.approx(105)
    assert result["busy_fraction"] == pytest.approx(0.8 * 20 / 22)
    # 50 s in the Tune function, 44 s in the worker of which 30 + 5 trained and scored: 6 s outside + 9 s loading
    assert result["start_to_first_step_s"]["median"] == pytest.approx(15.0)
    assert sorted([result["end_to_next_start_s"]["median"], result["end_to_next_start_s"]["max"]]) == \
        pytest.approx([3.5, 4.0])


def test_reads_nvidia_smi_lines(tmp_path):
    path = tmp_path / "samples.csv"
    path.write_text("2026/11/23 10:00:00.250, 0, 37\n2026/11/23 10:00:00.450, 1, 0\ngarbage\n")
    samples = bench.read_samples(path)
    assert [(gpu, util) for _, gpu, util in samples] == [(0, 37.0), (1, 0.0)]
    assert samples[1][0] - samples[0][0] == pytest.approx(0.2)
