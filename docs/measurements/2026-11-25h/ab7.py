"""A/B 7 at the paper shape (random, bf16, N 8192, V 256000, D 2304): the one-kernel finish (8e887b0) against ba7d36a
(kernels_prev) and the session's start (0f4159c, kernels_start), beta 0.1 and 0, rounds alternating; GEMM floors; a forward's parts (GPU idle before the
kernel's launch, the kernel, the ops after it)."""
import json, os, statistics, sys
import torch
sys.path.insert(0, "."); sys.path.insert(0, ".gpu_dense")
from benchmarks.bench_linear_ce import make_inputs, _GemmsOnly, Timer, peak_extra_mib
from kernels import forward, linear_cross_entropy
import kernels_start, kernels_prev

out = os.environ.get("OUT", "/tmp")
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 12
inputs = make_inputs("random", 8192, 256000, 2304, "cuda")
res = {"device": torch.cuda.get_device_name()}

def parts(beta):
    real = forward._lse_forward_kernel
    marks = []
    class Marked:
        def __getitem__(self, grid):
            def launch(*a, **k):
                e1 = torch.cuda.Event(enable_timing=True); e1.record()
                r = real[grid](*a, **k)
                e2 = torch.cuda.Event(enable_timing=True); e2.record()
                marks.append((e1, e2))
                return r
            return launch
    h, w = (t.detach().requires_grad_(True) for t in inputs[:2])
    for _ in range(3): linear_cross_entropy(h, w, inputs[2], label_smoothing=beta, filter="none")
    forward._lse_forward_kernel = Marked()
    ps = []
    try:
        for _ in range(15):
            torch.cuda.synchronize(); marks.clear()
            e0 = torch.cuda.Event(enable_timing=True); e3 = torch.cuda.Event(enable_timing=True)
            e0.record(); linear_cross_entropy(h, w, inputs[2], label_smoothing=beta, filter="none"); e3.record()
            e3.synchronize()
            e1, e2 = marks[0]
            ps.append((e0.elapsed_time(e1), e1.elapsed_time(e2), e2.elapsed_time(e3), e0.elapsed_time(e3)))
    finally:
        forward._lse_forward_kernel = real
    med = [statistics.median(p[i] for p in ps) for i in range(4)]
    print(f"beta {beta} forward parts (median ms): before the kernel {med[0]:.3f}, kernel {med[1]:.3f}, "
          f"after {med[2]:.3f}, total {med[3]:.3f}", flush=True)
    res[f"forward parts beta {beta}"] = ps

for beta in (0.1, 0.0):
    parts(beta)
    ms = {
        "start (0f4159c) none": lambda h, w, y: kernels_start.linear_cross_entropy(h, w, y, label_smoothing=beta,
                                                                                   filter="none"),
        "ba7d36a none": lambda h, w, y: kernels_prev.linear_cross_entropy(h, w, y, label_smoothing=beta, filter="none"),
        "ours none": lambda h, w, y: linear_cross_entropy(h, w, y, label_smoothing=beta, filter="none"),
                "GEMMs only, 4 (whole)": lambda h, w, y: _GemmsOnly.apply(h, w, "whole"),
    }
    def step(fn, bwd=True):
        h, w = (t.detach().requires_grad_(True) for t in inputs[:2])
        def run():
            loss = fn(h, w, inputs[2])
            if bwd:
                loss.backward()
            return h, w
        return run
    for k in ms:
        for _ in range(2): step(ms[k])()
    torch.cuda.synchronize()
    ref = [t.grad.float() for t in step(ms["start (0f4159c) none"])()]
    new = [t.grad.float() for t in step(ms["ours none"])()]
    print(f"beta {beta}: max|diff|/max ours vs start: " + " ".join(
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
        row["fwd MiB"] = peak_extra_mib(step(ms[k], bwd=False), "cuda")
        row["fwd+bwd MiB"] = peak_extra_mib(step(ms[k]), "cuda")
        res[f"beta {beta} {k}"] = row
        print(f"beta {beta:3} {k:26s} fwd {row['fwd']['median']:6.2f} ({row['fwd']['min']:.1f}-{row['fwd']['max']:.1f})"
              f" {row['fwd MiB']:7.1f} MiB | fwd+bwd {row['fwd+bwd']['median']:6.2f} ({row['fwd+bwd']['min']:.1f}-"
              f"{row['fwd+bwd']['max']:.1f}) {row['fwd+bwd MiB']:7.1f} MiB", flush=True)
json.dump(res, open(f"{out}/ab7_h100.json", "w"), indent=1)
