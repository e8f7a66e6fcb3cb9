"""One real trial per engine (``train.engine``: DeepSpeed, FSDP2) through ``trainable.worker.run_trial`` on N GPUs
of one host, without Ray: the trial's own loop, packing, scoring and rates, side by side on the same work.

    python benchmarks/trial_engines.py --gpus 2 --engines fsdp2,deepspeed --out trial_engines.json
    python benchmarks/trial_engines.py --cpu --shape tiny --steps 2 --eval-limit 4 --out t.json   # a check

Each engine's trial (``--shape``: ``1b``, a random-init Llama-3.2-1B shape, or ``tiny``; packed Alpaca rows of
``--seq-len`` tokens, micro-batch ``--micro-batch``, ``--steps`` optimiser steps, ARC-Easy scoring of
``--eval-limit`` questions; ZeRO-3's layout for both engines) runs under ``torchrun`` in its own processes, after
the engines before it on the same machine (so later ones find Inductor's and Triton's caches filled: list an
engine twice to see it warm). Reports the trial's final metrics: steady tokens/s per GPU (the store's
``tokens_per_s_steady`` over the GPUs), compile warm-up, load / train / scoring seconds, peak GiB (largest over
ranks, scoring included), loss and ARC-Easy accuracy. Prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

SHAPES = {
    "1b": {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
           "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 128256, "max_position_embeddings": 2048,
           "tie_word_embeddings": True},
    "tiny": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "vocab_size": 49152, "max_position_embeddings": 512},
}
ENGINES = ("deepspeed", "fsdp2")
KEPT = ("engine", "zero_stage", "world_size", "micro_batch_size", "tokens_per_s_steady", "wall_warmup_s", "mfu",
        "train_loss", "wall_load_s", "wall_train_s", "wall_eval_s", "arc_easy_accuracy", "attention")


def trial_config(args: argparse.Namespace, engine: str, results: str):
    """The benchmark's trial of ``engine``."""
    from trainable.config import TrialConfig

    family = f"llama-{args.shape}"
    return TrialConfig.from_dict(dict(
        run_name="trial_engines", trial_id=f"{family}-{engine}", family=family, learning_rate=1e-4,
        label_smoothing=0.1, seed=0, data_dir=args.data_dir, results_dir=results,
        custom_models={family: {"architecture": "llama", "tokenizer": args.tokenizer, "config": SHAPES[args.shape]}},
        sft={"max_examples": 20000, "max_seq_len": args.seq_len},
        train={"max_steps": args.steps, "micro_batch_size": args.micro_batch, "gradient_accumulation_steps": 1,
               "precision": "auto", "zero_stage": 3, "engine": engine, "pack": True, "pack_length": args.seq_len,
               "log_every": max(1, args.steps // 4), "val_examples": 0},
        eval={"limit": args.eval_limit, "batch_size": 32, "tasks": ["arc_easy"]}))


def worker(args: argparse.Namespace) -> None:
    """One rank of one engine's trial under torchrun; rank 0 writes the final metrics as JSON."""
    import torch
    import torch.distributed as dist

    from sweeps import store
    from trainable.worker import run_trial

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
    else:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        device = torch.device("cpu")
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    trial = trial_config(args, args.engine, str(Path(args.out).parent / "store"))
    started = time.time()
    final = run_trial(trial, device, rank, world, report=lambda metrics: None, writers=store.trial_writers())
    peak = torch.tensor(torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else 0.0,
                        device=device)
    dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    if rank == 0:
        result = {k: final.get(k) for k in KEPT}
        result.update(tokens_per_s_per_gpu=final["tokens_per_s_steady"] / world, peak_gib=float(peak),
                      wall_s=time.time() - started, shape=args.shape, seq_len=args.seq_len, steps=args.steps,
                      device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                      date=time.strftime("%Y-%m-%d"))
        Path(args.out).write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


def table(results: list[dict]) -> str:
    lines = [f"{'engine':<10} {'tok/s/GPU':>10} {'MFU':>6} {'warm-up s':>9} {'load s':>7} {'train s':>8} "
             f"{'score s':>8} {'peak GiB':>8} {'loss':>7} {'ARC acc':>7}"]
    for r in results:
        if "error" in r:
            lines.append(f"{r['engine']:<10} {r['error']}")
            continue
        mfu = f"{100 * r['mfu']:>5.1f}%" if r["mfu"] is not None else f"{'-':>6}"
        lines.append(f"{r['engine']:<10} {r['tokens_per_s_per_gpu']:>10,.0f} {mfu} {r['wall_warmup_s']:>9.1f} "
                     f"{r['wall_load_s']:>7.1f} {r['wall_train_s']:>8.1f} {r['wall_eval_s']:>8.1f} "
                     f"{r['peak_gib']:>8.1f} {r['train_loss']:>7.3f} {r['arc_easy_accuracy']:>7.3f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engines", default="fsdp2,deepspeed", help=f"comma-separated, of {ENGINES}, in run order")
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="1b")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--eval-limit", type=int, default=200, help="ARC-Easy questions scored")
    parser.add_argument("--tokenizer", default="smollm2-135m", help="registry name or local tokenizer directory")
    parser.add_argument("--data-dir", default=os.environ.get("CALSWEEP_DATA_DIR"),
                        help="data root with alpaca/ and arc_easy/ (default $CALSWEEP_DATA_DIR, else the hub)")
    parser.add_argument("--cpu", action="store_true", help="without GPUs: one gloo rank on the CPU (a check)")
    parser.add_argument("--out", default="trial_engines.json")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--engine", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args)
        return
    engines = [e for e in args.engines.split(",") if e]
    if not engines or set(engines) - set(ENGINES):
        parser.error(f"--engines: expected a comma-separated list of {ENGINES}, got {args.engines!r}")
    ranks = 1 if args.cpu else args.gpus
    out = Path(args.out).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    results = []
    for i, engine in enumerate(engines):
        part = out.with_suffix(f".{i}.{engine}.json")
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}",
                   __file__, "--worker", "--engine", engine, "--out", str(part)] + \
            [f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items()
             if k in ("shape", "steps", "micro_batch", "seq_len", "eval_limit", "tokenizer", "data_dir") and v]
        code = subprocess.run(command).returncode
        results.append(json.loads(part.read_text()) if code == 0 and part.exists()
                       else {"engine": engine, "error": f"exit code {code}"})
        out.write_text(json.dumps(results, indent=1))  # what has run so far
    print("\n" + table(results))


if __name__ == "__main__":
    main()
