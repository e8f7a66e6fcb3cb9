"""Where a sweep trial loses against its benchmark row (issue 45), in one process on one GPU.

    python benchmarks/trial_vs_row.py --tokenizer $PWD/.gpu/tokenizer --out $OUT/trial_vs_row.json     # 1b, one H100
    python benchmarks/trial_vs_row.py --shape tiny --seq-len 128 --max-examples 64 --steps 2 --warmup 1 \\
        --profile-steps 1 --out trial_vs_row.json                                                        # the CPU check

Runs, one after the other on the same device and data:
- ``row``: ``bench_sft_throughput.py``'s ``calsweep`` loop of the row ``<shape>:1:auto:<micro>:alpaca`` (its model,
  layout, engine, packed batches and step, each step's loss read after the next is queued): ``--warmup`` steps,
  then ``--steps`` timed ones.
- ``trial``: the sweep's own trial code, ``trainable.worker.set_up`` and ``train`` without Ray, on the
  ``TrialConfig`` that ``sweep_gpu_utilization.py``'s sweep gives its first grid point (``SweepConfig.trial``: the
  planned layout; learning rate ``--learning-rate``, beta ``--beta``), with its reports and checkpoint hand-off
  going to lists and torch's threads capped as a warm trial's actor caps them (``warm_trial.cap_threads``);
  ``--warmup + --steps`` steps, timed as the trial times them (the steady rate after ``warmup_step_count``).
- ``trial_synced_clock``: the trial with the checkpoint clock read back from the GPU every step, as
  ``CheckpointSchedule.due`` did before issue 45's fix (``.item()`` of a device flag: the host waits for the step).
- levers: the trial with one of its differences from the row set to the row's choice (``LEVERS``).
Each then runs ``--profile-steps`` more steps under ``torch.profiler``: GPU kernel time per step by category
(``CATEGORIES``, first match of the kernel's name), the attention kernels by name (which SDPA backend ran), the
GPU's busy time (union of kernel spans), the profiled window's wall time, and the host's waits for the GPU (CUDA
synchronize calls) per step. Tokens are real (non-padding) tokens. Prints a table and writes JSON.

The paths share one process, so Dynamo's graphs of the decoder layer: a path compiles anew where a guard differs
(the trial's capped thread count is one: Dynamo guards ``torch.get_num_threads()``), else takes an earlier path's
graph. SDPA's kernel is fixed in a graph when it is traced; ``trainable.compiled`` makes the attention check's
kernel set one of its guards, so a path never runs the kernel another path's set traced.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator, NamedTuple

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from benchmarks import bench_sft_throughput as bench  # noqa: E402
from benchmarks import sweep_gpu_utilization as utilization  # noqa: E402

# kernel category -> pattern of the kernel's name (lower case); the first that matches wins
CATEGORIES = (
    ("LS-CE kernel", r"^_\w+_kernel$"),  # the fused loss's Triton kernels (kernels/: _lse_forward_kernel, ...)
    ("fused elementwise", r"^triton_"),  # Inductor's kernels of the compiled decoder layers (norms, rotary, SiLU)
    ("attention", r"flash|fmha|attention|attn|cudnn|sdpa"),
    ("GEMM", r"gemm|cutlass|nvjet|xmma|cublas|matmul|wgmma"),
    ("optimizer", r"adam|multi_tensor|foreach"),  # fused AdamW, clip_grad_norm_'s foreach norms and scaling
    ("FSDP/NCCL copies", r"nccl|memcpy|memset|copy|cat|split"),  # FSDP2's all-gather copies, bf16 casts, H2D
)
OTHER = "other"
SYNCS = ("cudaStreamSynchronize", "cudaEventSynchronize", "cudaDeviceSynchronize")
# lever -> (what it changes on the trial: the row's choice, how): trial config keys, or a run setting
LEVERS = {
    "no_checkpoint_clock": "no checkpoint hand-off, so no checkpoint clock (the row takes no checkpoints)",
    "no_reports": "train.log_every past the last step: no progress reports (the row reports nothing)",
    "no_attention_check": "train.attention_check false: SDPA's own kernels, unchecked (the row does not check)",
    "threads_default": "torch's CPU threads as the process has them (a warm trial's actor caps them at 1)",
    "row_data": "the row's batches (bench_sft_throughput's packed Alpaca rows) instead of the trial's",
    "row_schedule": "learning rate 1e-5, no warm-up (the row's schedule)",
}


class Measured(NamedTuple):
    """One path's steady rate and its profiled steps."""

    name: str
    tokens_per_s: float
    ms_per_step: float
    tokens_per_step: float
    profile: dict[str, float]
    attention_kernels: dict[str, float]  # the profiled attention kernels' names -> ms per step (which SDPA backend ran)
    dynamo: dict[str, int]  # Dynamo's graphs, graph breaks and recompiles in this process so far (cumulative)
    attention: str  # the attention kernel set trained with (trainable.attention_check; the row: SDPA's own choice)
    attention_report: dict[str, str]  # what each candidate measured against the math kernel (the trial's check)


# ---------------------------------------------------------------- the profile of a few steps

def category(kernel: str) -> str:
    """The ``CATEGORIES`` entry of a kernel name, else ``OTHER``."""
    name = kernel.lower()
    return next((label for label, pattern in CATEGORIES if re.search(pattern, name)), OTHER)


def profiled(run_steps: Callable[[], None], steps: int, device: torch.device
             ) -> tuple[dict[str, float], dict[str, float]]:
    """Per step of ``run_steps()`` (which runs ``steps`` steps and returns once the device is done): (kernel ms by
    category, GPU busy ms (union of kernel spans), wall ms, host ms waiting in CUDA synchronize calls and their
    count; the attention category's kernels by name, ms each)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    started = time.perf_counter()
    with profile(activities=activities) as prof:
        run_steps()
    wall = time.perf_counter() - started
    per_category = {label: 0.0 for label, _ in CATEGORIES} | {OTHER: 0.0}
    attention: dict[str, float] = {}
    spans, waits, sync_count = [], 0.0, 0
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            label, ms = category(event.name), event.time_range.elapsed_us() / 1e3
            per_category[label] += ms
            if label == "attention":
                attention[event.name] = attention.get(event.name, 0.0) + ms / steps
            spans.append((event.time_range.start, event.time_range.end))
        elif event.name in SYNCS:
            waits += event.time_range.elapsed_us() / 1e3
            sync_count += 1
    return ({**{f"{k} ms": v / steps for k, v in per_category.items()}, "GPU busy ms": _union_us(spans) / 1e3 / steps,
             "wall ms": 1e3 * wall / steps, "host wait ms": waits / steps, "syncs": sync_count / steps},
            dict(sorted(attention.items(), key=lambda item: -item[1])))


def _union_us(spans: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for start, stop in sorted(spans):
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total


# ---------------------------------------------------------------- (a) the row

def _row_args(args: argparse.Namespace) -> argparse.Namespace:
    """What ``bench_sft_throughput``'s helpers read of its arguments, for this run."""
    return argparse.Namespace(seq_len=args.seq_len, beta=args.beta, tokenizer=args.tokenizer, data_dir=args.data_dir,
                              gpu_memory_gib=None, micro_batch=0, recompute=0)


def row_batches(args: argparse.Namespace, micro_batch: int) -> Iterator[dict[str, torch.Tensor]]:
    row = bench.parse_row(f"{args.shape}:1:auto:{micro_batch}:alpaca")
    return bench._rows_of_data(_row_args(args), row, 0, 1, micro_batch)[0]


def run_row(args: argparse.Namespace, device: torch.device, micro_batch: int) -> Measured:
    """``bench_sft_throughput.run_calsweep``'s ``calsweep`` loop of the row, in this process."""
    from trainable import deepspeed_setup, fsdp2_engine
    from trainable.compiled import compile_wanted, compiled_decoder_layers
    from trainable.config import TrainConfig, preferred_engine
    from trainable.layout import with_layout
    from trainable.lm_head import CausalLMWithFusedLoss
    from trainable.recompute import recomputed_layers
    from trainable.step_accounting import PendingLoss, optimizer_step

    row_args, row = _row_args(args), bench.parse_row(f"{args.shape}:1:auto:{micro_batch}:alpaca")
    shape, layout = bench._layout(row_args, row, device, preferred_engine(TrainConfig()))
    fsdp2 = layout.engine == "fsdp2"
    model = bench._model(row["shape"], device, dtype=torch.float32 if fsdp2 else None)
    wrapped = CausalLMWithFusedLoss(model, label_smoothing=args.beta)
    total = args.warmup + args.steps + args.profile_steps
    compiled = compile_wanted(None, device)  # the row's impl is the trial loop as the trials run it on this device
    train = with_layout(TrainConfig(max_steps=total, precision="auto", warmup_ratio=0.0, compile=compiled), layout,
                        shape)
    build = fsdp2_engine.build_engine if fsdp2 else deepspeed_setup.build_engine
    engine, _ = build(wrapped, train, 1e-5, total, device, 1)
    batches = row_batches(args, layout.micro_batch_size)
    tokens = [0]

    def step() -> PendingLoss:
        micro = [next(batches) for _ in range(layout.gradient_accumulation_steps)]
        tokens[0] += sum(int(batch["attention_mask"].sum()) for batch in micro)
        return PendingLoss(optimizer_step(engine, micro, device, 1), len(micro), 1)

    def steps(count: int) -> None:  # each step's loss read after the next is queued, as bench's _timed
        previous = None
        for _ in range(count):
            pending = step()
            if previous is not None:
                previous.value()
            previous = pending
        previous.value()
        bench._sync_end(device)

    with recomputed_layers(model, layout.checkpointed), compiled_decoder_layers(model, compiled):
        for _ in range(args.warmup):
            steps(1)
        started, tokens[0] = time.perf_counter(), 0
        steps(args.steps)
        seconds, counted = time.perf_counter() - started, tokens[0]
        profile, attention_kernels = profiled(lambda: steps(args.profile_steps), args.profile_steps, device)
    engine.destroy()
    return Measured("row", counted / seconds, 1e3 * seconds / args.steps, counted / args.steps, profile,
                    attention_kernels, bench._dynamo_counts(), "unchecked", {})


# ---------------------------------------------------------------- (b) the trial, (c) its levers

def sweep_trial(args: argparse.Namespace, results: Path):
    """The ``TrialConfig`` of ``sweep_gpu_utilization.py``'s sweep's grid point (lr ``--learning-rate``, beta
    ``--beta``), its ``sft`` and row width set by ``--max-examples`` and ``--seq-len``, its layout planned for this
    GPU's memory; and the sweep."""
    from sweeps.config import TrialPoint, sweep_from_dict

    config = utilization.sweep_config(argparse.Namespace(shapes=[args.shape], trials=8, tokenizer=args.tokenizer,
                                                         steps=args.warmup + args.steps, engine="auto",
                                                         eval_limit=4, micro_batch=None), results, warm=True)
    on_gpu = torch.cuda.is_available()
    config["sft"] = {**utilization.SETTINGS["gpu"][0], "max_examples": args.max_examples, "max_seq_len": args.seq_len}
    config["train"] = {**config["train"], **utilization.SETTINGS["gpu"][1], "pack_length": args.seq_len,
                       **({} if on_gpu else {"precision": "auto"})}  # packed rows as on the GPU; fp32 on the CPU
    config["data_dir"] = args.data_dir
    if on_gpu:  # planned for this GPU's memory, as the launcher plans a sweep's layouts (sweeps.launch)
        config["resources"]["gpu_memory_gb"] = torch.cuda.get_device_properties(0).total_memory / 2**30
    sweep = sweep_from_dict(config)
    point = TrialPoint(sweep.families[0], args.learning_rate, args.beta, sweep.trial_seeds[0])
    return sweep.trial(point), sweep


@contextlib.contextmanager
def synced_checkpoint_clock(device: torch.device) -> Iterator[None]:
    """Within the block the trial's checkpoint clock reads a device flag back every step (``.item()``), as
    ``CheckpointSchedule.due`` did before issue 45's fix."""
    from trainable import checkpointing

    plain = checkpointing.CheckpointSchedule

    class Synced(plain):
        def due(self, step: int) -> bool:
            late = bool(torch.full((), float(time.monotonic() - self.last >= 60 * (self.every_minutes or 1e9)),
                                   device=device).item())
            return super().due(step) or late

    checkpointing.CheckpointSchedule = Synced
    try:
        yield
    finally:
        checkpointing.CheckpointSchedule = plain


def run_trial_path(args: argparse.Namespace, device: torch.device, trial, sweep, name: str,
                   lever: str | None = None) -> Measured:
    """``trainable.worker``'s set_up and train on ``trial`` (with ``lever`` set to the row's choice), then
    ``--profile-steps`` more steps of ``train`` under the profiler."""
    from sweeps import warm_trial
    from trainable import trial_memory, worker

    train = trial.train
    if lever == "no_reports":
        train = dataclasses.replace(train, log_every=10**9)
    if lever == "no_attention_check":
        train = dataclasses.replace(train, attention_check=False)
    trial = dataclasses.replace(trial, train=train)
    if lever == "row_schedule":
        trial = dataclasses.replace(trial, learning_rate=1e-5, train=dataclasses.replace(train, warmup_ratio=0.0))
    threads = torch.get_num_threads()
    if lever != "threads_default":
        warm_trial.cap_threads(sweep)
    reports, handed = [], []

    def report_checkpoint(metrics: dict[str, Any], directory: Path | None) -> None:
        handed.append(metrics)

    hand_off = None if lever == "no_checkpoint_clock" else report_checkpoint
    clock = synced_checkpoint_clock(device) if name == "trial_synced_clock" else contextlib.nullcontext()
    try:
        setup = worker.set_up(trial, device, 0, 1, None, trial_memory.PhasePeaks(device))
        if lever == "row_data":
            setup.batches = row_batches(args, trial.train.micro_batch_size)
        with clock:
            trained = worker.train(trial, setup, device, 0, 1, reports.append, hand_off)
            steady_steps = setup.total_steps - trained.clock.warmup_steps
            rate, tokens = trained.clock.steady_rate(), trained.clock.tokens - trained.clock.warm_tokens
            more = dataclasses.replace(setup, total_steps=args.profile_steps, start=0)
            profile, attention_kernels = profiled(
                lambda: worker.train(trial, more, device, 0, 1, reports.append, hand_off), args.profile_steps, device)
        setup.engine.destroy()
        attention = setup.attention
    finally:
        torch.set_num_threads(threads)
    del setup, more
    _release(device)
    return Measured(f"{name}:{lever}" if lever else name, rate, 1e3 * tokens / rate / steady_steps,
                    tokens / steady_steps, profile, attention_kernels, bench._dynamo_counts(), attention.name,
                    attention.report)


def _versions() -> dict[str, str]:
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__}


def _release(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


# ---------------------------------------------------------------- the table and main

def table(results: list[Measured]) -> str:
    """One line per path: tok/s (and against the row), ms/step, tokens/step, then the profiled per-step figures."""
    keys = list(results[0].profile)
    short = {k: k.replace(" ms", "").replace("FSDP/NCCL copies", "copies").replace("fused elementwise", "elemwise")
             for k in keys}
    row_rate = next((r.tokens_per_s for r in results if r.name == "row"), None)
    lines = [f"{'path':<32} {'tok/s':>9} {'x row':>6} {'ms/step':>8} {'tok/step':>8} " +
             " ".join(f"{short[k]:>9}" for k in keys) + f" {'recompiles':>10}  attention"]
    for r in results:
        ratio = f"{r.tokens_per_s / row_rate:.3f}" if row_rate else "-"
        lines.append(f"{r.name:<32} {r.tokens_per_s:>9,.0f} {ratio:>6} {r.ms_per_step:>8.1f} {r.tokens_per_step:>8,.0f} "
                     + " ".join(f"{r.profile[k]:>9.2f}" for k in keys) + f" {r.dynamo['recompiles']:>10}  {r.attention}")
    lines += [f"attention check of {r.name}: {r.attention_report}" for r in results if r.attention_report][:1]
    lines += [f"attention kernels of {r.name} (ms/step): " + ", ".join(f"{name[:60]} {ms:.1f}" for name, ms in
                                                                        list(r.attention_kernels.items())[:3])
              for r in results if r.attention_kernels]
    lines.append("profiled columns: per step; kernel ms by category, GPU busy ms (union of kernel spans), wall ms, "
                 "host ms in CUDA synchronize calls, synchronize calls; "
                 "Dynamo's recompiles so far in the process")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line's settings, checked (exits with one line naming a bad value); ``levers`` as a list."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="1b", choices=sorted(bench.SHAPES))
    parser.add_argument("--steps", type=int, default=20, help="timed optimiser steps per path")
    parser.add_argument("--warmup", type=int, default=5, help="steps before the timed ones (the trial: its own count)")
    parser.add_argument("--profile-steps", type=int, default=3, help="profiled steps per path, after the timed ones")
    parser.add_argument("--seq-len", type=int, default=2048, help="packed row width (the sweep's: 2048)")
    parser.add_argument("--max-examples", type=int, default=utilization.SETTINGS["gpu"][0]["max_examples"])
    parser.add_argument("--beta", type=float, default=0.1, help="label smoothing of both paths")
    parser.add_argument("--learning-rate", type=float, default=1e-4, help="the trial's (the row's is 1e-5)")
    parser.add_argument("--tokenizer", default="smollm2-135m", help="registry name or local tokenizer directory")
    parser.add_argument("--data-dir", default=os.environ.get("CALSWEEP_DATA_DIR"),
                        help="data root holding alpaca/ (default $CALSWEEP_DATA_DIR)")
    parser.add_argument("--levers", default=",".join(LEVERS), help=f"comma-separated, of {list(LEVERS)}; '' for none")
    parser.add_argument("--results", default=None, help="results folder of the trials (default: beside --out)")
    parser.add_argument("--out", default="trial_vs_row.json")
    args = parser.parse_args(argv)
    levers = [lever for lever in args.levers.split(",") if lever]
    unknown = [lever for lever in levers if lever not in LEVERS]
    if unknown:
        parser.error(f"--levers: expected names from {list(LEVERS)}, got {unknown}")
    if min(args.steps, args.warmup, args.profile_steps) < 1:
        parser.error(f"expected --steps, --warmup and --profile-steps >= 1, got {args.steps}, {args.warmup}, "
                     f"{args.profile_steps}")
    args.levers = levers
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    levers = args.levers
    from sweeps import warm_trial

    device = warm_trial.accelerator()
    warm_trial.process_group(device)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    trial, sweep = sweep_trial(args, Path(args.results or out.with_suffix(".results")).resolve())
    record = {"date": time.strftime("%Y-%m-%d"),
              "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "shape": args.shape, "seq_len": args.seq_len, "steps": args.steps, "warmup": args.warmup,
              "profile_steps": args.profile_steps, "levers": {k: LEVERS[k] for k in levers}, "trial": trial.to_dict(),
              "threads": torch.get_num_threads(), "versions": _versions(), "paths": []}
    results = []
    runs = [("row", None), ("trial", None), ("trial_synced_clock", None)] + [("trial", lever) for lever in levers]
    for name, lever in runs:
        print(f"[trial_vs_row] {len(results) + 1}/{len(runs)} {name}{':' + lever if lever else ''}", flush=True)
        results.append(run_row(args, device, trial.train.micro_batch_size) if name == "row" else
                       run_trial_path(args, device, trial, sweep, name, lever))
        _release(device)
        record["paths"] = [r._asdict() for r in results]
        out.write_text(json.dumps(record, indent=1, default=str))  # the paths so far survive a later failure
    print("\n" + table(results))


if __name__ == "__main__":
    main()
