"""Shared fixtures: the real local data root (../shared/data), a tiny Llama config, the SmolLM2 tokenizer."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED_DATA = REPO.parent / "shared" / "data"


@pytest.fixture(scope="session")
def data_dir() -> str:
    root = os.environ.get("CALSWEEP_DATA_DIR") or str(SHARED_DATA)
    if not Path(root).is_dir():
        pytest.skip(f"local data root {root!r} not present")
    return str(Path(root).resolve())


@pytest.fixture(scope="session")
def tiny_llama_config() -> dict:
    """A 2-layer Llama with SmolLM2's vocabulary: random init in well under a second."""
    return dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=49152, max_position_embeddings=512)


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    from trainable.models import load_tokenizer, resolve_model

    return load_tokenizer(resolve_model("smollm2-135m"))


@pytest.fixture(scope="session")
def one_rank_process_group():
    """A one-process gloo group, as Ray Train would set up for a one-worker CPU trial."""
    import socket

    import torch.distributed as dist

    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    if not dist.is_initialized():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
        dist.init_process_group("gloo", rank=0, world_size=1)
    yield


def load_benchmark(name: str) -> ModuleType:
    """``benchmarks/<name>.py`` imported as a module (the scripts are files, not a package)."""
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def benchmark_script():
    """Loader of a benchmark script as a module: ``benchmark_script("bench_prefix_sharing").main([...])``."""
    return load_benchmark
