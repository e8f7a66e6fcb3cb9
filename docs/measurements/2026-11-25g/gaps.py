"""GPU idle gaps inside one dense fwd+bwd step (paper shape, beta 0.1): which kernels they sit between, and
whether the next kernel's launch came late (host-bound) or something waited."""
import json, os, sys, statistics
import torch
sys.path.insert(0, ".")
from benchmarks.bench_linear_ce import make_inputs
from kernels import linear_cross_entropy
from torch.profiler import profile, ProfilerActivity

out = os.environ.get("OUT", "/tmp")
h, w, y = make_inputs("random", 8192, 256000, 2304, "cuda")
f = sys.argv[1] if len(sys.argv) > 1 else "none"

def step():
    hh = h.detach().requires_grad_(True); ww = w.detach().requires_grad_(True)
    loss = linear_cross_entropy(hh, ww, y, label_smoothing=0.1, filter=f)
    loss.backward()

for _ in range(3): step()
torch.cuda.synchronize()
import time
rec = []
for _ in range(8):
    hh = h.detach().requires_grad_(True); ww = w.detach().requires_grad_(True)
    torch.cuda.synchronize()
    a, b, c = (torch.cuda.Event(enable_timing=True) for _ in range(3))
    t0 = time.perf_counter(); a.record()
    loss = linear_cross_entropy(hh, ww, y, label_smoothing=0.1, filter=f)
    b.record(); t1 = time.perf_counter()
    loss.backward(); t2 = time.perf_counter(); c.record(); torch.cuda.synchronize(); t3 = time.perf_counter()
    rec.append((1e3 * (t1 - t0), 1e3 * (t2 - t1), a.elapsed_time(b), a.elapsed_time(c), 1e3 * (t3 - t0)))
print("fwd_host bwd_host fwd_gpu total_gpu total_wall (ms), medians:",
      [round(statistics.median(r[i] for r in rec), 2) for i in range(5)])
s0 = torch.cuda.memory_stats()
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=False) as prof:
    for _ in range(2):
        step()
        torch.cuda.synchronize()
s1 = torch.cuda.memory_stats()
print("cudaMalloc during profiled steps:", s1["num_device_alloc"] - s0["num_device_alloc"],
      "frees:", s1["num_device_free"] - s0["num_device_free"])
path = f"{out}/trace_{f}.json"
prof.export_chrome_trace(path)
tr = json.load(open(path))
ev = tr["traceEvents"]
gpu = [e for e in ev if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "dur" in e]
gpu.sort(key=lambda e: e["ts"])
rt = {e["args"].get("correlation"): e for e in ev if e.get("cat") == "cuda_runtime" and "args" in e}
cpu_ops = [e for e in ev if e.get("cat") == "cpu_op" and "dur" in e]
def enclosing(ts):
    best = None
    for e in cpu_ops:
        if e["ts"] <= ts <= e["ts"] + e["dur"] and (best is None or e["dur"] < best["dur"]):
            best = e
    return best["name"] if best else "-"
# split into steps at gaps > 2 ms after a sync
busy = sum(e["dur"] for e in gpu)
span = gpu[-1]["ts"] + gpu[-1]["dur"] - gpu[0]["ts"]
print(f"2 steps: busy {busy/1e3:.2f} ms, span {span/1e3:.2f} ms")
gaps = []
end = gpu[0]["ts"] + gpu[0]["dur"]
for prev, e in zip(gpu, gpu[1:]):
    gap = e["ts"] - end
    if gap > 30:
        launch = rt.get(e["args"].get("correlation"))
        lts = launch["ts"] if launch else None
        gaps.append((gap, prev["name"][:50], e["name"][:50], (e["ts"] - lts) if lts else None,
                     enclosing(lts) if lts else "-", launch["name"] if launch else "-"))
    end = max(end, e["ts"] + e["dur"])
gaps.sort(reverse=True)
print("gap_us  prev -> next  | next launched this long before its start (us) | host op enclosing launch")
for g in gaps[:30]:
    print(f"{g[0]:8.0f}  {g[1]} -> {g[2]} | {g[3] if g[3] is None else round(g[3])} | {g[4]} ({g[5]})")
print("total gaps >30us:", round(sum(g[0] for g in gaps) / 1e3, 2), "ms over 2 steps")
# host op summary of the step (top self CPU)
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
