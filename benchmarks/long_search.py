"""A long Optuna + ASHA search of one-step trials of a tiny random-init model, to measure the sweep machinery itself:
trials per minute and the launcher's memory per trial. Writes JSON (and the launcher's output) under --out.

    python benchmarks/long_search.py --trials 200 --concurrent 8 --out docs/measurements/<date>/long_search

Each trial is a real one (Ray Tune driver, a warm trial actor, DeepSpeed on the CPU, one optimiser step, 4 ARC-Easy
questions scored, so that ``sweeps/analyze.py`` has calibration to read),
ASHA on the training loss with a grace period of one step, so it can stop trials at their first report; stopped
trials are stored as ``stopped``. The launcher's resident memory is sampled every second from /proc.

Continuing the study: a second call with ``--tag T`` writes ``long_search_T.json``/``launcher_T.log`` beside the
first. Without ``--resume`` it launches the same run again (the Optuna study in the store goes on with ``--trials``
more); ``--stop-after K`` interrupts the launcher (SIGINT, as Ctrl-C does) once K trials of this launch ended;
``--resume`` continues the run with ``launch.py --resume long``. Each JSON says what the launch added: new rows,
stored rows written again (a finished trial run twice), and the study's trials by state.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
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


def stored_rows(results: Path) -> dict[str, dict]:
    """The run's stored rows by trial id (none before the first launch)."""
    sys.path.insert(0, str(REPO))
    from sweeps import store

    if not (results / "trials").is_dir():
        return {}
    return {row["trial_id"]: row for row in store.read_trials(str(results), "long").to_pylist()}


def study_trials(results: Path) -> dict[str, int]:
    """The Optuna study's trials by state (COMPLETE, RUNNING, ...), from its SQLite file in the store."""
    import optuna

    path = results / "optuna" / "long.db"
    if not path.is_file():
        return {}
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    states = [t.state.name for t in optuna.load_study(study_name="long", storage=f"sqlite:///{path}").trials]
    return {state: states.count(state) for state in sorted(set(states))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--concurrent", type=int, default=8)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tag", default=None, help="name this launch's JSON and log (a later launch into --out)")
    parser.add_argument("--resume", action="store_true", help="continue the run: launch.py --resume long")
    parser.add_argument("--stop-after", type=int, default=None, metavar="K",
                        help="interrupt the launcher (SIGINT) once K trials of this launch ended")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    results = args.out / "store"
    suffix = f"_{args.tag}" if args.tag else ""
    before = stored_rows(results)
    study_before = study_trials(results)
    settings = [f"search.num_samples={args.trials}", "search.method=optuna", "search.sampler=random",
                "search.objectives={train_loss: min}", "learning_rates=[1.0e-4, 1.0e-2]", "label_smoothing=[0.0, 0.3]",
                "search.asha={metric: train_loss, grace_period: 1, reduction_factor: 2}", "train.max_steps=1",
                "train.attention_check=false", "eval.tasks=[arc_easy]", "eval.limit=4", "train.val_examples=0",
                f"resources.max_concurrent_trials={args.concurrent}",
                f"resources.cpus_per_worker={2 / args.concurrent:g}", "resources.max_failures=0"]
    command = [sys.executable, str(REPO / "sweeps" / "launch.py"), "--config", str(CONFIG), "--name", "long",
               "--results-dir", str(results), *settings]
    if args.resume:  # the run's saved sweep.yaml says the rest
        command = [sys.executable, str(REPO / "sweeps" / "launch.py"), "--resume", "long", "--results-dir", str(results)]
    load_start = os.getloadavg()
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
    interrupted = None
    with open(args.out / f"launcher{suffix}.log", "w") as log:  # written as it comes, to watch a long run
        for line in launcher.stdout:
            log.write(line)
            log.flush()
            if line.startswith("[calsweep") and (" done " in line or " stopped early " in line or " FAILED " in line):
                ended[0] += 1
                if args.stop_after is not None and ended[0] >= args.stop_after and interrupted is None:
                    launcher.send_signal(signal.SIGINT)
                    interrupted = round(time.time() - started, 1)
    launcher.wait()
    wall = time.time() - started
    rows = stored_rows(results)
    statuses = [row["status"] for row in rows.values()]
    after_first = [rss for _, done, rss in samples if done >= 1]
    late = [(done, rss) for _, done, rss in samples if done >= 1]
    growth = ((late[-1][1] - late[0][1]) / max(1, late[-1][0] - late[0][0])) if len(late) > 1 else None
    new = sorted(set(rows) - set(before))
    summary = {"trials": args.trials, "concurrent": args.concurrent, "resume": args.resume,
               "interrupted_at_s": interrupted, "exit": launcher.returncode, "trials_ended_this_launch": ended[0],
               "rows": len(rows), "statuses": {s: statuses.count(s) for s in sorted(set(statuses))},
               "rows_before": len(before), "new_rows": len(new),
               "new_rows_statuses": {s: [rows[t]["status"] for t in new].count(s)
                                     for s in sorted({rows[t]["status"] for t in new})},
               "rows_written_again": sum(rows[t]["finished_at"] != before[t]["finished_at"] for t in before if t in rows),
               "optuna_trials_before": study_before, "optuna_trials": study_trials(results),
               "wall_s": round(wall, 1), "trials_per_min": round(ended[0] / wall * 60, 2),
               "load_average_start_end": [round(load_start[0], 1), round(os.getloadavg()[0], 1)],
               "launcher_rss_mib": {"start": round(samples[0][2], 1) if samples else None,
                                    "first_trial_done": round(after_first[0], 1) if after_first else None,
                                    "end": round(samples[-1][2], 1) if samples else None,
                                    "max": round(max(s[2] for s in samples), 1) if samples else None},
               "launcher_rss_growth_mib_per_trial": round(growth, 3) if growth is not None else None,
               "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "command": command}
    (args.out / f"long_search{suffix}.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
