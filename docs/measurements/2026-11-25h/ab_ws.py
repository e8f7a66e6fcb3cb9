"""A/B at the paper shape (random, bf16, N 8192, V 256000, D 2304), beta 0.1: the committed code against warp
specialised forward / dZ loops, 4 dZ stages, the kept chunks' conversion on a side stream; GEMM floors; a kernel
profile of the committed code; host time of the forward before its kernel's launch."""
import cProfile, dataclasses, io, json, os, pstats, statistics, sys, time
import torch
sys.path.insert(0, ".")
from benchmarks.bench_linear_ce import make_inputs, _GemmsOnly, Timer, peak_extra_mib
from kernels import forward, backward, linear_cross_entropy
from torch.profiler import profile, ProfilerActivity

out = os.environ.get("OUT", "/tmp")
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 12
inputs = make_inputs("random", 8192, 256000, 2304, "cuda")
FB, BB = forward.TILES, backward.TILES
beta = 0.1

def ours(ft=FB, bt=BB):
    def fn(h, w, y):
        forward.TILES, backward.TILES = ft, bt
        try:
            loss = linear_cross_entropy(h, w, y, label_smoothing=beta, filter="none")
        finally:
            forward.TILES, backward.TILES = FB, BB
        return _Wrap.apply(loss, bt)
    return fn

class _Wrap(torch.autograd.Function):  # the backward runs under the variant's tiles too
    @staticmethod
    def forward(ctx, loss, bt):
        ctx.bt = bt
        return loss.clone()
    @staticmethod
    def backward(ctx, g):
        backward.TILES = ctx.bt
        return g, None

ms = {
    "committed": ours(),
    "fwd warp_specialize": ours(ft=dataclasses.replace(FB, warp_specialize=True)),
    "dZ warp_specialize": ours(bt=dataclasses.replace(BB, dz_warp_specialize=True)),
    "dZ 4 stages": ours(bt=dataclasses.replace(BB, dz_stages=4)),
    "kept side stream": ours(bt=dataclasses.replace(BB, kept_side_stream=True)),
    "side stream + dZ 4 stages": ours(bt=dataclasses.replace(BB, kept_side_stream=True, dz_stages=4)),
    "GEMMs only, 4 (chunked)": lambda h, w, y: _GemmsOnly.apply(h, w, "chunked"),
    "GEMMs only, 4 (whole)": lambda h, w, y: _GemmsOnly.apply(h, w, "whole"),
}

def step(fn, bwd=True):
    h, w = (t.detach().requires_grad_(True) for t in inputs[:2])
    def run():
        loss = fn(h, w, inputs[2])
        if bwd:
            loss.backward()
        backward.TILES = BB
        return h, w
    return run

res = {"device": torch.cuda.get_device_name()}
for k in list(ms):
    try:
        t0 = time.time()
        for _ in range(2): step(ms[k])()
        torch.cuda.synchronize()
        print(f"{k}: warm in {time.time() - t0:.1f} s", flush=True)
    except Exception as e:
        print(f"{k}: failed: {type(e).__name__}: {str(e)[:300]}", flush=True)
        del ms[k]
ref = [t.grad.float() for t in step(ms["committed"])()]
for k in [k for k in ms if not k.startswith("GEMMs") and k != "committed"]:
    new = [t.grad.float() for t in step(ms[k])()]
    rel = [((a - b).abs().max() / b.abs().max()).item() for a, b in zip(new, ref)]
    print(f"{k}: max|diff|/max vs committed: dE {rel[0]:.2e} dC {rel[1]:.2e}", flush=True)
    res[f"diff {k}"] = rel
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
        row[kind] = dict(median=statistics.median(t), min=min(t), max=max(t), all=t,
                         mib=peak_extra_mib(step(ms[k], bwd=kind == "fwd+bwd"), "cuda"))
    res[k] = row
    print(f"{k:28s} fwd {row['fwd']['median']:6.2f} ({row['fwd']['min']:.1f}-{row['fwd']['max']:.1f}) "
          f"{row['fwd']['mib']:7.1f} MiB | fwd+bwd {row['fwd+bwd']['median']:6.2f} "
          f"({row['fwd+bwd']['min']:.1f}-{row['fwd+bwd']['max']:.1f}) {row['fwd+bwd']['mib']:7.1f} MiB", flush=True)

# kernel profile of the committed code
run = step(ms["committed"])
torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    for _ in range(3): run()
    torch.cuda.synchronize()
rows = []
for e in prof.key_averages():
    t = getattr(e, "self_device_time_total", 0) / 3 / 1e3
    if t > 0.005: rows.append((round(t, 3), e.count // 3, e.key[:90]))
rows.sort(reverse=True)
print(f"== committed: kernel ms per step (sum {sum(r[0] for r in rows):.2f})")
for r in rows[:25]: print(f"{r[0]:8.3f} {r[1]:5d}  {r[2]}")
res["profile committed"] = rows

# host time of a forward with gradients, up to and after the kernel's launch
h, w = (t.detach().requires_grad_(True) for t in inputs[:2])
pr = cProfile.Profile()
for i in range(25):
    torch.cuda.synchronize()
    if i >= 5: pr.enable()
    linear_cross_entropy(h, w, inputs[2], label_smoothing=beta, filter="none")
    if i >= 5: pr.disable()
torch.cuda.synchronize()
s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(40)
print(s.getvalue()[:6000])
open(f"{out}/fwd_host_cprofile.txt", "w").write(s.getvalue())
json.dump(res, open(f"{out}/ab_ws_h100.json", "w"), indent=1)
os.system(f"nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,power.limit --format=csv >> {out}/smi.txt")
