"""MMLU 5-shot questions per second with and without the shared k-shot prefix KV cache, same answers.

    python benchmarks/bench_prefix_sharing.py --model gemma3-270m --prompt-cache /tmp/plans \\
        --data-dir ../shared/data --out results/bench_prefix_sharing.json          # GPU: bf16 by default
    python benchmarks/bench_prefix_sharing.py --model smollm2-135m --limit 8 --device cpu --out /tmp/b.json

Both modes score the first ``--limit`` MMLU test questions with ``calibration.scoring.score_prompts``: with
sharing, each subject's description and five examples run once and every question runs off their KV cache;
without, every question runs its full prompt. Both modes batch under the same caps (``--batch-size`` rows and
``--batch-tokens`` padded row tokens per forward), so a mode with short rows runs more of them per forward.
Reported per mode: seconds (tokenising and model time apart), questions/s, tokens run through the model,
accuracy; and across modes the speed-up, the largest log-likelihood difference and how many predicted answers
differ (bf16 rounding can flip near-ties). With ``--prompt-cache DIR`` the plans go to a fresh folder under DIR
(``calibration.prompt_cache``) and each mode runs a second pass that reads its plan from there, as every trial of a
sweep after the first does; the speed-up of those passes is reported too.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file from any directory, uninstalled
from calibration.prompt_cache import cached_groups  # noqa: E402
from calibration.scoring import score_plan, score_prompts  # noqa: E402
from calibration.task_config import TASKS, load_prompts  # noqa: E402
from common.provenance import git_revision  # noqa: E402


def run_mode(model: Any, tokenizer: Any, prompts: list, gold: np.ndarray, *, share_prefix: bool,
             batch_size: int, batch_tokens: int | None, prompt_cache: str | None = None
             ) -> tuple[dict[str, float], list[np.ndarray]]:
    """Time one full scoring pass, split into tokenising (the plan; read from ``prompt_cache`` when it holds it)
    and the model's forwards; tokens = prefix tokens + row tokens actually run through the model."""
    _synchronize()
    started = time.perf_counter()
    groups = cached_groups(tokenizer, prompts, share_prefix=share_prefix, directory=prompt_cache)
    planned = time.perf_counter()
    loglik = score_plan(model, groups, [len(p.continuations) for p in prompts], batch_size=batch_size,
                        batch_tokens=batch_tokens)
    _synchronize()
    finished = time.perf_counter()
    tokens = sum(len(g.prefix) + sum(len(r.tokens) for r in g.rows) for g in groups)
    accuracy = float(np.mean([np.argmax(ll) == g for ll, g in zip(loglik, gold)]))
    return {"seconds": finished - started, "tokenize_s": planned - started, "model_s": finished - planned,
            "questions_per_s": len(prompts) / (finished - started), "tokens": tokens, "accuracy": accuracy}, loglik


def _synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    from common.models import load_pretrained

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m", help="registry name, hub id or local path")
    parser.add_argument("--limit", type=int, default=None, help="first N MMLU test questions (default: all 14,042)")
    parser.add_argument("--batch-size", type=int, default=256, help="rows per forward, at most")
    parser.add_argument("--batch-tokens", type=int, default=16384, help="padded row tokens per forward, at most")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default=None,
                        help="default bfloat16 on GPU, float32 on CPU")
    parser.add_argument("--warmup", type=int, default=8, help="questions scored once per mode before timing")
    parser.add_argument("--prompt-cache", default=None,
                        help="directory for tokenised plans: each mode then runs twice, the second pass reading its "
                             "plan from there, as every trial of a sweep after the first does")
    parser.add_argument("--out", required=True, help="JSON file for the results")
    args = parser.parse_args(argv)

    dtype = getattr(torch, args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32"))
    model, tokenizer = load_pretrained(args.model, dtype=dtype, device=args.device)
    questions, prompts = load_prompts(TASKS["mmlu"], data_dir=args.data_dir, limit=args.limit)
    gold = np.array([q.gold for q in questions])
    for share in (True, False):
        score_prompts(model, tokenizer, prompts[: args.warmup], batch_size=args.batch_size,
                      batch_tokens=args.batch_tokens, share_prefix=share)
    caps = {"batch_size": args.batch_size, "batch_tokens": args.batch_tokens}
    # a fresh folder per run: plans left by an earlier run would make the first (tokenising) passes cached ones
    plans = None
    if args.prompt_cache:
        Path(args.prompt_cache).mkdir(parents=True, exist_ok=True)
        plans = tempfile.mkdtemp(prefix="run-", dir=args.prompt_cache)
    shared, shared_ll = run_mode(model, tokenizer, prompts, gold, share_prefix=True, prompt_cache=plans, **caps)
    full, full_ll = run_mode(model, tokenizer, prompts, gold, share_prefix=False, prompt_cache=plans, **caps)
    cached = {}
    if plans:
        cached = {"shared_prefix_cached_plan": run_mode(model, tokenizer, prompts, gold, share_prefix=True,
                                                        prompt_cache=plans, **caps)[0],
                  "no_sharing_cached_plan": run_mode(model, tokenizer, prompts, gold, share_prefix=False,
                                                     prompt_cache=plans, **caps)[0]}
    device = torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else platform.processor()
    report = {
        "date": time.strftime("%Y-%m-%d"), "device": device or platform.machine(), "torch": torch.__version__,
        "git_revision": git_revision(), "model": args.model, "dtype": str(dtype), **caps,
        "n_questions": len(prompts), "subjects": sorted({q.subject for q in questions}),
        "shared_prefix": shared, "no_sharing": full,
        "speedup": full["seconds"] / shared["seconds"], "model_speedup": full["model_s"] / shared["model_s"], **cached,
        **({"speedup_cached_plan": cached["no_sharing_cached_plan"]["seconds"]
            / cached["shared_prefix_cached_plan"]["seconds"]} if cached else {}),
        "max_abs_loglik_diff": float(max(np.max(np.abs(a - b)) for a, b in zip(shared_ll, full_ll))),
        "predictions_differ": int(sum(np.argmax(a) != np.argmax(b) for a, b in zip(shared_ll, full_ll))),
    }
    print(f"MMLU 5-shot, {len(prompts)} questions, {args.model} {dtype} on {report['device']}, "
          f"batches of <= {args.batch_size} rows and <= {args.batch_tokens} tokens")
    print(f"{'mode':<14}{'seconds':>10}{'tokenize s':>12}{'model s':>10}{'questions/s':>14}{'tokens':>12}"
          f"{'accuracy':>10}")
    rows = [("shared prefix", shared), ("no sharing", full)]
    if cached:
        rows += [("shared, cached", cached["shared_prefix_cached_plan"]),
                 ("none, cached", cached["no_sharing_cached_plan"])]
    for name, row in rows:
        print(f"{name:<14}{row['seconds']:>10.2f}{row['tokenize_s']:>12.2f}{row['model_s']:>10.2f}"
              f"{row['questions_per_s']:>14.2f}{row['tokens']:>12}{100 * row['accuracy']:>9.2f}%")
    print(f"speed-up {report['speedup']:.2f}x (model time alone {report['model_speedup']:.2f}x); "
          f"max |delta loglik| {report['max_abs_loglik_diff']:.2e}; {report['predictions_differ']} predictions differ")
    if cached:
        print(f"speed-up with the plans cached (tokenised once per sweep): {report['speedup_cached_plan']:.2f}x")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    main()
