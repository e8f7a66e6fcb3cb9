"""Retries of the results storage's reads and writes through a passing outage of an object store.

``retried(what, call)`` runs ``call()``; on a transient failure (``transient``: the endpoint unreachable, a
timeout, a throttling or 5xx answer) it waits and tries again, the waits doubling from ``FIRST_WAIT_S`` up to
``MAX_WAIT_S``, until ``BUDGET_S`` of waiting is spent; each retry is one line on stderr. Any other failure (a
full or read-only disk, wrong credentials, a missing bucket) and the last transient one are raised at once. A
retried call must be idempotent: the store's and the checkpoints' files are named deterministically and written
whole, so a write tried twice leaves one file.
"""

from __future__ import annotations

import sys
import time
from typing import Callable, TypeVar

T = TypeVar("T")

BUDGET_S = 120.0  # total waiting before the failure is raised (an S3 endpoint restarting, a network blip)
FIRST_WAIT_S = 1.0
MAX_WAIT_S = 20.0
# What the AWS SDK (pyarrow's S3) and Google's client say of a failure worth another try
TRANSIENT_MARKERS = ("NETWORK_CONNECTION", "Could not connect", "Couldn't connect", "curlCode", "timed out",
                     "Timeout", "SERVICE_UNAVAILABLE", "SLOW_DOWN", "SlowDown", "INTERNAL_FAILURE", "InternalError",
                     "REQUEST_TIMEOUT", "Connection reset", "Connection refused", "HTTP status 50")


def transient(exc: BaseException) -> bool:
    """Whether ``exc`` is an object store's passing failure: an ``OSError`` without an errno (a local disk's
    errors carry one and are not retried) whose message names a network failure, a timeout, throttling or a 5xx."""
    if not isinstance(exc, OSError) or exc.errno is not None:
        return False
    text = str(exc)
    return any(marker in text for marker in TRANSIENT_MARKERS)


def retried(what: str, call: Callable[[], T], budget_s: float = BUDGET_S, sleep: Callable[[float], None] = time.sleep
            ) -> T:
    """``call()``, tried again on a ``transient`` failure while the waits so far stay within ``budget_s``; ``what``
    (e.g. "write trials/run__t1.parquet") names it in the retry lines."""
    waited, wait, attempt = 0.0, FIRST_WAIT_S, 1
    while True:
        try:
            return call()
        except OSError as exc:
            if not transient(exc) or waited + wait > budget_s:
                raise
            print(f"[calsweep] storage: {what} failed ({' '.join(str(exc).split())[:160]}); retry {attempt} in "
                  f"{wait:.0f} s ({waited:.0f} of {budget_s:.0f} s waited)", file=sys.stderr, flush=True)
            sleep(wait)
            waited, wait, attempt = waited + wait, min(2 * wait, MAX_WAIT_S), attempt + 1
