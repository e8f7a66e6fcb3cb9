"""The calsweep console command: pyproject's entry point, its help, and real subcommands run as a user runs them."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from sweeps import cli

REPO = Path(__file__).resolve().parents[2]
TINY = Path(__file__).with_name("tiny_sweep.yaml")


def _calsweep(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """``calsweep ARGS`` as the installed script runs it: ``sweeps.cli:main`` in a fresh interpreter."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "sweeps.cli", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=300)


def test_pyproject_declares_the_command():
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"calsweep": "sweeps.cli:main"}


def test_help_lists_every_subcommand_and_a_typo_is_one_line(tmp_path):
    out = _calsweep("--help", cwd=tmp_path)
    assert out.returncode == 0 and all(name in out.stdout for name in ("launch", "analyze", "evaluate", "rescore"))
    wrong = _calsweep("lanch", cwd=tmp_path)
    assert wrong.returncode == 2 and wrong.stderr == (
        "calsweep: error: expected a command of ['launch', 'analyze', 'evaluate', 'rescore'], got 'lanch' "
        "(did you mean 'launch'?)\n")
    assert cli.main([]) == 2


def test_launch_dry_run_lists_the_trials_and_a_bad_value_exits_2(data_dir, tmp_path):
    args = ["launch", "--config", str(TINY), "--dry-run", "--data-dir", data_dir, "--results-dir", str(tmp_path)]
    out = _calsweep(*args, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    ids = out.stdout.split("\nLayouts on ")[0].split()
    assert len(ids) == 2 and all(line.startswith("tiny-llama_lr0.001_") for line in ids)
    bad = _calsweep(*args, "train.precision=int8", cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "train.precision: expected one of" in bad.stderr


def test_evaluate_and_rescore_dispatch_to_their_entry_points(tmp_path):
    evaluate = _calsweep("evaluate", "--model", "no-such-model", cwd=tmp_path)
    assert evaluate.returncode == 2 and evaluate.stderr.startswith("calsweep evaluate: error: unknown model family")
    rescore = _calsweep("rescore", "--help", cwd=tmp_path)
    assert rescore.returncode == 0 and "--temperature" in rescore.stdout


def test_each_subcommand_names_itself_calsweep_in_its_usage(capsys):
    for name in cli.COMMANDS:
        with pytest.raises(SystemExit) as exit_:
            cli.main([name, "--help"])
        assert exit_.value.code == 0 and capsys.readouterr().out.startswith(f"usage: calsweep {name} "), name
