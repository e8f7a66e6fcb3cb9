"""What the host does between the forward and our backward (DivBackward0 took 2-4 ms in profiles).

argv: real folder, out folder."""
import json, statistics, sys, time
import torch
sys.path.insert(0, ".")
from benchmarks.lce_real_inputs import load
from kernels import linear_cross_entropy as lce

folder, out = sys.argv[1], sys.argv[2]
h, w, y, _ = load(folder)
hh = h.cuda().requires_grad_(True); ww = w.cuda().requires_grad_(True); y = y.cuda()

def step(reduction, f="exact"):
    hh.grad = ww.grad = None
    torch.cuda.synchronize()
    s0, s2 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.perf_counter(); s0.record()
    loss = lce(hh, ww, y, filter=f, reduction=reduction)
    if reduction == "none":
        loss = loss.sum()
    t1 = time.perf_counter()
    loss.backward()
    t2 = time.perf_counter(); s2.record(); s2.synchronize()
    return {"total": s0.elapsed_time(s2), "fwd_host": 1e3 * (t1 - t0), "bwd_host": 1e3 * (t2 - t1)}

res = {}
for red in ("mean", "sum", "none"):
    for _ in range(3):
        step(red)
    recs = [step(red) for _ in range(15)]
    res[red] = {k: round(statistics.median(r[k] for r in recs), 2) for k in recs[0]}
    print(red, res[red], flush=True)

from torch.profiler import profile, ProfilerActivity
for red in ("mean", "sum"):
    step(red)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step(red)
    evs = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CPU),
                 key=lambda e: e.time_range.start)
    t0 = evs[0].time_range.start
    rows = [(round((e.time_range.start - t0) / 1e3, 3), round(e.time_range.end - e.time_range.start, 1),
             e.thread, e.name[:70]) for e in evs]
    gpu = sorted(((e.time_range.start - t0) / 1e3, e.time_range.end - e.time_range.start, e.name[:40])
                 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    json.dump({"cpu": rows, "gpu": gpu}, open(f"{out}/div_{red}.json", "w"))
    div = [r for r in rows if "DivBackward0" in r[3] or "SumBackward0" in r[3]]
    print(red, "backward nodes", div[:4])
    if div:
        a = div[0][0]; b = a + div[0][1] / 1e3
        print("  inside:", [r for r in rows if a <= r[0] <= b][:40])
    fk = [g for g in gpu if g[2].startswith("_lse_forward")]
    print("  forward kernel (start ms, us):", fk[:1])

from kernels import backward
for share in (0.0, 0.08, 0.15, 0.0, 0.08, 0.15):
    backward.PREFIX_SHARE = share
    backward.prefix_tiles = (lambda s: (lambda tiles: 0 if s == 0 else min(tiles, max(1, round(s * tiles)))))(share)
    for _ in range(2):
        step("mean")
    recs = [step("mean") for _ in range(15)]
    print("prefix", share, {k: round(statistics.median(r[k] for r in recs), 2) for k in recs[0]}, flush=True)
