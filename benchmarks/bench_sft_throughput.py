"""SFT throughput of a trial: calsweep's loop (DeepSpeed ZeRO-2 + fused label-smoothed loss) vs Hugging Face Trainer.

    python benchmarks/bench_sft_throughput.py --out throughput.json     # Trainer, calsweep eager and compiled

Model: Llama-3.2-1B-shaped (1.24B params, vocab 128256, tied embeddings), random init, bf16, sequence 2048,
batch 4, beta 0.1, random tokens. Each implementation runs in its own process (clean peak-memory counters):
``--warmup`` steps, then ``--steps`` timed optimiser steps. Reports tokens/s, MFU and peak allocated memory.
calsweep runs its trial loop (trainable/worker.py): DeepSpeed engine, fused loss, torch's fused AdamW, and on
CUDA each decoder layer under torch.compile (``calsweep_eager``: without, to show what compiling buys).
MFU = tokens/s * (6 N + 12 L d T) / peak bf16 FLOP/s (989e12 for H100/H200 SXM dense), N = non-embedding params
+ the LM head, as in the peers' anchor in ../shared/device/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PEAK_FLOPS = 989e12
IMPLS = ("hf_trainer", "calsweep_eager", "calsweep")
SHAPE = dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
             num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=True, rope_theta=500000.0,
             max_position_embeddings=2048, head_dim=64)


def _model(dtype):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    config = AutoConfig.for_model("llama", **SHAPE, attn_implementation="sdpa")
    return AutoModelForCausalLM.from_config(config, dtype=dtype)


def _flops_per_token(model, seq_len: int) -> float:
    embedding = model.get_input_embeddings().weight.numel()
    n = sum(p.numel() for p in model.parameters()) - embedding + model.get_output_embeddings().weight.numel()
    return 6 * n + 12 * SHAPE["num_hidden_layers"] * SHAPE["hidden_size"] * seq_len


def _batch(args, device):
    import torch

    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, SHAPE["vocab_size"], (args.batch, args.seq_len), generator=g).to(device)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}


def run_calsweep(args) -> dict:
    import torch
    import torch.distributed as dist

    from trainable.compiled import compile_wanted, compiled_decoder_layers
    from trainable.config import TrainConfig
    from trainable.deepspeed_setup import build_engine
    from trainable.lm_head import CausalLMWithFusedLoss

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    dist.init_process_group("nccl", rank=0, world_size=1)
    device = torch.device("cuda")
    model = _model(torch.float32)
    flops = _flops_per_token(model, args.seq_len)
    wrapped = CausalLMWithFusedLoss(model, label_smoothing=args.beta)
    train = TrainConfig(max_steps=args.warmup + args.steps, micro_batch_size=args.batch, precision="bf16",
                        zero_stage=args.zero_stage, warmup_ratio=0.0, compile=args.impl == "calsweep")
    engine, _ = build_engine(wrapped, train, 1e-5, args.warmup + args.steps, device, 1)
    batch = _batch(args, device)

    def step() -> torch.Tensor:  # the trial loop's micro-step (trainable/worker.py)
        loss = engine(**batch)
        engine.backward(loss)
        engine.step()
        return loss

    with compiled_decoder_layers(model, compile_wanted(train.compile, device)) as compiled:
        torch.cuda.reset_peak_memory_stats()
        for _ in range(args.warmup):
            step()
        torch.cuda.synchronize()
        started = time.perf_counter()
        for _ in range(args.steps):
            loss = step()
        torch.cuda.synchronize()
        seconds = time.perf_counter() - started
        name = f"calsweep (DeepSpeed ZeRO-{args.zero_stage}, fused LS-CE{', compiled layers' if compiled else ''})"
        result = _result(name, args, seconds, flops, float(loss))
        if args.profile:
            _profile(step, args.profile, args.trace)
    return result


def _profile(step, steps: int, trace: str | None) -> None:
    """Print the CUDA-time table of ``steps`` more steps (after the timed ones, so timing is unaffected);
    with ``trace`` also write their Chrome trace there (gzip when the name ends in .gz)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=40, max_name_column_width=70))
    if trace:
        prof.export_chrome_trace(trace)


def run_hf_trainer(args) -> dict:
    import torch
    from torch.utils.data import Dataset
    from transformers import Trainer, TrainerCallback, TrainingArguments

    class Repeated(Dataset):
        def __init__(self, item, n):
            self.item, self.n = item, n

        def __len__(self):
            return self.n

        def __getitem__(self, index):
            return {k: v[index % v.shape[0]] for k, v in self.item.items()}

    class Clock(TrainerCallback):
        def __init__(self):
            self.started = None

        def on_step_begin(self, targs, state, control, **kwargs):
            if state.global_step == args.warmup:
                torch.cuda.synchronize()
                self.started = time.perf_counter()

    model = _model(torch.float32)
    flops = _flops_per_token(model, args.seq_len)
    clock = Clock()
    total = args.warmup + args.steps
    targs = TrainingArguments(output_dir="/tmp/hf_trainer_bench", per_device_train_batch_size=args.batch,
                              max_steps=total, bf16=True, label_smoothing_factor=args.beta, optim="adamw_torch_fused",
                              learning_rate=1e-5, lr_scheduler_type="constant", logging_steps=10**6,
                              save_strategy="no", report_to=[], dataloader_num_workers=0, seed=0)
    data = Repeated({k: v.cpu() for k, v in _batch(args, "cpu").items()}, args.batch * total)
    trainer = Trainer(model=model, args=targs, train_dataset=data, callbacks=[clock])
    torch.cuda.reset_peak_memory_stats()
    output = trainer.train()
    torch.cuda.synchronize()
    seconds = time.perf_counter() - clock.started
    return _result("Hugging Face Trainer (label_smoothing_factor)", args, seconds, flops, float(output.training_loss))


def _result(name: str, args, seconds: float, flops_per_token: float, loss: float) -> dict:
    import torch

    tokens_per_s = args.steps * args.batch * args.seq_len / seconds
    return {"impl": name, "tokens_per_s": tokens_per_s, "mfu": tokens_per_s * flops_per_token / PEAK_FLOPS,
            "peak_gib": torch.cuda.max_memory_allocated() / 2**30, "step_ms": 1000 * seconds / args.steps,
            "last_loss": loss, "device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"),
            "batch": args.batch, "seq_len": args.seq_len, "beta": args.beta, "steps": args.steps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--impl", choices=["all"] + list(IMPLS), default="all",
                        help="calsweep: the trial loop as on CUDA (decoder layers compiled); calsweep_eager: without")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--beta", type=float, default=0.1)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--zero-stage", type=int, default=2)
    parser.add_argument("--profile", type=int, default=0,
                        help="calsweep: profile this many extra steps, print the table")
    parser.add_argument("--trace", default=None, help="with --profile: write the Chrome trace here (.json or .json.gz)")
    parser.add_argument("--out", default="sft_throughput.json")
    args = parser.parse_args()
    if args.impl != "all":
        result = run_hf_trainer(args) if args.impl == "hf_trainer" else run_calsweep(args)
        Path(args.out).write_text(json.dumps(result))
        return
    results = []
    for impl in IMPLS:
        part = Path(args.out).with_suffix(f".{impl}.json")
        command = [sys.executable, __file__, "--impl", impl, "--out", str(part)] + \
            [f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items()
             if k not in ("impl", "out") and v is not None]
        completed = subprocess.run(command, text=True)
        results.append(json.loads(part.read_text()) if completed.returncode == 0 and part.exists()
                       else {"impl": impl, "error": f"exit code {completed.returncode}"})
    trainer = results[0].get("tokens_per_s")
    print(f"\n{'implementation':<56} {'tokens/s':>10} {'MFU':>7} {'peak GiB':>9} {'step ms':>8} {'vs Trainer':>10}")
    for r in results:
        if "error" in r:
            print(f"{r['impl']:<56} failed ({r['error']})")
            continue
        ratio = f"{r['tokens_per_s'] / trainer:.2f}x" if trainer else "-"
        print(f"{r['impl']:<56} {r['tokens_per_s']:>10,.0f} {100 * r['mfu']:>6.1f}% {r['peak_gib']:>9.1f} "
              f"{r['step_ms']:>8.1f} {ratio:>10}")
    Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
