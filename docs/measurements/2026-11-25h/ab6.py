"""A/B 6 at the paper shape (random, bf16, N 8192, V 256000, D 2304), beta 0.1 and 0: the forward's logit sum as
E_i . sum_v C_v (07ab065) against row sums of every tile (ba7d36a, kernels_prev) and the session's start (0f4159c,
kernels_start); forward parts; compiled forward kernels."""
import json, os, statistics, sys
import torch
sys.path.insert(0, "."); sys.path.insert(0, ".gpu_dense")
from benchmarks.bench_linear_ce import make_inputs, _GemmsOnly, Timer, peak_extra_mib
from kernels import forward, linear_cross_entropy
import kernels_prev, kernels_start

out = os.environ.get("OUT", "/tmp")
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 14
inputs = make_inputs("random", 8192, 256000, 2304, "cuda")
res = {"device": torch.cuda.get_device_name()}
for beta in (0.1, 0.0):
    ms = {
        "start (0f4159c) none": lambda h, w, y: kernels_start.linear_cross_entropy(h, w, y, label_smoothing=beta, filter="none"),
        "row sums (ba7d36a) none": lambda h, w, y: kernels_prev.linear_cross_entropy(h, w, y, label_smoothing=beta, filter="none"),
        "ours (07ab065) none": lambda h, w, y: linear_cross_entropy(h, w, y, label_smoothing=beta, filter="none"),
        "GEMMs only, 4 (whole)": lambda h, w, y: _GemmsOnly.apply(h, w, "whole"),
    }
    def step(fn, bwd=True):
        h, w = (t.detach().requires_grad_(True) for t in inputs[:2])
        def run():
            loss = fn(h, w, inputs[2])
            if bwd:
                loss.backward()
            return loss, h, w
        return run
    for k in ms:
        for _ in range(2): step(ms[k])()
    torch.cuda.synchronize()
    ref = step(ms["row sums (ba7d36a) none"])()
    new = step(ms["ours (07ab065) none"])()
    print(f"beta {beta}: ours vs row sums: loss {(new[0] - ref[0]).abs().item():.2e} (loss {ref[0].item():.4f}); grads "
          + " ".join(f"{((a.grad - b.grad).abs().max() / b.grad.abs().max()).item():.2e}" for a, b in zip(new[1:], ref[1:])),
          flush=True)
    del ref, new
    timer = Timer("cuda")
    names = list(ms)
    times = {(k, kind): [] for k in names for kind in ("fwd", "fwd+bwd")}
    for r in range(rounds):
        for k in (names if r % 2 == 0 else names[::-1]):
            for kind in ("fwd", "fwd+bwd"):
                times[(k, kind)].append(timer(step(ms[k], bwd=kind == "fwd+bwd")))
    for k in names:
        row = {}
        for kind in ("fwd", "fwd+bwd"):
            t = times[(k, kind)]
            row[kind] = dict(median=statistics.median(t), min=min(t), max=max(t), all=t)
        row["fwd MiB"] = peak_extra_mib(step(ms[k], bwd=False), "cuda")
        row["fwd+bwd MiB"] = peak_extra_mib(step(ms[k]), "cuda")
        res[f"beta {beta} {k}"] = row
        print(f"beta {beta:3} {k:26s} fwd {row['fwd']['median']:6.2f} ({row['fwd']['min']:.1f}-{row['fwd']['max']:.1f})"
              f" {row['fwd MiB']:7.1f} MiB | fwd+bwd {row['fwd+bwd']['median']:6.2f} ({row['fwd+bwd']['min']:.1f}-"
              f"{row['fwd+bwd']['max']:.1f}) {row['fwd+bwd MiB']:7.1f} MiB", flush=True)
for mod in (forward, kernels_prev.forward):
    for dev_cache in mod._lse_forward_kernel.device_caches.values():
        for c in dev_cache[0].values():
            print("compiled:", mod.__name__, (c.name, c.n_regs, c.n_spills, c.metadata.shared, c.metadata.num_stages))
json.dump(res, open(f"{out}/ab6_h100.json", "w"), indent=1)
