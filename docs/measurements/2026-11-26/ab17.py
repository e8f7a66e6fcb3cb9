"""A/B 17: the head's column sum launched before the forward kernel on the same stream (0317904) against on a second
stream after the forward kernel's launch, waiting only for what precedes it (its programs take the SMs the forward's
last wave leaves free). Paper shape (random, beta 0.1, filter none) and Gemma-3-270M's (random, V 262144, D 640,
filter exact): kernel times and where the column sum ran (torch profiler), CUDA-event rounds, peak memory."""
import collections, json, os, statistics, sys, time
import torch
from torch.profiler import profile, ProfilerActivity
sys.path.insert(0, ".")
from benchmarks.bench_linear_ce import make_inputs, Timer, peak_extra_mib
import kernels
from kernels import forward

out = os.environ.get("OUT", "/tmp")
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 14
prof_rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 6
res = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d")}
timer = Timer("cuda")
variants = {"same stream": False, "beside": True}
for shape, filt in (((8192, 256000, 2304), "none"), ((8192, 262144, 640), "exact")):
    inputs = make_inputs("random", *shape, "cuda")
    tag = f"{shape[1]}x{shape[2]} {filt}"

    def step(k, bwd=True):
        h, w = (t.detach().requires_grad_(True) for t in inputs[:2])
        def run():
            forward.COLUMN_SUM_BESIDE = variants[k]
            h.grad = w.grad = None
            loss = kernels.linear_cross_entropy(h, w, inputs[2], label_smoothing=0.1, filter=filt)
            if bwd:
                loss.backward()
            return loss, h, w
        return run

    outs = {}
    for k in variants:
        for _ in range(2):
            step(k)()
        loss, h, w = step(k)()
        outs[k] = [loss.detach().float(), h.grad.float(), w.grad.float()]
    print(f"{tag}: beside vs same stream max|diff| (loss, dE, dC): " + " ".join(
        f"{(a - b).abs().max().item():.1e}" for a, b in zip(outs["beside"], outs["same stream"])), flush=True)
    del outs
    per = {k: collections.defaultdict(list) for k in variants}
    runs = {k: step(k, bwd=False) for k in variants}
    for r in range(prof_rounds):
        for k in (list(variants) if r % 2 == 0 else list(variants)[::-1]):
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                runs[k]()
                torch.cuda.synchronize()
            spans = collections.defaultdict(list)
            for e in prof.events():
                if e.device_type.name == "CUDA":
                    spans[e.name].append((e.time_range.start, e.time_range.end))
            fwd = next(v for n, v in spans.items() if "_lse_forward_kernel" in n)
            col = next(v for n, v in spans.items() if "_column_sum_kernel" in n)
            fin = next(v for n, v in spans.items() if "_finish_kernel" in n)
            first = min(min(a for a, _ in v) for v in spans.values())
            per[k]["forward kernel"].append(sum(b - a for a, b in fwd) / 1e3)
            per[k]["column sum"].append(sum(b - a for a, b in col) / 1e3)
            per[k]["column sum start - forward start"].append((col[0][0] - fwd[0][0]) / 1e3)
            per[k]["column sum end - forward end"].append((col[0][1] - fwd[-1][1]) / 1e3)
            per[k]["first kernel start to finish end"].append((fin[-1][1] - first) / 1e3)
    for k in variants:
        res[f"{tag} profile {k}"] = dict(per[k])
        print(f"{tag} {k}: " + ", ".join(f"{n} {statistics.median(v):.3f}" for n, v in per[k].items()) + " ms",
              flush=True)
    steps = {(k, kind): step(k, bwd=kind == "fwd+bwd") for k in variants for kind in ("fwd", "fwd+bwd")}
    times = collections.defaultdict(list)
    for r in range(rounds):
        for kind in ("fwd", "fwd+bwd"):
            for k in (list(variants) if r % 2 == 0 else list(variants)[::-1]):
                times[(k, kind)].append(timer(steps[(k, kind)]))
    for k in variants:
        row = {kind: dict(median=statistics.median(times[(k, kind)]), min=min(times[(k, kind)]),
                          max=max(times[(k, kind)]), all=times[(k, kind)]) for kind in ("fwd", "fwd+bwd")}
        row["fwd MiB"] = peak_extra_mib(step(k, bwd=False), "cuda")
        row["fwd+bwd MiB"] = peak_extra_mib(step(k), "cuda")
        res[f"{tag} rounds {k}"] = row
        print(f"{tag} {k:12s} fwd {row['fwd']['median']:6.2f} ({row['fwd']['min']:.1f}-{row['fwd']['max']:.1f})"
              f" | fwd+bwd {row['fwd+bwd']['median']:6.2f} ({row['fwd+bwd']['min']:.1f}-{row['fwd+bwd']['max']:.1f})"
              f" | MiB {row['fwd MiB']:.1f} / {row['fwd+bwd MiB']:.1f}", flush=True)
    del steps, runs, inputs
    torch.cuda.empty_cache()
json.dump(res, open(f"{out}/ab17_h100.json", "w"), indent=1)
