"""Interleaved A/B on the real rows: new code (prefix on/off) vs kernels_base vs torch.compile, 40 rounds.

argv: real folder, out json."""
import json, statistics, sys
import torch
sys.path.insert(0, ".")
from benchmarks.lce_real_inputs import load
from benchmarks.bench_linear_ce import _eager
import kernels, kernels_base
from kernels import backward

folder, out = sys.argv[1], sys.argv[2]
h, w, y, _ = load(folder)
hh = h.cuda().requires_grad_(True); ww = w.cuda().requires_grad_(True); y = y.cuda()
default_prefix = backward.prefix_tiles
no_prefix = lambda tiles: 0


def method(mod, f, beta, prefix=True, head_mib=16):
    def run():
        backward.prefix_tiles = default_prefix if prefix else no_prefix
        backward.GATHER_BUFFER_BYTES = head_mib << 20
        mod.linear_cross_entropy(hh, ww, y, label_smoothing=beta, filter=f).backward()
    return run


res = {}
for beta in (0.0, 0.1):
    comp = torch.compile(_eager(beta))
    ms = {"new exact": method(kernels, "exact", beta), "new exact, no prefix": method(kernels, "exact", beta, False),
          "new exact, head 24 MiB": method(kernels, "exact", beta, head_mib=24),
          "base exact": method(kernels_base, "exact", beta), "new loose": method(kernels, "loose", beta),
          "base loose": method(kernels_base, "loose", beta), "torch.compile": lambda: comp(hh, ww, y).backward()}
    times = {n: [] for n in ms}
    for r in range(43):
        for n, fn in ms.items():
            hh.grad = ww.grad = None
            torch.cuda.synchronize()
            s0, s1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s0.record(); fn(); s1.record(); s1.synchronize()
            if r >= 3:
                times[n].append(s0.elapsed_time(s1))
    for n, ts in times.items():
        q = statistics.quantiles(ts, n=4)
        res[f"{n} beta {beta}"] = {"median": round(statistics.median(ts), 2), "q1": round(q[0], 2),
                                   "q3": round(q[2], 2), "min": round(min(ts), 2)}
        print(f"{n:22s} beta {beta}", res[f"{n} beta {beta}"], flush=True)
json.dump(res, open(out, "w"), indent=1)
