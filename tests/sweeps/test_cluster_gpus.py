"""The sweep knows its GPUs: ``resources.gpu_memory_gb`` from the cluster's GPU types (Ray nodes declaring GPUs and
an ``accelerator_type:<type>`` resource, as Ray gives a node with NVIDIA cards; here a ``ray.cluster_utils.Cluster``
on this machine, whose nodes declare them), what ``--dry-run`` says of them, a cluster of two types, the key set
by hand winning, and no GPUs at all (this machine, which CI runs without one)."""

from pathlib import Path

import pytest
import torch

from sweeps.cluster_gpus import GpuGroup, planned_memory
from sweeps.config import ConfigError, load_sweep
from sweeps.launch import main, with_gpu_memory

TINY = Path(__file__).with_name("tiny_sweep.yaml")


@pytest.fixture(scope="module")
def cluster():
    """A CPU head and one node of 8 H100s (declared: Ray would detect them on real cards)."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, connect=False, head_node_args={"num_cpus": 1})
    cluster.add_node(num_cpus=1, num_gpus=8, resources={"accelerator_type:H100": 1})
    cluster.wait_for_nodes()
    yield cluster
    cluster.shutdown()


def _dry_run(address: str | None, data_dir: str, results: Path, capsys, *settings: str) -> str:
    args = ["--config", str(TINY), "--dry-run", "--data-dir", data_dir, "--results-dir", str(results), *settings]
    assert main(args + (["--address", address] if address else [])) == 0
    return capsys.readouterr().out


def test_the_dry_run_plans_for_the_clusters_gpus(cluster, data_dir, tmp_path, capsys):
    out = _dry_run(cluster.address, data_dir, tmp_path, capsys)
    assert "GPUs: 8 x H100 (79.6 GiB); planned for 79.6 GiB\n" in out
    assert "Layouts on 79.6 GiB GPUs" in out
    sweep, _ = with_gpu_memory(load_sweep(TINY), cluster.address)
    assert sweep.resources.gpu_memory_gb == 79.6


def test_the_key_set_by_hand_wins(cluster, data_dir, tmp_path, capsys):
    out = _dry_run(cluster.address, data_dir, tmp_path, capsys, "resources.gpu_memory_gb=40")
    assert "GPUs: 8 x H100 (79.6 GiB); planned for 40 GiB (resources.gpu_memory_gb)\n" in out
    assert "Layouts on 40 GiB GPUs" in out


def test_two_gpu_types_are_planned_for_the_smaller_and_a_node_gone_is_not_counted(cluster, data_dir, tmp_path,
                                                                                    capsys):
    l4 = cluster.add_node(num_cpus=1, num_gpus=2, resources={"accelerator_type:L4": 1})
    cluster.wait_for_nodes()
    try:
        out = _dry_run(cluster.address, data_dir, tmp_path, capsys)
        assert ("GPUs: 8 x H100 (79.6 GiB), 2 x L4 (21.9 GiB); planned for 21.9 GiB; GPUs of different memory: "
                "every family is planned for the smallest and its trials may run on any of them (not pinned to a "
                "type)\n") in out
        assert "Layouts on 21.9 GiB GPUs" in out
        by_hand = _dry_run(cluster.address, data_dir, tmp_path, capsys, "resources.gpu_memory_gb=79.6")
        assert ("planned for 79.6 GiB (resources.gpu_memory_gb); the cluster's 2 x L4 (21.9 GiB) have less: trials "
                "placed there may run out of memory\n") in by_hand
    finally:
        cluster.remove_node(l4)
    sweep, line = with_gpu_memory(load_sweep(TINY), cluster.address)
    assert (sweep.resources.gpu_memory_gb, line) == (79.6, "GPUs: 8 x H100 (79.6 GiB); planned for 79.6 GiB")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has GPUs")
def test_no_gpus_here_keeps_the_old_plan(data_dir, tmp_path, capsys):
    out = _dry_run(None, data_dir, tmp_path, capsys)
    assert "no GPUs detected: planned for 80 GiB GPUs (set resources.gpu_memory_gb where GPU nodes are yet to " \
           "start)\n" in out
    assert "Layouts on 80 GiB GPUs" in out


def test_types_of_unknown_or_ambiguous_memory_say_what_to_set():
    memory, line = planned_memory((GpuGroup("A100", 8),), None)
    assert memory == 39.4 and line.endswith("Ray names 40 and 80 GB A100s alike: 40 GB assumed; set "
                                            "resources.gpu_memory_gb: 79.1 for 80 GB cards")
    memory, line = planned_memory((GpuGroup("B300", 8),), None)
    assert (memory, line) == (80.0, "GPUs: 8 x B300 (memory unknown); planned for 80 GiB; GPU memory unknown: set "
                                    "resources.gpu_memory_gb to their GiB")
    memory, line = planned_memory((GpuGroup("H200", 8), GpuGroup(None, 2)), None)
    assert (memory, line) == (139.8, "GPUs: 8 x H200 (139.8 GiB), 2 x GPU (no type declared); planned for 139.8 "
                                     "GiB; GPUs of unknown memory not planned for: set resources.gpu_memory_gb to "
                                     "their GiB")


@pytest.mark.parametrize("value", [0.0, -40.5])
def test_a_gpu_memory_of_no_gib_is_refused_in_one_line(value):
    with pytest.raises(ConfigError) as error:
        load_sweep(TINY, assignments=[f"resources.gpu_memory_gb={value}"])
    assert error.value.problems == [f"override 'resources.gpu_memory_gb={value}': resources.gpu_memory_gb: expected "
                                    f"GiB per GPU > 0, or null to detect it, got {value!r}"]


def test_a_hand_set_a100_size_beats_rays_a100(cluster):
    a100 = cluster.add_node(num_cpus=1, num_gpus=4, resources={"accelerator_type:A100": 1,
                                                               "accelerator_type:A100-80G": 1})
    cluster.wait_for_nodes()
    try:
        sweep, line = with_gpu_memory(load_sweep(TINY), cluster.address)
    finally:
        cluster.remove_node(a100)
    assert sweep.resources.gpu_memory_gb == 79.1
    assert line.startswith("GPUs: 8 x H100 (79.6 GiB), 4 x A100-80G (79.1 GiB); planned for 79.1 GiB; GPUs of "
                           "different memory")
