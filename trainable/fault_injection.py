"""A worker death on demand, for tests and recovery drills: ``CALSWEEP_FAULT_AT_STEP=K``.

With the variable set, rank 0 of every trial ends its process right after optimiser step K (``os._exit``: no
cleanup, no report, as a kill or a preempted node would), once per trial: a marker file under
``<results_dir>/faults/`` records the death, so that the trial's retry (Ray Train's ``FailureConfig``) or a
resumed sweep runs past step K, from its last checkpoint.
"""

from __future__ import annotations

import os
from pathlib import Path

FAULT_ENV = "CALSWEEP_FAULT_AT_STEP"
EXIT_STATUS = 137  # what a SIGKILL'd process reports


def fault_step() -> int | None:
    """K from ``$CALSWEEP_FAULT_AT_STEP``, or None when unset; a value that is no integer >= 1 is an error."""
    value = os.environ.get(FAULT_ENV)
    if not value:
        return None
    if not value.strip().isdigit() or int(value) < 1:
        raise ValueError(f"{FAULT_ENV}: expected an optimiser step >= 1, got {value!r}")
    return int(value)


def die_if_due(step: int, rank: int, results_dir: str, run_name: str, trial_id: str) -> None:
    """End this process if it is rank 0, ``step`` is the fault step and this trial has not died there before."""
    if rank != 0 or step != fault_step():
        return
    if "://" in results_dir:
        raise ValueError(f"{FAULT_ENV}: expected a local results_dir for the fault marker, got {results_dir!r}")
    marker = Path(results_dir) / "faults" / f"{run_name}__{trial_id}.step{step}"
    if marker.exists():
        return
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.touch()
    print(f"[calsweep] {FAULT_ENV}={step}: trial {trial_id} rank 0 exits after step {step}", flush=True)
    os._exit(EXIT_STATUS)
