"""The node cache's building blocks: atomic files and folders rebuilt when damaged, memoised file hashes."""

from __future__ import annotations

import hashlib
import json
import os
import pickle

import pytest

from common.disk_cache import MANIFEST, atomic_write, cached_folder, cached_pickle, file_sha256, folder_is_whole


def test_atomic_write_leaves_the_old_file_when_the_writer_fails(tmp_path):
    path = tmp_path / "sub" / "value.bin"
    atomic_write(path, lambda handle: handle.write(b"first"))
    assert path.read_bytes() == b"first"

    def broken(handle):
        handle.write(b"half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        atomic_write(path, broken)
    assert path.read_bytes() == b"first" and sorted(p.name for p in path.parent.iterdir()) == ["value.bin"]


def test_cached_pickle_miss_hit_and_damaged_file(tmp_path, capsys):
    path, calls = tmp_path / "entry.pkl", []

    def build():
        calls.append(1)
        return {"ids": [1, 2, 3]}

    assert cached_pickle(path, build) == {"ids": [1, 2, 3]} and len(calls) == 1  # miss: built and stored
    assert pickle.loads(path.read_bytes()) == {"ids": [1, 2, 3]}
    assert cached_pickle(path, build) == {"ids": [1, 2, 3]} and len(calls) == 1  # hit: read, not built
    for damage in (path.read_bytes()[:7], b"not a pickle at all", b""):  # truncated, garbage, empty
        path.write_bytes(damage)
        assert cached_pickle(path, build) == {"ids": [1, 2, 3]}
        assert pickle.loads(path.read_bytes()) == {"ids": [1, 2, 3]}  # rebuilt in place
    assert len(calls) == 4 and "building it again" in capsys.readouterr().err
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def _write_two_files(out):
    (out / "a.txt").write_text("alpha")
    (out / "nested").mkdir()
    (out / "nested" / "b.bin").write_bytes(b"\0" * 10)


def test_cached_folder_is_built_once_with_a_manifest(tmp_path):
    folder, calls = tmp_path / "converted" / "model", []

    def build(out):
        calls.append(out)
        _write_two_files(out)

    assert cached_folder(folder, build) == folder and len(calls) == 1
    assert json.loads((folder / MANIFEST).read_text()) == {"a.txt": 5, "nested/b.bin": 10}
    assert calls[0] != folder and not calls[0].exists()  # built under a temporary name, then renamed
    assert cached_folder(folder, build) == folder and len(calls) == 1  # hit


@pytest.mark.parametrize("damage", ["truncate", "delete", "manifest"])
def test_a_damaged_folder_is_built_again(tmp_path, damage):
    folder, calls = tmp_path / "model", []

    def build(out):
        calls.append(out)
        _write_two_files(out)

    cached_folder(folder, build)
    if damage == "truncate":
        (folder / "nested" / "b.bin").write_bytes(b"\0" * 3)
    elif damage == "delete":
        (folder / "a.txt").unlink()
    else:
        (folder / MANIFEST).write_text("{not json")
    assert not folder_is_whole(folder)
    assert cached_folder(folder, build) == folder and len(calls) == 2 and folder_is_whole(folder)
    assert (folder / "nested" / "b.bin").read_bytes() == b"\0" * 10
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")) == ["model"]


def test_file_sha256_is_memoised_by_size_and_mtime(tmp_path):
    data, memo = tmp_path / "weights.gguf", tmp_path / "memo"
    data.write_bytes(b"weights v1")
    expected = hashlib.sha256(b"weights v1").hexdigest()
    assert file_sha256(data) == expected and not memo.exists()
    assert file_sha256(data, memo) == expected
    (entry,) = memo.iterdir()
    stored = json.loads(entry.read_text())
    entry.write_text(json.dumps({**stored, "sha256": "remembered"}))  # a hit reads the memo, not the file
    assert file_sha256(data, memo) == "remembered"
    data.write_bytes(b"weights v2, longer")  # changed file: hashed again
    assert file_sha256(data, memo) == hashlib.sha256(b"weights v2, longer").hexdigest()
    entry.write_text("garbage")  # unreadable memo: hashed again
    assert file_sha256(data, memo) == hashlib.sha256(b"weights v2, longer").hexdigest()
    os.utime(data, ns=(0, 0))  # same size, other mtime: hashed again (the memo's answer is not trusted)
    entry.write_text(json.dumps({**json.loads(entry.read_text()), "sha256": "stale"}))
    assert file_sha256(data, memo) == hashlib.sha256(b"weights v2, longer").hexdigest()
