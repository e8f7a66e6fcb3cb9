"""Where the dense path's time goes at the paper shape (N 8192, V 256000, D 2304, bf16, random), beta 0.1."""
import json, os, statistics, sys, time
import torch
sys.path.insert(0, ".")
from benchmarks.bench_linear_ce import make_inputs
from kernels import linear_cross_entropy, backward, forward
from torch.profiler import profile, ProfilerActivity

out = os.environ.get("OUT", "/tmp")
h, w, y = make_inputs("random", 8192, 256000, 2304, "cuda")
res = {}

def step(f, beta=0.1):
    hh = h.detach().requires_grad_(True); ww = w.detach().requires_grad_(True)
    loss = linear_cross_entropy(hh, ww, y, label_smoothing=beta, filter=f)
    loss.backward()

def timed(fn, reps=8, warm=2):
    for _ in range(warm): fn()
    ts = []
    for _ in range(reps):
        torch.cuda.synchronize(); a = torch.cuda.Event(enable_timing=True); b = torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); torch.cuda.synchronize(); ts.append(a.elapsed_time(b))
    return statistics.median(ts), min(ts), max(ts)

for f in ("none", "exact"):
    for _ in range(2): step(f)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3): step(f)
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        if e.device_type.name == "CUDA" or getattr(e, "self_device_time_total", 0) > 0:
            t = getattr(e, "self_device_time_total", 0) / 3 / 1e3
            if t > 0.01: rows.append((t, e.count // 3, e.key[:90]))
    rows.sort(reverse=True)
    print(f"== filter {f}: kernel ms per step (sum {sum(r[0] for r in rows):.2f})")
    for t, c, k in rows[:25]: print(f"{t:8.3f} {c:5d}  {k}")
    res[f"kernels_{f}"] = rows
    res[f"step_{f}"] = timed(lambda: step(f))
    print("step", f, res[f"step_{f}"], flush=True)

# GEMM floors on the same shapes
E, C = h, w
cb = torch.empty(8192, 4096, dtype=torch.bfloat16, device="cuda")
res["cublas_logits_chunk_8192x4096"] = timed(lambda: torch.mm(E, C[:4096].T, out=cb), reps=20)
full = torch.empty(8192, 256000, dtype=torch.bfloat16, device="cuda")
res["cublas_logits_full"] = timed(lambda: torch.mm(E, C.T, out=full), reps=6)
del full
# our dZ kernel over a whole 8192 x 32768 chunk vs cuBLAS on it
lse_all = torch.cat([(E[i:i+1024] @ C.T).float().logsumexp(1) for i in range(0, 8192, 1024)])
g = torch.full((8192,), 1 / 8192, device="cuda")
gscale = torch.ones(1, device="cuda")
rec = backward._Recompute(h, y, lse_all, g, gscale, w, None, 256000, 0.1, None)
ws = torch.empty(8192 * 32768, dtype=torch.bfloat16, device="cuda")
dz = ws.as_strided((8192, 32768), (32768, 1))
res["dz_kernel_8192x32768"] = timed(lambda: rec(dz, 0, 8192, 0, 32768, 0), reps=10)
res["cublas_8192x32768"] = timed(lambda: torch.mm(E, C[:32768].T, out=dz), reps=10)
acc = torch.zeros(8192, 2304, dtype=torch.float32, device="cuda")
res["cublas_dE_addmm_f32out_32768"] = timed(lambda: torch.addmm(acc, dz, C[:32768], out_dtype=torch.float32, out=acc), reps=10)
dc = torch.empty(32768, 2304, dtype=torch.bfloat16, device="cuda")
res["cublas_dC_mm_32768"] = timed(lambda: torch.mm(dz.T, E, out=dc), reps=10)
x = torch.empty(8192 * 65536, dtype=torch.bfloat16, device="cuda")
res["elementwise_inplace_mul_8192x65536"] = timed(lambda: x.mul_(1.0001), reps=10)
for k, v in res.items():
    if not k.startswith("kernels"): print(k, v)
json.dump(res, open(f"{out}/profile_dense_h100.json", "w"), indent=1)
os.system(f"nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,power.limit --format=csv >> {out}/smi.txt")
