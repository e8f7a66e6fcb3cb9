"""How long a trial waits for its model: a GGUF family loaded straight from the file, on the node's first trial
(converting it into the cache) and on later trials (reading the converted folder).

    python benchmarks/bench_model_load.py --families smollm2-135m,gemma3-270m --out results/model_load.json

Each load (tokenizer + model, float32, CPU) runs in a fresh process, as a trial's does, against a fresh
``$CALSWEEP_CACHE_DIR``: ``direct`` is transformers' GGUF loader (what every trial did before the cache),
``first`` converts and stores the folders and loads them, ``cached`` (``--repeats`` times) reads them. The GGUF is
fetched before any timing. ``agrees`` compares the cached model with the direct one: the same token ids for a
sample text and logits within ``1e-5``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file from any directory, uninstalled

SAMPLE = "Below is an instruction that describes a task. Write a response that appropriately completes the request."


def _load(family: str, mode: str) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from common.models import gguf_path, load_model, load_tokenizer, resolve_model

    spec = resolve_model(family)
    if mode == "direct":
        path = gguf_path(spec)
        return (AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name),
                AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32))
    return load_tokenizer(spec), load_model(spec)


def child(family: str, mode: str, out: Path) -> None:
    """One timed load in this process; with ``out``, the sample's ids and logits are saved there."""
    started = time.perf_counter()
    tokenizer, model = _load(family, mode)
    seconds = time.perf_counter() - started
    ids = tokenizer(SAMPLE, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    torch.save({"ids": ids, "logits": logits}, out)
    print(json.dumps({"seconds": seconds}))


def _timed(family: str, mode: str, env: dict[str, str], out: Path) -> float:
    done = subprocess.run([sys.executable, __file__, "--child", family, mode, str(out)], env=env,
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])["seconds"]


def bench(family: str, repeats: int) -> dict[str, Any]:
    """Direct, first and cached load times of one family, each in a fresh process, and whether they agree."""
    from common.models import gguf_path, resolve_model

    with tempfile.TemporaryDirectory(prefix="calsweep-load-") as scratch:
        env = {**os.environ, "CALSWEEP_CACHE_DIR": scratch}
        os.environ["CALSWEEP_CACHE_DIR"] = scratch
        gguf = gguf_path(resolve_model(family))  # fetched (or assembled) before anything is timed
        direct = _timed(family, "direct", env, Path(scratch, "direct.pt"))
        first = _timed(family, "cache", env, Path(scratch, "first.pt"))
        cached = [_timed(family, "cache", env, Path(scratch, "cached.pt")) for _ in range(repeats)]
        a, b = torch.load(Path(scratch, "direct.pt")), torch.load(Path(scratch, "cached.pt"))
        diff = float((a["logits"] - b["logits"]).abs().max()) if a["ids"].equal(b["ids"]) else float("inf")
        return {"family": family, "gguf_bytes": gguf.stat().st_size, "direct_s": direct, "first_s": first,
                "cached_s": cached, "max_abs_logit_diff": diff, "agrees": diff <= 1e-5,
                "converted_bytes": sum(p.stat().st_size for p in Path(scratch, "converted").rglob("*") if p.is_file())}


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", default="smollm2-135m,gemma3-270m", help="comma-separated GGUF families")
    parser.add_argument("--repeats", type=int, default=2, help="cached loads per family")
    parser.add_argument("--out", type=Path, help="also write the results here as JSON")
    parser.add_argument("--child", nargs=3, metavar=("FAMILY", "MODE", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child[0], args.child[1], Path(args.child[2]))
        return []
    results = [bench(family, args.repeats) for family in args.families.split(",")]
    text = json.dumps({"device": "cpu", "torch_threads": torch.get_num_threads(), "results": results}, indent=1)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return results


if __name__ == "__main__":
    main()
