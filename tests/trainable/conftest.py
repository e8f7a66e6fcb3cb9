"""Fixtures of the trainable tests: a trial run by two rank processes of a gloo group."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from common.ports import free_port

REPO = Path(__file__).resolve().parents[2]

# one rank of a two-rank gloo group: runs the trial (from a checkpoint folder if given), copies each checkpoint it
# reports into <out>/<phase><step> (the ranks' parts merged, as Ray Train does) and writes its reports to <out>
RANK = """
import json, os, shutil, sys
from pathlib import Path
import torch, torch.distributed as dist
from trainable.config import TrialConfig
from sweeps import store
from trainable.worker import run_trial
config, out, resume = json.loads(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
rank = int(os.environ["RANK"])
dist.init_process_group("gloo", rank=rank, world_size=2)
reports = []
def keep(metrics, directory):
    reports.append(metrics)
    if directory is not None:
        shutil.copytree(directory, out / f"{metrics['phase']}{metrics['step']}", dirs_exist_ok=True)
run_trial(TrialConfig.from_dict(config), torch.device("cpu"), rank, 2, reports.append, keep,
          Path(resume) if resume else None, writers=store.trial_writers())
(out / f"reports{rank}.json").write_text(json.dumps(reports))
dist.destroy_process_group()  # left to interpreter exit, gloo's threads can abort the process (std::terminate)
sys.stdout.flush()
os._exit(0)  # no interpreter teardown either: threads it would destroy still running can std::terminate the rank
"""


def _two_ranks(trial, out: Path, resume_from: Path | None = None) -> list[dict]:
    """Rank 0's reports of the trial run by two processes (DS_ACCELERATOR=cpu, gloo)."""
    out.mkdir(parents=True)
    env = {**os.environ, "PYTHONPATH": str(REPO), "DS_ACCELERATOR": "cpu", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port()), "WORLD_SIZE": "2", "OMP_NUM_THREADS": "1"}
    ranks = [subprocess.Popen([sys.executable, "-c", RANK, json.dumps(trial.to_dict()), str(out),
                               str(resume_from or "")], env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(2)]
    logs = [process.communicate(timeout=300)[0] for process in ranks]
    assert all(process.returncode == 0 for process in ranks), logs[0][-3000:] + logs[1][-3000:]
    return json.loads((out / "reports0.json").read_text())




@pytest.fixture
def two_ranks():
    """``two_ranks(trial, out, resume_from=None)``: rank 0's reports of ``trial`` run by two rank processes (DeepSpeed
    on the CPU, gloo), each checkpoint it reports copied into ``out/<phase><step>``."""
    return _two_ranks
