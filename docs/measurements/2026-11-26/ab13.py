"""A/B 13: the head's column sum, torch.sum(weight, 0, dtype=float32) (8f17b5d) against kernels.head_sum (two-pass
Triton): kernel time (torch profiler, median of 10) and peak memory beyond the inputs, Gemma-3-270M's head shape
(262144 x 640) and the paper's (256000 x 2304), bf16; and the forward of both heads' shapes (random, beta 0.1,
filter none / exact) with its peak memory."""
import json, os, statistics, sys, time
import torch
from torch.profiler import profile, ProfilerActivity
sys.path.insert(0, ".")
import kernels
from kernels import forward
from kernels.head_sum import head_column_sum
from benchmarks.bench_linear_ce import make_inputs, peak_extra_mib

out = os.environ.get("OUT", "/tmp")
res = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d")}
sms = forward.num_sms(torch.device("cuda"))
for vocab, d in ((262144, 640), (256000, 2304)):
    w = torch.randn(vocab, d, device="cuda").to(torch.bfloat16)
    ways = {"torch.sum": lambda: w.sum(dim=0, dtype=torch.float32), "head_column_sum": lambda: head_column_sum(w, sms)}
    exact = w.double().sum(0)
    for name, fn in ways.items():
        for _ in range(3):
            fn()
        err = ((fn().double() - exact).abs() / w.double().abs().sum(0)).max().item()
        ts = []
        for _ in range(10):
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                fn()
                torch.cuda.synchronize()
            ts.append(sum(e.device_time_total for e in prof.events() if e.device_type.name == "CUDA") / 1e3)
        mib = peak_extra_mib(fn, "cuda")
        res[f"{vocab}x{d} {name}"] = dict(ms=statistics.median(ts), all=ts, MiB=mib, rel_err=err)
        print(f"{vocab} x {d} {name:16s} {statistics.median(ts):.3f} ms (GPU), {mib:.2f} MiB, max err / sum|C| "
              f"{err:.1e}", flush=True)
    del w
for (n, vocab, d), filt in (((8192, 262144, 640), "exact"), ((8192, 256000, 2304), "none")):
    h, w, y = make_inputs("random", n, vocab, d, "cuda")
    h, w = h.requires_grad_(True), w.requires_grad_(True)
    fn = lambda: kernels.linear_cross_entropy(h, w, y, label_smoothing=0.1, filter=filt)
    for _ in range(3):
        fn()
    mib = peak_extra_mib(fn, "cuda")
    res[f"forward {vocab}x{d} {filt} MiB"] = mib
    print(f"forward N {n} V {vocab} D {d} beta 0.1 {filt}: {mib:.1f} MiB beyond the inputs", flush=True)
    del h, w, y
    torch.cuda.empty_cache()
json.dump(res, open(f"{out}/ab13_h100.json", "w"), indent=1)
