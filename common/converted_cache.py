"""GGUF checkpoints converted once per node instead of once per trial.

De-quantising a GGUF (transformers' GGUF loader) takes tens of seconds and converting its tokenizer a few; the
result depends only on the file and on the transformers that converts it. ``load_converted`` keeps each part as a
Hugging Face folder (``save_pretrained``: the model's config and float32 weights as safetensors; the tokenizer's
files) under

    <root>/<file stem>-<key>/<part>      key = sha256(the GGUF's sha256, transformers version, FORMAT)

and loads it from there. The GGUF's sha256 is memoised by its path, size and mtime (``root/.sha256``), so a hit
costs a ``stat`` and the folder read. Folders are built under a temporary name and renamed into place, with a
manifest of file sizes written last (``common.disk_cache.cached_folder``); one that is incomplete, or whose
files fail to load, is converted again.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, TypeVar

import torch

from common.disk_cache import cache_key, cached_folder, discard_folder, file_sha256

T = TypeVar("T")
FORMAT = "1"  # bump when what a converted folder holds changes
PARTS = ("model", "tokenizer")


def _save_model(gguf: Path, out: Path) -> None:
    import transformers

    # transformers >= 5.24 may keep GGUF blocks packed (and then refuses to save): ask for dense weights
    dense = {"quantization_config": transformers.GgufConfig(dequantize=True)} if hasattr(transformers, "GgufConfig") \
        else {}
    model = transformers.AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                              dtype=torch.float32, **dense)
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:  # the weights are plain tensors: save them as an ordinary checkpoint
        quantizer.remove_quantization_config(model)
    model.save_pretrained(out)


def _save_tokenizer(gguf: Path, out: Path) -> None:
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name).save_pretrained(out)


_SAVERS: dict[str, Callable[[Path, Path], None]] = {"model": _save_model, "tokenizer": _save_tokenizer}


def converted_folder(gguf: Path, part: str, root: Path) -> Path:
    """The folder of ``part`` (model | tokenizer) converted from the GGUF file ``gguf``, converting on a miss."""
    import transformers

    if part not in _SAVERS:
        raise ValueError(f"converted part: expected one of {list(PARTS)}, got {part!r}")
    key = cache_key(file_sha256(gguf, root / ".sha256"), transformers.__version__, FORMAT)[:24]
    return cached_folder(root / f"{gguf.stem}-{key}" / part, lambda out: _SAVERS[part](gguf, out))


def _load_errors() -> tuple[type[BaseException], ...]:
    from safetensors import SafetensorError

    return OSError, ValueError, SafetensorError


def load_converted(gguf: Path, part: str, root: Path, load: Callable[[Path], T]) -> T:
    """``load(folder)`` on the converted ``part`` of ``gguf``; a folder that fails to load (damaged in place) is
    discarded and converted once more."""
    folder = converted_folder(gguf, part, root)
    try:
        return load(folder)
    except _load_errors() as exc:
        print(f"[calsweep] converted {part} {folder} failed to load ({type(exc).__name__}); converting it again",
              flush=True)
        discard_folder(folder)
        return load(converted_folder(gguf, part, root))

