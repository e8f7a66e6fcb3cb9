"""A/B 2 at the paper shape (random, bf16, N 8192, V 256000, D 2304), beta 0.1: the kept logits' conversion kernel
alone by rows x warps; whole steps with conversion variants, a side stream, a 64 MiB dedicated dZ chunk; steps timed
alone and back to back; a kernel profile of the best variant."""
import dataclasses, json, os, statistics, sys
import torch, triton
sys.path.insert(0, ".")
from benchmarks.bench_linear_ce import make_inputs, _GemmsOnly, Timer, peak_extra_mib
from kernels import forward, backward, linear_cross_entropy
from torch.profiler import profile, ProfilerActivity

out = os.environ.get("OUT", "/tmp")
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 12
inputs = make_inputs("random", 8192, 256000, 2304, "cuda")
FB, BB = forward.TILES, backward.TILES
beta = 0.1
res = {"device": torch.cuda.get_device_name()}

def timed(fn, reps=20, warm=3):
    for _ in range(warm): fn()
    ts = []
    for _ in range(reps):
        torch.cuda.synchronize(); a = torch.cuda.Event(enable_timing=True); b = torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); torch.cuda.synchronize(); ts.append(a.elapsed_time(b))
    return statistics.median(ts), min(ts)

# 1. the conversion kernel alone: 8 chunks of 8192 x 8192
n, w, chunks = 8192, 8192, 8
region = torch.randn(chunks * w * n, device="cuda").to(torch.bfloat16)
shift = torch.randn(chunks * w // 256, n, device="cuda")
lse = torch.full((n,), 12.0, device="cuda"); g = torch.full((n,), 1 / n, device="cuda")
gs = torch.ones(1, device="cuda"); y = torch.randint(0, 256000, (n,), device="cuda")
rest = torch.rand(n, device="cuda"); zy = torch.randn(n, device="cuda")
for rows, warps in [(128, 4), (128, 8), (64, 4), (64, 8), (32, 4), (32, 8), (16, 4), (16, 2), (8, 4)]:
    rb = triton.cdiv(n, rows)
    f = lambda: backward._kept_dz_kernel[(chunks * rb, w // 256)](
        region, shift, lse, g, gs, y, rest, zy, n, w // 256, 0, 0.1, 0.1 / 256000, 1.0,
        BLOCK_N=rows, BLOCK_V=256, HAS_SOFTCAP=False, num_warps=warps)
    med, mn = timed(f)
    gbs = 2 * region.numel() * 2 / med / 1e6
    res[f"convert rows {rows} warps {warps}"] = (med, mn, gbs)
    print(f"convert rows {rows:3d} warps {warps}: {med:.3f} ms (min {mn:.3f}), {gbs:.0f} GB/s", flush=True)
x = region.view(-1)
med, mn = timed(lambda: x.mul_(1.0))
print(f"torch in-place mul of the same bytes: {med:.3f} ms ({2 * x.numel() * 2 / med / 1e6:.0f} GB/s)", flush=True)
res["torch mul_"] = (med, mn)
del region, x
best = min((k for k in res if k.startswith("convert")), key=lambda k: res[k][0])
brows, bwarps = int(best.split()[2]), int(best.split()[4])
print("best:", best, flush=True)

# 2. whole steps
def ours(ft=FB, bt=BB):
    def fn(h, w, y):
        forward.TILES, backward.TILES = ft, bt
        try:
            loss = linear_cross_entropy(h, w, y, label_smoothing=beta, filter="none")
        finally:
            forward.TILES = FB
        return loss
    return fn

R = lambda **kw: dataclasses.replace(BB, **kw)
ms = {
    "committed": ours(),
    f"convert {brows}x{bwarps}": ours(bt=R(kept_rows=brows, kept_warps=bwarps)),
    f"convert {brows}x{bwarps} + side stream": ours(bt=R(kept_rows=brows, kept_warps=bwarps, kept_side_stream=True)),
    "convert 128x4 + side stream": ours(bt=R(kept_side_stream=True)),
    f"convert {brows}x{bwarps} + 64 MiB dedicated": ours(bt=R(kept_rows=brows, kept_warps=bwarps, extra_bytes=136 << 20)),
    "GEMMs only, 4 (chunked)": lambda h, w, y: _GemmsOnly.apply(h, w, "chunked"),
    "GEMMs only, 4 (whole)": lambda h, w, y: _GemmsOnly.apply(h, w, "whole"),
}

def step(fn, bwd=True, pairs=1):
    h, w = (t.detach().requires_grad_(True) for t in inputs[:2])
    def run():
        for _ in range(pairs):
            h.grad = w.grad = None
            loss = fn(h, w, inputs[2])
            if bwd:
                loss.backward()
            backward.TILES = BB
        return h, w
    return run

for k in list(ms):
    for _ in range(2): step(ms[k])()
torch.cuda.synchronize()
ref = [t.grad.float() for t in step(ms["committed"])()]
for k in [k for k in ms if not k.startswith("GEMMs") and k != "committed"]:
    new = [t.grad.float() for t in step(ms[k])()]
    rel = [((a - b).abs().max() / b.abs().max()).item() for a, b in zip(new, ref)]
    print(f"{k}: max|diff|/max vs committed: dE {rel[0]:.2e} dC {rel[1]:.2e}", flush=True)
    res[f"diff {k}"] = rel
del ref, new
timer = Timer("cuda")
names = list(ms)
kinds = ("fwd", "fwd+bwd", "2 x fwd+bwd")
times = {(k, kind): [] for k in names for kind in kinds}
for r in range(rounds):
    for k in (names if r % 2 == 0 else names[::-1]):
        for kind in kinds:
            times[(k, kind)].append(timer(step(ms[k], bwd=kind != "fwd", pairs=2 if kind.startswith("2") else 1)))
for k in names:
    row = {}
    for kind in kinds:
        t = times[(k, kind)]
        row[kind] = dict(median=statistics.median(t), min=min(t), max=max(t), all=t)
    row["fwd+bwd MiB"] = peak_extra_mib(step(ms[k]), "cuda")
    res[k] = row
    print(f"{k:40s} fwd {row['fwd']['median']:6.2f} ({row['fwd']['min']:.1f}) | fwd+bwd {row['fwd+bwd']['median']:6.2f} "
          f"({row['fwd+bwd']['min']:.1f}-{row['fwd+bwd']['max']:.1f}) {row['fwd+bwd MiB']:7.1f} MiB | "
          f"2 back to back {row['2 x fwd+bwd']['median']:6.2f}", flush=True)

run = step(ms[f"convert {brows}x{bwarps}"], pairs=3)
run(); torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    run(); torch.cuda.synchronize()
rows = []
for e in prof.key_averages():
    t = getattr(e, "self_device_time_total", 0) / 3 / 1e3
    if t > 0.005: rows.append((round(t, 3), e.count // 3, e.key[:90]))
rows.sort(reverse=True)
print(f"== convert {brows}x{bwarps}: kernel ms per step (sum {sum(r[0] for r in rows):.2f})")
for r in rows[:20]: print(f"{r[0]:8.3f} {r[1]:5d}  {r[2]}")
res["profile"] = rows
json.dump(res, open(f"{out}/ab2_h100.json", "w"), indent=1)
os.system(f"nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,power.limit --format=csv >> {out}/smi.txt")
