"""A/B 2 on the real rows: which part of the new code costs (forward vs backward), head buffer 16 vs 24 MiB.

argv: real folder, out json."""
import json, statistics, sys, time
import torch
sys.path.insert(0, ".")
from benchmarks.lce_real_inputs import load
from benchmarks.bench_linear_ce import _eager
import kernels, kernels_base
from kernels import backward, triton_backend
import kernels_base.backward as base_backward
import kernels_base.forward as base_forward
from kernels import forward as new_forward

folder, out = sys.argv[1], sys.argv[2]
h, w, y, _ = load(folder)
hh = h.cuda().requires_grad_(True); ww = w.cuda().requires_grad_(True); y = y.cuda()
default_prefix = backward.prefix_tiles


def method(mod, f, beta, prefix=True, head_mib=16, fwd=None):
    def run():
        backward.prefix_tiles = default_prefix if prefix else (lambda tiles: 0)
        backward.GATHER_BUFFER_BYTES = base_backward.GATHER_BUFFER_BYTES = head_mib << 20
        triton_backend.BACKEND.forward = fwd or new_forward.triton_forward
        mod.linear_cross_entropy(hh, ww, y, label_smoothing=beta, filter=f).backward()
    return run


res = {}
for beta in (0.0, 0.1):
    comp = torch.compile(_eager(beta))
    ms = {"new exact h24": method(kernels, "exact", beta, head_mib=24),
          "new exact h24 no prefix": method(kernels, "exact", beta, False, 24),
          "new exact h24 base fwd": method(kernels, "exact", beta, head_mib=24, fwd=base_forward.triton_forward),
          "new exact h16": method(kernels, "exact", beta),
          "base exact h16": method(kernels_base, "exact", beta),
          "base exact h24": method(kernels_base, "exact", beta, head_mib=24),
          "new loose h24": method(kernels, "loose", beta, head_mib=24),
          "base loose h16": method(kernels_base, "loose", beta),
          "torch.compile": lambda: comp(hh, ww, y).backward()}
    times = {n: [] for n in ms}
    host = {n: [] for n in ms}
    for r in range(33):
        for n, fn in (list(ms.items()) if r % 2 else list(ms.items())[::-1]):  # alternate the order
            hh.grad = ww.grad = None
            torch.cuda.synchronize()
            s0, s1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0 = time.perf_counter(); s0.record(); fn(); t1 = time.perf_counter(); s1.record(); s1.synchronize()
            if r >= 3:
                times[n].append(s0.elapsed_time(s1)); host[n].append(1e3 * (t1 - t0))
    for n, ts in times.items():
        q = statistics.quantiles(ts, n=4)
        res[f"{n} beta {beta}"] = {"median": round(statistics.median(ts), 2), "q1": round(q[0], 2),
                                   "q3": round(q[2], 2), "min": round(min(ts), 2),
                                   "host": round(statistics.median(host[n]), 2)}
        print(f"{n:24s} beta {beta}", res[f"{n} beta {beta}"], flush=True)
    torch.cuda.reset_peak_memory_stats()
    for n in ("new exact h24", "new exact h16"):
        ms[n](); torch.cuda.synchronize()
        base = torch.cuda.memory_allocated(); torch.cuda.reset_peak_memory_stats(); hh.grad = ww.grad = None
        torch.cuda.synchronize(); base = torch.cuda.memory_allocated(); torch.cuda.reset_peak_memory_stats()
        ms[n](); torch.cuda.synchronize()
        res[f"{n} beta {beta} MiB"] = (torch.cuda.max_memory_allocated() - base) / 2**20
        print(n, "fwd+bwd MiB", res[f"{n} beta {beta} MiB"], flush=True)
json.dump(res, open(out, "w"), indent=1)
