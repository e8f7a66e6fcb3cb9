"""One launcher per run: a second launch of a run into the same store is refused while the first lives, and a
launcher killed hard leaves nothing held."""

import subprocess
import sys
from pathlib import Path

import pytest

from sweeps.run_lock import RunLockedError, run_lock

HOLD = "from sweeps.run_lock import run_lock\nimport sys, time\nwith run_lock(sys.argv[1], 'tiny'):\n" \
       "    print('held', flush=True)\n    time.sleep(600)\n"


def test_a_second_launch_is_refused_while_the_first_lives_and_a_killed_one_holds_nothing(tmp_path):
    first = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert first.stdout.readline().strip() == "held"
        with pytest.raises(RunLockedError, match=rf"^run 'tiny' is being launched already \(pid {first.pid} on "):
            with run_lock(str(tmp_path), "tiny"):
                pass
        with run_lock(str(tmp_path), "other"):  # another run of the same store is free
            pass
    finally:
        first.kill()  # SIGKILL: no clean-up runs
        first.wait()
    with run_lock(str(tmp_path), "tiny") as path:  # the kernel let go with the process
        assert path == str(tmp_path / "runs" / "tiny" / "launch.lock")


def test_the_launcher_refuses_a_held_run_in_one_line(tmp_path, data_dir, capsys):
    from sweeps.launch import main

    with run_lock(str(tmp_path), "tiny"):
        assert main(["--config", str(Path(__file__).with_name("tiny_sweep.yaml")), "--results-dir", str(tmp_path), "--data-dir", data_dir]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and error.startswith("calsweep: error: run 'tiny' is being launched already")
