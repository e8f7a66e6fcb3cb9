"""How busy a sweep keeps its GPUs, warm trials against cold ones, one shape or a mixed grid: run a sweep, sample
the GPUs, read the store.

    python benchmarks/sweep_gpu_utilization.py --out util.json                   # 8 trials, 1B Llama, warm then cold
    CUDA_VISIBLE_DEVICES=0 python benchmarks/sweep_gpu_utilization.py --paths warm --out util_1gpu.json
    CUDA_VISIBLE_DEVICES=0 python benchmarks/sweep_gpu_utilization.py --paths warm --engine deepspeed --out util_ds.json
    python benchmarks/sweep_gpu_utilization.py --paths warm --shape 8b,1b --trials 4 \
        --bench-rows 8b:2:auto:2:alpaca,1b:1:auto:4:alpaca --out util_mixed.json   # a mixed grid on a node's GPUs
    python benchmarks/sweep_gpu_utilization.py --paths warm --shape 8b,1b --trials 4 --steps 40 --micro-batch 8 \
        --bench-rows 8b:2:2:4:alpaca,1b:1:auto:8:alpaca --out util_sharded.json   # 8B sharded over two H200s
    python benchmarks/sweep_gpu_utilization.py --shape tiny --trials 2 --steps 1 --eval-limit 4   # on the CPU

Writes a sweep YAML (``--shape``: one shape or several, comma-separated, each a family ``llama-<shape>`` of the
grid: ``1b`` and ``8b``, random-init Llama-3.2-1B and Llama-3.1-8B shapes on packed Alpaca rows of 2,048 tokens,
or ``tiny`` and ``small``, 2- and 4-layer Llamas for the CPU; the models are ``bench_sft_throughput.SHAPES``;
``--trials`` grid points per shape = 2 lr x trials/2 betas, ``--steps`` optimiser steps each, ARC-Easy scoring of
``--eval-limit`` questions) and runs ``sweeps/launch.py`` on it once per ``--paths`` entry: ``warm``
(``resources.warm_trials: true``: one-worker trials in Tune actors reused across trials) and ``cold`` (false: a Ray
Train worker group started and stopped per trial); ``--micro-batch`` sequences a step (default 4). Every other key
is left at the user's default (scoring batch, retries, checkpoints, layout). Each family's GPUs are the planner's
(``trainable.layout``: the 8B shape at 4 sequences a step on one H200 or two H100s, at 8 on two H200s; one GPU for
the others), trials as many at once as the GPUs hold, in Tune's order (``sweeps.search.trial_order``). While a
sweep runs, ``nvidia-smi`` (when present) samples the utilisation (percent of time a kernel ran) of each GPU
``CUDA_VISIBLE_DEVICES`` names (all without it) every 200 ms. Reports
per path:
- busy: the mean sampled utilisation over the GPUs and of each GPU, from the first trial's start to the last
  trial's end; and from the end of the last GPU's first trial on (the warm trials alone);
- each trial (start order): its family, GPUs and layout (engine, stage, micro-batch x accumulation), span, and
  steady tokens/s per GPU (the store's ``tokens_per_s_steady`` over its ranks) against the benchmark row of the
  same shape and layout (``bench_sft_throughput.py``'s record of the same GPUs, engine, stage, micro-batch and
  accumulation; packed Alpaca rows first): from ``--bench JSON`` (a bench run on the same machine), or from
  ``--bench-rows ROWS`` run here first (the trial loop as the trials run it, at the sweep's sequence length); per
  family the medians;
- the trials' compile warm-up (``wall_warmup_s``) and layouts;
- per trial (``sweeps.overhead``, from the store's timestamps and the worker's wall times): overhead (time outside
  the trial's own load, training and scoring) and idle (overhead plus loading: previous trial's last scored
  question to this trial's first optimiser step), as means over the trials that follow another on their GPU; and
  each new actor's start (its process's start to its trial's: Ray's worker, imports, Tune's set-up), apart from
  Tune's scheduling before it (the previous trial's row to that process's start);
- train and scoring seconds per trial, and each trial's seconds by phase: load, attention check, compile warm-up
  (and of it, torch's own compiling), training, scoring (``phase_seconds``);
- GPU-hours: predicted (``sweeps.layout_report.predicted_gpu_hours``: training plus load, start, compile, scoring,
  ``sweeps/trial_cost.py``) against measured (each trial's wall time x GPUs held), as the launch's last line says;
- memory (``trainable.trial_memory``): each trial's host RSS in start order (a warm actor's growth shows there),
  the largest GPU peak, and the largest peak over the layout model's prediction for that trial.
Prints a table (and one of the trials), writes JSON (every ``--partial-every`` seconds while a sweep runs too, so that a
run killed from outside leaves the trials done so far) and, with samples, a plot of each GPU's utilisation over the
sweep with the trials' spans shaded by family (the JSON's name, .png). ``--summarise WORK`` reads a finished run's
folder (its stores, samples and bench JSON) again instead of running.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from statistics import mean, median
from typing import Callable

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.bench_sft_throughput import SHAPES as MODELS  # noqa: E402


SETTINGS = {  # sft and train settings of the shapes' trials: shapes run together share them
    "gpu": ({"max_examples": 20000, "max_seq_len": 2048},
            {"micro_batch_size": 4, "gradient_accumulation_steps": 1, "precision": "bf16", "zero_stage": "auto",
             "pack": True, "pack_length": 2048}),
    "cpu": ({"max_examples": 16, "max_seq_len": 96},
            {"micro_batch_size": 2, "gradient_accumulation_steps": 1, "zero_stage": 2}),
}
SHAPES = {"1b": "gpu", "8b": "gpu", "tiny": "cpu", "small": "cpu"}  # shape -> its SETTINGS; models: MODELS
FAMILY = "llama-"  # a shape's family in the sweep: llama-<shape>
RUN = "gpu_utilization"
BENCH_JSON = "bench_sft_throughput.json"  # --bench-rows' results, in the work folder
# the bench's implementations that run what a trial on the device runs: compiled layers on CUDA, eager on the CPU
TRIAL_LOOP = {"cuda": ("calsweep", "calsweep_fsdp2"), "cpu": ("calsweep_eager",)}


def shapes_problem(shapes: list[str]) -> str | None:
    """Why ``shapes`` cannot run as one sweep (one line), or None."""
    unknown = [shape for shape in shapes if shape not in SHAPES]
    if unknown or not shapes:
        return f"--shape: expected shapes from {sorted(SHAPES)}, got {unknown or shapes}"
    if len({SHAPES[shape] for shape in shapes}) > 1:
        return (f"--shape: expected shapes of one kind ({', '.join(sorted(SETTINGS))}: "
                f"{', '.join(f'{s} {k}' for s, k in SHAPES.items())}), got {','.join(shapes)}")
    return None


def sweep_config(args: argparse.Namespace, results: Path, warm: bool) -> dict:
    """The benchmark's sweep: ``args.trials`` trials of each of ``args.shapes``, warm or cold, on the GPUs the
    layout planner gives each family."""
    sft, train = SETTINGS[SHAPES[args.shapes[0]]]
    train = {**train, **({"micro_batch_size": args.micro_batch} if args.micro_batch else {})}
    betas = [round(0.1 * i, 1) for i in range(max(1, args.trials // 2))]
    return {
        "name": RUN, "seed": 0, "results_dir": str(results),
        "families": [FAMILY + shape for shape in args.shapes],
        "learning_rates": [1.0e-4, 3.0e-4][:max(1, min(2, args.trials))], "label_smoothing": betas,
        "custom_models": {FAMILY + shape: {"architecture": "llama", "tokenizer": args.tokenizer,
                                           "config": MODELS[shape]} for shape in args.shapes},
        "sft": sft, "train": {"max_steps": args.steps, **train, "engine": args.engine,
                              **({"zero_stage": 3} if args.engine == "fsdp2" else {})},
        "eval": {"tasks": ["arc_easy"], "limit": args.eval_limit},
        "resources": {"workers_per_trial": "auto", "warm_trials": warm},
    }


def visible_gpus() -> list[str]:
    """The ``nvidia-smi`` ids of the GPUs the sweep may use: ``CUDA_VISIBLE_DEVICES``'s, else [] (all)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    return [part.strip() for part in visible.split(",") if part.strip()]


def sample_gpus(path: Path) -> subprocess.Popen | None:
    """``nvidia-smi`` writing 'timestamp, index, utilization' lines every 200 ms for the sweep's GPUs
    (``visible_gpus``) until terminated; None without one (a CPU machine)."""
    if shutil.which("nvidia-smi") is None:
        path.write_text("")
        return None
    handle, gpus = path.open("w"), visible_gpus()
    ids = [f"--id={','.join(gpus)}"] if gpus else []
    return subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,index,utilization.gpu",
                             "--format=csv,noheader,nounits", "-lms", "200", *ids], stdout=handle, text=True)


def read_samples(path: Path) -> list[tuple[float, int, float]]:
    samples = []
    for line in path.read_text().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3 and parts[2].replace(".", "").isdigit():
            stamp = time.mktime(time.strptime(parts[0].split(".")[0], "%Y/%m/%d %H:%M:%S"))
            stamp += float("0." + parts[0].split(".")[1]) if "." in parts[0] else 0.0
            samples.append((stamp, int(parts[1]), float(parts[2])))
    return samples


def bench_records(path: Path | None) -> list[dict]:
    """The records of a ``bench_sft_throughput.py`` JSON (its list, or a curated file's ``records``); [] without."""
    if path is None:
        return []
    data = json.loads(path.read_text())
    return data["records"] if isinstance(data, dict) else data


def _layout_key(gpus: int, engine: str | None, stage: int | None, micro: int | None, accumulation: int | None) -> tuple:
    """What makes a trial's rate comparable with a benchmark row's: GPUs, engine, ZeRO stage (not FSDP2's: it
    shards as ZeRO-3 whatever stage its row was planned at), micro-batch and accumulation."""
    return gpus, engine, stage if engine == "deepspeed" else None, micro, accumulation


def bench_row(trial: dict, records: list[dict]) -> dict | None:
    """The benchmark record of ``trial``'s (a store row's) shape and layout, packed Alpaca before random tokens;
    None without one. Records are ``bench_sft_throughput.py``'s of the trial loop as it runs on the trial's device
    (``TRIAL_LOOP``)."""
    key = _layout_key(trial["world_size"], trial["engine"], trial["zero_stage"], trial["micro_batch_size"],
                      trial["gradient_accumulation_steps"])
    same = [r for r in records if "error" not in r and r.get("impl_id") in TRIAL_LOOP[trial["device"]]
            and FAMILY + r["shape"] == trial["family"]
            and _layout_key(r["gpus"], r.get("engine"), r.get("zero_stage"), r.get("micro_batch"),
                            r.get("accumulation")) == key]
    return min(same, key=lambda r: r["data"] != "alpaca", default=None)


def trial_spans(rows: list[dict], records: list[dict]) -> list[dict]:
    """Each trial in start order: family, status, GPUs and layout, span (seconds from the first trial's start),
    steady tokens/s per GPU, and its benchmark row's (``bench_row``) with the ratio of the two."""
    start = min(r["started_at"].timestamp() for r in rows)
    spans = []
    for r in sorted(rows, key=lambda r: r["started_at"]):
        gpus = r.get("world_size") or 1
        rate = r["tokens_per_s_steady"] / gpus if r.get("tokens_per_s_steady") is not None else None
        row = bench_row(r, records) if r.get("world_size") and r.get("device") else None  # a failed row: no device
        engine = "FSDP2" if r.get("engine") == "fsdp2" else f"ZeRO-{r.get('zero_stage')}"
        spans.append({
            "trial_id": r["trial_id"], "family": r["family"], "status": r["status"], "gpus": gpus,
            "layout": f"{engine} {r.get('micro_batch_size')}x{r.get('gradient_accumulation_steps')}",
            "start_s": r["started_at"].timestamp() - start, "end_s": r["finished_at"].timestamp() - start,
            **phase_seconds(r), "tokens_per_s_per_gpu": rate, "bench_row": row and row["row"],
            "bench_tokens_per_s_per_gpu": row and row["tokens_per_s_per_gpu"],
            "vs_bench": rate / row["tokens_per_s_per_gpu"] if row and rate is not None else None})
    return spans


def phase_seconds(row: dict) -> dict[str, float | None]:
    """A stored trial's seconds by phase: load (the attention check left out), attention check, compile warm-up
    (``wall_warmup_s``: the warm-up steps, compiling), of it torch's compiling (``compile_s``), training (the warm-up
    included) and scoring."""
    load, check = row.get("wall_load_s"), row.get("wall_check_s")
    return {"load_s": None if load is None else load - (check or 0.0), "check_s": check,
            "warmup_s": row.get("wall_warmup_s"), "compile_s": row.get("compile_s"), "train_s": row.get("wall_train_s"),
            "score_s": row.get("wall_eval_s")}


def gpu_hours(results: Path, rows: list[dict]) -> dict[str, float | None]:
    """Predicted (``sweeps.layout_report.predicted_gpu_hours`` of the run's resolved sweep.yaml, as the launcher
    planned it) and measured GPU-hours (each stored trial's wall time x GPUs held); nothing before the launcher has
    saved its sweep."""
    from sweeps.config import load_sweep
    from sweeps.layout_report import measured_gpu_hours, predicted_gpu_hours

    saved = results / "runs" / RUN / "sweep.yaml"
    if not saved.is_file():
        return {}
    sweep = load_sweep(saved)
    if not sweep.resources.gpus_per_worker:
        return {}
    return {"gpu_hours_predicted": predicted_gpu_hours(sweep, None), "gpu_hours_measured": measured_gpu_hours(sweep, rows)}


def by_family(spans: list[dict]) -> dict[str, dict]:
    """Per family: its trials, GPUs per trial, and the medians of their tokens/s per GPU and of their ratio to the
    benchmark row."""
    families = {}
    for family in sorted({s["family"] for s in spans}):
        mine = [s for s in spans if s["family"] == family]
        families[family] = {"trials": len(mine), "gpus": sorted({s["gpus"] for s in mine}),
                            "tokens_per_s_per_gpu_median": _median(mine, "tokens_per_s_per_gpu"),
                            "vs_bench_median": _median(mine, "vs_bench"),
                            "bench_rows": sorted({s["bench_row"] for s in mine if s["bench_row"]})}
    return families


def summarise(results: Path, samples: list[tuple[float, int, float]], records: list[dict] = ()) -> dict:
    """The store's trials of the run with the GPU samples of their span: busy fraction, overheads, wall times, and
    each trial's rate against its benchmark row among ``records`` (``bench_records``)."""
    from sweeps import overhead, store

    rows = store.read_trials(str(results), RUN).to_pylist() if (results / "trials").is_dir() else []
    if not rows:
        return {"trials": 0, "ok": 0}
    starts = [r["started_at"].timestamp() for r in rows]
    ends = [r["finished_at"].timestamp() for r in rows]
    window = [s for s in samples if min(starts) <= s[0] <= max(ends)]
    ok = [r for r in rows if r["status"] == "ok"]
    overheads = overhead.trial_overheads(rows)
    by_id = {r["trial_id"]: r for r in rows}
    firsts_end = max(by_id[o.trial_id]["finished_at"].timestamp() for o in overheads if o.gap_s is None)
    warm = [s for s in window if s[0] > firsts_end]
    spans = trial_spans(rows, list(records))
    return {
        "trials": len(rows), "ok": len(ok), "sweep_s": max(ends) - min(starts),
        "gpus": sorted({s[1] for s in samples}),
        "busy_fraction": mean(s[2] for s in window) / 100 if window else None,
        "busy_fraction_by_gpu": {gpu: mean(s[2] for s in window if s[1] == gpu) / 100
                                 for gpu in sorted({s[1] for s in window})},
        "busy_fraction_after_first": mean(s[2] for s in warm) / 100 if warm else None,
        "tokens_per_s_steady_median": _median(ok, "tokens_per_s_steady"),
        "warmup_s_median": _median(ok, "wall_warmup_s"),
        "warmup_s_max": max((r["wall_warmup_s"] for r in ok if r.get("wall_warmup_s") is not None), default=None),
        "layout": sorted({(r.get("zero_stage"), r.get("micro_batch_size"), r.get("gradient_accumulation_steps"))
                          for r in ok}),
        "engines": sorted({r.get("engine") for r in ok if r.get("engine")}),
        "train_s_median": median(r["wall_train_s"] for r in ok) if ok else None,
        "eval_s_median": median(r["wall_eval_s"] for r in ok) if ok else None,
        "load_s_median": median(r["wall_load_s"] for r in ok) if ok else None,
        "overhead": overhead.summary(overheads),
        **memory(ok), **gpu_hours(results, rows),
        "by_trial": spans, "by_family": by_family(spans),
    }


def memory(ok: list[dict]) -> dict:
    """The trials' memory columns (``trainable.trial_memory``): each trial's host RSS in start order (a warm
    actor's growth), the largest GPU peak and the largest peak over its layout's predicted one."""
    ordered = sorted(ok, key=lambda r: r["started_at"])
    peaks = [r["gpu_peak_gib"] for r in ok if r.get("gpu_peak_gib") is not None]
    ratios = [r["gpu_peak_gib"] / r["gpu_peak_predicted_gib"] for r in ok
              if r.get("gpu_peak_gib") is not None and r.get("gpu_peak_predicted_gib")]
    return {"host_rss_gib_by_trial": [r.get("host_rss_gib") for r in ordered],
            "gpu_peak_gib_max": max(peaks, default=None),
            "gpu_peak_over_predicted_max": max(ratios, default=None)}


def plot_timeline(works: dict[str, Path], summaries: dict[str, dict], path: Path) -> None:
    """One panel per run folder of ``works`` (path name -> folder): each GPU's sampled utilisation over the sweep,
    the trials' spans as bars above it coloured by family, titled with the path's figures from ``summaries``
    (``summarise``'s); written to ``path`` (PNG), nothing without samples."""
    from sweeps import store

    runs = {}
    for name, work in works.items():
        samples = read_samples(work / "gpu_samples.csv") if (work / "gpu_samples.csv").is_file() else []
        if samples and (work / "results" / "trials").is_dir():
            runs[name] = (samples, store.read_trials(str(work / "results"), RUN).to_pylist())
    if not runs:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(runs), 1, figsize=(11, 3.2 * len(runs)), squeeze=False)
    for ax, (name, (samples, rows)) in zip(axes[:, 0], runs.items()):
        start = min(r["started_at"].timestamp() for r in rows)
        colours = {f: plt.cm.Set2(i) for i, f in enumerate(sorted({r["family"] for r in rows}))}
        lanes: list[float] = []  # the end of each lane's last trial: a trial takes the first lane free at its start
        labelled: set[str] = set()
        for row in sorted(rows, key=lambda r: r["started_at"]):
            begin, end = row["started_at"].timestamp() - start, row["finished_at"].timestamp() - start
            lane = next((i for i, last in enumerate(lanes) if last <= begin), len(lanes))
            lanes[lane:lane + 1] = [end]
            ax.barh(108 + 5 * lane, end - begin, left=begin, height=4, color=colours[row["family"]],
                    label=None if row["family"] in labelled else row["family"])
            labelled.add(row["family"])
        for gpu in sorted({g for _, g, _ in samples}):
            points = [(t - start, u) for t, g, u in samples if g == gpu]
            ax.plot(*zip(*points), lw=0.6, label=f"GPU {gpu}")
        summary = summaries[name]
        by_gpu = " ".join(f"{100 * v:.0f}%" for v in summary["busy_fraction_by_gpu"].values())
        ax.set(xlim=(-5, summary["sweep_s"] + 5), ylim=(0, 110 + 5 * len(lanes)), ylabel="utilisation %",
               title=f"{name}: {summary['ok']} trials, GPU busy {100 * summary['busy_fraction']:.1f}% ({by_gpu}; "
                     f"after the first trials {100 * (summary['busy_fraction_after_first'] or 0):.1f}%)")
        ax.legend(loc="lower right", fontsize=7)
    axes[-1, 0].set_xlabel("seconds from the first trial's start (bars above: the trials, by family)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _hours(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def _mean(values: list[float] | None) -> float | None:
    return mean(values) if values else None


def _median(rows: list[dict], key: str) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    return median(values) if values else None


def run_path(args: argparse.Namespace, work: Path, warm: bool, records: list[dict],
             partial: Callable[[dict], None] = lambda summary: None) -> dict:
    """Run the benchmark's sweep once (warm or cold) under ``work``, sampling the GPUs; its summary, the trials'
    rates against ``records`` (``bench_records``). Every ``args.partial_every`` seconds while it runs, ``partial``
    gets the summary so far (``launch_exit_code`` "running"), so that a run killed from outside leaves its trials."""
    work.mkdir(parents=True, exist_ok=True)
    config = work / "sweep.yaml"
    config.write_text(yaml.safe_dump(sweep_config(args, work / "results", warm), sort_keys=False))
    sampler = sample_gpus(work / "gpu_samples.csv")
    launch = subprocess.Popen([sys.executable, str(ROOT / "sweeps" / "launch.py"), "--config", str(config)],
                              env=os.environ.copy())
    deadline = None if args.timeout is None else time.time() + args.timeout
    exit_code: int | str | None = None
    try:
        while exit_code is None:
            every = args.partial_every
            left = every if deadline is None else min(every, deadline - time.time())
            try:
                exit_code = launch.wait(timeout=max(left, 0.1))
            except subprocess.TimeoutExpired:
                if deadline is not None and time.time() >= deadline:  # summarise the trials that finished
                    launch.kill()
                    launch.wait()
                    exit_code = "timed out"
                else:
                    partial({"launch_exit_code": "running",
                             **summarise(work / "results", read_samples(work / "gpu_samples.csv"), records)})
    finally:
        if sampler is not None:
            sampler.terminate()
            sampler.wait()
    return {"launch_exit_code": exit_code,
            **summarise(work / "results", read_samples(work / "gpu_samples.csv"), records)}


def _device() -> str:
    if shutil.which("nvidia-smi") is None:
        return "cpu"
    names = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                           text=True).stdout.strip().splitlines()
    return f"{len(names)} x {names[0]}" if names else "unknown"


def table(result: dict) -> str:
    """The paths side by side: busy, overhead and idle per trial, sweep, train and scoring."""
    def cell(value: float | None, scale: float = 1.0, unit: str = " s") -> str:
        return "-" if value is None else f"{scale * value:.1f}{unit}"

    paths = [p for p, r in result["paths"].items() if r["trials"]]
    lines = [f"{result['device']}, {result['shape']} shape(s), {result['trials']} trials each x {result['steps']} "
             "steps",
             f"{'':<40}" + "".join(f"{p:>14}" for p in paths)]
    rows = [("trials ok", lambda r: f"{r['ok']}/{r['trials']}"),
            ("GPU busy (mean utilisation)", lambda r: cell(r["busy_fraction"], 100, "%")),
            ("GPU busy after the first trials", lambda r: cell(r.get("busy_fraction_after_first"), 100, "%")),
            ("GPU busy, each GPU", lambda r: " ".join(f"{100 * v:.0f}%" for v in r["busy_fraction_by_gpu"].values())
             or "-"),
            ("overhead per trial, mean / max", lambda r: f"{cell(r['overhead']['overhead_s_mean'])} / "
                                                        f"{cell(r['overhead']['overhead_s_max'])}"),
            ("idle per trial (incl. load), mean", lambda r: cell(r["overhead"]["idle_s_mean"])),
            ("first trial: framework / load", lambda r: f"{cell(r['overhead']['first_framework_s'][0])} / "
                                                       f"{cell(r['overhead']['first_load_s'][0])}"),
            ("new actor's start, mean / max", lambda r: f"{cell(_mean(r['overhead'].get('new_actor_start_s')))} / "
                                                       f"{cell(max(r['overhead'].get('new_actor_start_s') or [None]))}"),
            ("trial tokens/s (steady), median", lambda r: cell(r.get("tokens_per_s_steady_median"), 1, "")),
            ("compile warm-up, median / max", lambda r: f"{cell(r.get('warmup_s_median'))} / "
                                                       f"{cell(r.get('warmup_s_max'))}"),
            ("load / train / scoring, median", lambda r: f"{cell(r['load_s_median'])} / {cell(r['train_s_median'])}"
                                                        f" / {cell(r['eval_s_median'])}"),
            ("host RSS, first / last trial", lambda r: " / ".join(
                cell(r.get("host_rss_gib_by_trial", [None])[i], 1, " GiB") for i in (0, -1))),
            ("GPU peak max, / predicted", lambda r: f"{cell(r.get('gpu_peak_gib_max'), 1, ' GiB')}, "
                                                   f"{cell(r.get('gpu_peak_over_predicted_max'), 1, 'x')}"),
            ("GPU-hours predicted / measured", lambda r: f"{_hours(r.get('gpu_hours_predicted'))} / "
                                                        f"{_hours(r.get('gpu_hours_measured'))}"),
            ("sweep (first start to last end)", lambda r: cell(r["sweep_s"]))]
    def family_cell(figures: dict | None) -> str:
        if figures is None or figures["tokens_per_s_per_gpu_median"] is None:
            return "-"
        ratio = figures["vs_bench_median"]
        return f"{figures['tokens_per_s_per_gpu_median']:,.0f}" + ("" if ratio is None else f" {ratio:.3f}x")

    for family in sorted({f for p in paths for f in result["paths"][p].get("by_family", {})}):
        rows.append((f"{family}: tok/s/GPU, x its row", lambda r, f=family: family_cell(r.get("by_family", {}).get(f))))
    for label, value in rows:
        lines.append(f"{label:<40}" + "".join(f"{value(result['paths'][p]):>14}" for p in paths))
    return "\n".join(lines)


def trial_table(path: str, summary: dict) -> str:
    """One line per trial of a path (``trial_spans``), in start order: span, GPUs, layout, seconds of its phases
    (``phase_seconds``; warm-up is part of train), tokens/s per GPU against its benchmark row."""
    def cell(value: float | None, form: str) -> str:
        return "-" if value is None else format(value, form)

    phases = ("load_s", "check_s", "warmup_s", "compile_s", "train_s", "score_s")
    lines = [f"{path}: {'trial':<44} {'status':<7} {'start s':>8} {'end s':>8} GPUs  {'layout':<12} "
             f"{'load':>6} {'check':>6} {'warmup':>6} {'compile':>7} {'train':>6} {'score':>6} "
             f"{'tok/s/GPU':>10} {'bench row':<20} {'row tok/s':>10} {'vs row':>7}"]
    for t in summary.get("by_trial", []):
        lines.append(f"{'':{len(path) + 2}}{t['trial_id']:<44} {t['status']:<7} {t['start_s']:>8.1f} "
                     f"{t['end_s']:>8.1f} {t['gpus']:>4}  {t['layout']:<12} "
                     + "".join(f"{cell(t.get(k), '.1f'):>{7 if k == 'compile_s' else 6}} " for k in phases) +
                     f"{cell(t['tokens_per_s_per_gpu'], ',.0f'):>10} {t['bench_row'] or '-':<20} "
                     f"{cell(t['bench_tokens_per_s_per_gpu'], ',.0f'):>10} {cell(t['vs_bench'], '.3f'):>7}")
    return "\n".join(lines)


def run_bench(args: argparse.Namespace, work: Path) -> Path:
    """``bench_sft_throughput.py`` on ``args.bench_rows`` before the sweeps: the trial loop as the trials run it
    (``TRIAL_LOOP``) at the sweep's sequence length, on this machine's GPUs (without any, a short run on the CPU);
    its JSON."""
    sft, train = SETTINGS[SHAPES[args.shapes[0]]]
    out = work / BENCH_JSON
    on_cpu = shutil.which("nvidia-smi") is None
    cpu = ["--cpu", "--steps", "3", "--warmup", "1"] if on_cpu else []
    work.mkdir(parents=True, exist_ok=True)
    bench = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_sft_throughput.py"), "--rows",
                            args.bench_rows, "--impls", TRIAL_LOOP["cpu" if on_cpu else "cuda"][0], "--seq-len",
                            str(train.get("pack_length") or sft["max_seq_len"]), "--tokenizer", args.tokenizer,
                            "--out", str(out), *cpu])
    if bench.returncode:
        raise SystemExit(f"--bench-rows {args.bench_rows}: bench_sft_throughput.py exited {bench.returncode}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--paths", default="warm,cold", help="comma-separated: warm, cold (in this order of runs)")
    parser.add_argument("--shape", default="1b", help=f"comma-separated shapes, one family each: {', '.join(SHAPES)} "
                        "(GPU ones or CPU ones)")
    parser.add_argument("--trials", type=int, default=8, help="grid points per shape (2 learning rates x trials/2 "
                        "betas)")
    parser.add_argument("--steps", type=int, default=200, help="optimiser steps per trial")
    parser.add_argument("--micro-batch", type=int, default=None, metavar="N",
                        help="train.micro_batch_size: sequences a step (the planner may split them over GPUs); "
                             "default: the shapes' 4 on GPUs, 2 on the CPU")
    parser.add_argument("--eval-limit", type=int, default=400, help="ARC-Easy questions scored per trial")
    parser.add_argument("--tokenizer", default="smollm2-135m", help="registry name or local tokenizer directory")
    parser.add_argument("--work", default="gpu_utilization_run", help="directory for the sweeps' configs and stores")
    parser.add_argument("--timeout", type=float, default=None, help="seconds before a sweep is stopped and the "
                        "trials finished so far are summarised")
    parser.add_argument("--engine", choices=("auto", "deepspeed", "fsdp2"), default="auto",
                        help="train.engine of the trials (auto: one-GPU trials on FSDP2 on GPUs, DeepSpeed on the CPU; "
                             "deepspeed: ZeRO-0; fsdp2: FSDP2 everywhere)")
    parser.add_argument("--bench", default=None, metavar="JSON",
                        help="bench_sft_throughput.py results (of this machine) to set each trial's rate against")
    parser.add_argument("--bench-rows", default=None, metavar="ROWS",
                        help="run bench_sft_throughput.py on these rows first (shape:gpus:zero:batch:data, "
                             "comma-separated) and set each trial's rate against them")
    parser.add_argument("--out", default="gpu_utilization.json")
    parser.add_argument("--partial-every", type=float, default=30.0, metavar="S",
                        help="while a sweep runs, write its summary so far to --out every S seconds")
    parser.add_argument("--summarise", default=None, metavar="WORK",
                        help="run nothing: summarise the finished run in WORK (its --work) again, keeping the device, "
                             "date and exit codes of the JSON at --out, and plot it")
    args = parser.parse_args()
    paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    if not paths or set(paths) - {"warm", "cold"}:
        parser.error(f"--paths: expected warm and/or cold, got {args.paths!r}")
    args.shapes = [shape.strip() for shape in args.shape.split(",") if shape.strip()]
    if shapes_problem(args.shapes):
        parser.error(shapes_problem(args.shapes))
    if args.bench and args.bench_rows:
        parser.error(f"expected --bench or --bench-rows, got both ({args.bench!r}, {args.bench_rows!r})")
    work = Path(args.summarise or args.work).resolve()
    if args.summarise:  # the run's JSON, its summaries made again from its folder
        result = json.loads(Path(args.out).read_text())
        bench = args.bench or result.get("bench")
        records = bench_records(Path(bench) if bench else None)
        for path in paths:
            result["paths"][path] = {"launch_exit_code": result["paths"][path]["launch_exit_code"],
                                     **summarise(work / path / "results",
                                                 read_samples(work / path / "gpu_samples.csv"), records)}
    else:
        bench = str(run_bench(args, work)) if args.bench_rows else args.bench and str(Path(args.bench).resolve())
        records = bench_records(Path(bench) if bench else None)
        result = {"date": time.strftime("%Y-%m-%d"), "device": _device(), "shape": ",".join(args.shapes),
                  "trials": args.trials, "steps": args.steps, "micro_batch": args.micro_batch,
                  "eval_limit": args.eval_limit, "engine": args.engine,
                  "bench": bench, "paths": {}}
        out = Path(args.out)

        def write(path: str, summary: dict) -> None:  # what has run so far: a run killed from outside keeps it
            result["paths"][path] = summary
            temporary = out.with_name(out.name + ".tmp")
            temporary.write_text(json.dumps(result, indent=1, default=str))
            os.replace(temporary, out)

        for path in paths:
            print(f"[sweep_gpu_utilization] {path} sweep", flush=True)
            write(path, run_path(args, work / path, warm=path == "warm", records=records,
                                 partial=lambda summary, path=path: write(path, summary)))
    Path(args.out).write_text(json.dumps(result, indent=1, default=str))
    plot_timeline({path: work / path for path in paths}, result["paths"], Path(args.out).with_suffix(".png"))
    print("\n" + table(result))
    for path, summary in result["paths"].items():
        print("\n" + trial_table(path, summary))
    failed = {p: r["launch_exit_code"] for p, r in result["paths"].items() if r["launch_exit_code"] != 0}
    if failed:
        raise SystemExit(f"sweeps that did not end cleanly (launch exit codes): {failed}")


if __name__ == "__main__":
    main()
