"""Per-trial progress lines for the terminal, from Ray Tune's callback hooks."""

from __future__ import annotations

import os
import time
from typing import Any

from ray.tune import Callback


class TrialProgress(Callback):
    """Prints one line when a trial starts, every ~30 s of training, and when it ends (with its metrics)."""

    def __init__(self, total: int, every_s: float = 30.0):
        self.total = total
        self.every_s = every_s
        self.finished = 0
        self.started: dict[str, float] = {}
        self.last_print: dict[str, float] = {}

    def _say(self, text: str) -> None:
        print(f"[calsweep {self.finished}/{self.total}] {text}", flush=True)

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.started[trial.trial_id] = self.last_print[trial.trial_id] = time.time()
        self._say(f"start {trial}")

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        now = time.time()
        if result.get("phase") == "train" and now - self.last_print.get(trial.trial_id, 0) >= self.every_s:
            self.last_print[trial.trial_id] = now
            self._say(f"{trial}: step {result.get('step')}/{result.get('total_steps')} "
                      f"loss {result.get('train_loss', float('nan')):.4f} "
                      f"{result.get('tokens_per_s', 0):.0f} tok/s")

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.finished += 1
        result = trial.last_result or {}
        scores = "  ".join(f"{task} acc {result[f'{task}_accuracy']:.3f} ece {result[f'{task}_ece']:.3f}"
                           for task in ("mmlu", "arc_easy", "hellaswag") if f"{task}_accuracy" in result)
        self._say(f"done {trial} in {time.time() - self.started.get(trial.trial_id, time.time()):.0f} s  "
                  f"loss {result.get('train_loss', float('nan')):.4f}  {scores}")

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.finished += 1
        self._say(f"FAILED {trial} (recorded in the results store with its error)")


class StoreRecorder(Callback):
    """Makes sure every trial that ends has its row: a trial stopped early by the scheduler, or whose Tune
    function died before writing (e.g. its process was killed), is recorded as 'stopped' or 'failed'."""

    def __init__(self, sweep: Any):
        self.sweep = sweep
        self.started: dict[str, Any] = {}

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        from sweeps.driver import _now

        self.started[trial.trial_id] = _now()

    def _record(self, trial: Any, status: str, error: str | None) -> None:
        from sweeps import store
        from sweeps.driver import _now, trial_row

        config = trial.config
        trial_id = self.sweep.trial(self.sweep.point(config)).trial_id
        if trial_id in store.trial_statuses(self.sweep.results_dir, self.sweep.name):
            return
        row = trial_row(self.sweep, config, dict(trial.last_result or {}), status, error,
                        self.started.get(trial.trial_id, _now()), config["provenance"])
        store.write_trial(self.sweep.results_dir, row)

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._record(trial, "stopped", "stopped early by the scheduler")

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        message = "the trial's process ended without recording a result"
        if getattr(trial, "error_file", None) and os.path.exists(trial.error_file):
            with open(trial.error_file) as handle:
                lines = [line.strip() for line in handle.read().splitlines() if line.strip()]
            message = lines[-1][:2000] if lines else message
        self._record(trial, "failed", message)
