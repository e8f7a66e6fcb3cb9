"""The utilisation benchmark: its arithmetic on a hand-made store and sample file, its trial rates against a
recorded H200 run and its benchmark row, its mixed grids, and real runs of its warm and cold sweeps and of a mixed
grid on the CPU (the GPU figures need GPUs)."""

import argparse
import datetime as dt
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
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
    # two slots: a [0, 50] then c [53, 103] in a's actor; b [1, 51] then d [55, 105] in a new actor started at 52
    for trial_id, start, end, actor in [("a", 0, 50, -2), ("b", 1, 51, -1), ("c", 53, 103, -2), ("d", 55, 105, 52)]:
        store.write_trial(str(tmp_path), {**_row(trial_id, start, end),
                                          "actor_started_at": T0 + dt.timedelta(seconds=actor)})
    stamp = lambda s: (T0 + dt.timedelta(seconds=s)).timestamp()  # noqa: E731
    samples = [(stamp(s), gpu, 80.0 if s < 100 else 0.0) for s in range(0, 106, 5) for gpu in (0, 1)]
    result = bench.summarise(tmp_path, samples)
    assert result["trials"] == 4 and result["sweep_s"] == pytest.approx(105)
    assert result["busy_fraction"] == pytest.approx(0.8 * 20 / 22)
    # after b, the later of the slots' first trials, ends at 51: 9 of 11 samples per GPU at 80%
    assert result["busy_fraction_after_first"] == pytest.approx(0.8 * 9 / 11)
    # c and d follow a and b: gaps 3 and 4 s; each trial's 50 s span holds 43 s of load, train and scoring
    assert result["overhead"]["overhead_s_mean"] == pytest.approx((10 + 11) / 2)
    assert result["overhead"]["idle_s_max"] == pytest.approx(11 + 8)
    assert result["load_s_median"] == 8.0 and result["train_s_median"] == 30.0
    # new actors' starts, process to trial: a's, b's and d's (c reused a's actor)
    assert result["overhead"]["new_actor_start_s"] == [2.0, 2.0, 3.0]
    text = bench.table({"device": "cpu", "shape": "tiny", "trials": 4, "steps": 1, "paths": {"warm": result}})
    assert "new actor's start, mean / max" in text and "2.3 s / 3.0 s" in text


def test_memory_figures_in_start_order_and_against_the_prediction(tmp_path):
    memory = {"b": (2.5, 20.0, 21.0), "a": (2.0, 22.0, 20.0), "c": (3.0, 19.0, None)}  # RSS, GPU peak, predicted
    for trial_id, start in (("b", 60), ("a", 0), ("c", 120)):
        rss, peak, predicted = memory[trial_id]
        store.write_trial(str(tmp_path), {**_row(trial_id, start, start + 50), "host_rss_gib": rss,
                                          "gpu_peak_gib": peak, "gpu_peak_predicted_gib": predicted})
    store.write_trial(str(tmp_path), {**_row("failed", 200, 210), "status": "failed", "gpu_peak_gib": 99.0})
    result = bench.summarise(tmp_path, [])
    assert result["host_rss_gib_by_trial"] == [2.0, 2.5, 3.0]  # a, b, c: the failed trial's row is not counted
    assert result["gpu_peak_gib_max"] == 22.0 and result["gpu_peak_over_predicted_max"] == pytest.approx(1.1)
    assert "2.0 GiB / 3.0 GiB" in bench.table({"device": "cpu", "shape": "tiny", "trials": 3, "steps": 1,
                                               "paths": {"warm": result}})


def test_summarises_a_finished_run_again_and_plots_it(tmp_path):
    # a run's folder (its store and nvidia-smi's lines) and the JSON it wrote: summarised again, the JSON's device and
    # exit code kept, the new figures added, a PNG beside it
    warm = tmp_path / "work" / "warm"
    for trial_id, start, end in [("a", 0, 50), ("c", 53, 103)]:
        store.write_trial(str(warm / "results"), _row(trial_id, start, end))
    warm.joinpath("gpu_samples.csv").write_text("".join(
        f"{(T0 + dt.timedelta(seconds=s)).astimezone().strftime('%Y/%m/%d %H:%M:%S')}.000, 0, {0 if s < 5 else 90}\n"
        for s in range(0, 104, 2)))
    out = tmp_path / "run.json"
    out.write_text(json.dumps({"device": "2 x NVIDIA H200", "date": "2026-11-27", "shape": "1b", "trials": 2,
                               "steps": 200, "paths": {"warm": {"launch_exit_code": 0, "busy_fraction": None}}}))
    subprocess.run([sys.executable, str(Path(bench.__file__)), "--paths", "warm", "--summarise",
                    str(tmp_path / "work"), "--out", str(out)], check=True, capture_output=True, text=True)
    result = json.loads(out.read_text())
    assert result["device"] == "2 x NVIDIA H200" and result["paths"]["warm"]["launch_exit_code"] == 0
    assert result["paths"]["warm"]["busy_fraction"] == pytest.approx(0.9 * 49 / 52)
    assert result["paths"]["warm"]["busy_fraction_after_first"] == pytest.approx(0.9)
    assert out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


MEASUREMENTS = Path(__file__).resolve().parents[2] / "docs" / "measurements"


def test_a_recorded_run_s_trials_against_their_benchmark_row():
    """The 8 warm 1B trials of 2026-11-27 on an H200 against the bench's 1b:1:auto:4:alpaca row of that day: the
    0.992x of results.md, now from the script."""
    run = MEASUREMENTS / "2026-11-27-warm-thread" / "runs" / "1gpu_auto" / "warm"
    records = bench.bench_records(MEASUREMENTS / "2026-11-27-one-gpu-fsdp2" / "one_gpu_alpaca_h200.json")
    result = bench.summarise(run / "results", bench.read_samples(run / "gpu_samples.csv"), records)
    family = result["by_family"]["llama-1b"]
    assert family["bench_rows"] == ["1b:1:auto:4:alpaca"] and family["gpus"] == [1]  # FSDP2's row, not ZeRO-0's
    assert family["vs_bench_median"] == pytest.approx(48602.7 / 48989.6, abs=1e-4)
    trials = result["by_trial"]
    assert len(trials) == 8 and [t["start_s"] for t in trials] == sorted(t["start_s"] for t in trials)
    assert all(t["layout"] == "FSDP2 4x1" and 0.95 < t["vs_bench"] < 1.05 for t in trials)
    assert "48,603 0.992x" in bench.table({"device": "H200", "shape": "1b", "trials": 8, "steps": 200,
                                           "paths": {"warm": result}})
    assert "1b:1:auto:4:alpaca" in bench.trial_table("warm", result)


def _trial(trial_id: str, family: str, start: float, end: float, gpus: int, engine: str, stage: int, micro: int,
           rate: float | None) -> dict:
    return {**_row(trial_id, start, end), "family": family, "world_size": gpus, "engine": engine,
            "zero_stage": stage, "micro_batch_size": micro, "gradient_accumulation_steps": 1,
            "tokens_per_s_steady": rate, "device": "cuda"}


def _record(row: str, engine: str, stage: int, micro: int, rate: float, impl: str = "calsweep") -> dict:
    shape, gpus, _, batch, data = row.split(":")
    return {"impl_id": impl, "row": row, "shape": shape, "gpus": int(gpus), "batch": int(batch), "data": data,
            "engine": engine, "zero_stage": stage, "micro_batch": micro, "accumulation": 1,
            "tokens_per_s_per_gpu": rate}


def test_a_mixed_grid_s_trials_each_against_the_row_of_their_shape_and_layout(tmp_path):
    # 4 GPUs: two 8B trials on 2 GPUs each (ZeRO-2, micro-batch 2), then four 1B trials on one GPU each (FSDP2)
    trials = [_trial("big-a", "llama-8b", 0, 100, 2, "deepspeed", 2, 2, 2 * 8000.0),
              _trial("big-b", "llama-8b", 1, 101, 2, "deepspeed", 2, 2, 2 * 9000.0),
              *(_trial(f"small-{i}", "llama-1b", 101 + 30 * (i % 2), 131 + 30 * (i % 2), 1, "fsdp2", 3, 4, 45000.0)
                for i in range(4))]
    for row in trials:
        store.write_trial(str(tmp_path), row)
    records = [_record("8b:2:2:2:random", "deepspeed", 2, 2, 9000.0),
               _record("8b:2:2:2:alpaca", "deepspeed", 2, 2, 8500.0),
               _record("8b:2:auto:2:alpaca", "deepspeed", 2, 1, 1.0),  # another micro-batch
               _record("8b:2:2:2:alpaca", "deepspeed", 2, 2, 1.0, impl="calsweep_eager"),  # not compiled: a CPU's
               _record("1b:1:auto:4:alpaca", "fsdp2", 0, 4, 50000.0),  # FSDP2 on one GPU: planned at stage 0
               {"impl_id": "calsweep", "row": "1b:2:2:4:random", "shape": "1b", "gpus": 2, "error": "skipped"}]
    result = bench.summarise(tmp_path, [], records)
    by_id = {t["trial_id"]: t for t in result["by_trial"]}
    assert by_id["big-a"]["bench_row"] == "8b:2:2:2:alpaca" and by_id["big-a"]["tokens_per_s_per_gpu"] == 8000.0
    assert by_id["big-a"]["vs_bench"] == pytest.approx(8000 / 8500) and by_id["big-b"]["layout"] == "ZeRO-2 2x1"
    assert by_id["small-0"]["bench_row"] == "1b:1:auto:4:alpaca" and by_id["small-0"]["vs_bench"] == 0.9
    assert result["by_family"]["llama-8b"] == {"trials": 2, "gpus": [2], "tokens_per_s_per_gpu_median": 8500.0,
                                               "vs_bench_median": pytest.approx(1.0),
                                               "bench_rows": ["8b:2:2:2:alpaca"]}
    assert [t["trial_id"] for t in result["by_trial"]][:2] == ["big-a", "big-b"]
    # without a row of its layout a trial keeps its rate and has no ratio
    only_1b = {t["trial_id"]: t for t in bench.summarise(tmp_path, [], [records[4]])["by_trial"]}
    assert only_1b["big-a"]["vs_bench"] is None and only_1b["big-a"]["tokens_per_s_per_gpu"] == 8000.0
    assert only_1b["small-3"]["vs_bench"] == 0.9


def test_a_mixed_grid_sweep_plans_its_8b_family_on_two_gpus(tmp_path):
    from sweeps.config import sweep_from_dict

    args = argparse.Namespace(shapes=["8b", "1b"], trials=4, steps=200, eval_limit=400, tokenizer="smollm2-135m",
                              engine="auto", micro_batch=None)
    assert bench.shapes_problem(args.shapes) is None
    config = bench.sweep_config(args, tmp_path, warm=True)
    sweep = sweep_from_dict(config)
    assert sweep.families == ("llama-8b", "llama-1b") and len(sweep.trial_points()) == 8
    assert [sweep.layout(f).workers for f in sweep.families] == [2, 1]
    # what a user would leave is left: the scoring batch, the retries, the checkpoints
    assert (sweep.eval.batch_size, sweep.eval.batch_tokens, sweep.resources.max_failures,
            sweep.train.checkpoint_every_steps) == ("auto", "auto", 1, None)
    assert not {"batch_size", "batch_tokens"} & set(config["eval"]) and "max_failures" not in config["resources"]
    # 8 sequences a step: on H200s the 8B shards over two (ZeRO-2, 4 each), the 1B takes one GPU at 8 x 1
    config = bench.sweep_config(argparse.Namespace(**{**vars(args), "micro_batch": 8}), tmp_path, warm=True)
    sweep = sweep_from_dict({**config, "resources": {**config["resources"], "gpu_memory_gb": 139.8}})
    layouts = [sweep.layout(f) for f in sweep.families]
    assert [(x.workers, x.zero_stage, x.micro_batch_size) for x in layouts] == [(2, 2, 4), (1, 0, 8)]
    assert bench.shapes_problem(["8b", "tiny"]).startswith("--shape: expected shapes of one kind")
    assert "'2b'" in bench.shapes_problem(["2b"])


def test_reads_nvidia_smi_lines(tmp_path):
    path = tmp_path / "samples.csv"
    path.write_text("2026/11/23 10:00:00.250, 0, 37\n2026/11/23 10:00:00.450, 1, 0\ngarbage\n")
    samples = bench.read_samples(path)
    assert [(gpu, util) for _, gpu, util in samples] == [(0, 37.0), (1, 0.0)]
    assert samples[1][0] - samples[0][0] == pytest.approx(0.2)


def test_samples_only_the_gpus_the_sweep_may_use(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0, 2")
    assert bench.visible_gpus() == ["0", "2"]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert bench.visible_gpus() == []


CPU_RUNS = {  # the script's runs on the CPU that end by themselves: name -> their arguments
    "warm_and_cold": ["--shape", "tiny", "--trials", "2", "--steps", "1", "--eval-limit", "4", "--paths", "warm,cold"],
    "mixed_grid": ["--shape", "small,tiny", "--trials", "2", "--steps", "3", "--eval-limit", "4", "--paths", "warm",
                   "--bench-rows", "tiny:1:2:2:alpaca,small:1:2:2:alpaca"],
}


def _env(data_dir: str) -> dict[str, str]:
    return {**os.environ, "CALSWEEP_DATA_DIR": data_dir, "RAY_USAGE_STATS_ENABLED": "0"}


def _run(work: Path, data_dir: str, args: list[str]) -> tuple[subprocess.CompletedProcess, Path]:
    """The script with ``args``, its work folder ``work``: its run, and the JSON it wrote (``work``/util.json)."""
    out = work / "util.json"
    work.mkdir(parents=True)
    run = subprocess.run([sys.executable, bench.__file__, *args, "--work", str(work), "--out", str(out)],
                         capture_output=True, text=True, timeout=1800, env=_env(data_dir))
    return run, out


def _fsdp2_run_killed(work: Path, data_dir: str) -> tuple[dict, dict]:
    """A warm run of six one-step trials on FSDP2 (``--engine fsdp2``) that writes its summary so far every second
    (``--partial-every``), killed from outside (the script, its sweep and the sweep's Ray) once that summary holds
    two trials: the last summary read before the kill, and the JSON the run left."""
    out = work / "util.json"
    work.mkdir(parents=True)
    run = subprocess.Popen([sys.executable, bench.__file__, "--shape", "tiny", "--trials", "6", "--steps", "1",
                            "--eval-limit", "4", "--paths", "warm", "--engine", "fsdp2", "--partial-every", "1",
                            "--work", str(work), "--out", str(out)], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, start_new_session=True, env=_env(data_dir))
    try:
        deadline, warm = time.time() + 600, {}
        while time.time() < deadline and run.poll() is None and warm.get("trials", 0) < 2:
            time.sleep(1)
            warm = json.loads(out.read_text())["paths"].get("warm", {}) if out.is_file() else {}
    finally:
        os.killpg(run.pid, signal.SIGKILL)
        run.wait(timeout=60)
    return warm, json.loads(out.read_text())["paths"]["warm"]


@pytest.fixture(scope="module")
def cpu_runs(tmp_path_factory, data_dir) -> dict[str, tuple]:
    """The script's CPU runs, launched at once (each sweep with a Ray of its own): for each of CPU_RUNS its run and
    JSON (``_run``), and "fsdp2_killed" (``_fsdp2_run_killed``)."""
    root = tmp_path_factory.mktemp("cpu_runs")
    with ThreadPoolExecutor(len(CPU_RUNS) + 1) as pool:
        runs = {name: pool.submit(_run, root / name, data_dir, args) for name, args in CPU_RUNS.items()}
        runs["fsdp2_killed"] = pool.submit(_fsdp2_run_killed, root / "fsdp2_killed", data_dir)
        return {name: run.result() for name, run in runs.items()}


@pytest.mark.slow
def test_runs_warm_and_cold_sweeps_on_the_cpu(cpu_runs):
    run, out = cpu_runs["warm_and_cold"]
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    print(run.stdout[-1500:])
    result = json.loads(out.read_text())
    assert result["device"] == "cpu" and list(result["paths"]) == ["warm", "cold"]
    for path in ("warm", "cold"):
        figures = result["paths"][path]
        assert figures["launch_exit_code"] == 0 and figures["ok"] == figures["trials"] == 2
        assert figures["busy_fraction"] is None and figures["overhead"]["slots"] == 1
        assert figures["overhead"]["overhead_s_mean"] > 0
        assert len(figures["host_rss_gib_by_trial"]) == 2 and min(figures["host_rss_gib_by_trial"]) > 0.2
        assert figures["gpu_peak_gib_max"] is None  # no GPU
        for trial in figures["by_trial"]:  # each trial's phases; the check's seconds are part of the load's
            assert trial["load_s"] > 0 and trial["check_s"] > 0 and trial["train_s"] >= trial["warmup_s"] > 0
            assert trial["score_s"] > 0 and trial["compile_s"] is not None  # the trial's own (compile: CUDA only)
        assert "gpu_hours_measured" not in figures  # a CPU sweep holds no GPUs
    assert "overhead per trial, mean / max" in run.stdout and "GPU busy" in run.stdout
    assert "GPU-hours predicted / measured" in run.stdout and " check " in run.stdout and " compile " in run.stdout


@pytest.mark.slow
def test_a_run_killed_from_outside_leaves_the_trials_it_finished(cpu_runs):
    """While its sweep runs the script writes the summary so far (``--partial-every``): killed after two trials'
    rows, its JSON holds those trials."""
    seen, left = cpu_runs["fsdp2_killed"]
    assert seen.get("launch_exit_code") == "running" and seen["trials"] >= 2, seen
    assert left["launch_exit_code"] == "running" and left["trials"] >= 2 and left["by_trial"][0]["status"] == "ok"


@pytest.mark.slow
def test_warm_one_gpu_trials_run_on_fsdp2_when_asked(cpu_runs):
    """``--engine fsdp2``: the warm Tune actors train one-worker trials on FSDP2 (ZeRO-3's layout on one rank), one
    after another."""
    _, warm = cpu_runs["fsdp2_killed"]
    assert warm["ok"] == warm["trials"] >= 2 and warm["engines"] == ["fsdp2"] and warm["layout"] == [[3, 2, 1]]
    assert warm["overhead"]["slots"] == 1, warm["overhead"]


@pytest.mark.slow
def test_a_mixed_grid_on_the_cpu_against_bench_rows_run_first(cpu_runs):
    """Two tiny families of different sizes in one warm sweep, each trial's rate set against the bench row of its
    shape and layout, which the script ran first (``--bench-rows``)."""
    run, out = cpu_runs["mixed_grid"]
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    print(run.stdout[-2500:])
    result = json.loads(out.read_text())
    assert result["bench"] == str(out.parent / bench.BENCH_JSON) and result["shape"] == "small,tiny"
    warm = result["paths"]["warm"]
    assert warm["ok"] == warm["trials"] == 4 and set(warm["by_family"]) == {"llama-small", "llama-tiny"}
    for family, figures in warm["by_family"].items():
        assert figures["bench_rows"] == [f"{family.removeprefix('llama-')}:1:2:2:alpaca"] and figures["gpus"] == [1]
        assert figures["tokens_per_s_per_gpu_median"] > 0 and figures["vs_bench_median"] > 0
    assert [t["family"] for t in warm["by_trial"]] == ["llama-small"] * 2 + ["llama-tiny"] * 2  # longest first
    assert "llama-small: tok/s/GPU, x its row" in run.stdout and "small:1:2:2:alpaca" in run.stdout
