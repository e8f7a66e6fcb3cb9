"""Shared fixtures: the real local data root (../shared/data), a tiny Llama config, the SmolLM2 tokenizer."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch


def _define_triton_kernels_interpreted() -> None:
    """On a machine without CUDA, define Triton's library and our kernels under TRITON_INTERPRET=1.

    Triton reads the flag when a ``@triton.jit`` function is defined, its own library included, and the first
    import of transformers' models (through torch._dynamo) imports Triton: so it is done here, before any test
    module is collected. The variable is restored afterwards, so that CPU calls elsewhere keep the PyTorch path;
    tests/kernels/test_triton_interpret.py sets it for its own tests.
    """
    if torch.cuda.is_available() or "triton" in sys.modules:
        return
    user_value = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        import triton.language  # noqa: F401

        from kernels import triton_backend  # noqa: F401
    except ImportError:  # no Triton on this platform: the interpreter tests are skipped there
        pass
    finally:
        if user_value is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = user_value


_define_triton_kernels_interpreted()

REPO = Path(__file__).resolve().parent.parent
SHARED_DATA = REPO.parent / "shared" / "data"


@pytest.fixture(scope="session")
def data_dir() -> str:
    """The local data root: $CALSWEEP_DATA_DIR, else ../shared/data. When it is missing the test is skipped, or
    fails under CI ($CI set, as .ci/run exports it): a CI run must not pass by testing nothing of the data."""
    root = os.environ.get("CALSWEEP_DATA_DIR") or str(SHARED_DATA)
    if not Path(root).is_dir():
        (pytest.fail if os.environ.get("CI") else pytest.skip)(f"local data root {root!r} not present")
    return str(Path(root).resolve())


@pytest.fixture(scope="session")
def tiny_llama_config() -> dict:
    """A 2-layer Llama with SmolLM2's vocabulary: random init in well under a second."""
    return dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=49152, max_position_embeddings=512)


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    from common.models import load_tokenizer, resolve_model

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
