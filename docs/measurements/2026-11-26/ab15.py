"""A/B 15: the forward's programs in groups (kernels.forward.choose_order: 8 splits x 16 row blocks at these shapes)
against 7bbe0fd (kernels_7bb: 2 splits, every wave over all 64 row blocks). Paper shape (random, N 8192, V 256000,
D 2304, filter none, beta 0.1) and Gemma-3-270M's shape (random, V 262144, D 640, filter none and exact, beta
0.1): kernel time per kernel (torch profiler, one fwd+bwd of each per round, order alternating) and CUDA-event
rounds of fwd and fwd+bwd."""
import collections, json, os, statistics, sys, time
import torch
from torch.profiler import profile, ProfilerActivity
sys.path.insert(0, "."); sys.path.insert(0, ".gpu_host")
from benchmarks.bench_linear_ce import make_inputs, Timer, peak_extra_mib
import kernels, kernels_7bb

out = os.environ.get("OUT", "/tmp")
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 12
prof_rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 6
res = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d")}
KEYS = ("_lse_forward_kernel", "_finish_kernel", "_kept_dz_kernel", "_dz_kernel", "_column_sum_kernel")
timer = Timer("cuda")
for shape, filt in (((8192, 256000, 2304), "none"), ((8192, 262144, 640), "none"), ((8192, 262144, 640), "exact")):
    inputs = make_inputs("random", *shape, "cuda")
    ms = {name: (lambda pkg: lambda h, w, y: pkg.linear_cross_entropy(h, w, y, label_smoothing=0.1, filter=filt))(pkg)
          for name, pkg in (("7bbe0fd", kernels_7bb), ("groups", kernels))}

    def step(fn, bwd=True):
        h, w = (t.detach().requires_grad_(True) for t in inputs[:2])
        def run():
            h.grad = w.grad = None
            loss = fn(h, w, inputs[2])
            if bwd:
                loss.backward()
            return loss, h, w
        return run

    outs = {}
    for k in ms:
        for _ in range(2):
            step(ms[k])()
        loss, h, w = step(ms[k])()
        outs[k] = [loss.detach().float(), h.grad.float(), w.grad.float()]
    print(f"{shape} {filt}: groups vs 7bbe0fd max|diff| / max|base| (loss, dE, dC): " + " ".join(
        f"{((a - b).abs().max() / b.abs().max()).item():.2e}" for a, b in zip(outs["groups"], outs["7bbe0fd"])),
        flush=True)
    del outs
    tag = f"{shape[1]}x{shape[2]} {filt}"
    per = {k: collections.defaultdict(list) for k in ms}
    runs = {k: step(ms[k]) for k in ms}
    for r in range(prof_rounds):
        for k in (list(ms) if r % 2 == 0 else list(ms)[::-1]):
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                runs[k]()
                torch.cuda.synchronize()
            sums = collections.Counter()
            for e in prof.events():
                if e.device_type.name == "CUDA":
                    key = next((n for n in KEYS if n in e.name),
                               "gemm" if ("gemm" in e.name or "xmma" in e.name or "nvjet" in e.name) else "other")
                    sums[key] += e.device_time_total
            for n, v in sums.items():
                per[k][n].append(v / 1e3)
            per[k]["total"].append(sum(sums.values()) / 1e3)
    for k in ms:
        res[f"{tag} profile {k}"] = dict(per[k])
        print(f"{tag} {k} kernels per step, median of {prof_rounds} (ms): "
              f"{ {n: round(statistics.median(v), 3) for n, v in per[k].items()} }", flush=True)
    steps = {(k, kind): step(ms[k], bwd=kind == "fwd+bwd") for k in ms for kind in ("fwd", "fwd+bwd")}
    times = collections.defaultdict(list)
    for r in range(rounds):
        for k in (list(ms) if r % 2 == 0 else list(ms)[::-1]):
            for kind in ("fwd", "fwd+bwd"):
                times[(k, kind)].append(timer(steps[(k, kind)]))
    for k in ms:
        row = {kind: dict(median=statistics.median(times[(k, kind)]), min=min(times[(k, kind)]),
                          max=max(times[(k, kind)]), all=times[(k, kind)]) for kind in ("fwd", "fwd+bwd")}
        row["fwd MiB"] = peak_extra_mib(step(ms[k], bwd=False), "cuda")
        row["fwd+bwd MiB"] = peak_extra_mib(step(ms[k]), "cuda")
        res[f"{tag} rounds {k}"] = row
        print(f"{tag} {k:8s} fwd {row['fwd']['median']:6.2f} ({row['fwd']['min']:.1f}-{row['fwd']['max']:.1f})"
              f" | fwd+bwd {row['fwd+bwd']['median']:6.2f} ({row['fwd+bwd']['min']:.1f}-{row['fwd+bwd']['max']:.1f})"
              f" | MiB {row['fwd MiB']:.1f} / {row['fwd+bwd MiB']:.1f}", flush=True)
    del steps, runs, inputs
    torch.cuda.empty_cache()
json.dump(res, open(f"{out}/ab15_h100.json", "w"), indent=1)
