"""A trial's scoring phase at several scoring batches: seconds, forwards and memory of each, same answers.

    python benchmarks/bench_scoring_batch.py --shape 1b --tokenizer DIR --limit 400 --out scoring_1b.json
    python benchmarks/bench_scoring_batch.py --shape 8b --tokenizer DIR --batches 8:none,64:plan --out scoring_8b.json
    python benchmarks/bench_scoring_batch.py --shape tiny --limit 8 --batches 2:none,8:64 --out /tmp/s.json  # CPU

Runs what ``trainable.worker.score`` runs after training, on a random-init model of a
``bench_sft_throughput.SHAPES`` shape (bf16 on a GPU, float32 on the CPU) or on ``--model`` (a registry name or
path): ``calibration.evaluate.evaluate_model`` over ``--tasks`` (first ``--limit`` questions each; tokenised plans
cached in a fresh folder by a pass before the timed ones, as a sweep's later trials find them) and
``calibration.entropy.prompt_states.evaluation_entropy_stats``, once per ``--batches`` entry ``ROWS:TOKENS``: at
most ROWS rows and TOKENS padded tokens a forward (``none``: no token cap; ``plan``: the cap a sweep plans for the
trial, ``trainable.layout.planned_scoring_tokens`` of the 1-GPU FSDP2 layout at ``--micro-batch`` rows of
``--seq-len``, no layer recomputed). Reported per entry: seconds of each pass, decoder forwards, each pass's
allocator peak above what was allocated before it (the model) against ``trainable.layout``'s prediction
(``scoring_activation_bytes`` of the cap, ``entropy_stats_bytes``), accuracy, and the largest log-likelihood
difference from the first entry (bf16 batches round differently). ``--memory-at-peak K``: what entry K's peak
holds, by allocating line (``benchmarks/memory_at_peak.py``).
Prints a table and writes JSON.
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
from benchmarks import memory_at_peak  # noqa: E402
from benchmarks.bench_sft_throughput import SHAPES, _model  # noqa: E402
from calibration.entropy.prompt_states import evaluation_entropy_stats  # noqa: E402
from calibration.evaluate import evaluate_model  # noqa: E402
from common.provenance import git_revision  # noqa: E402
from trainable.layout import (ModelShape, entropy_stats_bytes, planned_scoring_tokens,  # noqa: E402
                              scoring_activation_bytes)

GIB = 2**30


def parse_batches(text: str) -> list[tuple[int, int | str | None]]:
    """'8:none,64:plan,32:16384' -> [(8, None), (64, 'plan'), (32, 16384)]; a bad entry raises naming it."""
    entries = []
    for item in text.split(","):
        rows, _, tokens = item.partition(":")
        try:
            cap: int | str | None = None if tokens == "none" else tokens if tokens == "plan" else int(tokens)
            entry = (int(rows), cap)
        except ValueError:
            raise ValueError(f"expected ROWS:TOKENS entries (TOKENS a number, 'none' or 'plan'), got {item!r}") \
                from None
        if entry[0] < 1 or isinstance(cap, int) and cap < 1:
            raise ValueError(f"expected ROWS >= 1 and TOKENS >= 1, got {item!r}")
        entries.append(entry)
    return entries


def _gib(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_entry(model: Any, tokenizer: Any, args: argparse.Namespace, rows: int, tokens: int | None,
              plans: str) -> tuple[dict[str, Any], np.ndarray]:
    """One scoring phase at ``rows`` x ``tokens``: its measurements and every question's log-likelihoods."""
    device = next(model.parameters()).device
    forwards = [0]
    hook = model.get_decoder().register_forward_pre_hook(lambda *_: forwards.__setitem__(0, forwards[0] + 1))
    try:
        base = _start_pass(device)
        started = time.perf_counter()
        result = evaluate_model(model, tokenizer, tasks=args.tasks, data_dir=args.data_dir, limit=args.limit,
                                batch_size=rows, batch_tokens=tokens, progress=False, prompt_cache=plans)
        score_peak = _pass_peak(device, base)
        scored = time.perf_counter()
        score_forwards = forwards[0]
        base = _start_pass(device)
        evaluation_entropy_stats(model, tokenizer, args.tasks, data_dir=args.data_dir, limit=args.limit,
                                 batch_size=rows, batch_tokens=tokens)
        entropy_peak = _pass_peak(device, base)
        ended = time.perf_counter()
    finally:
        hook.remove()
    loglik = np.concatenate([np.asarray(ll) for ll in result.records.column("loglik").to_pylist()])
    accuracy = float(np.mean(result.records.column("correct").to_numpy(zero_copy_only=False)))
    return {"batch_size": rows, "batch_tokens": tokens, "score_s": scored - started, "entropy_s": ended - scored,
            "total_s": ended - started, "score_forwards": score_forwards,
            "entropy_forwards": forwards[0] - score_forwards,
            "score_peak_gib": score_peak, "entropy_peak_gib": entropy_peak, "accuracy": accuracy}, loglik


def _start_pass(device: torch.device) -> int:
    """Synchronise and reset the allocator's peak; what is allocated now (bytes; 0 off CUDA)."""
    _synchronize(device)
    if device.type != "cuda":
        return 0
    torch.cuda.reset_peak_memory_stats(device)
    return torch.cuda.memory_allocated(device)


def _pass_peak(device: torch.device, base: int) -> float | None:
    """The allocator's peak since ``_start_pass`` above its ``base`` (GiB; None off CUDA)."""
    _synchronize(device)
    return (torch.cuda.max_memory_allocated(device) - base) / GIB if device.type == "cuda" else None


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    from common.models import load_pretrained, load_tokenizer, resolve_model

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", default="1b", choices=sorted(SHAPES), help="random-init model shape")
    parser.add_argument("--model", default=None, help="a registry name or path instead of --shape")
    parser.add_argument("--tokenizer", default="smollm2-135m", help="random-init shapes: a family or tokenizer folder")
    parser.add_argument("--tasks", default="arc_easy", type=lambda s: tuple(s.split(",")))
    parser.add_argument("--limit", type=int, default=400, help="first N questions of each task")
    parser.add_argument("--batches", default="8:none,32:none,64:plan", type=parse_batches,
                        help="ROWS:TOKENS entries, comma-separated (TOKENS: a number, none or plan)")
    parser.add_argument("--micro-batch", type=int, default=4, help="'plan': the training rows a step per GPU")
    parser.add_argument("--seq-len", type=int, default=2048, help="'plan': the training row length")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--memory-at-peak", type=int, default=None, metavar="K",
                        help="record the allocator's history through entry K (0-based) and report what its peak holds")
    parser.add_argument("--out", required=True, help="JSON file for the results")
    args = parser.parse_args(argv)

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if args.model:
        model, tokenizer = load_pretrained(args.model, dtype=torch.bfloat16 if device.type == "cuda" else torch.float32,
                                           device=device)
    else:
        model, tokenizer = _model(args.shape, device).eval(), load_tokenizer(resolve_model(args.tokenizer))
    shape = ModelShape.from_config(model.config, sum(p.numel() for p in model.parameters()))
    plans = tempfile.mkdtemp(prefix="plans-")
    evaluate_model(model, tokenizer, tasks=args.tasks, data_dir=args.data_dir, limit=args.limit, progress=False,
                   prompt_cache=plans)  # tokenises into the plan cache, and warms the kernels up
    entries, reference = [], None
    for rows, tokens in args.batches:
        cap = planned_scoring_tokens(shape, 3, 1, args.micro_batch, args.seq_len, engine="fsdp2") \
            if tokens == "plan" else tokens
        recording = args.memory_at_peak == len(entries) and device.type == "cuda"
        if recording:
            memory_at_peak.start()
        entry, loglik = run_entry(model, tokenizer, args, rows, cap, plans)
        if recording:
            entry["memory_at_peak"] = memory_at_peak.at_peak(torch.cuda.memory._snapshot(), device.index or 0)
            torch.cuda.memory._record_memory_history(enabled=None)
        entry["planned"] = tokens == "plan"
        entry["score_predicted_gib"] = None if cap is None else scoring_activation_bytes(shape, cap) / GIB
        entry["entropy_predicted_gib"] = entropy_stats_bytes(shape) / GIB
        reference = loglik if reference is None else reference
        entry["max_abs_loglik_diff"] = float(np.max(np.abs(loglik - reference)))
        entries.append(entry)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or platform.machine()
    report = {"date": time.strftime("%Y-%m-%d"), "device": name, "torch": torch.__version__,
              "git_revision": git_revision(), "model": args.model or f"random-init {args.shape}",
              "tasks": list(args.tasks), "limit": args.limit, "entries": entries}
    print(f"scoring {','.join(args.tasks)} (first {args.limit}), {report['model']} on {name}")
    print(f"{'rows':>6}{'tokens':>9}{'score s':>9}{'entropy s':>11}{'total s':>9}{'forwards':>10}"
          f"{'score GiB':>11}{'predicted':>11}{'entropy GiB':>13}{'predicted':>11}{'accuracy':>10}{'max dLL':>10}")
    for e in entries:
        gib = [_gib(e[key]) for key in ("score_peak_gib", "score_predicted_gib", "entropy_peak_gib",
                                        "entropy_predicted_gib")]
        print(f"{e['batch_size']:>6}{str(e['batch_tokens']):>9}{e['score_s']:>9.2f}{e['entropy_s']:>11.2f}"
              f"{e['total_s']:>9.2f}{e['score_forwards'] + e['entropy_forwards']:>10}{gib[0]:>11}{gib[1]:>11}"
              f"{gib[2]:>13}{gib[3]:>11}{100 * e['accuracy']:>9.2f}%{e['max_abs_loglik_diff']:>10.2e}")
    for e in entries:
        if "memory_at_peak" in e:
            print(f"entry {e['batch_size']}:{e['batch_tokens']}: " + memory_at_peak.table(e["memory_at_peak"]))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    main()
