"""Several Ray nodes on one machine (``ray.cluster_utils.Cluster``: a head and worker nodes, each its own raylet, as
Ray tests itself): a head without trial resources and two one-CPU worker nodes, the results store on a directory
all of them share or in a bucket (a local S3 server over HTTP, as on a cluster without a shared disk), the sweep
joining with ``--address``. The two trials land on both worker nodes, one each; a worker node killed hard mid-trial
costs its trial the node, not its row: it resumes from its last checkpoint (read from the store) on the surviving
node (the row's ``node_id``), and the store ends with one ok row per trial and no half-written file, which the
closing table shows and ``calsweep analyze`` reads."""

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow.fs as pafs
import pytest

from common.ports import free_port
from sweeps import analyze, store

REPO = Path(__file__).resolve().parents[2]
CONFIG = Path(__file__).with_name("tiny_sweep.yaml")
# 0.9 CPU: a worker and the (0.001-CPU) Tune drivers fit on a one-CPU node, two workers do not: one trial per node
ON_TWO_NODES = ["resources.cpus_per_worker=0.9", "resources.max_concurrent_trials=2"]


@pytest.fixture
def results(request, tmp_path) -> str:
    """The store's root: a directory the nodes share ("local", the default), or a prefix of a local S3 server's
    bucket ("s3": its endpoint and credentials exported before the nodes start, so that every node's processes
    reach it)."""
    if getattr(request, "param", "local") == "s3":
        return f"s3://{request.getfixturevalue('s3_store').bucket}/calsweep"
    return str(tmp_path / "shared")


@pytest.fixture
def cluster(data_dir, results):
    """A head with no CPUs (no trial, no driver lands there) and two worker nodes with one CPU each, started after
    the store's environment is set."""
    from ray.cluster_utils import Cluster

    os.environ["CALSWEEP_DATA_DIR"] = data_dir  # the nodes' processes (trial drivers, workers) inherit it
    # the dashboard as on a real head: Ray Train frees a dead trial's placement group through its State API
    port = free_port()  # not 8265: another Ray instance on this machine may hold it
    cluster = Cluster(initialize_head=True, connect=False,
                      head_node_args={"num_cpus": 0, "include_dashboard": True, "dashboard_port": port})
    workers = [cluster.add_node(num_cpus=1) for _ in range(2)]
    cluster.wait_for_nodes()
    yield cluster, workers
    cluster.shutdown()


def _launch(address: str, results: str, *settings: str) -> subprocess.Popen:
    command = [sys.executable, str(REPO / "sweeps" / "launch.py"), "--config", str(CONFIG), "--address", address,
               "--results-dir", results, *ON_TWO_NODES, *settings]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"})


def _files(root: str) -> list[str]:
    """Every file under ``root`` (a local path or a URI), as paths relative to it."""
    fs, base = store.filesystem(root)
    infos = fs.get_file_info(pafs.FileSelector(base, allow_not_found=True, recursive=True))
    return [info.path[len(base) + 1:] for info in infos if info.type == pafs.FileType.File]


def _leftovers(results: str) -> list[str]:
    """Hidden (temporary) files of the store's tables: what a writer killed mid-write would leave."""
    return [path for path in _files(results) if path.split("/")[0] in ("trials", "questions")
            and path.split("/")[-1].startswith(".")]


def _checkpointed(results: str) -> int:
    """Trials with a checkpoint in the store that their retry resumes from: a Ray Train run's committed checkpoint
    list (a folder uploaded a moment before its controller died is not yet one), or a warm trial's complete
    checkpoint folder (``sweeps.checkpoints.persist`` writes its trial.json last)."""
    return len({path.split("/")[0] for path in _files(f"{results}/ray") if path.startswith("tiny-") and (
        path.count("/") == 1 and path.endswith("/checkpoint_manager_snapshot.json")
        or path.count("/") == 2 and path.split("/")[1].startswith("checkpoint_") and path.endswith("/trial.json"))})


@pytest.mark.slow
@pytest.mark.parametrize("results", ["local", "s3"], indirect=True)
def test_a_worker_node_killed_mid_trial_costs_no_row(cluster, results, tmp_path):
    cluster, workers = cluster
    overrides = ("train.max_steps=16", "train.checkpoint_every_steps=8", "train.log_every=1", "eval.tasks=[arc_easy]",
                 "resources.max_failures=2")
    launcher = _launch(cluster.address, results, *overrides)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(launcher.stdout), daemon=True)
    reader.start()
    deadline = time.time() + 600
    while _checkpointed(results) < 2 and launcher.poll() is None and time.time() < deadline:
        time.sleep(0.5)  # both trials train, one on each worker node, each past its first checkpoint
    assert _checkpointed(results) == 2, "".join(lines)[-4000:]
    lost, survivor = workers
    cluster.remove_node(lost, allow_graceful=False)  # its raylet and every process on it: SIGKILL
    # while the first recovers, the same launch again (its config the first's, so that the lock alone refuses it,
    # whether or not the survivor's trial is stored by then): refused (flock, or the bucket's lease)
    second = _launch(cluster.address, results, *overrides)
    refusal, _ = second.communicate(timeout=300)
    assert second.returncode == 2 and launcher.poll() is None, refusal[-4000:]
    assert refusal.splitlines()[-1].startswith("calsweep: error: run 'tiny' is being launched already"), refusal
    launcher.wait(timeout=900)
    reader.join(timeout=60)
    out = "".join(lines)
    assert launcher.returncode == 0, out[-4000:]
    rows = store.read_trials(results, "tiny").to_pylist()
    assert [row["status"] for row in rows] == ["ok", "ok"], out[-4000:]  # one ok row per trial
    assert {row["node_id"] for row in rows} == {survivor.node_id}  # the lost node's trial finished on the survivor
    assert any(row["resumed_from_step"] >= 8 for row in rows), out[-4000:]  # from its checkpoint, not step 0
    # so the trials landed on both nodes: one ran on the lost node when it died (resumed), and the other, which had
    # checkpointed by then, was not on it (a one-CPU node holds one trial; one finished there would have its row)
    assert "resumed from its checkpoint at step" in out and _leftovers(results) == []
    assert "runs/tiny/launch.lease" not in _files(results)  # a bucket's lease: released when the launch ended
    assert "tiny-llama  0.001  0.1   0     ok" in out  # the closing table
    written = analyze.main([results, "--n-boot", "20", "--out", str(tmp_path / "analysis")])
    assert any(path.name == "table1.csv" for path in written)
