"""A/B 4 at the paper shape (random, bf16, N 8192, V 256000, D 2304), beta 0.1: where a forward's event-timed
milliseconds go (GPU idle before the kernel's launch, the kernel, the ops after it); allocator activity; forward
tiles 128 wide at 4 warps (one or two programs per SM) against the defaults."""
import dataclasses, json, os, statistics, sys
import torch
sys.path.insert(0, ".")
from benchmarks.bench_linear_ce import make_inputs, _GemmsOnly, Timer, peak_extra_mib
from kernels import forward, backward, linear_cross_entropy

out = os.environ.get("OUT", "/tmp")
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 10
inputs = make_inputs("random", 8192, 256000, 2304, "cuda")
FB, BB = forward.TILES, backward.TILES
beta = 0.1
res = {"device": torch.cuda.get_device_name()}

# 1. a forward's parts: events before and after the forward kernel's launch
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
parts = []
for _ in range(15):
    torch.cuda.synchronize(); marks.clear()
    e0 = torch.cuda.Event(enable_timing=True); e3 = torch.cuda.Event(enable_timing=True)
    e0.record(); linear_cross_entropy(h, w, inputs[2], label_smoothing=beta, filter="none"); e3.record()
    e3.synchronize()
    e1, e2 = marks[0]
    parts.append((e0.elapsed_time(e1), e1.elapsed_time(e2), e2.elapsed_time(e3), e0.elapsed_time(e3)))
forward._lse_forward_kernel = real
med = [statistics.median(p[i] for p in parts) for i in range(4)]
print(f"forward parts (median ms): before the kernel {med[0]:.3f}, kernel {med[1]:.3f}, after {med[2]:.3f}, "
      f"total {med[3]:.3f}", flush=True)
res["forward parts"] = parts

def variant(ft=FB, bt=BB):
    def fn(h, w, y):
        return linear_cross_entropy(h, w, y, label_smoothing=beta, filter="none")
    fn.tiles = (ft, bt)
    return fn

F = lambda **kw: dataclasses.replace(FB, **kw)
ms = {
    "defaults": variant(),
    "fwd 128 wide, 4 warps, keep 2 stages, 2/SM": variant(ft=F(block_v=128, num_warps=4, keep_stages=2, ctas_per_sm=2)),
    "fwd 128 wide, 4 warps, keep 2 stages, 1/SM": variant(ft=F(block_v=128, num_warps=4, keep_stages=2)),
    "fwd 128 wide, 4 warps, keep 3 stages, 1/SM": variant(ft=F(block_v=128, num_warps=4, keep_stages=3)),
    "nothing kept": variant(ft=F(keep_vocab=1 << 30)),
    "GEMMs only, 4 (whole)": lambda h, w, y: _GemmsOnly.apply(h, w, "whole"),
}

def step(fn, bwd=True):
    h, w = (t.detach().requires_grad_(True) for t in inputs[:2])
    def run():
        forward.TILES, backward.TILES = getattr(fn, "tiles", (FB, BB))
        try:
            loss = fn(h, w, inputs[2])
            if bwd:
                loss.backward()
        finally:
            forward.TILES, backward.TILES = FB, BB
        return h, w
    return run

for k in list(ms):
    try:
        for _ in range(2): step(ms[k])()
        torch.cuda.synchronize()
    except Exception as e:
        print(f"{k}: failed: {type(e).__name__}: {str(e)[:300]}", flush=True)
        del ms[k]
for dev_cache in forward._lse_forward_kernel.device_caches.values():
    for c in dev_cache[0].values():
        print("compiled:", (c.name, c.n_regs, c.n_spills, c.metadata.shared, c.metadata.num_warps, c.metadata.num_stages))
ref = [t.grad.float() for t in step(ms["defaults"])()]
for k in [k for k in ms if not k.startswith("GEMMs") and k != "defaults"]:
    new = [t.grad.float() for t in step(ms[k])()]
    rel = [((a - b).abs().max() / b.abs().max()).item() for a, b in zip(new, ref)]
    print(f"{k}: max|diff|/max vs defaults: dE {rel[0]:.2e} dC {rel[1]:.2e}", flush=True)
del ref, new
timer = Timer("cuda")
names = list(ms)
kinds = ("fwd", "fwd+bwd")
times = {(k, kind): [] for k in names for kind in kinds}
stats0 = torch.cuda.memory_stats()
for r in range(rounds):
    for k in (names if r % 2 == 0 else names[::-1]):
        for kind in kinds:
            times[(k, kind)].append(timer(step(ms[k], bwd=kind != "fwd")))
stats1 = torch.cuda.memory_stats()
for key in ("num_alloc_retries", "segment.all.allocated", "segment.all.freed", "num_device_alloc", "num_device_free"):
    if key in stats1:
        print(f"allocator during the rounds: {key} +{stats1[key] - stats0.get(key, 0)}", flush=True)
for k in names:
    row = {}
    for kind in kinds:
        t = times[(k, kind)]
        row[kind] = dict(median=statistics.median(t), min=min(t), max=max(t), all=t)
    row["fwd+bwd MiB"] = peak_extra_mib(step(ms[k]), "cuda")
    res[k] = row
    print(f"{k:44s} fwd {row['fwd']['median']:6.2f} ({row['fwd']['min']:.1f}-{row['fwd']['max']:.1f}) | fwd+bwd "
          f"{row['fwd+bwd']['median']:6.2f} ({row['fwd+bwd']['min']:.1f}-{row['fwd+bwd']['max']:.1f}) "
          f"{row['fwd+bwd MiB']:7.1f} MiB", flush=True)
json.dump(res, open(f"{out}/ab4_h100.json", "w"), indent=1)
