"""Registry guard: a family that an installed transformers is known to load wrongly is refused in one line."""

from __future__ import annotations

import pytest

from trainable.models import check_transformers, resolve_model


def test_gemma3_gguf_is_refused_on_a_transformers_that_loads_it_wrongly():
    gemma = resolve_model("gemma3-270m")
    with pytest.raises(RuntimeError, match=r"needs transformers >= 5\.23\.0 .* got 5\.17\.0"):
        check_transformers(gemma, "5.17.0")
    check_transformers(gemma, "5.23.0")
    check_transformers(resolve_model("smollm2-135m"), "5.17.0")  # no known problem


def test_the_installed_transformers_loads_every_registry_gguf():
    for name in ("smollm2-135m", "gemma3-270m"):
        check_transformers(resolve_model(name))
