"""The cluster's GPUs as Ray sees them, and the GPU memory a sweep's layouts are planned for.

Ray gives a node with NVIDIA GPUs a ``GPU`` resource (how many) and a custom resource ``accelerator_type:<type>``
(the type read from the card's name: ``H100``, ``A100``, ``L4``, ...). ``detect`` reads them from the live nodes of
the cluster at ``--address``, or, without one, from this machine as the ``ray.init`` of the run would (Ray's own
accelerator manager: ``CUDA_VISIBLE_DEVICES`` respected, nothing started). A type's memory is ``GPU_MEMORY_GIB``:
a table, so that no GPU is taken from the sweep to measure it. The plan is for the smallest memory among the
cluster's GPUs of known type; trials are not pinned to a type. No GPU (a CPU-only machine, or an autoscaling
cluster with no GPU node up yet): ``NO_GPU_MEMORY_GB``, as before detection existed (on the CPU the layout's
memory model only bounds micro-batches). ``resources.gpu_memory_gb`` set in the config wins over all of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ACCELERATOR_PREFIX = "accelerator_type:"  # Ray's resource of a node's GPU type (ray.util.accelerators names)
NO_GPU_MEMORY_GB = 80.0  # what layouts are planned for where no GPU of known type is seen
# GiB that PyTorch reports for a card of each Ray accelerator type: H100 and H200 as measured for this project, the
# others estimated from NVIDIA's sizes less the driver's reserve and rounded down (resources.gpu_memory_gb gives
# the exact figure). Ray names both A100s 'A100' (the -40G and -80G types are set by hand): planned as the smaller.
GPU_MEMORY_GIB = {
    "H100": 79.6, "H200": 139.8, "A100": 39.4, "A100-40G": 39.4, "A100-80G": 79.1, "L4": 21.9, "L40S": 44.3,
    "A10G": 21.9, "T4": 14.7, "V100": 15.7,
}


@dataclass(frozen=True)
class GpuGroup:
    """GPUs of one type over the cluster's live nodes; ``gpu_type`` None where a node declares no type."""

    gpu_type: str | None
    count: int

    @property
    def memory_gib(self) -> float | None:
        """The type's memory (``GPU_MEMORY_GIB``), None for an unknown type."""
        return GPU_MEMORY_GIB.get(self.gpu_type) if self.gpu_type else None

    def describe(self) -> str:
        """'8 x H100 (79.6 GiB)', '2 x B300 (memory unknown)', '2 x GPU (no type declared)'."""
        if self.gpu_type is None:
            return f"{self.count} x GPU (no type declared)"
        memory = self.memory_gib
        return f"{self.count} x {self.gpu_type} ({f'{memory:g} GiB' if memory else 'memory unknown'})"


def gpu_groups(nodes: list[dict[str, Any]]) -> tuple[GpuGroup, ...]:
    """The GPUs of ``nodes`` (rows as ``ray.nodes()`` gives them; dead ones skipped) grouped by type, largest
    count first. A node declaring several types (Ray's ``A100`` and a hand-set ``A100-80G``) counts as the most
    specific known one."""
    counts: dict[str | None, int] = {}
    for node in nodes:
        resources = node.get("Resources", {})
        gpus = int(resources.get("GPU", 0))
        if not node.get("Alive", True) or not gpus:
            continue
        types = [name[len(ACCELERATOR_PREFIX):] for name in resources if name.startswith(ACCELERATOR_PREFIX)]
        gpu_type = max(types, key=lambda t: (t in GPU_MEMORY_GIB, len(t)), default=None)  # A100-80G over A100
        counts[gpu_type] = counts.get(gpu_type, 0) + gpus
    return tuple(GpuGroup(t, n) for t, n in sorted(counts.items(), key=lambda item: (-item[1], str(item[0]))))


def detect(address: str | None) -> tuple[GpuGroup, ...]:
    """The GPUs of the Ray cluster at ``address`` (connected to and left again), or of this machine without one."""
    import ray

    if address is None:
        return gpu_groups([_this_node()])
    ray.init(address=address, logging_level="error", log_to_driver=False)
    try:
        return gpu_groups(ray.nodes())
    finally:
        ray.shutdown()


def _this_node() -> dict[str, Any]:
    """This machine as a ``ray.nodes()`` row: the GPU count and type ``ray.init`` would give its node."""
    from ray._private.accelerators import get_accelerator_manager_for_resource

    manager = get_accelerator_manager_for_resource("GPU")
    gpus = manager.get_current_node_num_accelerators()
    gpu_type = manager.get_current_node_accelerator_type() if gpus else None
    return {"Alive": True, "Resources": {"GPU": gpus, **({f"{ACCELERATOR_PREFIX}{gpu_type}": 1} if gpu_type else {})}}


def planned_memory(groups: tuple[GpuGroup, ...], configured: float | None) -> tuple[float, str]:
    """The GiB per GPU to plan layouts for and one line saying why: ``configured`` (``resources.gpu_memory_gb``)
    if set, else the smallest memory among ``groups`` of known type, else ``NO_GPU_MEMORY_GB``."""
    known = [g.memory_gib for g in groups if g.memory_gib]
    seen = ", ".join(g.describe() for g in groups)
    if configured is not None:
        smaller = [g.describe() for g in groups if g.memory_gib and g.memory_gib < configured]
        warning = f"; the cluster's {', '.join(smaller)} have less: trials placed there may run out of memory" \
            if smaller else ""
        return configured, f"GPUs: {seen or 'none detected'}; planned for {configured:g} GiB " \
                           f"(resources.gpu_memory_gb){warning}"
    if not groups:
        return NO_GPU_MEMORY_GB, f"no GPUs detected: planned for {NO_GPU_MEMORY_GB:g} GiB GPUs (set " \
                                 f"resources.gpu_memory_gb where GPU nodes are yet to start)"
    memory = min(known) if known else NO_GPU_MEMORY_GB
    notes = []
    if len(set(known)) > 1:
        notes.append("GPUs of different memory: every family is planned for the smallest and its trials may run "
                     "on any of them (not pinned to a type)")
    if len(known) < len(groups):
        notes.append(f"{'GPUs of unknown memory not planned for' if known else 'GPU memory unknown'}: set "
                     f"resources.gpu_memory_gb to their GiB")
    if any(g.gpu_type == "A100" for g in groups):
        notes.append("Ray names 40 and 80 GB A100s alike: 40 GB assumed; set resources.gpu_memory_gb: 79.1 for "
                     "80 GB cards")
    return memory, f"GPUs: {seen}; planned for {memory:g} GiB" + "".join(f"; {note}" for note in notes)
