"""One launcher per run: ``run_lock`` holds the run's lock while a launch of the run lives.

A local (or NFS) store: a ``flock`` on <results_dir>/runs/<name>/launch.lock. The lock is the kernel's, not the file's
existence: a launcher that dies, however hard, releases it, so a dead launcher never blocks ``--resume``. Linux NFS
clients carry ``flock`` to the server as a POSIX lock, so on a shared results directory it holds across machines.

An object store (a URI root, e.g. s3://) has no locks: a lease object, <root>/runs/<name>/launch.lease (JSON: the
holder's id, host, boot id, pid, lease time and expiry), which the launcher renews every ``lease_s / 4`` from a
thread and deletes on exit. A second launcher is refused while the lease is unexpired. One killed hard leaves it
behind: a successor (``--resume``) takes it over once it expires, or at once on the holder's own machine (the same
host name and boot id) where the holder's pid is gone. Expiry is wall-clock time, so the hosts' clocks must agree to
well under ``lease_s`` (NTP does). pyarrow's filesystems have no conditional put (boto3's ``IfNoneMatch`` would be
one, but boto3 is no dependency), so two launchers that find the run free at once both write: each reads the lease
back ``SETTLE_S`` after its write, and only the one whose write landed last holds it. Both hold only if one's write
lands more than ``SETTLE_S`` after its read found the run free (a stalled request: the gap is one round trip
otherwise).
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import os
import socket
import sys
import threading
import time
import uuid
from typing import Iterator

import pyarrow.fs as pafs

from sweeps.storage_retry import retried
from sweeps.store import filesystem, write_file

LEASE_S = 60.0  # how long a lease outlives its last renewal: a crashed launcher's run is free again after this
SETTLE_S = 1.0  # from a lease's write to its read-back: longer than a rival taker's read-to-write round trip


class RunLockedError(RuntimeError):
    """Another live process is launching the same run into the same store."""


@contextlib.contextmanager
def run_lock(results_dir: str, name: str, lease_s: float = LEASE_S) -> Iterator[str]:
    """Hold the run's lock for the ``with`` block (yields the lock's or lease's path); raises ``RunLockedError`` (one
    line naming the holder) if another launch holds it. ``lease_s``: an object store's lease time."""
    if "://" in results_dir:
        with _lease(results_dir, name, lease_s) as path:
            yield path
        return
    directory = os.path.join(results_dir, "runs", name)
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "launch.lock")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
            raise RunLockedError(f"run {name!r} is being launched already ({holder}, lock {path}); wait for that "
                                 f"launch to end (then --resume {name}), or choose another --name") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}".encode(), 0)
        yield path
    finally:
        os.close(fd)  # closing the last descriptor releases the lock


def _read_lease(fs: pafs.FileSystem, path: str) -> dict | None:
    """The lease at ``path``, or None where there is none (or none that parses: ``write_file`` writes whole, so only
    a hand-edited lease could fail to)."""
    try:
        with fs.open_input_stream(path) as source:
            lease = json.loads(source.read())
    except (FileNotFoundError, ValueError):
        return None
    if not isinstance(lease, dict) or not isinstance(lease.get("expires_at"), (int, float)):
        return None
    return lease


def _boot_id() -> str | None:
    """This machine's boot id (Linux: new at every boot), or None where the kernel has none."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as source:
            return source.read().strip()
    except OSError:
        return None


def _write_lease(fs: pafs.FileSystem, path: str, holder: str, lease_s: float) -> None:
    lease = {"holder": holder, "host": socket.gethostname(), "boot_id": _boot_id(), "pid": os.getpid(),
             "lease_s": lease_s, "expires_at": time.time() + lease_s}
    write_file(fs, path, json.dumps(lease).encode())


def _held(lease: dict | None) -> bool:
    """Whether ``lease`` still holds its run: unexpired, unless its holder ran on this machine (the same host name
    and boot id) and its pid is gone (a launcher killed here is resumed here at once)."""
    if lease is None or lease["expires_at"] <= time.time():
        return False
    boot = _boot_id()
    here = boot is not None and lease.get("boot_id") == boot and lease.get("host") == socket.gethostname()
    if here and isinstance(lease.get("pid"), int):
        try:
            os.kill(lease["pid"], 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # another user's live process
            pass
    return True


def _refusal(name: str, uri: str, lease: dict) -> RunLockedError:
    """The one line that refuses a launch of run ``name`` while ``lease`` (at ``uri``) holds it."""
    expires = datetime.datetime.fromtimestamp(lease["expires_at"], datetime.timezone.utc)
    return RunLockedError(
        f"run {name!r} is being launched already (pid {lease.get('pid')} on {lease.get('host')}, lease {uri} expires "
        f"at {expires:%Y-%m-%d %H:%M:%S} UTC unless renewed); wait for that launch to end, or, if it died, for its "
        f"lease to expire ({lease.get('lease_s', LEASE_S):g} s after its last renewal at most; then --resume {name}), "
        f"or choose another --name")


@contextlib.contextmanager
def _lease(root: str, name: str, lease_s: float) -> Iterator[str]:
    """Take the run's lease (refused while another holder's is unexpired), renew it from a thread, delete it on exit."""
    if not lease_s > 0:
        raise ValueError(f"expected a lease time > 0 s, got {lease_s!r}")
    fs, base = filesystem(root)
    what = f"runs/{name}/launch.lease"
    path, uri = f"{base}/{what}", f"{root.rstrip('/')}/{what}"
    holder = uuid.uuid4().hex
    lease = retried(f"read {what}", lambda: _read_lease(fs, path))
    if _held(lease):
        raise _refusal(name, uri, lease)
    retried(f"write {what}", lambda: _write_lease(fs, path, holder, lease_s))
    time.sleep(SETTLE_S)
    lease = retried(f"read {what}", lambda: _read_lease(fs, path))
    if lease is None:
        raise RunLockedError(f"run {name!r}: its lease {uri} vanished right after this launcher wrote it; another "
                             f"launch of the run races for it: launch it once")
    if lease.get("holder") != holder:  # a rival taker's write landed after ours: it holds the run
        raise _refusal(name, uri, lease)
    stop = threading.Event()
    renewer = threading.Thread(target=_renew, args=(fs, path, uri, holder, lease_s, stop), daemon=True,
                               name=f"calsweep-lease-{name}")
    renewer.start()
    try:
        yield uri
    finally:
        stop.set()
        renewer.join()
        with contextlib.suppress(OSError):  # unreachable store: the lease expires by itself
            if (_read_lease(fs, path) or {}).get("holder") == holder:
                fs.delete_file(path)


def _renew(fs: pafs.FileSystem, path: str, uri: str, holder: str, lease_s: float, stop: threading.Event) -> None:
    """Push the lease's expiry ``lease_s`` ahead every ``lease_s / 4`` until ``stop``; a renewal the store refuses is
    tried again at the next period (three may fail before the lease lapses). A lease found taken over is said once
    and left to its new holder."""
    while not stop.wait(lease_s / 4):
        try:
            lease = _read_lease(fs, path)
            if lease is not None and lease.get("holder") != holder:
                print(f"calsweep: warning: the run's lease {uri} was taken over by pid {lease.get('pid')} on "
                      f"{lease.get('host')} (this launcher could not renew it in time); two launches now share the run",
                      file=sys.stderr, flush=True)
                return
            _write_lease(fs, path, holder, lease_s)
        except OSError:
            continue
