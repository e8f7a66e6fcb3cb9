"""Does SFT with the fused kernel track the PyTorch path? Same seed, same data, N steps each; compare loss curves.

    python benchmarks/sft_kernel_parity.py --family smollm2-135m --steps 200 --out parity.json

Runs ``trainable.worker.run_trial`` twice (``train.loss_impl`` = fused, then torch: logits + F.cross_entropy),
one process, one rank, and reports the per-step loss difference against the run-to-run noise of bf16 (the
largest step-to-step change of the torch curve is printed for scale). Writes JSON and a PNG of both curves.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _init_one_rank() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    import torch

    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo", rank=0, world_size=1)


def run(args: argparse.Namespace) -> dict:
    import torch

    from trainable.config import TrialConfig
    from trainable.worker import run_trial

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    _init_one_rank()
    curves = {}
    for impl in ("fused", "torch"):
        trial = TrialConfig.from_dict(dict(
            run_name="parity", trial_id=impl, family=args.family, learning_rate=args.lr,
            label_smoothing=args.beta, seed=args.seed, data_dir=args.data_dir,
            custom_models=json.loads(args.custom_models) if args.custom_models else {},
            sft={"max_examples": args.steps * args.micro_batch, "max_seq_len": args.seq_len},
            train={"max_steps": args.steps, "micro_batch_size": args.micro_batch, "zero_stage": args.zero_stage,
                   "precision": args.precision, "loss_impl": impl, "warmup_ratio": 0.05},
            eval={"tasks": []}))
        reports: list[dict] = []
        started = time.time()
        run_trial(trial, device, 0, 1, reports.append)
        curves[impl] = {"loss": [r["train_loss"] for r in reports if r["phase"] == "train"],
                        "seconds": time.time() - started}
        torch.cuda.empty_cache() if device.type == "cuda" else None
    fused, reference = curves["fused"]["loss"], curves["torch"]["loss"]
    diffs = [abs(a - b) for a, b in zip(fused, reference)]
    noise = max(abs(b - a) for a, b in zip(reference, reference[1:])) if len(reference) > 1 else 0.0
    tail = slice(max(0, len(diffs) - 20), len(diffs))
    return {"family": args.family, "steps": args.steps, "beta": args.beta, "precision": args.precision,
            "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
            "date": time.strftime("%Y-%m-%d"), "max_abs_diff": max(diffs), "mean_abs_diff": sum(diffs) / len(diffs),
            "final_fused": sum(fused[tail]) / len(fused[tail]), "final_torch": sum(reference[tail]) / len(reference[tail]),
            "largest_step_change_torch": noise, "curves": curves}


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for impl, style in (("torch", "-"), ("fused", "--")):
        ax.plot(result["curves"][impl]["loss"], style, label=f"{impl} ({result['curves'][impl]['seconds']:.0f} s)")
    ax.set(xlabel="optimiser step", ylabel="train loss (label-smoothed)",
           title=f"{result['family']} beta={result['beta']} {result['precision']} on {result['device']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--family", default="smollm2-135m")
    parser.add_argument("--custom-models", default=None, help="JSON of custom_models (random-init families)")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--beta", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--zero-stage", type=int, default=2)
    parser.add_argument("--precision", default="auto")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--out", default="sft_kernel_parity.json")
    args = parser.parse_args()
    result = run(args)
    print(f"{'impl':<6} {'final loss (mean of last 20)':>30} {'seconds':>8}")
    for impl in ("fused", "torch"):
        print(f"{impl:<6} {result[f'final_{impl}']:>30.5f} {result['curves'][impl]['seconds']:>8.1f}")
    print(f"max |fused - torch| over {result['steps']} steps: {result['max_abs_diff']:.5f} "
          f"(mean {result['mean_abs_diff']:.5f}; largest step-to-step change of the torch curve "
          f"{result['largest_step_change_torch']:.5f})")
    Path(args.out).write_text(json.dumps(result, indent=1))
    plot(result, str(Path(args.out).with_suffix(".png")))


if __name__ == "__main__":
    main()
