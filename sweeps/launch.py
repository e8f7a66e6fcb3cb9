"""Run a label-smoothing calibration sweep: ``python sweeps/launch.py [--config FILE] [KEY.SUB=VALUE ...]``.

With no arguments it runs the packaged default sweep (sweeps/configs/default.yaml) on this machine, Ray
started in-process; ``--address auto`` (or $RAY_ADDRESS) joins a running cluster instead. Each grid point
(family x learning rate x beta x seed) is one Ray Tune trial driving a Ray Train TorchTrainer with DeepSpeed;
results go to the Parquet store under ``results_dir`` and a summary table is printed at the end. Before Ray
starts, the pre-flight (``sweeps.preflight``) checks models, data, ASHA and the store, and lists every problem.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
import tempfile
from typing import Any, Callable

import pyarrow.fs as pafs
import yaml

from common.datasource import DataSourceError, resolve_data_dir
from common.ports import free_port
from sweeps import cluster_gpus, search, store
from sweeps.config import (ConfigError, SweepConfig, load_sweep, name_problems, sweep_to_dict, with_absolute_local_paths,
                           workers_for)
from sweeps.layout_report import alternatives_table, gpu_hours_line, layout_table, sft_row_count
from sweeps.preflight import preflight, stale_problems
from sweeps.run_lock import RunLockedError, run_lock
from sweeps.storage_retry import retried
from sweeps.driver import DRIVER_CPUS
from trainable.result import TrialResult


PROG = "python sweeps/launch.py"  # the name usage and help show; `calsweep launch` passes its own


def parse_args(argv: list[str] | None = None, prog: str = PROG) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Run a grid of SFT trials (model family x learning rate x label smoothing beta x seed) with Ray "
                    "Tune; each trial trains with DeepSpeed and the fused label-smoothed loss, then scores "
                    "calibration (accuracy, ECE, RMS calibration error) on MMLU, ARC-Easy and HellaSwag.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--config", default=None,
                        help="sweep YAML (default: the packaged sweeps/configs/default.yaml: 2 PyPI models x 1 lr x "
                             "beta {0, 0.1})")
    parser.add_argument("--address", default=os.environ.get("RAY_ADDRESS"),
                        help="Ray cluster to join ('auto' for the local cluster started by `ray start`/`ray up`); "
                             "default: $RAY_ADDRESS, else start Ray in this process")
    parser.add_argument("--dashboard", action="store_true",
                        help="start the Ray dashboard with the local Ray instance (a cluster has its own)")
    parser.add_argument("--name", default=None, help="run name (overrides the config's `name`)")
    parser.add_argument("--families", default=None,
                        help="comma-separated model families (overrides `families`), e.g. to run one half of a grid")
    parser.add_argument("--results-dir", default=None, help="results store root (overrides `results_dir`)")
    parser.add_argument("--data-dir", default=None,
                        help="local data root (overrides `data_dir`; default $CALSWEEP_DATA_DIR, else the hub)")
    parser.add_argument("--resume", metavar="RUN", default=None,
                        help="continue the interrupted sweep RUN from <results-dir>/runs/RUN/sweep.yaml: finished "
                             "trials are not re-run, unfinished and errored ones are")
    parser.add_argument("--verbose", action="store_true",
                        help="also show the workers' and Ray's own output (progress bars, Ray Train's reports); "
                             "default: one line per trial event and the summary table")
    parser.add_argument("--rerun-changed", action="store_true",
                        help="re-run trials whose stored ok row comes from another config (otherwise an error)")
    parser.add_argument("--dry-run", action="store_true",
                        help="validate the config, run the pre-flight checks, list the trials and exit")
    parser.add_argument("assignments", nargs="*", metavar="KEY.SUB=VALUE",
                        help="config overrides, VALUE read as YAML, e.g. train.max_steps=100 eval.limit=null "
                             "seeds=[0,1,2]")
    return parser.parse_intermixed_args(argv)  # KEY=VALUE overrides may come before, between or after options


def _report(problems: list[str]) -> int:
    """Print each problem on its own line to stderr; the exit status of a bad input (2)."""
    print("\n".join(f"calsweep: error: {problem}" for problem in problems), file=sys.stderr)
    return 2


def with_gpu_memory(sweep: SweepConfig, address: str | None,
                    groups: tuple[cluster_gpus.GpuGroup, ...] | None = None) -> tuple[SweepConfig, str]:
    """The sweep with ``resources.gpu_memory_gb`` set (as configured, else from the GPUs of the cluster at
    ``address`` or of this machine: ``sweeps.cluster_gpus``, or the ``groups`` read from it) and the line that says
    which GPUs it is planned for."""
    groups = cluster_gpus.detect(address) if groups is None else groups
    memory, line = cluster_gpus.planned_memory(groups, sweep.resources.gpu_memory_gb)
    return dataclasses.replace(sweep, resources=dataclasses.replace(sweep.resources, gpu_memory_gb=memory)), line


def plan_resources(sweep: SweepConfig, cluster: dict[str, float],
                   probe: Callable[[SweepConfig], float] | None = None) -> SweepConfig:
    """Fill the config's null resources from the cluster: GPUs per worker, CPUs per worker, concurrency. GPUs per
    worker ``auto`` is 0 on a CPU-only cluster, else ``probe(sweep)`` (default: ``packing.probe_fraction``, a
    measured one-step memory probe per family)."""
    from sweeps.gpu_sharing import probe_fraction

    r = sweep.resources
    gpus_total, cpus_total = int(cluster.get("GPU", 0)), max(1, int(cluster.get("CPU", 1)))
    if r.gpus_per_worker == "auto":
        gpus_per_worker = (probe or probe_fraction)(sweep) if gpus_total else 0
        if gpus_total:
            print(f"GPU memory probe: {gpus_per_worker:g} GPU per worker (resources.gpus_per_worker: auto)", flush=True)
    else:
        gpus_per_worker = r.gpus_per_worker if r.gpus_per_worker is not None else (1 if gpus_total else 0)
    workers = min(workers_for(sweep, family) for family in sweep.families)
    # A restored Tune experiment starts the drivers of all its unfinished trials at once (max_concurrent_trials
    # holds only for new ones): their CPUs are set aside, so that the workers of one trial still fit.
    drivers = DRIVER_CPUS * search.num_samples(sweep)
    if gpus_per_worker:
        concurrent = r.max_concurrent_trials or max(1, int(gpus_total / (gpus_per_worker * workers) + 1e-9))
        cpus_per_worker = r.cpus_per_worker or min(8.0, (cpus_total - drivers) / max(1, gpus_total))
    else:  # CPU only: trials share the machine's cores one after another
        concurrent = r.max_concurrent_trials or 1
        cpus_per_worker = r.cpus_per_worker or (cpus_total - drivers) / (concurrent * workers)
    resources = dataclasses.replace(r, gpus_per_worker=gpus_per_worker, cpus_per_worker=cpus_per_worker,
                                    max_concurrent_trials=concurrent)
    return dataclasses.replace(sweep, resources=resources)


def summary_table(results_dir: str, run_name: str, tasks: tuple[str, ...]) -> str:
    """The run's trials as a fixed-width table: family, lr, beta, seed, then from each row's ``TrialResult`` the
    final step's label-smoothed loss and its plain cross-entropy (comparable across betas), and acc/ECE/RMS per
    task."""
    rows = sorted(store.read_trials(results_dir, run_name).to_pylist(),
                  key=lambda r: (r["family"], r["learning_rate"], r["label_smoothing"], r["seed"]))
    header = ["family", "lr", "beta", "seed", "status", "train_loss", "plain_loss"] + [
        f"{t}_{m}" for t in tasks for m in ("acc", "ece", "rms")]
    lines = [header]
    for row in rows:
        result = TrialResult.from_metrics(row)
        cells = [row["family"], f"{row['learning_rate']:g}", f"{row['label_smoothing']:g}", str(row["seed"]),
                 row["status"], _fmt(result.train_loss), _fmt(result.train_loss_plain)]
        cells += [_fmt(result.task_metrics.get(f"{t}_{m}")) for t in tasks for m in ("accuracy", "ece", "rms_ce")]
        lines.append(cells)
    widths = [max(len(str(line[i])) for line in lines) for i in range(len(header))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(line, widths)) for line in lines)


def _fmt(value: Any) -> str:
    return "-" if value is None else f"{value:.4f}"


def saved_sweep(results_dir: str, name: str) -> str:
    """Where a run's resolved sweep is kept: <results_dir>/runs/<name>/sweep.yaml (a path or URI)."""
    return f"{results_dir.rstrip('/')}/runs/{name}/sweep.yaml"


def save_sweep(sweep: SweepConfig) -> str:
    """Write the resolved sweep to ``saved_sweep`` (what ``--resume`` reads back), whole, retried through an outage
    of an object store."""
    path = saved_sweep(sweep.results_dir, sweep.name)
    fs, target = store.filesystem(path)
    text = yaml.safe_dump(json.loads(json.dumps(sweep_to_dict(sweep))), sort_keys=False)
    retried(f"write runs/{sweep.name}/sweep.yaml", lambda: store.write_file(fs, target, text.encode()))
    return path


def read_saved_sweep(results_dir: str, name: str, into: str) -> str:
    """Copy the run's ``saved_sweep`` to the local folder ``into`` (it may live in an object store); its local path.
    A run saved nowhere there, or a store that cannot be read (not retried: nothing has started), is a
    ``ConfigError``."""
    path = saved_sweep(results_dir, name)
    local = os.path.join(into, "sweep.yaml")
    try:
        fs, source = store.filesystem(path)
        if fs.get_file_info(source).type != pafs.FileType.File:
            raise ConfigError(f"--resume {name!r}: expected a run saved at {path}, found none")
        pafs.copy_files(source, local, source_filesystem=fs)
    except OSError as exc:
        raise ConfigError(f"--resume {name!r}: could not read {path} ({' '.join(str(exc).split())[:200]}); "
                          f"expected a readable store") from None
    return local


def _trial_name(sweep: SweepConfig):
    return lambda t: sweep.trial(sweep.point(t.config)).trial_id


def run_sweep(sweep: SweepConfig, address: str | None, dashboard: bool, resume: bool = False,
              rerun_changed: bool = False, verbose: bool = False) -> int:
    """Start or join Ray, run the sweep through Tune (restoring it with ``resume``; re-running trials stored from
    another config with ``rerun_changed``), print the summary; return the number of failed trials.

    The console holds one line per trial event (``TrialProgress``) and the summary; ``verbose`` adds the workers'
    and Ray's own output (progress bars, Ray Train's reports and logs)."""
    import ray
    from ray import tune

    from sweeps import tracking
    from sweeps.driver import trial_driver, trial_resources
    from sweeps.progress import StoreRecorder, TrialProgress, ended_failed, settle_stopped
    from common.provenance import git_revision, package_versions

    if not verbose:  # Tune's legacy console at verbose=0 prints nothing; its newer one still draws a table
        os.environ["RAY_AIR_NEW_OUTPUT"] = "0"
    quiet = {"log_to_driver": verbose, "logging_level": "warning" if verbose else "error"}
    if address:
        context = ray.init(address=address, **quiet)
    else:
        # a Ray of our own ("local": never silently the one a `ray start` on this machine left in /tmp/ray), always
        # with the dashboard on a free port: Ray Train frees the workers' resources of a trial Tune stopped or lost
        # through its State API; without it (8265 taken by another Ray) a long ASHA search stalls on leaked CPUs
        context = ray.init(address="local", include_dashboard=True, dashboard_port=free_port(),
                           configure_logging=True, **quiet)
    if not verbose:  # a failed trial is one FAILED line, not Tune's traceback; no Optuna INFO line ('study created')
        logging.getLogger("ray.tune").setLevel(logging.CRITICAL)
        if sweep.search.method == "optuna":
            import optuna

            optuna.logging.set_verbosity(optuna.logging.WARNING)
    if dashboard or address:
        url = context.dashboard_url
        print(f"Ray dashboard: {f'http://{url}' if url and '://' not in url else url or '(not running)'}", flush=True)
        if address and not url:  # Ray Train's placement-group cleaner asks the dashboard's State API
            print("warning: this cluster runs no dashboard: a trial whose driver dies with its node keeps its workers' "
                  "CPUs/GPUs reserved and its retry waits forever; start the head with the dashboard", flush=True)
    os.environ["TUNE_DISABLE_AUTO_CALLBACK_LOGGERS"] = "1"  # tracking.callbacks chooses Tune's loggers
    if sweep.search.method == "optuna":  # progress reports carry no objective until the trial's final report
        os.environ["TUNE_DISABLE_STRICT_METRIC_CHECKING"] = "1"
    cluster = ray.cluster_resources()
    sweep = plan_resources(sweep, cluster)
    results_dir = sweep.results_dir
    save_sweep(sweep)
    storage_path = f"{results_dir}/ray" if "://" in results_dir else os.path.join(results_dir, "ray")
    param_space = {**search.search_space(sweep), "sweep": sweep_to_dict(sweep), "storage_path": storage_path,
                   "rerun_changed": rerun_changed,
                   "provenance": {"package_versions": package_versions(), "git_rev": git_revision()}}
    trainable = tune.with_resources(trial_driver, trial_resources)
    experiment = f"{storage_path}/{sweep.name}"

    def callbacks() -> list:  # fresh ones for each Tuner
        return [StoreRecorder(sweep), *tracking.callbacks(sweep)]

    if resume and tune.Tuner.can_restore(experiment):
        print(f"Resuming the Tune experiment {experiment}", flush=True)
        tuner = tune.Tuner.restore(experiment, trainable, resume_unfinished=True, resume_errored=True,
                                   param_space=param_space)
    else:
        n_trials = search.num_samples(sweep)
        tuner = tune.Tuner(
            trainable, param_space=param_space,
            tune_config=tune.TuneConfig(  # the search algorithm holds resources.max_concurrent_trials
                num_samples=n_trials,
                search_alg=search.search_algorithm(sweep, cluster.get("GPU", 0)), scheduler=search.scheduler(sweep),
                trial_name_creator=_trial_name(sweep), trial_dirname_creator=_trial_name(sweep),
                reuse_actors=True),  # a warm trial's actor (process, CUDA context, compiled graphs) serves the next
            # Tune restarts a trial whose driver died (its node lost): it resumes from its last checkpoint
            run_config=tune.RunConfig(name=sweep.name, storage_path=storage_path, verbose=0,
                                      failure_config=tune.FailureConfig(max_failures=sweep.resources.max_failures),
                                      callbacks=[TrialProgress(sweep, n_trials), *callbacks()]),
        )
    if not verbose:  # MLflow's own INFO lines (creating its tables) are no trial events
        logging.getLogger("mlflow").setLevel(logging.WARNING)
    grid = tuner.fit()
    settle_stopped(results_dir, sweep.name, {sweep.trial(sweep.point(r.config)).trial_id:
                                             ended_failed(r.error, r.metrics) for r in grid})
    retry_out_of_memory(sweep, param_space, callbacks)
    print("\n" + summary_table(results_dir, sweep.name, sweep.eval.tasks), flush=True)
    hours = gpu_hours_line(sweep, store.read_trials(results_dir, sweep.name).to_pylist(), sft_row_count(sweep))
    if hours:
        print(hours, flush=True)
    print(f"\nResults: {results_dir}/trials (one row per trial), {results_dir}/questions (per question)", flush=True)
    statuses = store.trial_statuses(results_dir, sweep.name)
    unrecorded = sorted({sweep.trial(sweep.point(result.config)).trial_id for result in grid} - set(statuses))
    if unrecorded:
        print(f"\n{len(unrecorded)} trial(s) have no row in the store ({', '.join(unrecorded[:3])}"
              f"{', ...' if len(unrecorded) > 3 else ''}): `--resume {sweep.name}` runs them again and records them",
              flush=True)
    return list(statuses.values()).count("failed") + len(unrecorded)  # a scheduler's early stop is no failure


def retry_out_of_memory(sweep: SweepConfig, param_space: dict[str, Any], callbacks: Callable[[], list]) -> None:
    """Run each trial stored as failed with a GPU out-of-memory error again, alone (``packing.alone``: whole GPUs,
    one trial at a time), each as a one-trial Tuner with the sweep's ``param_space`` and new ``callbacks()``; its
    driver stores the new row (ok, or failed again). Resources are no result setting: the row is a normal one."""
    from ray import tune

    from sweeps.driver import trial_driver, trial_resources
    from sweeps.gpu_sharing import alone as run_alone, out_of_memory
    from sweeps.progress import TrialProgress

    rows = [row for row in store.read_trials(sweep.results_dir, sweep.name).to_pylist()
            if row["status"] == "failed" and out_of_memory(row["error"])]
    if not rows:
        return
    alone = run_alone(sweep)
    print(f"Retrying {len(rows)} trial(s) that ran out of GPU memory while sharing, alone "
          f"({alone.resources.gpus_per_worker:g} GPU per worker, one trial at a time): "
          f"{', '.join(row['trial_id'] for row in rows)}", flush=True)
    trainable = tune.with_resources(trial_driver, trial_resources)
    for row in rows:
        point = {"family": row["family"], "learning_rate": row["learning_rate"],
                 "label_smoothing": row["label_smoothing"], "seed": row["seed"]}
        tuner = tune.Tuner(
            trainable, param_space={**param_space, "sweep": sweep_to_dict(alone), **point},
            tune_config=tune.TuneConfig(max_concurrent_trials=1, trial_name_creator=_trial_name(alone),
                                        trial_dirname_creator=_trial_name(alone)),
            run_config=tune.RunConfig(name=f"{sweep.name}-alone-{row['trial_id']}",
                                      storage_path=param_space["storage_path"], verbose=0,
                                      failure_config=tune.FailureConfig(max_failures=alone.resources.max_failures),
                                      callbacks=[TrialProgress(alone, 1), *callbacks()]))
        tuner.fit()


def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    args = parse_args(argv, prog)
    try:
        with tempfile.TemporaryDirectory(prefix="calsweep-resume-") as local:
            config = args.config
            if args.resume:
                if name_problems(args.resume, "--resume"):
                    raise ConfigError(*name_problems(args.resume, "--resume"))
                config = read_saved_sweep(args.results_dir or "results", args.resume, local)
            families = [f.strip() for f in args.families.split(",") if f.strip()] if args.families else None
            sweep = load_sweep(config, {"name": args.name, "results_dir": args.results_dir,
                                        "data_dir": args.data_dir, "families": families}, args.assignments)
        if "://" not in sweep.results_dir:
            sweep = dataclasses.replace(sweep, results_dir=os.path.abspath(sweep.results_dir))
        root = resolve_data_dir(sweep.data_dir)  # absolute, so that Ray workers in other directories find it
        sweep = with_absolute_local_paths(dataclasses.replace(sweep, data_dir=str(root.resolve()) if root else None))
    except ConfigError as exc:
        return _report(exc.problems)
    except DataSourceError as exc:
        return _report([str(exc)])
    try:
        groups = cluster_gpus.detect(args.address)
        sweep, gpus = with_gpu_memory(sweep, args.address, groups)
    except ConnectionError as exc:
        return _report([f"--address {args.address!r}: {' '.join(str(exc).split())}"])
    checked = preflight(sweep)
    problems = checked.problems
    if checked.changed and (not args.rerun_changed or sweep.search.method == "optuna"):
        problems = problems + stale_problems(checked.sweep, checked.changed)
    if problems:
        return _report(problems)
    sweep = checked.sweep
    if checked.changed:
        print(f"Re-running {len(checked.changed)} trial(s) stored from another config (--rerun-changed)", flush=True)
    if args.dry_run:
        if sweep.search.method == "optuna":
            print(f"Optuna study {sweep.name!r} ({sweep.search.sampler}): {sweep.search.num_samples} trials this launch"
                  + (", the grid's points first:" if sweep.search.seed_with_grid else "; the grid's points:"))
        for point in search.trial_order(sweep):  # longest first (the launch fits one-GPU trials in around them)
            print(sweep.trial(point).trial_id)
        rows = sft_row_count(sweep)
        print(layout_table(sweep, rows, sum(group.count for group in groups) or None))
        alternatives = alternatives_table(sweep, rows)
        if alternatives:
            print(alternatives)
        print(gpus)
        return 0
    print(gpus, flush=True)
    try:
        with run_lock(sweep.results_dir, sweep.name):
            failed = run_sweep(sweep, args.address, args.dashboard, resume=bool(args.resume),
                               rerun_changed=args.rerun_changed, verbose=args.verbose)
    except RunLockedError as exc:
        return _report([str(exc)])
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
