"""Benchmark linear + (label-smoothed) cross-entropy implementations on one GPU: time and peak extra memory.

Methods: ours (kernels.linear_cross_entropy) with each gradient filter (kernels/filter.py): "exact" (the default:
at most 2^-10 of probability mass dropped per token), "loose" (2^-8) and "none" (every tile), torch eager
(F.cross_entropy on materialised logits upcast to float32, as Hugging Face does), torch.compile of the same,
Liger's FusedLinearCrossEntropy and Cut Cross-Entropy (beta = 0 only: no smoothing support; default options, its
gradient filter included); with --baseline MODULE also that module's linear_cross_entropy under each of its
filters (an earlier version of kernels/, copied under another name), for a before/after in the same run. Each at
beta 0 and 0.1, on inputs (bf16, no ignored tokens). As floors, the matrix products alone (no loss, `_GemmsOnly`):
four GEMMs in our dense backward's chunks (O(N) memory), the same four each in one cuBLAS call (the floor of any
design that recomputes the logits) and three with the logits kept (torch.compile's structure); on a power-limited
GPU these, not peak TFLOP/s, bound what a design can reach.
- random (at --n/--vocab/--dim, the paper's shape by default): E ~ N(0, 1), C ~ N(0, 1 / D): logits ~ N(0, 1),
  a flat softmax (the gradient filter skips nothing).
- peaked (synthetic): CCE's trick, as kernels.testing.make_case: rows of E scaled to norm sqrt(D), distinct
  targets, the target row of C = 30 E_i / D (target logit 30), other rows ~ N(0, 0.81 / D).
- real: a model's final hidden states on Alpaca text (prompt + response, next-token targets) and its LM head,
  one input per --real folder, written on a CPU by benchmarks/lce_real_inputs.py (Gemma-3-270M: N = 8192,
  V = 262144, D = 640; SmolLM2-135M: V = 49152, D = 576). Each folder holds the hidden states and targets
  (inputs.pt) and the head as its GGUF tensor's bytes in parts under 48 MB (head.NN); they are de-quantised
  here (the gguf package), bit for bit the head transformers loads.
Times are medians of --iters runs (CUDA events) after --warmup runs, taken round-robin: per input and beta,
every method runs once per round, so clock and power-cap drift of the GPU touch all methods alike (min and max
are in the JSON); "fwd" runs the forward with inputs that require grad (as in training), "fwd+bwd" forward and
backward. Memory is the peak allocated during the step minus what was allocated before it (inputs), so fwd+bwd
includes the two gradients. For our rows,
"active" is the share of (128-row x 256-entry) logit tiles the backward computes (the rest are filtered),
and the "exact" and "loose" rows carry "rel. diff dE" = max|dE - dE_none| / max|dE_none| (likewise dC): what the
filter changes.

Usage (repo root, GPU machine):
    python benchmarks/bench_linear_ce.py --out results/bench_linear_ce.json      # random and peaked
    python benchmarks/bench_linear_ce.py --inputs real random    # real inputs from .gpu_lce/ (below)
    python benchmarks/bench_linear_ce.py --tiles --inputs real random   # our kernel under a few chunk configurations
    python benchmarks/bench_linear_ce.py --profile --inputs real   # CUDA and host time per op of ours exact
    python benchmarks/bench_linear_ce.py --n 256 --vocab 1024 --dim 64 --device cpu --iters 2   # harness dry run

Real inputs on the GPU machine (its image lacks gguf, Liger and CCE; a call carries at most 64 MiB). On a CPU:
`lce_real_inputs.py --family gemma3-270m` and `--family smollm2-135m` write .gpu_lce/ (git-ignored), and
`pip download --no-deps -d .gpu_lce/whl liger-kernel==0.8.5 cut-cross-entropy==25.1.1 gguf==0.19.0` the
wheels. Gemma's head is 178 MB (Q8_0, four parts): four staging calls back to back on the warm machine, each
carrying one .gpu_lce/gemma3-270m/head.0K and running `mkdir -p ~/lce && cp -r .gpu_lce/. ~/lce/`, then one
call carrying .gpu_lce/gemma3-270m/inputs.pt, .gpu_lce/smollm2-135m and .gpu_lce/whl (1 MB) that runs
    mkdir -p ~/lce && cp -r .gpu_lce/. ~/lce/ && python3 -m pip install -q --no-index --no-deps --target /tmp/site
    .gpu_lce/whl/*.whl && PYTHONPATH=/tmp/site:$PYTHONPATH timeout 470 python3 benchmarks/bench_linear_ce.py
    --inputs real random --real ~/lce/gemma3-270m ~/lce/smollm2-135m --out $OUT/bench_linear_ce.json
(one line; rows are written as they finish, so a timeout keeps the rows measured).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib
import json
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kernels import backward, forward, linear_cross_entropy  # noqa: E402
from kernels.filter import FILTER_MASS, FILTERS, kept_share  # noqa: E402
from kernels.plan_history import PlanHistory  # noqa: E402

Loss = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
MIB = 1 << 20


def make_inputs(kind: str, n: int, vocab: int, dim: int, device: str, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """(hidden, weight, targets) in bf16 as described in the module docstring."""
    g = torch.Generator(device=device).manual_seed(seed)
    hidden = torch.randn(n, dim, generator=g, device=device)
    weight = torch.randn(vocab, dim, generator=g, device=device) / dim**0.5
    targets = torch.randint(0, vocab, (n,), generator=g, device=device)
    if kind == "peaked":
        hidden *= dim**0.5 / hidden.norm(dim=1, keepdim=True)
        targets = torch.randperm(vocab, generator=g, device=device)[:n]
        weight *= 0.9
        weight[targets] = hidden * (30.0 / dim)
    return hidden.bfloat16(), weight.bfloat16(), targets


def _eager(beta: float) -> Loss:
    def loss(h: torch.Tensor, w: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy((h @ w.T).float(), y, label_smoothing=beta)

    return loss


class _GemmsOnly(torch.autograd.Function):
    """The matrix products of a fused loss without the loss, the floor a kernel's design can reach: forward
    Z = E C^T, backward dE = dZ C and dC = dZ^T E with dZ = Z (no softmax, no filter). mode "chunked": Z in
    chunks, recomputed in the backward in the chunks of our dense backward (`backward.dense_chunks`: dZ in dC's
    unwritten rows, then a dedicated buffer; four GEMMs, O(N) memory, like ours); "whole": the same four products
    each in one cuBLAS call (Z recomputed whole: the floor of any design that recomputes, at 4 GB); "kept": Z kept
    whole (three GEMMs, torch.compile's structure). Returns 0 * Z[0, 0] so that backward() runs."""

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, mode: str) -> torch.Tensor:  # noqa: ANN001
        ctx.save_for_backward(hidden, weight)
        ctx.mode = mode
        if mode != "chunked":
            z = hidden @ weight.T
            ctx.z = z if mode == "kept" else None
            return 0.0 * z[0, 0].float()
        rows, cols = backward.chunk_shape(
            -(-hidden.shape[0] // forward.TILES.block_n), -(-weight.shape[0] // forward.TILES.block_v),
            hidden.shape[1], hidden.shape[0], hidden.element_size(), True,
        )
        z = torch.empty(rows, cols, dtype=hidden.dtype, device=hidden.device)
        for r0 in range(0, hidden.shape[0], rows):
            for c0 in range(0, weight.shape[0], cols):
                e, c = hidden[r0 : r0 + rows], weight[c0 : c0 + cols]
                torch.mm(e, c.T, out=z[: e.shape[0], : c.shape[0]])
        return 0.0 * z[0, 0].float()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple:  # noqa: ANN001
        hidden, weight = ctx.saved_tensors
        if ctx.mode != "chunked":
            z = ctx.z if ctx.mode == "kept" else hidden @ weight.T
            return z @ weight, z.T @ hidden, None
        n, d = hidden.shape
        d_hidden = torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device)
        d_weight = torch.empty_like(weight)
        dedicated = None
        for chunk in backward.dense_chunks(n, weight.shape[0], d, hidden.element_size(), True, True):
            c0, vc = chunk.c0, chunk.vc
            c = weight[c0 : c0 + vc]
            if chunk.workspace is not None:
                space = d_weight.view(-1)[chunk.workspace :]
            else:
                dedicated = dedicated if dedicated is not None else hidden.new_empty(chunk.rows * vc)
                space = dedicated
            for r0 in range(0, n, chunk.rows):
                e = hidden[r0 : r0 + chunk.rows]
                zc = space.as_strided((e.shape[0], vc), (vc, 1))
                torch.mm(e, c.T, out=zc)
                if r0 == 0:
                    torch.mm(zc.T, e, out=d_weight[c0 : c0 + vc])
                else:
                    d_weight[c0 : c0 + vc].addmm_(zc.T, e)
                acc = d_hidden[r0 : r0 + chunk.rows]
                torch.addmm(acc, zc, c, out_dtype=torch.float32, out=acc)
        return d_hidden.to(hidden.dtype), d_weight, None


def methods(beta: float, device: str, baseline: str | None = None) -> dict[str, Loss]:
    """Name -> loss function of (hidden, weight, targets); libraries that are missing are left out."""
    out: dict[str, Loss] = {  # each with its own plan history, as a trial's fused head has
        f"ours {f}": lambda h, w, y, f=f, history=PlanHistory(): linear_cross_entropy(
            h, w, y, label_smoothing=beta, filter=f, plan_history=history)
        for f in FILTERS
    }
    if baseline:
        old = importlib.import_module(baseline)
        for f in importlib.import_module(f"{baseline}.api").FILTERS:
            out[f"{baseline} {f}"] = lambda h, w, y, f=f: old.linear_cross_entropy(h, w, y, label_smoothing=beta,
                                                                                  filter=f)
    if device == "cuda":
        if beta == 0.0:
            try:
                from cut_cross_entropy import linear_cross_entropy as cce

                out["CCE"] = lambda h, w, y: cce(h, w, y)
            except ImportError as e:
                print(f"CCE not available: {e}")
        try:
            from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

            liger = LigerFusedLinearCrossEntropyLoss(label_smoothing=beta)
            out["Liger FLCE"] = lambda h, w, y: liger(w, h, y)
        except ImportError as e:
            print(f"Liger not available: {e}")
    out["torch eager"] = _eager(beta)
    out["torch.compile"] = torch.compile(_eager(beta))
    if device == "cuda" and beta == 0.0:  # the floors (no loss; the same products at either beta)
        out["GEMMs only, 4 (chunked)"] = lambda h, w, y: _GemmsOnly.apply(h, w, "chunked")
        out["GEMMs only, 4 (whole)"] = lambda h, w, y: _GemmsOnly.apply(h, w, "whole")
        out["GEMMs only, 3 (logits kept)"] = lambda h, w, y: _GemmsOnly.apply(h, w, "kept")
    return out


class Timer:
    """Milliseconds of fn() with CUDA events (wall clock on CPU)."""

    def __init__(self, device: str) -> None:
        self.cuda = device == "cuda"

    def __call__(self, fn: Callable[[], None]) -> float:
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end)
        t0 = datetime.datetime.now()
        fn()
        return (datetime.datetime.now() - t0).total_seconds() * 1e3


def peak_extra_mib(fn: Callable[[], None], device: str) -> float | None:
    """Peak memory allocated while running fn, beyond what was allocated before (None off CUDA)."""
    if device != "cuda":
        fn()
        return None
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / MIB


def _steps(loss_fn: Loss, inputs: tuple[torch.Tensor, ...]) -> dict[str, Callable[[], None]]:
    """{"fwd": forward with inputs that require grad, "fwd+bwd": forward and backward} of loss_fn on its own leaf
    copies of the inputs (so methods timed in turn never share gradients)."""
    hidden, weight = (t.detach().requires_grad_(True) for t in inputs[:2])
    targets = inputs[2]

    def fwd() -> None:
        loss_fn(hidden, weight, targets)

    def fwd_bwd() -> None:
        hidden.grad = weight.grad = None
        loss_fn(hidden, weight, targets).backward()
        hidden.grad = weight.grad = None

    return {"fwd": fwd, "fwd+bwd": fwd_bwd}


def measure_interleaved(
    loss_fns: dict[str, Loss], inputs: tuple[torch.Tensor, ...], device: str, warmup: int, iters: int,
) -> dict[str, dict]:
    """{method: {"fwd ms", "fwd+bwd ms" (median), "... min", "... max", "fwd MiB", "fwd+bwd MiB"}}. Every method is
    warmed up and its peak memory taken alone; then the timed runs go round-robin, one of each method per round
    (`iters` rounds), in reverse order every other round, so that clock and power-cap drift on the GPU and the
    method run just before touch every method alike. A method that fails (an out-of-memory error, a library error)
    gets {"error": ...} and leaves the rounds."""
    timer = Timer(device)
    steps, out = {}, {}
    for name, fn in loss_fns.items():
        try:
            steps[name] = _steps(fn, inputs)
            out[name] = {}
            for kind, step in steps[name].items():
                for _ in range(warmup):
                    step()
                out[name][f"{kind} MiB"] = peak_extra_mib(step, device)
        except Exception as e:  # noqa: BLE001 - an OOM or a library failure is a result too
            out[name] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
            steps.pop(name, None)
        if device == "cuda":
            torch.cuda.empty_cache()
    for kind in ("fwd", "fwd+bwd"):
        times: dict[str, list[float]] = {name: [] for name in steps}
        for round_ in range(iters):
            for name in list(times)[:: 1 if round_ % 2 == 0 else -1]:
                try:
                    times[name].append(timer(steps[name][kind]))
                except Exception as e:  # noqa: BLE001
                    out[name] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
                    del times[name]
        for name, ts in times.items():
            out[name].update({f"{kind} ms": statistics.median(ts), f"{kind} ms min": min(ts),
                              f"{kind} ms max": max(ts)})
    return out


def active_share(inputs: tuple[torch.Tensor, ...], beta: float, filter: str) -> float:
    """Share of (row block x vocabulary tile) logit products our backward computes (the rest filtered)."""
    hidden, weight, targets = inputs
    *_, (_, _, _, _, _, kept, *_) = forward.triton_forward(hidden, weight, targets, beta, -100, None, filter)
    return kept_share(kept, -(-weight.shape[0] // forward.TILES.block_v))


def filter_changes(inputs: tuple[torch.Tensor, ...], beta: float, filter: str) -> dict[str, float]:
    """max|grad_filter - grad_none| / max|grad_none| for dE and dC: what the filter changes."""
    grads = {}
    for f in (filter, "none"):
        hidden, weight = (t.detach().clone().requires_grad_(True) for t in inputs[:2])
        linear_cross_entropy(hidden, weight, inputs[2], label_smoothing=beta, filter=f).backward()
        grads[f] = (hidden.grad.float(), weight.grad.float())
    return {
        f"rel. diff {name}": ((ours - dense).abs().max() / dense.abs().max()).item()
        for name, ours, dense in zip(("dE", "dC"), grads[filter], grads["none"])
    }


def environment(device: str) -> dict:
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    import importlib.metadata

    import triton

    versions = {}
    for package in ("liger-kernel", "cut-cross-entropy"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None
    return {
        "date": datetime.date.today().isoformat(),
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "torch": torch.__version__,
        "triton": triton.__version__,
        **versions,
        "git": rev,
        "forward_tiles": dataclasses.asdict(forward.TILES),
        "backward_tiles": dataclasses.asdict(backward.TILES),
        "filter_mass": FILTER_MASS,
    }


COLUMNS = ["method", "input", "beta", "fwd ms", "fwd+bwd ms", "fwd MiB", "fwd+bwd MiB", "active"]


def print_table(rows: list[dict]) -> None:
    def fmt(v: object) -> str:
        return "-" if v is None else f"{v:.3g}" if isinstance(v, float) and abs(v) < 1 else (
            f"{v:.1f}" if isinstance(v, float) else str(v))

    print("| " + " | ".join(COLUMNS) + " |")
    print("|" + "---|" * len(COLUMNS))
    for r in rows:
        print("| " + " | ".join(fmt(r.get(c, r.get("error"))) for c in COLUMNS) + " |")


def make_all_inputs(args: argparse.Namespace) -> list[tuple[str, dict, tuple[torch.Tensor, ...]]]:
    """(label, shape, (hidden, weight, targets)) for each input of --inputs."""
    out = []
    for kind in args.inputs:
        if kind == "real":
            from benchmarks.lce_real_inputs import load

            for folder in args.real:
                hidden, weight, targets, facts = load(folder, args.device)
                shape = {"n": hidden.shape[0], "vocab": weight.shape[0], "dim": hidden.shape[1], "facts": facts}
                out.append((f"real {facts['family']}", shape, (hidden, weight, targets)))
        else:
            shape = {"n": args.n, "vocab": args.vocab, "dim": args.dim}
            out.append((kind, shape, make_inputs(kind, args.n, args.vocab, args.dim, args.device)))
    return out


def run_all(args: argparse.Namespace) -> list[dict]:
    rows: list[dict] = []
    for label, shape, inputs in make_all_inputs(args):
        for beta in (0.0, 0.1):
            fns = {name: fn for name, fn in methods(beta, args.device, args.baseline).items()
                   if not args.only or name in args.only}
            results = measure_interleaved(fns, inputs, args.device, args.warmup, args.iters)
            for name, result in results.items():
                row = {"method": name, "input": label, "beta": beta, **shape, **result}
                if "error" not in row and name.startswith("ours") and args.device == "cuda":
                    row["active"] = active_share(inputs, beta, name.split()[1].rstrip(","))
                if "error" not in row and name in ("ours exact", "ours loose") and args.device == "cuda":
                    row.update(filter_changes(inputs, beta, name.split()[1].rstrip(",")))
                rows.append(row)
                print(json.dumps({k: v for k, v in row.items() if k != "facts"}), flush=True)
            write(args.out, rows, args)
        del inputs
    return rows


def run_tiles(args: argparse.Namespace) -> list[dict]:
    """Our kernel (dense: filter none) under a few backward chunk configurations, timed round-robin, on every
    --inputs, beta 0 and 0.1:
    the default, without chunks in dC's storage (workspace_vocab 0: the dedicated buffer only, the design before
    2026-11-25e), narrower and wider chunks there, other dZ tile groups."""
    configs = [
        backward.BackwardTiles(),
        backward.BackwardTiles(workspace_vocab=0),
        backward.BackwardTiles(workspace_vocab=16384),
        backward.BackwardTiles(workspace_vocab=65536),
        backward.BackwardTiles(dz_group_v=8),
        backward.BackwardTiles(dz_group_v=32),
    ]
    rows = []
    for label, shape, inputs in make_all_inputs(args):
        for beta in (0.0, 0.1):
            ours = methods(beta, args.device)["ours none"]

            def under(bt: backward.BackwardTiles) -> Loss:
                def loss(h: torch.Tensor, w: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
                    backward.TILES = bt  # read by the backward, which runs before the next method's step
                    return ours(h, w, y)

                return loss

            fns = {json.dumps(dataclasses.asdict(bt)): under(bt) for bt in configs}
            results = measure_interleaved(fns, inputs, args.device, args.warmup, args.iters)
            for bt in configs:
                row = {"input": label, "beta": beta, **{k: v for k, v in shape.items() if k != "facts"},
                       "backward_tiles": dataclasses.asdict(bt), **results[json.dumps(dataclasses.asdict(bt))]}
                rows.append(row)
                print(json.dumps(row), flush=True)
            write(args.out, rows, args)
    backward.TILES = backward.BackwardTiles()
    return rows


def run_profile(args: argparse.Namespace) -> None:
    """CUDA time per kernel of one method's forward + backward (--only, default ours exact; beta 0.1) on each
    --inputs, after a warm-up; then host and device time per op of the same steps."""
    name = args.only[0] if args.only else "ours exact"
    for label, _, inputs in make_all_inputs(args):
        print(f"## {name}, {label}, beta 0.1")
        step = _steps(methods(0.1, args.device, args.baseline)[name], inputs)["fwd+bwd"]
        for _ in range(args.warmup):
            step()
        cpu, cuda = torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA
        for acts, sort_by in (([cuda], "cuda_time_total"), ([cpu, cuda], "cpu_time_total")):
            with torch.profiler.profile(activities=acts) as prof:
                for _ in range(3):
                    step()
                torch.cuda.synchronize()
            print(prof.key_averages().table(sort_by=sort_by, row_limit=25, max_name_column_width=60))


def write(path: str | None, rows: list[dict], args: argparse.Namespace) -> None:
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        timing = {"warmup": args.warmup, "iters": args.iters, "statistic": "median", "dtype": "bfloat16"}
        Path(path).write_text(json.dumps({**environment(args.device), **timing, "rows": rows}, indent=1))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=8192)
    p.add_argument("--vocab", type=int, default=256000)
    p.add_argument("--dim", type=int, default=2304)
    p.add_argument("--device", default="cuda")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--only", nargs="*", help="method names to run (default: all)")
    p.add_argument("--inputs", nargs="+", default=["random", "peaked"], choices=["random", "peaked", "real"])
    p.add_argument("--real", nargs="*", default=[".gpu_lce/gemma3-270m", ".gpu_lce/smollm2-135m"],
                   help="folders written by benchmarks/lce_real_inputs.py (with --inputs real)")
    p.add_argument("--tiles", action="store_true", help="compare tile configurations of our kernel instead")
    p.add_argument("--profile", action="store_true", help="CUDA and host time per op of one method (--only) instead")
    p.add_argument("--baseline", help="importable copy of an earlier kernels/ (e.g. kernels_old) timed alongside")
    p.add_argument("--out", help="JSON file to write (rewritten after every row)")
    args = p.parse_args(argv)
    if args.profile:
        run_profile(args)
    elif args.tiles:
        run_tiles(args)
    else:
        print_table(run_all(args))


if __name__ == "__main__":
    main()
