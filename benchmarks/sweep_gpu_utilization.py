"""How busy a sweep keeps the GPUs: run one sweep of one-GPU trials, sample the GPUs, read the store.

    python benchmarks/sweep_gpu_utilization.py --out util.json          # 8 trials of a random-init 8-layer Llama

Writes a sweep YAML (random-init Llama, ``--trials`` grid points = 2 lr x trials/2 betas, ``--steps`` optimiser
steps each, ARC-Easy scoring of ``--eval-limit`` questions) and runs ``sweeps/launch.py`` on it while
``nvidia-smi`` samples every GPU's utilisation (percent of time a kernel ran) every 200 ms. Reports:
- busy: the mean sampled utilisation over the GPUs, from the first trial's start to the last trial's end;
- per trial, from the store's timestamps and the worker's wall times: start to first step (the Tune function's
  start to the end of loading: worker group, process group, model, DeepSpeed engine) and, per GPU slot,
  end to next start (a trial's end to the start of the trial that takes its place).
Prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from statistics import mean, median

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def sweep_config(args: argparse.Namespace, results: Path) -> dict:
    betas = [round(0.1 * i, 1) for i in range(max(1, args.trials // 2))]
    return {
        "name": "gpu_utilization", "seed": 0, "results_dir": str(results),
        "families": ["llama-8x512"], "learning_rates": [1.0e-4, 3.0e-4], "label_smoothing": betas,
        "custom_models": {"llama-8x512": {"architecture": "llama", "tokenizer": args.tokenizer, "config": {
            "hidden_size": 512, "intermediate_size": 2048, "num_hidden_layers": 8, "num_attention_heads": 8,
            "num_key_value_heads": 4, "vocab_size": 49152, "max_position_embeddings": 1024}}},
        "sft": {"max_examples": 4096, "max_seq_len": 512},
        "train": {"max_steps": args.steps, "micro_batch_size": 16, "gradient_accumulation_steps": 1,
                  "precision": "bf16", "zero_stage": 2, "compile": False},
        "eval": {"tasks": ["arc_easy"], "limit": args.eval_limit, "batch_size": 32},
        "resources": {"workers_per_trial": 1, "gpus_per_worker": 1, "max_failures": 0},
    }


def sample_gpus(path: Path) -> subprocess.Popen:
    """``nvidia-smi`` writing 'timestamp, index, utilization' lines every 200 ms until terminated."""
    handle = path.open("w")
    return subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,index,utilization.gpu",
                             "--format=csv,noheader,nounits", "-lms", "200"], stdout=handle, text=True)


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
    from sweeps import store

    rows = sorted(store.read_trials(str(results), "gpu_utilization").to_pylist(), key=lambda r: r["started_at"])
    starts = [r["started_at"].timestamp() for r in rows]
    ends = [r["finished_at"].timestamp() for r in rows]
    window = [s for s in samples if min(starts) <= s[0] <= max(ends)]
    to_first_step = [r["wall_total_s"] - r["wall_train_s"] - r["wall_eval_s"] + (
        r["finished_at"].timestamp() - r["started_at"].timestamp() - r["wall_total_s"]) for r in rows]
    # slots: each end is followed by the earliest later start not yet taken (the trial that replaced it)
    gaps, taken = [], set()
    for end in sorted(ends):
        later = [i for i, s in enumerate(starts) if s >= end - 1e-3 and i not in taken]
        if later:
            first = min(later, key=lambda i: starts[i])
            taken.add(first)
            gaps.append(starts[first] - end)
    return {
        "trials": len(rows), "ok": sum(r["status"] == "ok" for r in rows),
        "sweep_s": max(ends) - min(starts), "gpus": sorted({s[1] for s in samples}),
        "busy_fraction": mean(s[2] for s in window) / 100 if window else None,
        "start_to_first_step_s": {"median": median(to_first_step), "max": max(to_first_step)},
        "end_to_next_start_s": {"median": median(gaps), "max": max(gaps)} if gaps else None,
        "train_s_median": median(r["wall_train_s"] for r in rows),
        "eval_s_median": median(r["wall_eval_s"] for r in rows),
        "per_trial": [{"trial_id": r["trial_id"], "status": r["status"], "wall_load_s": r["wall_load_s"],
                       "wall_train_s": r["wall_train_s"], "wall_eval_s": r["wall_eval_s"],
                       "tune_s": e - s} for r, s, e in zip(rows, starts, ends)],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=8, help="grid points (2 learning rates x trials/2 betas)")
    parser.add_argument("--steps", type=int, default=300, help="optimiser steps per trial")
    parser.add_argument("--eval-limit", type=int, default=200, help="ARC-Easy questions scored per trial")
    parser.add_argument("--tokenizer", default="smollm2-135m", help="registry name or local tokenizer directory")
    parser.add_argument("--work", default="gpu_utilization_run", help="directory for the sweep's config and store")
    parser.add_argument("--timeout", type=float, default=None, help="seconds before the sweep is stopped and the "
                        "trials finished so far are summarised")
    parser.add_argument("--out", default="gpu_utilization.json")
    args = parser.parse_args()
    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    config = work / "sweep.yaml"
    config.write_text(yaml.safe_dump(sweep_config(args, work / "results"), sort_keys=False))
    sampler = sample_gpus(work / "gpu_samples.csv")
    launch = subprocess.Popen([sys.executable, str(ROOT / "sweeps" / "launch.py"), "--config", str(config)],
                              env=os.environ.copy())
    try:
        exit_code = launch.wait(timeout=args.timeout)
    except subprocess.TimeoutExpired:  # summarise the trials that finished
        launch.kill()
        exit_code = "timed out"
    finally:
        sampler.terminate()
        sampler.wait()
    result = {"date": time.strftime("%Y-%m-%d"), "launch_exit_code": exit_code,
              **summarise(work / "results", read_samples(work / "gpu_samples.csv"))}
    name = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                          text=True).stdout.strip().splitlines()
    result["device"] = f"{len(name)} x {name[0]}" if name else "unknown"
    Path(args.out).write_text(json.dumps(result, indent=1, default=str))
    print(f"\n{result['device']}, {result['trials']} trials ({result['ok']} ok), sweep {result['sweep_s']:.0f} s")
    print(f"{'GPU busy (mean utilisation)':<36} {100 * (result['busy_fraction'] or 0):6.1f}%")
    print(f"{'start to first step, median / max':<36} {result['start_to_first_step_s']['median']:6.1f} / "
          f"{result['start_to_first_step_s']['max']:.1f} s")
    if result["end_to_next_start_s"]:
        print(f"{'end to next start, median / max':<36} {result['end_to_next_start_s']['median']:6.1f} / "
              f"{result['end_to_next_start_s']['max']:.1f} s")
    print(f"{'train / eval per trial, median':<36} {result['train_s_median']:6.1f} / {result['eval_s_median']:.1f} s")


if __name__ == "__main__":
    main()
