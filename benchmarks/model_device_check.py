"""Does a model compute on this device what it computes on the CPU? A check to run before a sweep on new hardware
or a new software stack.

    python benchmarks/model_device_check.py --model gemma3-270m --data-dir ../shared/data --out results/check.json

The reference is the mean loss (beta = 0, PyTorch loss) of the first ``--examples`` Alpaca SFT examples, as the
trial loop tokenises them, in float32 on the CPU. On ``--device`` the same loss is computed in float32 and bf16
under SDPA's own kernel choice and under each kernel alone (math, memory-efficient, Flash, cuDNN; "fails: ..."
where one cannot run), with padding to 1 and to 64 tokens, and through the fused loss; then the trial's attention
check (``trainable.attention_check``) picks its kernels and the untrained model scores the first ``--arc-limit``
ARC-Easy questions under them. ``agrees``: the bf16 loss under the chosen kernels is within 5% of the CPU's
(bf16 rounding moves it by well under 1%). This is what found that transformers 5.17 loads Gemma-3-270M's GGUF
into a broken model on every device (docs/results/2026-11-23).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import torch
from torch.nn.attention import SDPBackend

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file from any directory, uninstalled

KERNELS = {"math": SDPBackend.MATH, "efficient": SDPBackend.EFFICIENT_ATTENTION,
           "flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
AGREEMENT = 0.05


def mean_loss(wrapped: Any, examples: list[dict], pad_token_id: int, pad_to: int, device: str,
              kernel: SDPBackend | None = None) -> float | str:
    """The wrapped model's loss on one batch of ``examples`` (no gradient), or "fails: ..." for a kernel that
    cannot run these inputs."""
    from trainable.attention_check import kernels
    from trainable.sft_data import collate

    batch = {k: v.to(device) for k, v in collate(examples, pad_token_id, pad_to).items()}
    try:
        with torch.no_grad(), kernels([kernel] if kernel else None):
            return float(wrapped(**batch))
    except RuntimeError as exc:
        return f"fails: {str(exc).splitlines()[0][:120]}"


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    import transformers

    from calibration.evaluate import evaluate_model
    from trainable.attention_check import choose_attention
    from trainable.config import SFTConfig
    from trainable.lm_head import CausalLMWithFusedLoss
    from common.models import load_pretrained
    from trainable.sft_data import build_sft_examples, collate

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m", help="registry name, hub id or local path")
    parser.add_argument("--data-dir", default=None, help="local data root (Alpaca and ARC-Easy); default: the hub")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--examples", type=int, default=8, help="Alpaca examples in the loss batch")
    parser.add_argument("--arc-limit", type=int, default=200, help="ARC-Easy questions scored after the check")
    parser.add_argument("--out", required=True, help="JSON file for the results")
    args = parser.parse_args(argv)

    model, tokenizer = load_pretrained(args.model)
    examples = build_sft_examples(SFTConfig(max_examples=max(64, args.examples)), tokenizer, 0, args.data_dir)
    examples = examples[: args.examples]
    wrapped = CausalLMWithFusedLoss(model, 0.0, "pytorch").eval()
    report: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "model": args.model, "device": args.device,
                              "transformers": transformers.__version__, "torch": torch.__version__}
    report["cpu_float32"] = mean_loss(wrapped, examples, tokenizer.pad_token_id, 1, "cpu")
    wrapped.to(args.device)
    for dtype in (torch.float32, torch.bfloat16):
        wrapped.to(dtype)
        name = str(dtype).removeprefix("torch.")
        for pad_to in (1, 64):
            report[f"{name}_pad{pad_to}_sdpa_choice"] = mean_loss(wrapped, examples, tokenizer.pad_token_id, pad_to,
                                                                  args.device)
        for kernel_name, kernel in KERNELS.items():
            report[f"{name}_pad64_{kernel_name}"] = mean_loss(wrapped, examples, tokenizer.pad_token_id, 64,
                                                              args.device, kernel)
    wrapped.loss_impl = "fused"
    report["bfloat16_pad64_fused_loss"] = mean_loss(wrapped, examples, tokenizer.pad_token_id, 64, args.device)
    wrapped.loss_impl = "pytorch"
    probe = {k: v.to(args.device) for k, v in collate(examples, tokenizer.pad_token_id, 64).items()}
    wrapped.train()
    choice = choose_attention(model, lambda: wrapped(**probe))
    wrapped.eval()
    report["attention_check"] = {"kept": choice.name, "report": choice.report}
    with choice.context():
        chosen = mean_loss(wrapped, examples, tokenizer.pad_token_id, 64, args.device)
    report["bfloat16_pad64_chosen"] = chosen
    report["agrees"] = isinstance(chosen, float) and abs(chosen - report["cpu_float32"]) <= AGREEMENT * abs(
        report["cpu_float32"])
    result = evaluate_model(model, tokenizer, tasks=["arc_easy"], data_dir=args.data_dir, limit=args.arc_limit,
                            batch_size=64, progress=False, attention=choice.backends)
    report["arc_easy"] = {k: float(result.summary["arc_easy"][k]) for k in ("accuracy", "ece", "n_questions")}

    print(f"{args.model} on {args.device} (transformers {transformers.__version__}): mean loss of "
          f"{len(examples)} Alpaca examples, CPU float32 reference {report['cpu_float32']:.4f}")
    for key, value in report.items():
        if key.startswith(("float32_", "bfloat16_")):
            print(f"  {key:<32}{value if isinstance(value, str) else f'{value:.4f}'}")
    print(f"attention kernels kept: {choice.name}; agrees with the CPU (within {AGREEMENT:.0%}): {report['agrees']}; "
          f"ARC-Easy accuracy {report['arc_easy']['accuracy']:.3f} on {int(report['arc_easy']['n_questions'])}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    main()
