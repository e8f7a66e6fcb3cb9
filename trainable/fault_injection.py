"""Faults on demand, for tests and recovery drills: ``CALSWEEP_FAULT_AT_STEP=K`` and ``CALSWEEP_FAULT_OOM=1``.

With the variable set, rank 0 of every trial ends its process right after optimiser step K (``os._exit``: no
cleanup, no report, as a kill or a preempted node would), once per trial: a marker file under
``<results_dir>/faults/`` records the death, so that the trial's retry (Ray Train's ``FailureConfig``) or a
resumed sweep runs past step K, from its last checkpoint.

With ``CALSWEEP_FAULT_OOM=1``, rank 0 of every trial raises a real ``torch.OutOfMemoryError`` before its DeepSpeed
engine is built (where co-tenant trials on a shared GPU run it out of memory), once per trial (a marker file, as
above): the launcher's retry of the trial alone then runs through. In a trial of several Ray Train workers it reaches
the driver inside Ray Train's ``WorkerGroupError``, as a real one would.
"""

from __future__ import annotations

import os
from pathlib import Path

FAULT_ENV = "CALSWEEP_FAULT_AT_STEP"
OOM_ENV = "CALSWEEP_FAULT_OOM"
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
    if not _first_time(FAULT_ENV, results_dir, f"{run_name}__{trial_id}.step{step}"):
        return
    print(f"[calsweep] {FAULT_ENV}={step}: trial {trial_id} rank 0 exits after step {step}", flush=True)
    os._exit(EXIT_STATUS)


def oom_if_due(rank: int, results_dir: str, run_name: str, trial_id: str) -> None:
    """Raise ``torch.OutOfMemoryError`` if ``$CALSWEEP_FAULT_OOM`` is 1, this is rank 0 and this trial has not raised
    it before; any other value of the variable but unset or empty is an error."""
    value = os.environ.get(OOM_ENV)
    if not value:
        return
    if value != "1":
        raise ValueError(f"{OOM_ENV}: expected 1 (or unset), got {value!r}")
    if rank != 0 or not _first_time(OOM_ENV, results_dir, f"{run_name}__{trial_id}.oom"):
        return
    import torch

    raise torch.OutOfMemoryError(f"CUDA out of memory. ({OOM_ENV}=1: trial {trial_id}'s first attempt)")


def _first_time(variable: str, results_dir: str, name: str) -> bool:
    """Whether the marker ``<results_dir>/faults/<name>`` is new (it is created now)."""
    if "://" in results_dir:
        raise ValueError(f"{variable}: expected a local results_dir for the fault marker, got {results_dir!r}")
    marker = Path(results_dir) / "faults" / name
    if marker.exists():
        return False
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.touch()
    return True
