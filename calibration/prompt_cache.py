"""Tokenised prompts (the groups of ``calibration.requests.plan``) kept on disk: every trial of a sweep scores the
same prompts with its family's tokenizer.

Tokenising is the one part of scoring that does not depend on the weights, and with a shared k-shot prefix it is
most of a pass (all of MMLU with Gemma-3's tokenizer on an H100: 20 s tokenising, 7 s model). ``cached_groups``
returns exactly what ``calibration.requests.plan`` returns, computing it once per (tokenizer, prompts, sharing):

    key = sha256(tokenizer fingerprint, every prompt's prefix, query and continuations, share_prefix)

where the fingerprint is the tokenizer's class, its special tokens and its full serialisation (vocabulary, merges,
normaliser, pre-tokeniser, post-processor: ``backend_tokenizer.to_str()``). A tokenizer without a serialisation
(a slow, Python-only one) is never cached. Files are ``<directory>/<key>.pkl``, written to a temporary name and
renamed (atomic, ``common.disk_cache``), so trials that tokenise the same task at once on one node leave one
whole file; an unreadable file is tokenised again.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Sequence

from common.disk_cache import cached_pickle
from calibration.prompts import Prompt
from calibration.requests import Group, plan


def tokenizer_fingerprint(tokenizer: Any) -> str | None:
    """sha256 of what decides the tokenizer's ids, or None when it cannot be serialised."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    digest = hashlib.sha256(type(tokenizer).__name__.encode())
    digest.update(repr(sorted(tokenizer.special_tokens_map.items())).encode())
    digest.update(backend.to_str().encode())
    return digest.hexdigest()


def prompts_key(fingerprint: str, prompts: Sequence[Prompt], share_prefix: bool) -> str:
    """sha256 over the fingerprint, the sharing flag and every prompt's texts (NUL-separated)."""
    digest = hashlib.sha256(f"{fingerprint}\0{share_prefix}\0{len(prompts)}".encode())
    for prompt in prompts:
        digest.update("\0".join((prompt.prefix, prompt.query, *prompt.continuations, "\1")).encode())
    return digest.hexdigest()


def cached_groups(tokenizer: Any, prompts: Sequence[Prompt], *, share_prefix: bool = True,
                directory: str | Path | None = None) -> list[Group]:
    """``plan(tokenizer, prompts, share_prefix=...)``, read from ``directory`` when it holds it, else computed
    and stored there (no directory: computed, never stored)."""
    fingerprint = tokenizer_fingerprint(tokenizer) if directory is not None else None
    if fingerprint is None:
        return plan(tokenizer, prompts, share_prefix=share_prefix)
    path = Path(directory) / f"{prompts_key(fingerprint, prompts, share_prefix)}.pkl"
    return cached_pickle(path, lambda: plan(tokenizer, prompts, share_prefix=share_prefix))
