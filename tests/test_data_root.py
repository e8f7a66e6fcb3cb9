"""A missing local data root skips the tests that need it, except under CI ($CI, exported by .ci/run): there it
fails them, so that CI cannot pass without the data."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
NEEDS_DATA = "tests/sweeps/test_cli.py::test_launch_dry_run_lists_the_trials_and_a_bad_value_exits_2"


def _pytest(tmp_path: Path, **env: str) -> str:
    environ = {k: v for k, v in os.environ.items() if k != "CI"}
    environ.update(CALSWEEP_DATA_DIR=str(tmp_path / "absent"), **env)
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", NEEDS_DATA], cwd=REPO,
                         capture_output=True, text=True, env=environ, timeout=300)
    return out.stdout.strip().splitlines()[-1]


def test_a_missing_data_root_skips_locally_and_fails_under_ci(tmp_path):
    assert _pytest(tmp_path).startswith("1 skipped in ")
    assert _pytest(tmp_path, CI="true").startswith("1 error in ")
