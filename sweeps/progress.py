"""The sweep's console: one line per trial event, from Ray Tune's callback hooks; and the store's safety net."""

from __future__ import annotations

import os
import time
from typing import Any

from ray.tune import Callback

from sweeps.failures import FAILED_PHASE, describe, retry_reason
from trainable.result import TrialResult


def sweep_eta(elapsed: dict[str, float], fractions: dict[str, float | None], durations: list[float],
              pending: int, concurrency: int) -> float | None:
    """Seconds until the sweep ends: each running trial's remainder plus the pending trials, ``concurrency`` at a
    time. A trial's expected duration is the mean of finished ones, else the running ones' projection from their
    fraction of training done (``elapsed`` / ``fractions``: per running trial); None while nothing says."""
    projected = [elapsed[t] / f for t, f in fractions.items() if f]
    typical = sum(durations) / len(durations) if durations else (sum(projected) / len(projected) if projected
                                                                  else None)
    if typical is None:
        return None
    remaining = sum(max(0.0, (elapsed[t] / f if f and not durations else typical) - elapsed[t])
                    for t, f in fractions.items())
    return (remaining + pending * typical) / max(1, concurrency)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def trial_error(trial: Any) -> str:
    """The last non-empty line of a failed Tune trial's error file (the error itself), or a generic line."""
    if getattr(trial, "error_file", None) and os.path.exists(trial.error_file):
        with open(trial.error_file) as handle:
            lines = [line.strip() for line in handle.read().splitlines() if line.strip()]
        if lines:
            return lines[-1][:2000]
    return "the trial's process ended without recording a result"


class TrialProgress(Callback):
    """One line per trial event: start, training progress (as the workers report it, every ``train.log_every``
    steps, at most one line per trial every ``every_s``) with tokens/s and the sweep's ETA, a resume from a
    checkpoint (a retried or resumed trial's first report), done with its ``TrialResult`` (losses, steady tokens/s
    and MFU, each task's accuracy and ECE),
    skipped (already stored ok), failed with its one-line error and where Tune keeps the traceback. Lines start
    with ``[calsweep finished/total]``."""

    def __init__(self, sweep: Any, total: int, every_s: float = 30.0):
        self.sweep, self.total, self.every_s = sweep, total, every_s
        self.concurrency = sweep.resources.max_concurrent_trials or 1
        self.finished = 0
        self.started: dict[str, float] = {}
        self.fraction: dict[str, float | None] = {}
        self.last_print: dict[str, float] = {}
        self.durations: list[float] = []
        self.resumed: dict[str, int] = {}
        self.caught_up = False

    def _catch_up(self, trials: list) -> None:
        """Count, once per launch, the trials a restored experiment (``--resume``) finished before it: Tune reports
        no event of theirs, and the counter would stop short of the total."""
        if not self.caught_up:
            self.caught_up = True
            self.finished += sum(t.status in ("TERMINATED", "ERROR") for t in trials if t.trial_id not in self.started)

    def _say(self, text: str) -> None:
        print(f"[calsweep {self.finished}/{self.total}] {text}", flush=True)

    def _eta(self, now: float) -> str:
        elapsed = {t: now - self.started[t] for t in self.fraction}
        pending = max(0, self.total - self.finished - len(self.fraction))
        return _duration(sweep_eta(elapsed, self.fraction, self.durations, pending, self.concurrency))

    def _end(self, trial: Any) -> float:
        self.finished += 1
        self.fraction.pop(trial.trial_id, None)
        return time.time() - self.started.get(trial.trial_id, time.time())

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._catch_up(trials)
        now = time.time()
        self.started[trial.trial_id] = now
        self.fraction[trial.trial_id] = None
        self.last_print[trial.trial_id] = 0.0
        self._say(f"start {trial}")

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        if result.get("phase") != "train":
            return
        now = time.time()
        step, total = result.get("step"), result.get("total_steps")
        self.fraction[trial.trial_id] = step / total if step and total else None
        resumed = result.get("resumed_from_step") or 0
        if resumed and self.resumed.get(trial.trial_id) != resumed:
            self.resumed[trial.trial_id] = resumed
            self._say(f"{trial}: resumed from its checkpoint at step {resumed}/{total}")
        if now - self.last_print.get(trial.trial_id, 0.0) < self.every_s and step != total:
            return
        self.last_print[trial.trial_id] = now
        speed = result.get("tokens_per_s_steady", result.get("tokens_per_s"))
        self._say(f"{trial}: step {step}/{total}  loss {_losses(result)}"
                  + (f"  {speed:.0f} tok/s" if speed is not None else "") + f"  sweep ETA {self._eta(now)}")

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        seconds = self._end(trial)
        result = trial.last_result or {}
        if result.get("resumed_from_store"):
            self._say(f"skip {trial}: already stored ok with this config")
            return
        if result.get("phase") == FAILED_PHASE:  # its driver ended it: the error recurs
            self.durations.append(seconds)
            self._say(f"FAILED {trial}: {self._stored_error(trial) or result.get('error')} (not retried: the same "
                      f"input fails the same way)")
            return
        self.durations.append(seconds)
        outcome = TrialResult.from_metrics(result)  # a stopped trial's last training report: its fields None
        parts = [f"{'done' if outcome.train_steps is not None else 'stopped early'} {trial} in {seconds:.0f} s",
                 f"loss {_losses(result)}"]
        if outcome.tokens_per_s_steady is not None:
            parts.append(f"{outcome.tokens_per_s_steady:.0f} tok/s steady"
                         + (f" (MFU {100 * outcome.mfu:.1f}%)" if outcome.mfu is not None else ""))
        scored = outcome.task_metrics
        parts += [f"{task} acc {scored[f'{task}_accuracy']:.3f} ece {scored[f'{task}_ece']:.3f}"
                  for task in self.sweep.eval.tasks if f"{task}_accuracy" in scored]
        self._say("  ".join(parts + [f"sweep ETA {self._eta(time.time())}"]))

    def _stored_row(self, trial: Any) -> dict[str, Any] | None:
        """The trial's stored row: its driver's own, written before Tune heard of the failure."""
        from sweeps import store

        trial_id = self.sweep.trial(self.sweep.point(trial.config)).trial_id
        return store.stored_trial(self.sweep.results_dir, self.sweep.name, trial_id)

    def _stored_error(self, trial: Any) -> str | None:
        """The driver's failed row as the console says it (``failures.describe``), None without one."""
        row = self._stored_row(trial)
        return describe(row) if row and row["status"] == "failed" and row["error"] else None

    def on_trial_recover(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.fraction.pop(trial.trial_id, None)
        self._say(f"retrying {trial} ({retry_reason(self._stored_row(trial), trial_error(trial))})")

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.durations.append(self._end(trial))
        error = self._stored_error(trial) or trial_error(trial)
        where = f" (traceback under {trial.path})" if getattr(trial, "storage", None) and trial.path else ""
        self._say(f"FAILED {trial}: {error}{where}")


class StoreRecorder(Callback):
    """Makes sure every trial that ends has its row: a trial stopped early by the scheduler, or whose Tune
    function died before writing (e.g. its process was killed), is recorded as 'stopped' or 'failed'. A stopped
    trial's driver may have seen its workers torn down and stored that as 'failed' first: Tune's word (complete, not
    errored) wins over any row but 'ok'."""

    def __init__(self, sweep: Any):
        self.sweep = sweep
        self.started: dict[str, Any] = {}
        self.errored: set[str] = set()  # trials whose error event came: their row was written or its failure said

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        from sweeps.driver import _now

        self.started[trial.trial_id] = _now()

    def _record(self, trial: Any, status: str, error: str | None, replaces: tuple[str, ...] = ()) -> None:
        """Store ``status`` unless the trial has a row already, of a status other than ``replaces``."""
        from sweeps import store
        from sweeps.driver import _now, trial_row

        config = trial.config
        trial_id = self.sweep.trial(self.sweep.point(config)).trial_id
        stored = store.stored_trial(self.sweep.results_dir, self.sweep.name, trial_id)
        if stored is not None and stored["status"] not in replaces:
            return
        row = trial_row(self.sweep, config, dict(trial.last_result or {}), status, error,
                        self.started.get(trial.trial_id, _now()), config["provenance"])
        try:
            store.write_trial(self.sweep.results_dir, row)
        except OSError as exc:  # the store (full, unwritable, gone): this trial's line, the sweep goes on
            print(f"[calsweep] {trial_id}: its {status} row could not be written to the store "
                  f"({' '.join(str(exc).split())[:300]}); `--resume {self.sweep.name}` runs it again", flush=True)

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        result = trial.last_result or {}
        if result.get("phase") == FAILED_PHASE:  # its driver ended it failed (and stored that, unless it could not)
            self._record(trial, "failed", result.get("error"))
            return
        self._record(trial, "stopped", "stopped early by the scheduler", replaces=("failed",))

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.errored.add(trial.trial_id)
        self._record(trial, "failed", trial_error(trial))

    def on_experiment_end(self, trials: list, **info: Any) -> None:
        """Store as 'failed' each trial Tune ended in error without running it (no error event: e.g. the reused actor
        it was given could not be reset), so that no trial is lost unrecorded and ``--resume`` runs it. A trial
        whose error event came is not one: its row was written then, or the store's failure said so."""
        from sweeps import store

        stored = store.trial_statuses(self.sweep.results_dir, self.sweep.name)
        for trial in trials:
            if trial.trial_id in self.errored:
                continue
            if trial.status == "ERROR" and self.sweep.trial(self.sweep.point(trial.config)).trial_id not in stored:
                self._record(trial, "failed", trial_error(trial))
                print(f"[calsweep] {trial}: ended by Tune before it ran ({trial_error(trial)}); stored as failed",
                      flush=True)


def ended_failed(error: BaseException | None, metrics: dict[str, Any] | None) -> bool:
    """Whether a trial's Tune result is a failure: an error, or its driver's last report of ``FAILED_PHASE``."""
    return error is not None or (metrics or {}).get("phase") == FAILED_PHASE


def settle_stopped(results_dir: str, run_name: str, errored: dict[str, bool]) -> list[str]:
    """Store as 'stopped' each trial Tune ended without failing (``errored``: trial id -> ``ended_failed``) whose
    row says 'failed': the scheduler stopped it and its driver, torn down with its workers, stored that after
    ``StoreRecorder`` had looked. Returns the trial ids changed."""
    from sweeps import store

    changed = []
    for row in store.read_trials(results_dir, run_name).to_pylist():
        if row["status"] == "failed" and errored.get(row["trial_id"]) is False:
            store.write_trial(results_dir, {**row, "status": "stopped", "error": "stopped early by the scheduler"})
            changed.append(row["trial_id"])
    return changed


def _losses(result: dict[str, Any]) -> str:
    """'2.5000' (the label-smoothed loss), with '(plain 1.9000)' beside it when the trial reports it."""
    text = f"{result.get('train_loss', float('nan')):.4f}"
    plain = result.get("train_loss_plain")
    return text if plain is None else f"{text} (plain {plain:.4f})"
