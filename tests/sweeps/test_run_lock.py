"""One launcher per run: a second launch of a run into the same store is refused while the first lives, and a
launcher killed hard leaves nothing held: on a local store at once (the kernel's ``flock``), on an object store (a
local S3 server over HTTP) once its lease expires, or at once where it ran on this machine; the lease is renewed
while its launcher lives and deleted when it ends."""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sweeps.run_lock import SETTLE_S, RunLockedError, run_lock

HOLD = "import socket, sys\nfrom sweeps.run_lock import run_lock\nif sys.argv[3:]:\n" \
       "    socket.gethostname = lambda: sys.argv[3]\n" \
       "with run_lock(sys.argv[1], 'tiny', lease_s=float(sys.argv[2])):\n" \
       "    print('held', flush=True)\n    sys.stdin.readline()\n"  # holds until a line (or EOF) arrives
LEASE_S = 2.0  # a short lease for the tests: renewed every 0.5 s
TAKEOVER_S = LEASE_S + SETTLE_S + 3.0  # a dead holder's lease taken over within its time, our read-back and slack


def _hold(root: str, host: str | None = None, lease_s: float = LEASE_S) -> subprocess.Popen:
    """A process that takes the run's lock and holds it until its stdin gets a line; with ``host``, as a launcher on
    another machine of that name (its lease names that host: this machine cannot see whether its pid lives)."""
    holder = subprocess.Popen([sys.executable, "-c", HOLD, root, str(lease_s), *([host] if host else [])],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_a_second_launch_is_refused_while_the_first_lives_and_a_killed_one_holds_nothing(tmp_path):
    first = _hold(str(tmp_path))
    try:
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


def test_an_object_store_lease_is_renewed_refused_taken_over_after_expiry_and_released(s3_store):
    root, key = f"s3://{s3_store.bucket}/calsweep", "calsweep/runs/tiny/launch.lease"
    first = _hold(root, host="node-2")
    try:
        lease = json.loads(s3_store.client().get_object(Bucket=s3_store.bucket, Key=key)["Body"].read())
        assert (lease["host"], lease["pid"], lease["lease_s"]) == ("node-2", first.pid, LEASE_S)
        refusal = (rf"^run 'tiny' is being launched already \(pid {first.pid} on node-2, lease s3://{s3_store.bucket}/"
                   rf"calsweep/runs/tiny/launch.lease expires at 20\d\d-\d\d-\d\d \d\d:\d\d:\d\d UTC unless renewed\); "
                   rf"wait for that launch to end, or, if it died, for its lease to expire \(2 s after its last "
                   rf"renewal at most; then --resume tiny\), or choose another --name$")
        with pytest.raises(RunLockedError, match=refusal):
            with run_lock(root, "tiny", lease_s=LEASE_S):
                pass
        time.sleep(1.5 * LEASE_S)  # past the first expiry: the holder's thread has renewed it
        with pytest.raises(RunLockedError, match=refusal):
            with run_lock(root, "tiny", lease_s=LEASE_S):
                pass
        with run_lock(root, "other", lease_s=LEASE_S):  # another run of the same bucket is free
            pass
    finally:
        first.kill()  # SIGKILL: its lease stays until it expires
        first.wait()
    killed_at = time.time()
    with pytest.raises(RunLockedError, match=refusal):  # another machine's launcher: dead or not, only time tells
        with run_lock(root, "tiny", lease_s=LEASE_S):
            pass
    while True:  # taken over once the dead holder's lease expires, within the lease time
        try:
            with run_lock(root, "tiny", lease_s=LEASE_S) as uri:
                assert time.time() - killed_at < TAKEOVER_S
                assert uri == f"{root}/runs/tiny/launch.lease" and key in s3_store.keys()
            break
        except RunLockedError:
            assert time.time() - killed_at < TAKEOVER_S
            time.sleep(0.2)
    assert key not in s3_store.keys()  # released on exit


def test_a_lease_of_a_launcher_killed_on_this_machine_is_taken_over_at_once(s3_store):
    root, key = f"s3://{s3_store.bucket}/calsweep", "calsweep/runs/tiny/launch.lease"
    first = _hold(root, lease_s=60.0)
    first.kill()  # SIGKILL on this machine: its pid is gone, its lease a minute from expiry
    first.wait()
    with run_lock(root, "tiny", lease_s=LEASE_S):  # --resume at once, as after a crash of this machine's launcher
        lease = json.loads(s3_store.client().get_object(Bucket=s3_store.bucket, Key=key)["Body"].read())
        assert lease["pid"] != first.pid
    live = _hold(root, lease_s=60.0)
    with pytest.raises(RunLockedError, match=rf"^run 'tiny' is being launched already \(pid {live.pid} on "):
        with run_lock(root, "tiny", lease_s=LEASE_S):  # a live holder on this machine is refused
            pass
    live.communicate("\n", timeout=60)  # ends normally: its lease is deleted, the run free at once
    assert live.returncode == 0 and key not in s3_store.keys()


@pytest.mark.parametrize("remote", [False, True], ids=["local", "s3"])
def test_the_launcher_refuses_a_held_run_in_one_line(tmp_path, data_dir, capsys, request, remote):
    from sweeps.launch import main

    results = f"s3://{request.getfixturevalue('s3_store').bucket}/calsweep" if remote else str(tmp_path)
    with run_lock(results, "tiny"):
        assert main(["--config", str(Path(__file__).with_name("tiny_sweep.yaml")), "--results-dir", results,
                     "--data-dir", data_dir]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and error.startswith("calsweep: error: run 'tiny' is being launched already")
