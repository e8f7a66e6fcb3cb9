"""A/B at the paper shape (random, bf16): the committed dense path (kernels_head) against today's (target and
uniform parts inside dZ, the first chunks' logits kept by the forward, or not), beside the GEMM floors."""
import dataclasses, json, os, statistics, sys
import torch
sys.path.insert(0, "."); sys.path.insert(0, ".gpu_dense")
from benchmarks.bench_linear_ce import make_inputs, _GemmsOnly, Timer, peak_extra_mib
from kernels import forward, linear_cross_entropy
import kernels_head

out = os.environ.get("OUT", "/tmp")
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 15
inputs = make_inputs("random", 8192, 256000, 2304, "cuda")
KEEP, NOKEEP = forward.TILES, dataclasses.replace(forward.TILES, keep_vocab=1 << 30)

def ours(beta, f, tiles):
    def fn(h, w, y):
        forward.TILES = tiles
        try:
            return linear_cross_entropy(h, w, y, label_smoothing=beta, filter=f)
        finally:
            forward.TILES = KEEP
    return fn

def methods(beta):
    m = {
        "head none": lambda h, w, y: kernels_head.linear_cross_entropy(h, w, y, label_smoothing=beta, filter="none"),
        "new none (logits kept)": ours(beta, "none", KEEP),
        "new none (none kept)": ours(beta, "none", NOKEEP),
        "head exact": lambda h, w, y: kernels_head.linear_cross_entropy(h, w, y, label_smoothing=beta, filter="exact"),
        "new exact": ours(beta, "exact", KEEP),
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
res = {}
for beta in (0.1, 0.0):
    ms = methods(beta)
    # agreement of gradients with the committed code
    grads = {}
    for name in ("head none", "new none (logits kept)", "new none (none kept)"):
        h, w = step(ms[name])()
        grads[name] = (h.grad.float(), w.grad.float())
    ref = grads["head none"]
    for name in ("new none (logits kept)", "new none (none kept)"):
        dh = (grads[name][0] - ref[0]).abs().max().item() / ref[0].abs().max().item()
        dw = (grads[name][1] - ref[1]).abs().max().item() / ref[1].abs().max().item()
        print(f"beta {beta} {name}: max|d dE|/max|dE| {dh:.2e}, max|d dC|/max|dC| {dw:.2e}")
        res[f"agreement beta {beta} {name}"] = (dh, dw)
    del grads, ref
    times = {k: [] for k in ms}
    mem = {}
    for k, fn in ms.items():
        for _ in range(2): step(fn)()
        mem[k] = peak_extra_mib(step(fn), "cuda")
    names = list(ms)
    for r in range(rounds):
        order = names if r % 2 == 0 else names[::-1]
        for k in order:
            times[k].append(timer(step(ms[k])))
    fwd = {k: [] for k in ("head none", "new none (logits kept)")}
    for r in range(rounds):
        for k in (fwd if r % 2 == 0 else list(fwd)[::-1]):
            fwd[k].append(timer(step(ms[k], backward=False)))
    for k, t in fwd.items():
        res[f"beta {beta} fwd {k}"] = dict(median=statistics.median(t), min=min(t), max=max(t),
                                           mib=peak_extra_mib(step(ms[k], backward=False), "cuda"))
        print(f"beta {beta:3} fwd {k:24s} {statistics.median(t):7.2f} ms ({min(t):.1f}-{max(t):.1f})  "
              f"{res[f'beta {beta} fwd {k}']['mib']:8.1f} MiB", flush=True)
    for k in names:
        t = times[k]
        res[f"beta {beta} {k}"] = dict(median=statistics.median(t), min=min(t), max=max(t), mib=mem[k], all=t)
        print(f"beta {beta:3} {k:28s} {statistics.median(t):7.2f} ms ({min(t):.1f}-{max(t):.1f})  {mem[k]:8.1f} MiB",
              flush=True)
res["device"] = torch.cuda.get_device_name()
json.dump(res, open(f"{out}/ab_dense_h100.json", "w"), indent=1)
