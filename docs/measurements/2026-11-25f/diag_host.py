"""Where the host time of one exact step goes: cProfile over steps, and the CPU op timeline of one step.

argv: real folder, out folder, module (kernels), filter."""
import cProfile, importlib, io, json, pstats, sys, time
import torch
sys.path.insert(0, ".")
from benchmarks.lce_real_inputs import load

folder, out, mod, filt = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
lce = importlib.import_module(mod).linear_cross_entropy
h, w, y, _ = load(folder)
hh = h.cuda().requires_grad_(True); ww = w.cuda().requires_grad_(True); y = y.cuda()

def step():
    hh.grad = ww.grad = None
    lce(hh, ww, y, label_smoothing=0.0, filter=filt).backward()
    torch.cuda.synchronize()

for _ in range(5):
    step()
pr = cProfile.Profile()
pr.enable()
for _ in range(10):
    step()
pr.disable()
s = io.StringIO()
pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(45)
s2 = io.StringIO()
pstats.Stats(pr, stream=s2).sort_stats("cumulative").print_stats(45)
open(f"{out}/cprofile_{mod}_{filt}.txt", "w").write(s.getvalue() + s2.getvalue())
print(s.getvalue()[-6000:])

from torch.profiler import profile, ProfilerActivity
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    step()
evs = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CPU]
evs.sort(key=lambda e: e.time_range.start)
t0 = evs[0].time_range.start
top, end = [], -1
for e in evs:  # top-level ops only (not inside an earlier op's range)
    if e.time_range.start >= end:
        top.append((round((e.time_range.start - t0) / 1e3, 3), round((e.time_range.end - e.time_range.start), 1),
                    e.name[:60]))
        end = e.time_range.end
gpu = sorted((e.time_range.start, e.time_range.end, e.name[:40]) for e in prof.events()
             if e.device_type == torch.autograd.DeviceType.CUDA)
json.dump({"cpu_top": top, "gpu": [((a - t0) / 1e3, (b - a), n) for a, b, n in gpu]},
          open(f"{out}/timeline_{mod}_{filt}.json", "w"))
print("top-level CPU ops:", len(top))
for row in top[:120]:
    print(row)
