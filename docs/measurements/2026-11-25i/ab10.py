"""A/B 10 at the paper shape (random, bf16, N 8192, V 256000, D 2304, beta 0.1, filter none), one H100: eb2f0a4
(kernels_eb2: its kernels/, imports renamed) against v5 (the dense dZ's (p - beta / V) g as one FMA, the target
term -(1 - beta) g added in tiles that hold a target); a forward's parts, fwd+bwd steps profiled one variant after
the other in alternating order (kernel time per kernel), rounds alternating."""
import collections, json, os, statistics, sys, time
import torch
from torch.profiler import profile, ProfilerActivity
sys.path.insert(0, "."); sys.path.insert(0, ".gpu_host")
from benchmarks.bench_linear_ce import make_inputs, Timer, peak_extra_mib
import kernels, kernels_eb2
from kernels import forward as f1
from kernels_eb2 import forward as f0

out = os.environ.get("OUT", "/tmp")
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 12
beta = 0.1
inputs = make_inputs("random", 8192, 256000, 2304, "cuda")
res = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d")}
pk = {"eb2f0a4": (kernels_eb2, f0), "v5": (kernels, f1)}

def parts(label):
    pkg, fmod = pk[label]
    real = fmod._lse_forward_kernel
    marks = []
    class Marked:
        def __getitem__(self, grid):
            def launch(*a, **k):
                marks.append(time.perf_counter())
                e1 = torch.cuda.Event(enable_timing=True); e1.record()
                r = real[grid](*a, **k)
                e2 = torch.cuda.Event(enable_timing=True); e2.record()
                marks.append((e1, e2))
                return r
            return launch
    h, w = (t.detach().requires_grad_(True) for t in inputs[:2])
    for _ in range(3): pkg.linear_cross_entropy(h, w, inputs[2], label_smoothing=beta, filter="none")
    fmod._lse_forward_kernel = Marked()
    ps = []
    try:
        for _ in range(15):
            torch.cuda.synchronize(); marks.clear()
            e0 = torch.cuda.Event(enable_timing=True); e3 = torch.cuda.Event(enable_timing=True)
            t0 = time.perf_counter()
            e0.record(); pkg.linear_cross_entropy(h, w, inputs[2], label_smoothing=beta, filter="none"); e3.record()
            e3.synchronize()
            t_launch, (e1, e2) = marks[0], marks[1]
            ps.append((e0.elapsed_time(e1), e1.elapsed_time(e2), e2.elapsed_time(e3), e0.elapsed_time(e3),
                       1e3 * (t_launch - t0)))
    finally:
        fmod._lse_forward_kernel = real
    med = [statistics.median(p[i] for p in ps) for i in range(5)]
    print(f"{label} forward parts (median ms): before the kernel {med[0]:.3f}, kernel {med[1]:.3f}, "
          f"after {med[2]:.3f}, total {med[3]:.3f}; host from call to the launch's entry {med[4]:.3f}", flush=True)
    res[f"forward parts {label}"] = ps

def step(fn, bwd=True):
    h, w = (t.detach().requires_grad_(True) for t in inputs[:2])
    def run():
        h.grad = w.grad = None
        loss = fn(h, w, inputs[2])
        if bwd:
            loss.backward()
        return h, w
    return run

ms = {k: (lambda pkg: lambda h, w, y: pkg.linear_cross_entropy(h, w, y, label_smoothing=beta, filter="none"))(v[0])
      for k, v in pk.items()}
for k in ms:
    for _ in range(2): step(ms[k])()
for k in ms:
    parts(k)
torch.cuda.synchronize()
ref = [t.grad.float() for t in step(ms["eb2f0a4"])()]
for k in ("v5",):
    new = [t.grad.float() for t in step(ms[k])()]
    print(f"{k} vs eb2f0a4 max|diff|/max: " + " ".join(
        f"{((a - b).abs().max() / b.abs().max()).item():.2e}" for a, b in zip(new, ref)), flush=True)
    del new
del ref
# kernel time per kernel: one fwd+bwd step of each variant per round, order alternating, one profiler each
prof_rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 8
per = {k: collections.defaultdict(list) for k in ms}
runs = {k: step(ms[k]) for k in ms}
for r in range(prof_rounds):
    for k in (list(ms) if r % 2 == 0 else list(ms)[::-1]):
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            runs[k]()
            torch.cuda.synchronize()
        sums = collections.Counter()
        for e in prof.events():
            if e.device_type.name == "CUDA":
                name = e.name
                key = next((n for n in ("_lse_forward_kernel", "_dz_kernel", "_kept_dz_kernel", "_finish_kernel")
                            if n in name), "gemm" if ("gemm" in name or "xmma" in name or "nvjet" in name) else "other")
                sums[key] += e.device_time_total
        for n, v in sums.items():
            per[k][n].append(v / 1e3)
        per[k]["total"].append(sum(sums.values()) / 1e3)
for k in ms:
    row = {n: round(statistics.median(v), 3) for n, v in per[k].items()}
    res[f"profile {k}"] = {n: v for n, v in per[k].items()}
    print(f"{k} kernels per step, median of {prof_rounds} (ms): {row}", flush=True)
timer = Timer("cuda")
names = list(ms)
times = {(k, kind): [] for k in names for kind in ("fwd", "fwd+bwd")}
for r in range(rounds):
    for k in (names if r % 2 == 0 else names[::-1]):
        for kind in ("fwd", "fwd+bwd"):
            times[(k, kind)].append(timer(step(ms[k], bwd=kind == "fwd+bwd")))
for k in names:
    row = {}
    for kind in ("fwd", "fwd+bwd"):
        t = times[(k, kind)]
        row[kind] = dict(median=statistics.median(t), min=min(t), max=max(t), all=t)
    row["fwd+bwd MiB"] = peak_extra_mib(step(ms[k]), "cuda")
    res[f"rounds {k}"] = row
    print(f"{k:8s} fwd {row['fwd']['median']:6.2f} ({row['fwd']['min']:.1f}-{row['fwd']['max']:.1f})"
          f" | fwd+bwd {row['fwd+bwd']['median']:6.2f} ({row['fwd+bwd']['min']:.1f}-"
          f"{row['fwd+bwd']['max']:.1f}) {row['fwd+bwd MiB']:7.1f} MiB", flush=True)
json.dump(res, open(f"{out}/ab10_h100.json", "w"), indent=1)
