"""A/B 8 at the paper shape (random, bf16, N 8192, V 256000, D 2304), filter none, one H100 (2026-11-25): "new" =
exp2 with one FMA and the target mask only in tiles that hold a target (a block-wide max of "a target in this
tile", then an `if`), in the forward's and dZ's softmax, the forward's split results in one PART array and no
placeholder allocations before its launch; against d5c6eb2 (kernels_d5c: its kernels/, imports renamed); beta 0.1
and 0, rounds alternating; a forward's parts; host time to the launch. The forward's kernel took 17.4-17.8 ms
against 15.6-15.7: that forward was dropped (ab9.py)."""
import json, os, statistics, sys, time
import torch
sys.path.insert(0, "."); sys.path.insert(0, ".gpu_host")
from benchmarks.bench_linear_ce import make_inputs, _GemmsOnly, Timer, peak_extra_mib
import kernels, kernels_d5c
from kernels import forward as fwd_new
from kernels_d5c import forward as fwd_old

out = os.environ.get("OUT", "/tmp")
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 12
inputs = make_inputs("random", 8192, 256000, 2304, "cuda")
res = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d")}

def parts(pkg, fmod, beta, label):
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
    print(f"{label} beta {beta} forward parts (median ms): before the kernel {med[0]:.3f}, kernel {med[1]:.3f}, "
          f"after {med[2]:.3f}, total {med[3]:.3f}; host from call to the launch's entry {med[4]:.3f}", flush=True)
    res[f"forward parts {label} beta {beta}"] = ps

for beta in (0.1, 0.0):
    parts(kernels_d5c, fwd_old, beta, "d5c6eb2")
    parts(kernels, fwd_new, beta, "new")
    ms = {
        "d5c6eb2 none": lambda h, w, y: kernels_d5c.linear_cross_entropy(h, w, y, label_smoothing=beta, filter="none"),
        "new none": lambda h, w, y: kernels.linear_cross_entropy(h, w, y, label_smoothing=beta, filter="none"),
        "GEMMs only, 4 (whole)": lambda h, w, y: _GemmsOnly.apply(h, w, "whole"),
    }
    def step(fn, bwd=True):
        h, w = (t.detach().requires_grad_(True) for t in inputs[:2])
        def run():
            h.grad = w.grad = None
            loss = fn(h, w, inputs[2])
            if bwd:
                loss.backward()
            return h, w
        return run
    for k in ms:
        for _ in range(2): step(ms[k])()
    torch.cuda.synchronize()
    ref = [t.grad.float() for t in step(ms["d5c6eb2 none"])()]
    new = [t.grad.float() for t in step(ms["new none"])()]
    la = kernels_d5c.linear_cross_entropy(*inputs, label_smoothing=beta, filter="none").item()
    lb = kernels.linear_cross_entropy(*inputs, label_smoothing=beta, filter="none").item()
    print(f"beta {beta}: loss {la:.7f} / {lb:.7f}; max|diff|/max new vs d5c6eb2: " + " ".join(
        f"{((a - b).abs().max() / b.abs().max()).item():.2e}" for a, b in zip(new, ref)), flush=True)
    del ref, new
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
        res[f"beta {beta} {k}"] = row
        print(f"beta {beta:3} {k:24s} fwd {row['fwd']['median']:6.2f} ({row['fwd']['min']:.1f}-{row['fwd']['max']:.1f})"
              f" | fwd+bwd {row['fwd+bwd']['median']:6.2f} ({row['fwd+bwd']['min']:.1f}-"
              f"{row['fwd+bwd']['max']:.1f}) {row['fwd+bwd MiB']:7.1f} MiB", flush=True)
json.dump(res, open(f"{out}/ab8_h100.json", "w"), indent=1)
