"""Does SFT with the fused kernel track the PyTorch path? Same seed, same data, N steps each; compare loss curves.

    python benchmarks/sft_kernel_parity.py --family smollm2-135m --steps 200 --out parity.json
    python benchmarks/sft_kernel_parity.py --family gemma3-270m --impls torch fused loose --out loose.json

Runs ``trainable.worker.run_trial`` once per implementation, one process, one rank: ``torch`` (logits +
F.cross_entropy, the reference), ``fused`` (kernels.linear_cross_entropy with its default filter="exact"), ``loose``
(filter="loose") and ``none`` (filter="none": every logit tile). Reports each curve's per-step loss difference from
the reference's, and loose's from fused's, against the noise of bf16 training: |fused - torch| is what two exact
implementations differ by (the largest step-to-step change of the torch curve is printed for scale). Writes JSON and
a PNG of the curves.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common.ports import free_port  # noqa: E402 - the repository's root, inserted above


IMPLS = ("torch", "fused", "loose", "none")  # loss_impl torch | fused with filter exact, loose or none
FILTER_OF = {"torch": "exact", "fused": "exact", "loose": "loose", "none": "none"}


def _init_one_rank() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        return
    port = free_port()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    import torch

    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo", rank=0, world_size=1)


def run(args: argparse.Namespace) -> dict:
    import torch

    from trainable.config import TrialConfig
    from sweeps import store
    from trainable.worker import run_trial

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    _init_one_rank()
    curves = {}
    for impl in args.impls:
        trial = TrialConfig.from_dict(dict(
            run_name="parity", trial_id=impl, family=args.family, learning_rate=args.lr,
            label_smoothing=args.beta, seed=args.seed, data_dir=args.data_dir,
            custom_models=json.loads(args.custom_models) if args.custom_models else {},
            sft={"max_examples": args.steps * args.micro_batch, "max_seq_len": args.seq_len},
            train={"max_steps": args.steps, "micro_batch_size": args.micro_batch, "zero_stage": args.zero_stage,
                   "precision": args.precision, "loss_impl": "torch" if impl == "torch" else "fused",
                   "loss_filter": FILTER_OF[impl], "warmup_ratio": 0.05,
                   "log_every": 1},
            eval={"tasks": []}))
        reports: list[dict] = []
        started = time.time()
        run_trial(trial, device, 0, 1, reports.append, writers=store.trial_writers())
        curves[impl] = {"loss": [r["train_loss"] for r in reports if r["phase"] == "train"],
                        "seconds": time.time() - started}
        torch.cuda.empty_cache() if device.type == "cuda" else None
    reference = curves[args.impls[0]]["loss"]
    noise = max(abs(b - a) for a, b in zip(reference, reference[1:])) if len(reference) > 1 else 0.0
    pairs = [(impl, args.impls[0]) for impl in args.impls[1:]]
    pairs += [("loose", "fused")] if {"loose", "fused"} <= set(args.impls) else []
    diffs = {f"{a} - {b}": [x - y for x, y in zip(curves[a]["loss"], curves[b]["loss"])] for a, b in pairs}
    for curve in curves.values():
        tail = curve["loss"][-20:]
        curve["final"] = sum(tail) / len(tail)
    return {"family": args.family, "steps": args.steps, "beta": args.beta, "precision": args.precision,
            "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
            "date": time.strftime("%Y-%m-%d"), "reference": args.impls[0],
            "diffs": {name: {"max_abs": max(map(abs, d)), "mean_abs": sum(map(abs, d)) / len(d),
                             "mean": sum(d) / len(d)} for name, d in diffs.items()},
            "largest_step_change_reference": noise, "curves": curves}


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for impl, style in zip(result["curves"], ("-", "--", ":", "-.")):
        ax.plot(result["curves"][impl]["loss"], style, label=f"{impl} ({result['curves'][impl]['seconds']:.0f} s)")
    ax.set(xlabel="optimiser step", ylabel="train loss (label-smoothed)",
           title=f"{result['family']} beta={result['beta']} {result['precision']} on {result['device']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--family", default="smollm2-135m")
    parser.add_argument("--custom-models", default=None, help="JSON of custom_models (random-init families)")
    parser.add_argument("--impls", nargs="+", default=["torch", "fused"], choices=IMPLS,
                        help="implementations, the first is the reference")
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
    args = parser.parse_args(argv)
    result = run(args)
    print(f"{'impl':<6} {'final loss (mean of last 20)':>30} {'seconds':>8}")
    for impl, curve in result["curves"].items():
        print(f"{impl:<6} {curve['final']:>30.5f} {curve['seconds']:>8.1f}")
    for name, d in result["diffs"].items():
        print(f"{name:<15} over {result['steps']} steps: max |diff| {d['max_abs']:.5f}, mean |diff| "
              f"{d['mean_abs']:.5f}, mean diff {d['mean']:+.5f}")
    print(f"largest step-to-step change of the {result['reference']} curve: "
          f"{result['largest_step_change_reference']:.5f}")
    Path(args.out).write_text(json.dumps(result, indent=1))
    plot(result, str(Path(args.out).with_suffix(".png")))


if __name__ == "__main__":
    main()
