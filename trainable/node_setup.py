"""What a trial sets up before it builds anything, so that the node, not each trial, pays for building.

Compile once per node: Inductor caches the code it generates for a graph (the FX graph cache) and AOTAutograd
the joint forward and backward it derives (the autograd cache). Both are on by default but live in
``/tmp/torchinductor_<user>``, which containers and reboots lose; ``use_node_compile_cache`` points them (and the
Triton kernels kept below them) at ``<root>/inductor``, so a later trial of the same model shape on the node reads
compiled graphs instead of compiling them, and ``compile_counts`` says how many it found there and how long torch
spent compiling.

Nothing built per trial: DeepSpeed's CPU accelerator JIT-compiles a shared-memory all-reduce
(``deepspeed_shm_comm``, C++, one to two minutes on a fresh machine) when its comm backend starts. Only its
inference all-reduce (AutoTP) uses that op, never training, so ``skip_deepspeed_shm_op`` marks it unavailable in
DeepSpeed's table of compatible ops, which is what DeepSpeed consults before building it; training
communicates through gloo as before.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

CACHE_DIR_ENV = "TORCHINDUCTOR_CACHE_DIR"
SHM_OP = "deepspeed_shm_comm"  # ShareMemCommBuilder.NAME


def use_node_compile_cache(root: Path) -> Path:
    """Turn on Inductor's FX graph and AOTAutograd caches in ``<root>/inductor`` (a ``TORCHINDUCTOR_CACHE_DIR``
    the user set wins) and return the directory used. Call before the process compiles anything."""
    import torch._functorch.config
    import torch._inductor.config
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    current = os.environ.get(CACHE_DIR_ENV)  # importing Inductor writes its default there: that one is not a choice
    if current is None or os.path.abspath(current) == os.path.abspath(default_cache_dir()):
        os.environ[CACHE_DIR_ENV] = str(Path(root).absolute() / "inductor")
    torch._inductor.config.fx_graph_cache = True
    torch._functorch.config.enable_autograd_cache = True
    return Path(os.environ[CACHE_DIR_ENV])


# torch's own compile timers (``torch._dynamo.utils.compile_times``) that together time a compile: Dynamo's frames
# with their AOTAutograd and Inductor work, and backward graphs compiled at their first backward; neither nests the other
COMPILE_TIMERS = ("_compile.compile_inner", "backward._backward_impl")


def compile_counts() -> dict[str, float]:
    """What this process compiled so far: graphs read from (hits) or added to (misses) the node's compile caches,
    and ``compile_s``, the seconds torch spent compiling (``COMPILE_TIMERS``)."""
    from torch._dynamo.utils import compile_times, counters

    names, seconds = compile_times(repr="csv", aggregate=True)
    return {"compile_fx_hits": counters["inductor"]["fxgraph_cache_hit"],
            "compile_fx_misses": counters["inductor"]["fxgraph_cache_miss"],
            "compile_autograd_hits": counters["aot_autograd"]["autograd_cache_hit"],
            "compile_autograd_misses": counters["aot_autograd"]["autograd_cache_miss"],
            "compile_s": sum(float(s) for name, s in zip(names, seconds) if name in COMPILE_TIMERS)}


def compile_counts_since(before: dict[str, float]) -> dict[str, float]:
    """``compile_counts`` from the snapshot ``before`` on: a warm actor's trial counts its own compiles alone."""
    return {name: value - before[name] for name, value in compile_counts().items()}


def skip_deepspeed_shm_op() -> None:
    """Keep DeepSpeed's CPU accelerator from compiling its shared-memory all-reduce op (unused by training).
    Call after ``DS_ACCELERATOR=cpu`` is set and before ``deepspeed.init_distributed``."""
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__[SHM_OP] = False


def prepare_node(root: Path, device: torch.device) -> Path:
    """A trial's set-up before it compiles or starts DeepSpeed: the node's compile cache, and on the CPU no
    DeepSpeed op to build. Returns the compile cache directory."""
    directory = use_node_compile_cache(root)
    if device.type == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        skip_deepspeed_shm_op()
    return directory


def ray_node_id() -> str | None:
    """The Ray node this process runs on (hex id), or None outside Ray (a trial run as a plain function)."""
    import ray

    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
