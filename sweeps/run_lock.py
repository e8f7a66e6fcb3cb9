"""One launcher per run: ``run_lock`` holds <results_dir>/runs/<name>/launch.lock while a launch of the run lives.

The lock is the kernel's (``flock``), not the file's existence: a launcher that dies, however hard, releases it, so
a dead launcher never blocks ``--resume``. Linux NFS clients carry ``flock`` to the server as a POSIX lock, so on a
shared results directory it holds across machines. A remote store (an object store URI) has no locks: not locked.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
from typing import Iterator


class RunLockedError(RuntimeError):
    """Another live process is launching the same run into the same store."""


@contextlib.contextmanager
def run_lock(results_dir: str, name: str) -> Iterator[str | None]:
    """Hold the run's lock for the ``with`` block (yields its path; None for a remote store); raises
    ``RunLockedError`` (one line naming the holder) if another process holds it."""
    if "://" in results_dir:
        yield None
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
