"""A/B 14: the forward kernel's program order at the paper shape (random, bf16, beta 0.1, filter none, kept logits):
base = 2 splits, program pid on row block pid % 64 (a wave: all 64 row blocks, E's 37.7 MB); sS = S splits in the
same order; gGsS = groups of G row blocks x S splits (a wave: G row blocks' E rows, S vocabulary tiles at a time).
Forward kernel time (torch profiler, one forward per variant per round, order alternating)."""
import collections, json, os, statistics, sys, time
import torch
from torch.profiler import profile, ProfilerActivity
sys.path.insert(0, "."); sys.path.insert(0, ".gpu_host")
from benchmarks.bench_linear_ce import make_inputs
import kernels_g  # kernels as of 7bbe0fd with ab14_kernels_g_forward.patch, under another name
from kernels_g import forward as fg

out = os.environ.get("OUT", "/tmp")
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 8
res = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d")}
variants = {"base": (0, 0), "s8": (0, 8), "g16s8": (16, 8), "g32s4": (32, 4), "g8s16": (8, 16)}
inputs = make_inputs("random", 8192, 256000, 2304, "cuda")
h, w = (t.detach().requires_grad_(True) for t in inputs[:2])


def run(name):
    fg.GROUP, fg.SPLITS = variants[name]
    return kernels_g.linear_cross_entropy(h, w, inputs[2], label_smoothing=0.1, filter="none")


base = run("base").item()
for k in variants:
    for _ in range(2):
        run(k)
    print(f"{k}: loss {run(k).item():.7f} (base {base:.7f})", flush=True)
per = collections.defaultdict(list)
for r in range(rounds):
    for k in (list(variants) if r % 2 == 0 else list(variants)[::-1]):
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            run(k)
            torch.cuda.synchronize()
        per[k].append(sum(e.device_time_total for e in prof.events()
                          if e.device_type.name == "CUDA" and "_lse_forward_kernel" in e.name) / 1e3)
for k in variants:
    print(f"{k:6s} forward kernel median {statistics.median(per[k]):.3f} ms (min {min(per[k]):.3f}, "
          f"max {max(per[k]):.3f})", flush=True)
res["forward kernel ms"] = dict(per)
json.dump(res, open(f"{out}/ab14_h100.json", "w"), indent=1)
