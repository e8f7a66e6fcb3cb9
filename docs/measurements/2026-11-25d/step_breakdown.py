"""Host vs GPU time of one loss step on the real rows: fwd, backward host time, step total."""
import sys, time, statistics, torch
sys.path.insert(0, ".")
from benchmarks.lce_real_inputs import load
from kernels import linear_cross_entropy
h, w, y, _ = load(sys.argv[1], device="cuda") if "device" in load.__code__.co_varnames else load(sys.argv[1])
h, w, y = h.cuda(), w.cuda(), y.cuda()
for beta in (0.0, 0.1):
    for f in ("exact", "loose", "none"):
        rec = {"fwd_host": [], "bwd_host": [], "total": [], "fwd_gpu": []}
        for i in range(13):
            hh = h.detach().clone().requires_grad_(True); ww = w.detach().clone().requires_grad_(True)
            torch.cuda.synchronize()
            s0, s1, s2 = (torch.cuda.Event(enable_timing=True) for _ in range(3))
            t0 = time.perf_counter(); s0.record()
            loss = linear_cross_entropy(hh, ww, y, label_smoothing=beta, filter=f)
            s1.record(); t1 = time.perf_counter()
            loss.backward()
            t2 = time.perf_counter(); s2.record(); torch.cuda.synchronize(); t3 = time.perf_counter()
            if i >= 3:
                rec["fwd_host"].append(1e3 * (t1 - t0)); rec["bwd_host"].append(1e3 * (t2 - t1))
                rec["total"].append(s0.elapsed_time(s2)); rec["fwd_gpu"].append(s0.elapsed_time(s1))
        print(f"beta {beta} {f:6s} " + " ".join(f"{k} {statistics.median(v):6.2f}" for k, v in rec.items()), flush=True)
