"""GGUF checkpoints converted once per node: a real (tiny) GGUF through ``load_model``/``load_tokenizer``.

The GGUF is written here with the ``gguf`` package: the first 1,024 tokens of SmolLM2's tokenizer (and the
merges among them, copied from the registry file) and a one-layer, 64-wide Llama with random float32 weights, so
a conversion takes a second or two, not a minute.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from common.disk_cache import MANIFEST
from common.models import gguf_path, load_model, load_tokenizer, resolve_model

gguf = pytest.importorskip("gguf")

HIDDEN, FFN, HEADS, KV_HEADS, VOCAB = 64, 128, 4, 2, 1024


def _write_tiny_gguf(path, source, seed: int) -> None:
    fields = gguf.GGUFReader(source).fields
    value = lambda key: fields[key].contents()  # noqa: E731
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.add_context_length(256)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_dimension_count(HIDDEN // HEADS)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    tokens = value("tokenizer.ggml.tokens")[:VOCAB]  # special tokens, bytes, then merges in the order learnt
    kept = set(tokens)
    merges = [m for m in value("tokenizer.ggml.merges") if set(m.split(" ")) <= kept and m.replace(" ", "") in kept]
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model(value("tokenizer.ggml.model"))
    writer.add_tokenizer_pre(value("tokenizer.ggml.pre"))
    writer.add_token_list(tokens)
    writer.add_token_types(value("tokenizer.ggml.token_type")[:VOCAB])
    writer.add_token_merges(merges)
    writer.add_bos_token_id(value("tokenizer.ggml.bos_token_id"))
    writer.add_eos_token_id(value("tokenizer.ggml.eos_token_id"))
    writer.add_pad_token_id(value("tokenizer.ggml.padding_token_id"))
    writer.add_chat_template(value("tokenizer.chat_template"))
    rng = np.random.default_rng(seed)
    kv = KV_HEADS * HIDDEN // HEADS
    shapes = {"token_embd.weight": (len(tokens), HIDDEN), "output_norm.weight": (HIDDEN,),
              "blk.0.attn_norm.weight": (HIDDEN,), "blk.0.ffn_norm.weight": (HIDDEN,),
              "blk.0.attn_q.weight": (HIDDEN, HIDDEN), "blk.0.attn_k.weight": (kv, HIDDEN),
              "blk.0.attn_v.weight": (kv, HIDDEN), "blk.0.attn_output.weight": (HIDDEN, HIDDEN),
              "blk.0.ffn_gate.weight": (FFN, HIDDEN), "blk.0.ffn_up.weight": (FFN, HIDDEN),
              "blk.0.ffn_down.weight": (HIDDEN, FFN)}
    for name, shape in shapes.items():
        writer.add_tensor(name, (rng.standard_normal(shape) * 0.02).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(scope="module")
def tiny_ggufs(tmp_path_factory) -> list[Path]:
    """Two tiny GGUFs that differ only in their weights (seeds 0 and 1)."""
    source = gguf_path(resolve_model("smollm2-135m"))
    folder = tmp_path_factory.mktemp("tiny-gguf")
    for seed in (0, 1):
        _write_tiny_gguf(folder / f"seed{seed}.gguf", source, seed)
    return [folder / "seed0.gguf", folder / "seed1.gguf"]


@pytest.fixture
def tiny_gguf(tiny_ggufs, tmp_path, monkeypatch):
    """(spec of a local tiny GGUF, the node cache it converts into); the file and the cache are this test's own."""
    monkeypatch.setenv("CALSWEEP_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "tiny-llama.gguf"
    shutil.copyfile(tiny_ggufs[0], path)
    return resolve_model(str(path)), tmp_path / "cache" / "converted"


def _folders(root):
    return sorted(p for p in root.glob("*/*") if p.is_dir())


def _direct(spec):
    path = Path(spec.location)
    return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)


def test_first_load_converts_later_loads_read_the_folder_and_match_the_gguf(tiny_gguf):
    spec, root = tiny_gguf
    model = load_model(spec)
    model_folder, = _folders(root)
    assert model_folder.name == "model" and (model_folder / "model.safetensors").is_file()
    assert (model_folder / MANIFEST).is_file() and not [p for p in root.rglob("*.partial")]
    stamp = (model_folder / "model.safetensors").stat().st_mtime_ns
    again = load_model(spec, dtype=torch.bfloat16)  # a hit: the folder is read, not written again
    assert (model_folder / "model.safetensors").stat().st_mtime_ns == stamp and again.dtype == torch.bfloat16
    ids = torch.tensor([[1, 2, 3, 500, 1000]])
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, _direct(spec)(input_ids=ids).logits)
    tokenizer = load_tokenizer(spec)
    assert [p.name for p in _folders(root)] == ["model", "tokenizer"]
    direct = AutoTokenizer.from_pretrained(str(Path(spec.location).parent), gguf_file=Path(spec.location).name)
    text = "Below is an instruction that describes a task."
    assert tokenizer(text)["input_ids"] == direct(text)["input_ids"] and len(tokenizer(text)["input_ids"]) > 5
    assert tokenizer.chat_template == direct.chat_template and tokenizer.eos_token == direct.eos_token


def test_a_changed_gguf_gets_its_own_folder(tiny_gguf, tiny_ggufs):
    spec, root = tiny_gguf
    first = load_model(spec)
    shutil.copyfile(tiny_ggufs[1], spec.location)  # same path, other weights
    second = load_model(spec)
    assert len(_folders(root)) == 2
    assert not torch.equal(first.model.embed_tokens.weight, second.model.embed_tokens.weight)


@pytest.mark.parametrize("damage", ["truncate", "garbage header"])
def test_a_damaged_folder_is_converted_again(tiny_gguf, damage):
    spec, root = tiny_gguf
    expected = load_model(spec).model.embed_tokens.weight.clone()
    weights = _folders(root)[0] / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2] if damage == "truncate" else b"\xff" * 64 + data[64:])
    assert torch.equal(load_model(spec).model.embed_tokens.weight, expected)
    assert weights.read_bytes() == data
