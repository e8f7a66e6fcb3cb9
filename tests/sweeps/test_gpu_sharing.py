"""Packing small trials: the GPU fraction from a measured peak, ``gpus_per_worker: auto`` on a CPU-only cluster,
which stored errors are out-of-memory ones, the resources of a trial retried alone, and the probe's one-rank process
group (the warm trials' own, which takes no announced port)."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from sweeps.config import ConfigError, load_sweep
from sweeps.launch import main, plan_resources
from sweeps.gpu_sharing import alone, gpu_fraction, out_of_memory

TINY = Path(__file__).with_name("tiny_sweep.yaml")
GIB = 2**30
REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("peak_gib, margin, expected", [
    (10, 1.3, 0.25),  # 13 GiB of 80: 0.1625 -> 2/8
    (15.38, 1.3, 0.25),  # 19.99 GiB: just under 2/8
    (15.39, 1.3, 0.375),  # 20.007 GiB: just over 2/8 -> 3/8
    (20, 1.0, 0.25),  # exactly 2/8 stays 2/8
    (0.1, 1.3, 0.125),  # a tiny model still asks for 1/8
    (70, 1.3, 1.0),  # more than the GPU: a whole one
])
def test_gpu_fraction_rounds_peak_times_margin_up_to_eighths(peak_gib, margin, expected):
    assert gpu_fraction(peak_gib * GIB, 80 * GIB, margin) == expected


def test_gpu_fraction_rejects_nonsense():
    with pytest.raises(ValueError, match="margin >= 1"):
        gpu_fraction(GIB, 80 * GIB, 0.5)


def test_out_of_memory_errors():
    assert out_of_memory("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")
    assert out_of_memory("RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB")
    assert not out_of_memory("ValueError: expected a finite loss") and not out_of_memory(None)


def test_auto_on_a_cpu_cluster_means_no_gpus():
    sweep = load_sweep(TINY, assignments=["resources.gpus_per_worker=auto"])
    assert sweep.resources.gpus_per_worker == "auto" and sweep.resources.probe_margin == 1.3
    planned = plan_resources(sweep, {"CPU": 2.0})
    assert planned.resources.gpus_per_worker == 0 and planned.resources.max_concurrent_trials == 1


def test_the_drivers_of_every_trial_leave_room_for_one_trial_s_workers():
    """Restoring a Tune experiment starts every unfinished trial's driver at once: on 2 CPUs, the two tiny trials'
    drivers and one trial's worker must fit together (with one driver's CPUs set aside, none of them did)."""
    from sweeps.launch import DRIVER_CPUS

    sweep = load_sweep(TINY)
    planned = plan_resources(sweep, {"CPU": 2.0}).resources
    pending = len(sweep.trial_points())
    assert pending == 2 and planned.max_concurrent_trials == 1
    assert pending * DRIVER_CPUS + planned.cpus_per_worker <= 2.0


def test_auto_on_a_gpu_cluster_packs_by_the_probe():
    sweep = load_sweep(TINY, assignments=["resources.gpus_per_worker=auto"])
    planned = plan_resources(sweep, {"CPU": 16.0, "GPU": 2.0}, probe=lambda s: gpu_fraction(10 * GIB, 80 * GIB, 1.3))
    assert planned.resources.gpus_per_worker == 0.25 and planned.resources.max_concurrent_trials == 8


def test_numbers_still_work_and_bad_values_are_named():
    assert load_sweep(TINY, assignments=["resources.gpus_per_worker=0.25"]).resources.gpus_per_worker == 0.25
    with pytest.raises(ConfigError, match=r"gpus_per_worker: expected a fraction in \[0, 1\], a whole number or "
                                          r"'auto', got 'autp'"):
        load_sweep(TINY, assignments=["resources.gpus_per_worker=autp"])
    with pytest.raises(ConfigError, match=r"probe_margin: expected a number >= 1, got 0.9"):
        load_sweep(TINY, assignments=["resources.probe_margin=0.9"])


def test_dry_run_accepts_auto(data_dir, tmp_path, capsys):
    assert main(["--config", str(TINY), "--dry-run", "--data-dir", data_dir, "--results-dir", str(tmp_path),
                 "resources.gpus_per_worker=auto"]) == 0
    assert capsys.readouterr().out.count("tiny-llama_") == 2


def test_alone_takes_whole_gpus_one_trial_at_a_time():
    shared = plan_resources(load_sweep(TINY, assignments=["resources.gpus_per_worker=0.25"]),
                            {"CPU": 16.0, "GPU": 1.0})
    assert shared.resources.max_concurrent_trials == 4
    solo = alone(shared).resources
    assert solo.gpus_per_worker == 1 and solo.max_concurrent_trials == 1
    cpu = alone(plan_resources(load_sweep(TINY), {"CPU": 2.0})).resources
    assert cpu.gpus_per_worker == 0 and cpu.max_concurrent_trials == 1


def test_the_library_makes_its_one_rank_process_groups_in_one_place():
    """The GPU memory probe and the warm trials share ``sweeps.warm_trial.process_group`` (one declaration)."""
    calls = [f"{path.relative_to(REPO)}:{function.name}"
             for layer in ("common", "kernels", "calibration", "trainable", "sweeps")
             for path in sorted((REPO / layer).rglob("*.py"))
             for function in ast.walk(ast.parse(path.read_text())) if isinstance(function, ast.FunctionDef)
             for node in ast.walk(function) if isinstance(node, ast.Call)
             and getattr(node.func, "attr", getattr(node.func, "id", None)) == "init_process_group"]
    assert calls == ["sweeps/warm_trial.py:process_group"]


def test_the_shared_group_works_and_leaves_the_announced_port_unbound():
    """The probe's group before took MASTER_PORT for its store after letting go of it (a race with any process
    binding a port meanwhile); the shared group's store is in memory: nothing listens on that port."""
    script = """
import os, psutil, torch, torch.distributed as dist
from sweeps.warm_trial import process_group
process_group(torch.device("cpu"))
process_group(torch.device("cpu"))  # a later trial keeps the group
ports = {c.laddr.port for c in psutil.Process().net_connections("tcp") if c.status == psutil.CONN_LISTEN}
total = torch.ones(3)
dist.all_reduce(total)
print(dist.get_world_size(), dist.get_backend(), int(os.environ["MASTER_PORT"]) in ports, total.tolist())
dist.destroy_process_group()
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[-2] == "1 gloo False [1.0, 1.0, 1.0]"
