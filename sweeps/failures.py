"""What a failed trial says, and whether running it again could help.

A trial's error is its root error: the exception raised in the trial's own process, or for a Ray Train trial the one
its first failing worker raised (``WorkerGroupError.worker_failures``, lowest rank first; Ray's rendered text cuts
each worker's traceback short), followed down its causes. ``one_line`` writes it for the row's ``error`` column.

The rule for retries: an error that will recur identically is not retried. Those are the errors a bad input raises
(a ``ValueError``, ``TypeError``, ``KeyError``, ``IndexError`` or ``NotImplementedError``: our config, data and
shape checks, and Python's or PyTorch's own on a bad value) and a loss gone non-finite (seeded training diverges at
the same step again). The driver stores such a trial failed and ends it without raising, its last report of phase
``FAILED_PHASE``; Tune's ``FailureConfig`` retries every other error (a lost node or process, an out-of-memory on a
shared GPU, a store that could not be written), from the trial's last checkpoint.
"""

from __future__ import annotations

import builtins
import re
from typing import Any

from sweeps.gpu_sharing import out_of_memory

FAILED_PHASE = "failed"  # the last report of a trial ended without raising: its error recurs, no retry
RECURRING = (ValueError, TypeError, KeyError, IndexError, NotImplementedError)
NON_FINITE_LOSS = "trainable.worker.NonFiniteLossError"  # by name: the driver does not import the worker

_ERROR_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt)(\(\w+\))?: ")  # a traceback's last line
_LAYOUT = ("world_size", "engine", "zero_stage", "micro_batch_size", "gradient_accumulation_steps",
           "activation_checkpointing")


def root_error(error: BaseException) -> BaseException:
    """The error a trial's failure comes from: through Ray Train's ``WorkerGroupError`` (the lowest failing rank's
    exception) and ``ControllerError``, then down ``__cause__``/``__context__`` to the innermost."""
    from ray.train import ControllerError, WorkerGroupError

    while True:
        if isinstance(error, WorkerGroupError) and error.worker_failures:
            error = error.worker_failures[min(error.worker_failures)]
        elif isinstance(error, ControllerError):
            error = error.controller_failure
        elif error.__cause__ is not None or error.__context__ is not None:
            error = error.__cause__ or error.__context__
        else:
            return error


def type_name(error: BaseException) -> str:
    """'ValueError' for a builtin, else its module and name ('torch.OutOfMemoryError')."""
    kind = type(error)
    return kind.__qualname__ if kind.__module__ == builtins.__name__ else f"{kind.__module__}.{kind.__qualname__}"


def one_line(error: BaseException) -> str:
    """The root error (``root_error``) as 'Type: message' on one line. A root error whose message carries a remote
    traceback (a Ray error from a worker whose exception was not kept) is its last 'SomeError: message' line."""
    root = root_error(error)
    lines = [line.strip() for line in str(root).splitlines() if line.strip()]
    raised = next((line for line in reversed(lines[1:]) if _ERROR_LINE.match(line)), None)
    if raised:
        return raised[:2000]
    return f"{type_name(root)}: {' '.join(' '.join(lines).split())}"[:2000]


def recurs(error: BaseException) -> bool:
    """Whether ``error``'s root error will recur identically on a retry (the module's rule)."""
    root = root_error(error)
    return isinstance(root, RECURRING) or type_name(root) == NON_FINITE_LOSS


def describe(row: dict[str, Any]) -> str:
    """A failed row's error as the console writes it: an out-of-memory one with the layout the trial ran and its
    planned and measured GPU peaks ('out of GPU memory on 2 workers, ZeRO-2 (deepspeed), micro-batch 2 x 2,
    0 layers recomputed; peak planned 30.1 GiB, measured 31.0 GiB: torch.OutOfMemoryError: ...'; 'n/a' where
    not known, as on the CPU), any other as it is."""
    error = row.get("error") or "no error recorded"
    if not out_of_memory(error):
        return error
    if any(row.get(key) is None for key in _LAYOUT):
        layout = "an unknown layout"
    else:
        layout = (f"{row['world_size']} worker{'s' if row['world_size'] > 1 else ''}, ZeRO-{row['zero_stage']} "
                  f"({row['engine']}), micro-batch {row['micro_batch_size']} x {row['gradient_accumulation_steps']}, "
                  f"{row['activation_checkpointing']} layers recomputed")
    return (f"out of GPU memory on {layout}; peak planned {_gib(row.get('gpu_peak_predicted_gib'))}, "
            f"measured {_gib(row.get('gpu_peak_gib'))}: {error}")


def retry_reason(row: dict[str, Any] | None, tune_error: str) -> str:
    """Why Tune retries a trial, for its 'retrying' line: its driver's failed ``row`` (``describe``), else Tune's
    own error line ``tune_error``: a store that could not be written says so, anything else is a lost driver or
    node."""
    if row is not None and row["status"] == "failed" and row["error"]:
        return describe(row)
    if "StoreWriteError" in tune_error:
        return f"its row could not be written: {tune_error}"
    return f"its driver or node failed: {tune_error}"


def _gib(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f} GiB"
