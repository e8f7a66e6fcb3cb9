"""A trial's workers compile with as many Inductor workers as they have CPUs (not up to 32 per rank): a Ray Train
worker through its environment (``sweeps.driver.worker_env``), a warm trial's Tune actor, which has the job's
environment, by setting Inductor's config (``sweeps.warm_trial.cap_threads``); the user's ``TORCHINDUCTOR_*``
settings reach the workers and win. So do the CUDA allocator's settings (``PYTORCH_CUDA_ALLOC_CONF``: expandable
segments unless the user sets it). Checked in real Ray worker processes of a local Ray."""

from pathlib import Path

import pytest

from sweeps.config import load_sweep
from sweeps.driver import worker_env

TINY = Path(__file__).with_name("tiny_sweep.yaml")
THREE_CPUS = ["resources.cpus_per_worker=3"]  # not this machine's core count: a cap, not Inductor's own choice


def test_worker_env_forwards_inductor_settings_and_caps_compile_threads(monkeypatch):
    sweep = load_sweep(TINY, assignments=THREE_CPUS)
    monkeypatch.delenv("TORCHINDUCTOR_COMPILE_THREADS", raising=False)
    monkeypatch.setenv("TORCHINDUCTOR_FX_GRAPH_CACHE", "0")
    env = worker_env(sweep)
    assert (env["OMP_NUM_THREADS"], env["TORCHINDUCTOR_COMPILE_THREADS"]) == ("3", "3")
    assert env["TORCHINDUCTOR_FX_GRAPH_CACHE"] == "0"
    monkeypatch.setenv("TORCHINDUCTOR_COMPILE_THREADS", "1")  # the user's choice wins
    assert worker_env(sweep)["TORCHINDUCTOR_COMPILE_THREADS"] == "1"


def test_worker_env_sets_the_allocator_default_unless_the_user_chose(monkeypatch):
    sweep = load_sweep(TINY, assignments=THREE_CPUS)
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    assert worker_env(sweep)["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:False"
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:512")
    assert worker_env(sweep)["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:512"


def _compile_threads(cap_like_a_warm_actor: dict | None = None) -> tuple[int, int, str | None]:
    """In a Ray worker: Inductor's compile workers, torch's threads and the allocator's settings (after
    ``cap_threads`` of that sweep)."""
    import os

    import torch
    import torch._inductor.config

    if cap_like_a_warm_actor is not None:
        from sweeps.config import sweep_from_dict
        from sweeps.warm_trial import cap_threads

        cap_threads(sweep_from_dict(cap_like_a_warm_actor))
    return torch._inductor.config.compile_threads, torch.get_num_threads(), os.environ.get("PYTORCH_CUDA_ALLOC_CONF")


@pytest.fixture
def local_ray(monkeypatch):
    import ray

    monkeypatch.delenv("TORCHINDUCTOR_COMPILE_THREADS", raising=False)  # the workers inherit no choice
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="error")
    yield ray
    ray.shutdown()


def test_ray_train_workers_and_warm_actors_compile_with_the_workers_cpus(local_ray):
    from sweeps.config import sweep_to_dict

    sweep = load_sweep(TINY, assignments=THREE_CPUS)
    task = local_ray.remote(num_cpus=1)(_compile_threads)
    as_a_train_worker = task.options(runtime_env={"env_vars": worker_env(sweep)}).remote()
    as_a_warm_actor = task.remote(sweep_to_dict(sweep))
    threads, _, train_conf = local_ray.get(as_a_train_worker)  # (its OpenMP threads are Ray's and torch's affair)
    assert (threads, train_conf) == (3, "expandable_segments:False")
    assert local_ray.get(as_a_warm_actor) == (3, 3, "expandable_segments:False")
