"""On-disk caches shared by the trials of a node: atomic files and folders, and memoised file hashes.

Every write goes to a hidden temporary sibling and is renamed into place (``os.replace``), so a reader sees
either nothing or a whole entry, never a partial one, and trials that build the same entry at once leave one
whole copy. An entry that is there but unreadable (truncated, overwritten with garbage) is built again.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import pickle
import secrets
import shutil
import sys
from pathlib import Path
from typing import BinaryIO, Callable, Iterator, TypeVar

T = TypeVar("T")
MANIFEST = "calsweep_manifest.json"  # inside a cached folder: every other file and its size, written last


def cache_key(*parts: str) -> str:
    """sha256 of the parts, NUL-separated."""
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def _sibling(path: Path, suffix: str) -> Path:
    """A hidden name beside ``path`` that no other writer uses."""
    return path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.{suffix}")


def atomic_write(path: Path, write: Callable[[BinaryIO], None]) -> None:
    """Create or replace ``path`` with what ``write`` writes to an open binary file (temp file + rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = _sibling(path, "partial")
    try:
        with open(partial, "xb") as handle:
            write(handle)
        os.replace(partial, path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


def _note_rebuild(path: Path, reason: str) -> None:
    print(f"[calsweep] cache entry {path} is unreadable ({reason}); building it again", file=sys.stderr, flush=True)


def cached_pickle(path: Path, build: Callable[[], T]) -> T:
    """The object pickled at ``path``; when it is missing or unreadable, ``build()``, stored atomically."""
    if path.is_file():
        try:
            with open(path, "rb") as handle:
                return pickle.load(handle)
        except Exception as exc:  # noqa: BLE001 - whatever a damaged pickle raises, the remedy is to rebuild it
            _note_rebuild(path, type(exc).__name__)
    value = build()
    atomic_write(path, lambda handle: pickle.dump(value, handle, protocol=pickle.HIGHEST_PROTOCOL))
    return value


@contextlib.contextmanager
def exclusive(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive advisory lock on ``lock_path`` (other processes of the node wait for it)."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def folder_is_whole(folder: Path) -> bool:
    """True when ``folder`` has its manifest and every file the manifest lists, at the listed size."""
    try:
        sizes = json.loads((folder / MANIFEST).read_text())
        return all((folder / name).stat().st_size == size for name, size in sizes.items())
    except (OSError, ValueError, AttributeError):
        return False


def discard_folder(folder: Path) -> None:
    """Remove a cached folder (renamed aside first, so no reader sees it half deleted)."""
    if folder.exists():
        aside = _sibling(folder, "discarded")
        os.replace(folder, aside)
        shutil.rmtree(aside, ignore_errors=True)


def cached_folder(folder: Path, build: Callable[[Path], None]) -> Path:
    """``folder``, first built by ``build(empty_dir)`` when missing or not whole, then renamed into place.

    One process of the node builds it while the others wait (a lock file beside it), then they all read it.
    """
    if folder_is_whole(folder):
        return folder
    with exclusive(folder.with_name(f".{folder.name}.lock")):
        if folder_is_whole(folder):  # another process built it while this one waited
            return folder
        if folder.exists():
            _note_rebuild(folder, "missing or truncated files")
            discard_folder(folder)
        partial = _sibling(folder, "partial")
        partial.mkdir()
        try:
            build(partial)
            sizes = {str(p.relative_to(partial)): p.stat().st_size for p in sorted(partial.rglob("*")) if p.is_file()}
            (partial / MANIFEST).write_text(json.dumps(sizes, indent=1))
            os.replace(partial, folder)
        finally:
            shutil.rmtree(partial, ignore_errors=True)
    return folder


def _sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def file_sha256(path: Path, memo_dir: Path | None = None) -> str:
    """sha256 of the file's bytes. With ``memo_dir`` it is read once per (real path, size, mtime, inode): later
    calls, in any process, only ``stat`` the file while it is unchanged."""
    real = Path(path).resolve()
    if memo_dir is None:
        return _sha256_of(real)
    stat = real.stat()
    identity = {"path": str(real), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "inode": stat.st_ino}
    memo = Path(memo_dir) / f"{cache_key(str(real))}.json"
    try:
        known = json.loads(memo.read_text())
        if {key: known[key] for key in identity} == identity:
            return known["sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        pass  # no memo yet, or an unreadable one: hash the file
    digest = _sha256_of(real)
    atomic_write(memo, lambda handle: handle.write(json.dumps({**identity, "sha256": digest}).encode()))
    return digest
