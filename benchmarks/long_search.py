"""A long Optuna + ASHA search of one-step trials of a tiny random-init model, to measure the sweep machinery itself:
trials per minute and the launcher's memory per trial. Writes JSON (and the launcher's output) under --out.

    python benchmarks/long_search.py --trials 200 --concurrent 8 --out docs/measurements/<date>/long_search

Each trial is a real one (Ray Tune driver, Ray Train worker, DeepSpeed on the CPU, one optimiser step, no scoring),
ASHA on the training loss with a grace period of one step, so it can stop trials at their first report; stopped
trials are stored as ``stopped``. The launcher's resident memory is sampled every second from /proc.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "tests" / "sweeps" / "tiny_sweep.yaml"


def rss_mib(pid: int) -> float | None:
    """Resident memory of a process (MiB), or None once it has ended."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--concurrent", type=int, default=8)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    results = args.out / "store"
    settings = [f"search.num_samples={args.trials}", "search.method=optuna", "search.sampler=random",
                "search.objectives={train_loss: min}", "learning_rates=[1.0e-4, 1.0e-2]", "label_smoothing=[0.0, 0.3]",
                "search.asha={metric: train_loss, grace_period: 1, reduction_factor: 2}", "train.max_steps=1",
                "train.attention_check=false", "eval.tasks=[]", "train.val_examples=0",
                f"resources.max_concurrent_trials={args.concurrent}",
                f"resources.cpus_per_worker={2 / args.concurrent:g}", "resources.max_failures=0"]
    command = [sys.executable, str(REPO / "sweeps" / "launch.py"), "--config", str(CONFIG), "--name", "long",
               "--results-dir", str(results), *settings]
    started = time.time()
    launcher = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    samples: list[tuple[float, int, float]] = []  # (seconds, trials ended, RSS MiB)
    ended = [0]

    def sample() -> None:
        while launcher.poll() is None:
            rss = rss_mib(launcher.pid)
            if rss is not None:
                samples.append((time.time() - started, ended[0], rss))
            time.sleep(1.0)

    threading.Thread(target=sample, daemon=True).start()
    lines = []
    for line in launcher.stdout:
        lines.append(line)
        if line.startswith("[calsweep") and (" done " in line or " stopped early " in line or " FAILED " in line):
            ended[0] += 1
    launcher.wait()
    wall = time.time() - started
    (args.out / "launcher.log").write_text("".join(lines))
    sys.path.insert(0, str(REPO))
    from sweeps import store

    statuses = store.read_trials(str(results), "long").column("status").to_pylist()
    after_first = [rss for _, done, rss in samples if done >= 1]
    late = [(done, rss) for _, done, rss in samples if done >= 1]
    growth = ((late[-1][1] - late[0][1]) / max(1, late[-1][0] - late[0][0])) if len(late) > 1 else None
    summary = {"trials": args.trials, "concurrent": args.concurrent, "exit": launcher.returncode,
               "rows": len(statuses), "statuses": {s: statuses.count(s) for s in set(statuses)},
               "wall_s": round(wall, 1), "trials_per_min": round(len(statuses) / wall * 60, 2),
               "launcher_rss_mib": {"first_trial_done": round(after_first[0], 1) if after_first else None,
                                    "end": round(samples[-1][2], 1) if samples else None,
                                    "max": round(max(s[2] for s in samples), 1) if samples else None},
               "launcher_rss_growth_mib_per_trial": round(growth, 3) if growth is not None else None,
               "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "command": command}
    (args.out / "long_search.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
