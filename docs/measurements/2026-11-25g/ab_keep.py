"""A/B at the paper shape (random, bf16, N 8192, V 256000, D 2304): the committed dense path (kernels_head)
against today's, the first chunks' logits kept by the forward (TMA store with 3 or 4 pipeline stages, or pointer
stores) or not; fwd (inputs requiring grad) and fwd+bwd, rounds alternating their order; GEMM floors."""
import dataclasses, json, os, statistics, sys
import torch
sys.path.insert(0, "."); sys.path.insert(0, ".gpu_dense")
from benchmarks.bench_linear_ce import make_inputs, _GemmsOnly, Timer, peak_extra_mib
from kernels import forward, linear_cross_entropy
import kernels_head

out = os.environ.get("OUT", "/tmp")
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 10
inputs = make_inputs("random", 8192, 256000, 2304, "cuda")
BASE = forward.TILES
real_tma = forward.tma_operand

def no_tma_3d(t, block):
    return (t, False) if t.dim() == 3 else real_tma(t, block)

def ours(beta, f="none", tiles=BASE, pointer=False):
    def fn(h, w, y):
        forward.TILES = tiles
        forward.tma_operand = no_tma_3d if pointer else real_tma
        try:
            return linear_cross_entropy(h, w, y, label_smoothing=beta, filter=f)
        finally:
            forward.TILES, forward.tma_operand = BASE, real_tma
    return fn

def methods(beta):
    m = {
        "head none": lambda h, w, y: kernels_head.linear_cross_entropy(h, w, y, label_smoothing=beta, filter="none"),
        "kept, TMA halves, 4 stages": ours(beta),
        "kept, TMA whole, 3 stages": ours(beta, tiles=dataclasses.replace(BASE, keep_stages=3, keep_halves=False)),
        "kept, TMA halves, 3 stages": ours(beta, tiles=dataclasses.replace(BASE, keep_stages=3)),
        "none kept": ours(beta, tiles=dataclasses.replace(BASE, keep_vocab=1 << 30)),
    }
    if beta == 0.0:
        m["GEMMs only, 4 (chunked)"] = lambda h, w, y: _GemmsOnly.apply(h, w, "chunked")
        m["GEMMs only, 4 (whole)"] = lambda h, w, y: _GemmsOnly.apply(h, w, "whole")
    return m

def step(fn, backward=True):
    h, w = (t.detach().requires_grad_(True) for t in inputs[:2])
    def run():
        loss = fn(h, w, inputs[2])
        if backward:
            loss.backward()
        return h, w
    return run

timer = Timer("cuda")
res = {"device": torch.cuda.get_device_name()}
for beta in (0.1, 0.0):
    ms = methods(beta)
    for k in list(ms):
        try:
            for _ in range(2): step(ms[k])()
        except Exception as e:  # e.g. out of shared memory
            print(f"{k}: failed: {type(e).__name__}: {str(e)[:200]}")
            del ms[k]
    ref = [t.grad.float() for t in step(ms["head none"])()]
    for k in [k for k in ms if k.startswith("kept")]:
        new = [t.grad.float() for t in step(ms[k])()]
        rel = [((a - b).abs().max() / b.abs().max()).item() for a, b in zip(new, ref)]
        print(f"beta {beta} {k}: max|diff|/max vs head: dE {rel[0]:.2e} dC {rel[1]:.2e}")
    del ref
    names = list(ms)
    times = {(k, kind): [] for k in names for kind in ("fwd", "fwd+bwd")}
    for r in range(rounds):
        for k in (names if r % 2 == 0 else names[::-1]):
            for kind in ("fwd", "fwd+bwd"):
                times[(k, kind)].append(timer(step(ms[k], backward=kind == "fwd+bwd")))
    for k in names:
        row = {}
        for kind in ("fwd", "fwd+bwd"):
            t = times[(k, kind)]
            row[kind] = dict(median=statistics.median(t), min=min(t), max=max(t), all=t,
                             mib=peak_extra_mib(step(ms[k], backward=kind == "fwd+bwd"), "cuda"))
        res[f"beta {beta} {k}"] = row
        print(f"beta {beta:3} {k:28s} fwd {row['fwd']['median']:6.2f} ({row['fwd']['min']:.1f}-{row['fwd']['max']:.1f}) "
              f"{row['fwd']['mib']:7.1f} MiB | fwd+bwd {row['fwd+bwd']['median']:6.2f} "
              f"({row['fwd+bwd']['min']:.1f}-{row['fwd+bwd']['max']:.1f}) {row['fwd+bwd']['mib']:7.1f} MiB", flush=True)
json.dump(res, open(f"{out}/ab_keep_h100.json", "w"), indent=1)
