"""A/B 12 at the paper shape (random, bf16, N 8192, V 256000, D 2304, filter none), beta 0.1: eb2f0a4
(kernels_eb2, the session's start) against the working tree: v1 = the logit sum as E_i . sum_v C_v with the head's
column sum before the forward's launch (8f17b5d); v3 = the column sum on a side stream after the launch (on the
SMs the forward's grid of 128 programs leaves free). Kernel time per kernel (torch profiler,
one fwd+bwd step of each per round, order alternating) and CUDA-event rounds of fwd and fwd+bwd."""
import collections, json, os, statistics, sys, time
import torch
from torch.profiler import profile, ProfilerActivity
sys.path.insert(0, "."); sys.path.insert(0, ".gpu_host")
from benchmarks.bench_linear_ce import make_inputs, Timer, peak_extra_mib
import kernels, kernels_eb2
from kernels import forward as fwd_mod

out = os.environ.get("OUT", "/tmp")
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 12
prof_rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 6
inputs = make_inputs("random", 8192, 256000, 2304, "cuda")
res = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d")}


def variant(pkg, side, beta):
    def loss(h, w, y):
        fwd_mod.COLUMN_SUM_SIDE = side
        return pkg.linear_cross_entropy(h, w, y, label_smoothing=beta, filter="none")
    return loss


def step(fn, bwd=True):
    h, w = (t.detach().requires_grad_(True) for t in inputs[:2])
    def run():
        h.grad = w.grad = None
        loss = fn(h, w, inputs[2])
        if bwd:
            loss.backward()
        return loss, h, w
    return run


KEYS = ("_lse_forward_kernel", "_finish_kernel", "_dz_kernel", "_kept_dz_kernel", "reduce_kernel")
for beta in (0.1,):
    ms = {"eb2f0a4": variant(kernels_eb2, True, beta), "v1": variant(kernels, False, beta),
          "v3": variant(kernels, True, beta)}
    for k in ms:
        for _ in range(2):
            step(ms[k])()
    torch.cuda.synchronize()
    def outs(k):
        loss, h, w = step(ms[k])()
        return [loss.detach().float(), h.grad.float(), w.grad.float()]
    base = outs("eb2f0a4")
    for k in ("v1", "v3"):
        new = outs(k)
        print(f"beta {beta} {k} vs eb2f0a4 max|diff| / max|base| (loss, dE, dC): " + " ".join(
            f"{((a - b).abs().max() / b.abs().max()).item():.2e}" for a, b in zip(new, base)), flush=True)
        del new
    del base
    per = {k: collections.defaultdict(list) for k in ms}
    runs = {k: step(ms[k]) for k in ms}
    for r in range(prof_rounds):
        for k in (list(ms) if r % 2 == 0 else list(ms)[::-1]):
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                runs[k]()
                torch.cuda.synchronize()
            sums = collections.Counter()
            spans = {}
            for e in prof.events():
                if e.device_type.name == "CUDA" and ("reduce_kernel" in e.name or "_lse_forward" in e.name):
                    spans.setdefault("reduce" if "reduce" in e.name else "fwd", (e.time_range.start, e.time_range.end))
            if len(spans) == 2:  # the column sum's start and end against the forward kernel's (us)
                per[k]["sum start - fwd start"].append(spans["reduce"][0] - spans["fwd"][0])
                per[k]["sum end - fwd end"].append(spans["reduce"][1] - spans["fwd"][1])
            for e in prof.events():
                if e.device_type.name == "CUDA":
                    name = e.name
                    key = next((n for n in KEYS if n in name),
                               "gemm" if ("gemm" in name or "xmma" in name or "nvjet" in name) else "other")
                    sums[key] += e.device_time_total
            for n, v in sums.items():
                per[k][n].append(v / 1e3)
            per[k]["total"].append(sum(v for n, v in sums.items()) / 1e3)
    for k in ms:
        row = {n: round(statistics.median(v), 3) for n, v in per[k].items()}
        res[f"beta {beta} profile {k}"] = {n: v for n, v in per[k].items()}
        print(f"beta {beta} {k} kernels per step, median of {prof_rounds} (ms): {row}", flush=True)
    timer = Timer("cuda")
    names = list(ms)
    times = {(k, kind): [] for k in names for kind in ("fwd", "fwd+bwd")}
    steps = {(k, kind): step(ms[k], bwd=kind == "fwd+bwd") for k in names for kind in ("fwd", "fwd+bwd")}
    for r in range(rounds):
        for k in (names if r % 2 == 0 else names[::-1]):
            for kind in ("fwd", "fwd+bwd"):
                times[(k, kind)].append(timer(steps[(k, kind)]))
    for k in names:
        row = {}
        for kind in ("fwd", "fwd+bwd"):
            t = times[(k, kind)]
            row[kind] = dict(median=statistics.median(t), min=min(t), max=max(t), all=t)
        row["fwd MiB"] = peak_extra_mib(step(ms[k], bwd=False), "cuda")
        row["fwd+bwd MiB"] = peak_extra_mib(step(ms[k]), "cuda")
        res[f"beta {beta} rounds {k}"] = row
        print(f"beta {beta} {k:8s} fwd {row['fwd']['median']:6.2f} ({row['fwd']['min']:.1f}-{row['fwd']['max']:.1f})"
              f" | fwd+bwd {row['fwd+bwd']['median']:6.2f} ({row['fwd+bwd']['min']:.1f}-"
              f"{row['fwd+bwd']['max']:.1f}) | MiB {row['fwd MiB']:.1f} / {row['fwd+bwd MiB']:.1f}", flush=True)
    del steps, runs
    torch.cuda.empty_cache()
json.dump(res, open(f"{out}/ab12_h100.json", "w"), indent=1)
