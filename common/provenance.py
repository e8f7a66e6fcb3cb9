"""Where a result came from: package versions, the code's git revision, the host."""

from __future__ import annotations

import json
import subprocess
from importlib import metadata
from pathlib import Path

PACKAGES = ("calsweep", "torch", "triton", "ray", "deepspeed", "transformers", "datasets", "optuna", "pyarrow")


def package_versions() -> str:
    """JSON object package -> installed version (or null)."""
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return json.dumps(versions, sort_keys=True)


def git_revision() -> str:
    """HEAD of the repository holding this code, '+dirty' if it has uncommitted changes; 'unknown' outside git."""
    here = Path(__file__).resolve().parent
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True,
                             check=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return rev + ("+dirty" if dirty else "")
