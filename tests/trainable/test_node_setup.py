"""Per-node set-up: a second process compiling the same graph reads it from the node's compile cache (and its
compile counts, from a snapshot on, are that graph's alone), and on the CPU DeepSpeed's comm backend builds no op."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from trainable.node_setup import CACHE_DIR_ENV, prepare_node, use_node_compile_cache

REPO = Path(__file__).resolve().parents[2]
COMPILE_ONCE = """
import json, sys, torch
sys.path.insert(0, {repo!r})
from trainable.node_setup import compile_counts, compile_counts_since, use_node_compile_cache
directory = use_node_compile_cache({root!r})
before = torch.compile(lambda x: (x.cos() + x).sum())  # another graph first, in the same process
before(torch.randn(16, requires_grad=True)).backward()
start = compile_counts()
step = torch.compile(lambda x: (x.sin() * x).sum())  # two small C++ kernels: forward and backward
step(torch.randn(16, requires_grad=True)).backward()
print(json.dumps({{"directory": str(directory), **compile_counts_since(start), "process": compile_counts()}}))
"""


def _compile_in_a_fresh_process(root: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != CACHE_DIR_ENV}
    done = subprocess.run([sys.executable, "-c", COMPILE_ONCE.format(repo=str(REPO), root=str(root))], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_second_process_reads_compiled_graphs_from_the_node_cache(tmp_path):
    first = _compile_in_a_fresh_process(tmp_path)
    assert first["directory"] == str(tmp_path / "inductor") and (tmp_path / "inductor").is_dir()
    assert first["compile_fx_misses"] > 0 and first["compile_fx_hits"] == 0
    second = _compile_in_a_fresh_process(tmp_path)
    assert second["compile_fx_hits"] == first["compile_fx_misses"] and second["compile_fx_misses"] == 0
    assert second["compile_autograd_hits"] > 0 and second["compile_autograd_misses"] == 0
    for run in (first, second):  # the graph's own compile: the process's less the graph compiled before the snapshot
        process = run["process"]
        assert process["compile_fx_hits"] + process["compile_fx_misses"] == \
            2 * (run["compile_fx_hits"] + run["compile_fx_misses"])
        assert 0 < run["compile_s"] < process["compile_s"]


def test_a_cache_directory_already_set_wins(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "mine"))
    assert use_node_compile_cache(tmp_path / "node") == tmp_path / "mine"


def test_on_the_cpu_deepspeed_builds_no_comm_op(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "extensions"))
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "inductor"))
    prepare_node(tmp_path, torch.device("cpu"))
    from deepspeed.comm.torch import build_shm_op

    assert build_shm_op() is None and not (tmp_path / "extensions").exists()
