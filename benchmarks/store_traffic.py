"""The launcher's results-store traffic for an N-trial search against a local S3 server (requests and bytes).

    python benchmarks/store_traffic.py --trials 200 --out docs/measurements/2026-11-28-s3/store_traffic.json

A local S3 server (``local_s3``: moto's, over HTTP on 127.0.0.1) counts every request. The sweep is the tiny test
sweep (``--config``) with ``seeds`` 0..N-1: N trials, one after another, each making the store calls a sweep's trial
makes, through the launcher's own code: at its start its driver asks for its stored row
(``sweeps.driver.needs_run``); at its end its worker writes its question records (``store.write_questions``, four
questions) and its driver its row (``store.write_trial``), and the launcher's ``StoreRecorder`` checks the row is
there (``on_trial_complete`` on a real Tune ``Trial``); after the last, the launcher's closing reads
(``settle_stopped``, ``summary_table``, ``trial_statuses``). No model is trained: a trial's own work does not touch
the store. Printed: requests, bytes sent and received per phase, and per trial for the first and last ten (a
cost growing with the number of trials stored is the quadratic one); written: the same as JSON.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from local_s3 import Request, local_s3  # noqa: E402 - the script's own folder

from common.provenance import git_revision  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG = REPO / "tests" / "sweeps" / "tiny_sweep.yaml"
PHASES = ("start", "write", "recorder", "closing")


def _records(n: int):
    """``n`` question records of ``calibration.records.SCHEMA`` (four choices each)."""
    import pyarrow as pa

    from calibration import records

    return pa.Table.from_pydict({
        "task": ["arc_easy"] * n, "split": ["test"] * n, "question_id": [f"q{i}" for i in range(n)],
        "subject": [None] * n, "gold": [i % 4 for i in range(n)], "n_choices": [4] * n,
        "loglik": [[-1.0, -2.0, -3.0, -4.0]] * n, "loglik_norm": [[-0.1, -0.2, -0.3, -0.4]] * n,
        "confidence": [0.6] * n, "correct": [i % 2 == 0 for i in range(n)]}, schema=records.SCHEMA)


def _totals(requests: list[Request]) -> dict[str, int]:
    return {"requests": len(requests), "bytes_sent": sum(r.bytes_in for r in requests),
            "bytes_received": sum(r.bytes_out for r in requests)}


def measure(trials: int, config: Path) -> dict:
    """Run the N trials' store calls against a fresh local server; the traffic per phase and per trial."""
    from ray.tune.experiment import Trial

    from sweeps import store
    from sweeps.config import load_sweep
    from sweeps.driver import _now, needs_run, trial_row
    from sweeps.launch import summary_table
    from sweeps.progress import StoreRecorder, settle_stopped

    with local_s3() as s3, s3.exported():
        root = f"s3://{s3.bucket}/traffic"
        sweep = load_sweep(config, {"results_dir": root, "name": "traffic"},
                           [f"seeds=[{','.join(map(str, range(trials)))}]", "label_smoothing=[0.1]"])
        recorder, records = StoreRecorder(sweep), _records(4)
        phases = {phase: [] for phase in PHASES}
        per_trial = []
        for point in sweep.trial_points():
            trial = sweep.trial(point)
            params = {**point._asdict(), "provenance": {"git_rev": "bench", "package_versions": "{}"}}
            tune_trial = Trial("trainable", config=params, stub=True)
            recorder.on_trial_start(0, [tune_trial], tune_trial)
            first = len(s3.requests)
            mark = first
            for phase, call in (
                    ("start", lambda: needs_run(sweep, trial, False)),
                    ("write", lambda: (store.write_questions(root, sweep.name, trial.trial_id, records),
                                       store.write_trial(root, trial_row(sweep, params, {}, "ok", None, _now(),
                                                                         params["provenance"])))),
                    ("recorder", lambda: recorder.on_trial_complete(0, [tune_trial], tune_trial))):
                call()
                phases[phase] += s3.requests[mark:]
                mark = len(s3.requests)
            per_trial.append(_totals(s3.requests[first:]))
        mark = len(s3.requests)
        ids = [sweep.trial(point).trial_id for point in sweep.trial_points()]
        settle_stopped(root, sweep.name, dict.fromkeys(ids, False))
        summary_table(root, sweep.name, sweep.eval.tasks)
        statuses = store.trial_statuses(root, sweep.name)
        phases["closing"] += s3.requests[mark:]
        assert len(statuses) == trials and set(statuses.values()) == {"ok"}, statuses
    return {"phases": {phase: _totals(requests) for phase, requests in phases.items()},
            "total": _totals([r for requests in phases.values() for r in requests]),
            "per_trial_first10": per_trial[:10], "per_trial_last10": per_trial[-10:]}


def table(result: dict) -> str:
    """Requests and MB each way per phase, then the per-trial mean of the first and last ten trials."""
    lines = [f"{'phase':<22}{'requests':>10}{'MB sent':>10}{'MB received':>13}"]
    for name, totals in [*result["phases"].items(), ("total", result["total"])]:
        lines.append(f"{name:<22}{totals['requests']:>10}{totals['bytes_sent'] / 1e6:>10.2f}"
                     f"{totals['bytes_received'] / 1e6:>13.2f}")
    for label in ("first10", "last10"):
        rows = result[f"per_trial_{label}"]
        lines.append(f"{'per trial, ' + label:<22}{sum(r['requests'] for r in rows) / len(rows):>10.1f}"
                     f"{sum(r['bytes_sent'] for r in rows) / len(rows) / 1e6:>10.3f}"
                     f"{sum(r['bytes_received'] for r in rows) / len(rows) / 1e6:>13.3f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=200, help="trials of the search (seeds 0..N-1)")
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="the sweep whose trials are counted")
    parser.add_argument("--out", type=Path, default=None, help="JSON to write")
    parser.add_argument("--label", default="", help="a name for this code in the JSON (e.g. before, after)")
    args = parser.parse_args(argv)
    if args.trials < 1:
        raise SystemExit(f"--trials: expected an integer >= 1, got {args.trials}")
    result = {"trials": args.trials, "label": args.label, "git_rev": git_revision(),
              "date": dt.date.today().isoformat(), "machine": f"{os.cpu_count()}-core CPU ({platform.machine()})",
              **measure(args.trials, args.config)}
    print(table(result))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
