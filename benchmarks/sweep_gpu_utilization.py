"""How busy a sweep keeps its GPUs, warm trials against cold ones: run a sweep, sample the GPUs, read the store.

    python benchmarks/sweep_gpu_utilization.py --out util.json                   # 8 trials, 1B Llama, warm then cold
    CUDA_VISIBLE_DEVICES=0 python benchmarks/sweep_gpu_utilization.py --paths warm --out util_1gpu.json
    CUDA_VISIBLE_DEVICES=0 python benchmarks/sweep_gpu_utilization.py --paths warm --engine deepspeed --out util_ds.json
    python benchmarks/sweep_gpu_utilization.py --shape tiny --trials 2 --steps 1 --eval-limit 4   # on the CPU

Writes a sweep YAML (``--shape``: ``1b``, a random-init Llama-3.2-1B shape on packed Alpaca rows of 2,048 tokens,
or ``tiny``, a 2-layer Llama for the CPU; ``--trials`` grid points = 2 lr x trials/2 betas, ``--steps`` optimiser
steps each, ARC-Easy scoring of ``--eval-limit`` questions) and runs ``sweeps/launch.py`` on it once per
``--paths`` entry: ``warm`` (``resources.warm_trials: true``: one-worker trials in Tune actors reused across
trials) and ``cold`` (false: a Ray Train worker group started and stopped per trial). Trials are one-GPU trials,
as many at once as there are GPUs. While a sweep runs, ``nvidia-smi`` (when present) samples the utilisation
(percent of time a kernel ran) of each GPU ``CUDA_VISIBLE_DEVICES`` names (all without it) every 200 ms. Reports
per path:
- busy: the mean sampled utilisation over the GPUs (and per GPU), from the first trial's start to the last
  trial's end; and from the end of the last GPU's first trial on (the warm trials alone);
- the trials' steady tokens/s and compile warm-up (the store's ``tokens_per_s_steady``, ``wall_warmup_s``) and
  layout (stage, micro-batch, accumulation), to set beside ``bench_sft_throughput.py``'s row of the same layout;
- per trial (``sweeps.overhead``, from the store's timestamps and the worker's wall times): overhead (time outside
  the trial's own load, training and scoring) and idle (overhead plus loading: previous trial's last scored
  question to this trial's first optimiser step), as means over the trials that follow another on their GPU;
- train and scoring seconds per trial;
- memory (``trainable.trial_memory``): each trial's host RSS in start order (a warm actor's growth shows there),
  the largest GPU peak, and the largest peak over the layout model's prediction for that trial.
Prints a table, writes JSON and, with samples, a plot of each GPU's utilisation over the sweep with the trials'
spans (the JSON's name, .png). ``--summarise WORK`` reads a finished run's folder (its stores and samples) again
instead of running.
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

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


SHAPES = {  # family name -> (custom model config, sft, train settings)
    "1b": ({"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
            "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 128256, "max_position_embeddings": 2048,
            "tie_word_embeddings": True},
           {"max_examples": 20000, "max_seq_len": 2048},
           {"micro_batch_size": 4, "gradient_accumulation_steps": 1, "precision": "bf16", "zero_stage": "auto",
            "pack": True, "pack_length": 2048}),
    "tiny": ({"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "vocab_size": 49152, "max_position_embeddings": 512},
             {"max_examples": 16, "max_seq_len": 96},
             {"micro_batch_size": 2, "gradient_accumulation_steps": 1, "zero_stage": 2}),
}
RUN = "gpu_utilization"


def sweep_config(args: argparse.Namespace, results: Path, warm: bool) -> dict:
    """The benchmark's sweep: ``args.trials`` one-worker trials of ``args.shape``, warm or cold."""
    model, sft, train = SHAPES[args.shape]
    family = f"llama-{args.shape}"
    betas = [round(0.1 * i, 1) for i in range(max(1, args.trials // 2))]
    return {
        "name": RUN, "seed": 0, "results_dir": str(results),
        "families": [family], "learning_rates": [1.0e-4, 3.0e-4][:max(1, min(2, args.trials))],
        "label_smoothing": betas,
        "custom_models": {family: {"architecture": "llama", "tokenizer": args.tokenizer, "config": model}},
        "sft": sft, "train": {"max_steps": args.steps, "checkpoint_every_steps": None, **train, "engine": args.engine,
                              **({"zero_stage": 3} if args.engine == "fsdp2" else {})},
        "eval": {"tasks": ["arc_easy"], "limit": args.eval_limit, "batch_size": 32},
        "resources": {"workers_per_trial": 1, "max_failures": 0, "warm_trials": warm},
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


def summarise(results: Path, samples: list[tuple[float, int, float]]) -> dict:
    """The store's trials of the run with the GPU samples of their span: busy fraction, overheads, wall times."""
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
        **memory(ok),
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
    the trials' spans shaded by turns, titled with the path's figures from ``summaries`` (``summarise``'s); written
    to ``path`` (PNG), nothing without samples."""
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

    fig, axes = plt.subplots(len(runs), 1, figsize=(11, 2.6 * len(runs)), squeeze=False)
    for ax, (name, (samples, rows)) in zip(axes[:, 0], runs.items()):
        start = min(r["started_at"].timestamp() for r in rows)
        for i, row in enumerate(sorted(rows, key=lambda r: r["started_at"])):
            ax.axvspan(row["started_at"].timestamp() - start, row["finished_at"].timestamp() - start,
                       color=("tab:blue", "tab:orange")[i % 2], alpha=0.08, lw=0)
        for gpu in sorted({g for _, g, _ in samples}):
            points = [(t - start, u) for t, g, u in samples if g == gpu]
            ax.plot(*zip(*points), lw=0.6, label=f"GPU {gpu}")
        summary = summaries[name]
        ax.set(xlim=(-5, summary["sweep_s"] + 5), ylim=(0, 105), ylabel="utilisation %",
               title=f"{name}: {summary['ok']} trials, GPU busy {100 * summary['busy_fraction']:.1f}% "
                     f"(after the first trials {100 * (summary['busy_fraction_after_first'] or 0):.1f}%)")
        ax.legend(loc="lower right", fontsize=7)
    axes[-1, 0].set_xlabel("seconds from the first trial's start (shaded: one trial each)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _median(rows: list[dict], key: str) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    return median(values) if values else None


def run_path(args: argparse.Namespace, work: Path, warm: bool) -> dict:
    """Run the benchmark's sweep once (warm or cold) under ``work``, sampling the GPUs; its summary."""
    work.mkdir(parents=True, exist_ok=True)
    config = work / "sweep.yaml"
    config.write_text(yaml.safe_dump(sweep_config(args, work / "results", warm), sort_keys=False))
    sampler = sample_gpus(work / "gpu_samples.csv")
    launch = subprocess.Popen([sys.executable, str(ROOT / "sweeps" / "launch.py"), "--config", str(config)],
                              env=os.environ.copy())
    try:
        exit_code = launch.wait(timeout=args.timeout)
    except subprocess.TimeoutExpired:  # summarise the trials that finished
        launch.kill()
        exit_code = "timed out"
    finally:
        if sampler is not None:
            sampler.terminate()
            sampler.wait()
    return {"launch_exit_code": exit_code, **summarise(work / "results", read_samples(work / "gpu_samples.csv"))}


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
    lines = [f"{result['device']}, {result['shape']} shape, {result['trials']} trials x {result['steps']} steps",
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
            ("trial tokens/s (steady), median", lambda r: cell(r.get("tokens_per_s_steady_median"), 1, "")),
            ("compile warm-up, median / max", lambda r: f"{cell(r.get('warmup_s_median'))} / "
                                                       f"{cell(r.get('warmup_s_max'))}"),
            ("load / train / scoring, median", lambda r: f"{cell(r['load_s_median'])} / {cell(r['train_s_median'])}"
                                                        f" / {cell(r['eval_s_median'])}"),
            ("host RSS, first / last trial", lambda r: " / ".join(
                cell(r.get("host_rss_gib_by_trial", [None])[i], 1, " GiB") for i in (0, -1))),
            ("GPU peak max, / predicted", lambda r: f"{cell(r.get('gpu_peak_gib_max'), 1, ' GiB')}, "
                                                   f"{cell(r.get('gpu_peak_over_predicted_max'), 1, 'x')}"),
            ("sweep (first start to last end)", lambda r: cell(r["sweep_s"]))]
    for label, value in rows:
        lines.append(f"{label:<40}" + "".join(f"{value(result['paths'][p]):>14}" for p in paths))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--paths", default="warm,cold", help="comma-separated: warm, cold (in this order of runs)")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="1b")
    parser.add_argument("--trials", type=int, default=8, help="grid points (2 learning rates x trials/2 betas)")
    parser.add_argument("--steps", type=int, default=200, help="optimiser steps per trial")
    parser.add_argument("--eval-limit", type=int, default=400, help="ARC-Easy questions scored per trial")
    parser.add_argument("--tokenizer", default="smollm2-135m", help="registry name or local tokenizer directory")
    parser.add_argument("--work", default="gpu_utilization_run", help="directory for the sweeps' configs and stores")
    parser.add_argument("--timeout", type=float, default=None, help="seconds before a sweep is stopped and the "
                        "trials finished so far are summarised")
    parser.add_argument("--engine", choices=("auto", "deepspeed", "fsdp2"), default="auto",
                        help="train.engine of the trials (auto: one-GPU trials on FSDP2 on GPUs, DeepSpeed on the CPU; "
                             "deepspeed: ZeRO-0; fsdp2: FSDP2 everywhere)")
    parser.add_argument("--out", default="gpu_utilization.json")
    parser.add_argument("--summarise", default=None, metavar="WORK",
                        help="run nothing: summarise the finished run in WORK (its --work) again, keeping the device, "
                             "date and exit codes of the JSON at --out, and plot it")
    args = parser.parse_args()
    paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    if not paths or set(paths) - {"warm", "cold"}:
        parser.error(f"--paths: expected warm and/or cold, got {args.paths!r}")
    work = Path(args.summarise or args.work).resolve()
    if args.summarise:  # the run's JSON, its summaries made again from its folder
        result = json.loads(Path(args.out).read_text())
        for path in paths:
            result["paths"][path] = {"launch_exit_code": result["paths"][path]["launch_exit_code"],
                                     **summarise(work / path / "results",
                                                 read_samples(work / path / "gpu_samples.csv"))}
    else:
        result = {"date": time.strftime("%Y-%m-%d"), "device": _device(), "shape": args.shape, "trials": args.trials,
                  "steps": args.steps, "eval_limit": args.eval_limit, "engine": args.engine, "paths": {}}
        for path in paths:
            print(f"[sweep_gpu_utilization] {path} sweep", flush=True)
            result["paths"][path] = run_path(args, work / path, warm=path == "warm")
            Path(args.out).write_text(json.dumps(result, indent=1, default=str))  # what has run so far
    Path(args.out).write_text(json.dumps(result, indent=1, default=str))
    plot_timeline({path: work / path for path in paths}, result["paths"], Path(args.out).with_suffix(".png"))
    print("\n" + table(result))
    failed = {p: r["launch_exit_code"] for p, r in result["paths"].items() if r["launch_exit_code"] != 0}
    if failed:
        raise SystemExit(f"sweeps that did not end cleanly (launch exit codes): {failed}")


if __name__ == "__main__":
    main()
