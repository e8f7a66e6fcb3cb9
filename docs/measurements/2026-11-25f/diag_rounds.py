"""Why ours exact is slower in the bench's rounds than alone: per-step host/GPU timeline, clocks, kernel busy share.

argv: real folder, out folder, module names to compare (e.g. kernels kernels_base)."""
import importlib, json, statistics, subprocess, sys, time
import torch
sys.path.insert(0, ".")
from benchmarks.lce_real_inputs import load
from benchmarks.bench_linear_ce import _eager

folder, out = sys.argv[1], sys.argv[2]
mods = sys.argv[3:] or ["kernels"]
h, w, y, _ = load(folder)
h, w, y = h.cuda(), w.cuda(), y.cuda()
hh = h.detach().requires_grad_(True); ww = w.detach().requires_grad_(True)
res = {}

waits = []
for m in mods:
    hostmod = importlib.import_module(f"{m}._host")
    orig = hostmod.AsyncHostCopy.get
    def timed_get(self, orig=orig):
        t0 = time.perf_counter(); r = orig(self); waits.append(1e3 * (time.perf_counter() - t0)); return r
    hostmod.AsyncHostCopy.get = timed_get

def ours(mod, f, beta=0.0):
    lce = importlib.import_module(mod).linear_cross_entropy
    return lambda: lce(hh, ww, y, label_smoothing=beta, filter=f)

comp = torch.compile(_eager(0.0))
methods = {f"{m} exact": ours(m, "exact") for m in mods}
methods["ours loose"] = ours("kernels", "loose")
methods["ours none"] = ours("kernels", "none")
methods["torch.compile"] = lambda: comp(hh, ww, y)

def step(fn):
    hh.grad = ww.grad = None
    torch.cuda.synchronize()
    s0, s1, s2 = (torch.cuda.Event(enable_timing=True) for _ in range(3))
    waits.clear()
    t0 = time.perf_counter(); s0.record()
    loss = fn()
    s1.record(); t1 = time.perf_counter()
    loss.backward()
    t2 = time.perf_counter(); s2.record(); s2.synchronize(); t3 = time.perf_counter()
    hh.grad = ww.grad = None
    return {"total": s0.elapsed_time(s2), "fwd_gpu": s0.elapsed_time(s1), "fwd_host": 1e3 * (t1 - t0),
            "bwd_host": 1e3 * (t2 - t1), "wait": sum(waits), "wall": 1e3 * (t3 - t0)}

for fn in methods.values():
    for _ in range(3):
        step(fn)

smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw",
                        "--format=csv,noheader", "-lms", "50"], stdout=open(f"{out}/smi.csv", "w"))
marks = []
def summary(recs):
    return {k: round(statistics.median(r[k] for r in recs), 2) for k in recs[0]}

# A: rounds
rounds = {n: [] for n in methods}
marks.append(("rounds start", time.time()))
for _ in range(20):
    for n, fn in methods.items():
        rounds[n].append(step(fn))
marks.append(("rounds end", time.time()))
res["rounds"] = {n: summary(r) for n, r in rounds.items()}
# B: alone, back to back
res["alone"] = {}
for n, fn in methods.items():
    marks.append((f"alone {n} start", time.time()))
    res["alone"][n] = summary([step(fn) for _ in range(15)])
# C: exact right after torch.compile vs after itself
for n in [f"{m} exact" for m in mods]:
    after = []
    for _ in range(15):
        step(methods["torch.compile"]); after.append(step(methods[n]))
    res.setdefault("after torch.compile", {})[n] = summary(after)
    after = []
    for _ in range(15):
        step(methods["ours none"]); after.append(step(methods[n]))
    res.setdefault("after ours none", {})[n] = summary(after)
    after = []
    for _ in range(15):
        torch.cuda.synchronize(); time.sleep(0.05); after.append(step(methods[n]))
    res.setdefault("after 50 ms idle", {})[n] = summary(after)
marks.append(("end", time.time()))
smi.terminate()
res["marks"] = marks

# D: kernels of one exact step, alone and after torch.compile
def kernel_profile(pre):
    from torch.profiler import profile, ProfilerActivity
    for _ in range(2):
        pre(); step(methods[f"{mods[0]} exact"])
    pre()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        step(methods[f"{mods[0]} exact"])
    ev = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA and e.device_time_total > 0]
    spans = sorted((e.time_range.start, e.time_range.end) for e in ev)
    busy, cur = 0.0, None
    for s, e in spans:
        if cur is None or s > cur[1]:
            if cur: busy += cur[1] - cur[0]
            cur = [s, e]
        else:
            cur[1] = max(cur[1], e)
    if cur: busy += cur[1] - cur[0]
    tot = {}
    for e in ev:
        k = e.name[:50]; t, c = tot.get(k, (0, 0)); tot[k] = (t + e.device_time_total, c + 1)
    # gaps over 50 us in the device timeline, with where they are
    gaps = []
    prev = None
    for s, e in spans:
        if prev is not None and s - prev > 50:
            gaps.append((round((prev - spans[0][0]) / 1e3, 2), round((s - prev) / 1e3, 3)))
        prev = e if prev is None else max(prev, e)
    return {"span_ms": (max(e for _, e in spans) - spans[0][0]) / 1e3, "busy_ms": busy / 1e3,
            "kernels": sorted(((k, round(t / 1e3, 3), c) for k, (t, c) in tot.items()), key=lambda x: -x[1])[:25],
            "gaps_ms_at": gaps[:40]}

res["profile alone"] = kernel_profile(lambda: None)
res["profile after torch.compile"] = kernel_profile(lambda: step(methods["torch.compile"]))
json.dump(res, open(f"{out}/diag_rounds.json", "w"), indent=1)
for k in ("rounds", "alone", "after torch.compile", "after ours none", "after 50 ms idle"):
    print(k)
    for n, s in res[k].items():
        print(f"  {n:22s}", s)
for k in ("profile alone", "profile after torch.compile"):
    p = res[k]
    print(k, "span", round(p["span_ms"], 2), "busy", round(p["busy_ms"], 2))
    for row in p["kernels"][:14]:
        print("   ", row)
    print("   gaps", p["gaps_ms_at"][:20])
