"""A/B 16: the dZ recompute's tile order at the paper shape (random, bf16, beta 0.1, filter none): BackwardTiles.
dz_group_v = 16 (the default: a wave of 132 tiles covers ~8 row blocks x 16 vocabulary tiles, 4.7 + 18.9 MB of E
and C rows), 8 (~16 x 8: 9.4 + 9.4 MB) and 4 (~33 x 4: 19.5 + 4.7 MB). dZ kernel time per fwd+bwd step (torch
profiler, one step of each per round, order alternating)."""
import collections, dataclasses, json, os, statistics, sys, time
import torch
from torch.profiler import profile, ProfilerActivity
sys.path.insert(0, ".")
from benchmarks.bench_linear_ce import make_inputs
import kernels
from kernels import backward

out = os.environ.get("OUT", "/tmp")
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 8
res = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d")}
inputs = make_inputs("random", 8192, 256000, 2304, "cuda")
h, w = (t.detach().requires_grad_(True) for t in inputs[:2])
default = backward.TILES
variants = {f"group_v {g}": dataclasses.replace(default, dz_group_v=g) for g in (16, 8, 4)}


def run(name):
    backward.TILES = variants[name]
    h.grad = w.grad = None
    kernels.linear_cross_entropy(h, w, inputs[2], label_smoothing=0.1, filter="none").backward()
    backward.TILES = default
    return h.grad.float(), w.grad.float()


base = run("group_v 16")
for k in variants:
    run(k)
    new = run(k)
    print(f"{k}: max|diff| / max (dE, dC) " + " ".join(
        f"{((a - b).abs().max() / b.abs().max()).item():.1e}" for a, b in zip(new, base)), flush=True)
del base, new
per = collections.defaultdict(lambda: collections.defaultdict(list))
for r in range(rounds):
    for k in (list(variants) if r % 2 == 0 else list(variants)[::-1]):
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            run(k)
            torch.cuda.synchronize()
        sums = collections.Counter()
        for e in prof.events():
            if e.device_type.name == "CUDA":
                key = next((n for n in ("_lse_forward_kernel", "_kept_dz_kernel", "_dz_kernel") if n in e.name),
                           "gemm" if ("gemm" in e.name or "nvjet" in e.name) else "other")
                sums[key] += e.device_time_total / 1e3
        for n, v in sums.items():
            per[k][n].append(v)
        per[k]["total"].append(sum(sums.values()))
for k in variants:
    print(f"{k}: " + ", ".join(f"{n} {statistics.median(v):.3f}" for n, v in per[k].items()) + " ms (median)",
          flush=True)
res["per step ms"] = {k: dict(v) for k, v in per.items()}
json.dump(res, open(f"{out}/ab16_h100.json", "w"), indent=1)
