"""The installed package: our top-level `kernels` must not pass for Hugging Face's `kernels` library."""

import subprocess
import sys

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
