"""Host time of a dense forward with gradients (paper shape, beta 0.1, filter none): where it goes before the
main kernel's launch, and what the pieces cost alone."""
import json, os, statistics, sys, time
sys.path.insert(0, ".")
import torch
from benchmarks.bench_linear_ce import make_inputs
from kernels import api, forward, triton_backend, linear_cross_entropy
from kernels._tl_utils import tma_operand
from kernels.plan_history import HISTORY, plan_key
from triton.tools.tensor_descriptor import TensorDescriptor

OUT = os.environ.get("OUT", "/tmp")
pc = time.perf_counter
h, w, y = make_inputs("random", 8192, 256000, 2304, "cuda")
hh, ww = h.detach().requires_grad_(True), w.detach().requires_grad_(True)
marks, captured = {}, {}

def stamp(name, fn):
    def inner(*a, **k):
        marks[name + ">"] = pc(); r = fn(*a, **k); marks[name + "<"] = pc(); return r
    return inner

class Wrap:
    def __init__(self, name, orig): self.name, self.orig = name, orig
    def __getitem__(self, grid):
        launch = self.orig[grid]
        def run(*a, **k):
            captured.setdefault(self.name, (grid, a, k))
            marks[self.name + ">"] = pc(); r = launch(*a, **k); marks[self.name + "<"] = pc(); return r
        return run

orig_validate, orig_fwd = api._validate, triton_backend.BACKEND.forward
orig_main, orig_finish, orig_start = forward._lse_forward_kernel, forward._finish_kernel, api.TargetRangeCheck.start
api._validate = stamp("validate", orig_validate)
triton_backend.BACKEND.forward = stamp("backend_fwd", orig_fwd)
forward._lse_forward_kernel = Wrap("main", orig_main)
forward._finish_kernel = Wrap("finish", orig_finish)
api.TargetRangeCheck.start = stamp("check_start", orig_start)

def call():
    return linear_cross_entropy(hh, ww, y, label_smoothing=0.1, filter="none")

for _ in range(3):
    call().backward(); hh.grad = ww.grad = None
torch.cuda.synchronize()
rows = []
for i in range(40):
    torch.cuda.synchronize()
    a, b, c = (torch.cuda.Event(enable_timing=True) for _ in range(3))
    t0 = pc(); a.record()
    loss = call()
    t1 = pc(); b.record()
    torch.cuda.synchronize()
    r = {k: 1e6 * (v - t0) for k, v in marks.items()}
    r["return"] = 1e6 * (t1 - t0)
    r["gpu_ms"] = a.elapsed_time(b)
    rows.append(r)
    del loss
res = {"timeline_us_median": {k: round(statistics.median(r[k] for r in rows), 1) for k in rows[0]}}
print("timeline (us from call, median of 40):", res["timeline_us_median"])

def med_us(fn, n=200):
    ts = []
    for _ in range(n):
        t = pc(); fn(); ts.append(1e6 * (pc() - t))
    return round(statistics.median(ts), 2)

torch.cuda.synchronize()
micro = {}
micro["torch.empty(33,8192)"] = med_us(lambda: torch.empty(33, 8192, dtype=torch.float32, device="cuda"))
micro["torch.empty(0)"] = med_us(lambda: torch.empty(0, dtype=torch.int64, device="cuda"))
micro["torch.empty(V*D bf16)"] = med_us(lambda: torch.empty(256000 * 2304, dtype=torch.bfloat16, device="cuda"), 50)
micro["TensorDescriptor.from_tensor"] = med_us(lambda: TensorDescriptor.from_tensor(h, [128, 64]))
micro["tma_operand"] = med_us(lambda: tma_operand(h, [128, 64]))
micro["_validate"] = med_us(lambda: orig_validate(hh, ww, y, 0.1, -100, "mean", None, "none"))
micro["filter_for"] = med_us(lambda: HISTORY.filter_for(plan_key(ww, "none")))
micro["targets.contiguous"] = med_us(lambda: y.contiguous())
micro["is_grad_enabled+reshape"] = med_us(lambda: (torch.is_grad_enabled(), hh.reshape(-1, 2304), y.reshape(-1)))

class Nop(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b, c, *rest):
        ctx.save_for_backward(a, b, c)
        return a.new_empty(0), a.new_empty(0), a.new_empty(0), a.new_empty(0)
    @staticmethod
    def backward(ctx, *g):
        return (None,) * 10
micro["autograd.Function.apply (4 new_empty)"] = med_us(lambda: Nop.apply(hh, ww, y, 1, 0.1, -100, None, "none", None, True))
micro["4x new_empty"] = med_us(lambda: (h.new_empty(0), h.new_empty(0), h.new_empty(0), h.new_empty(0)))

forward._lse_forward_kernel, forward._finish_kernel = orig_main, orig_finish
grid, args, kwargs = captured["main"]
fgrid, fargs, fkwargs = captured["finish"]
micro["finish launch (jit)"] = med_us(lambda: orig_finish[fgrid](*fargs, **fkwargs), 100)
torch.cuda.synchronize()
micro["main launch (jit), 20 queued"] = med_us(lambda: orig_main[grid](*args, **kwargs), 20)
torch.cuda.synchronize()
try:
    from triton.runtime import driver
    dev = driver.active.get_current_device()
    kernel_cache, kernel_key_cache, target, backend, binder = orig_main.device_caches[dev]
    micro["main binder"] = med_us(lambda: binder(*args, **kwargs))
    bound_args, spec, options = binder(*args, **kwargs)
    from triton.runtime.jit import compute_cache_key
    micro["main cache key"] = med_us(lambda: compute_cache_key(kernel_key_cache, spec, options))
    kernel = kernel_cache[compute_cache_key(kernel_key_cache, spec, options)]
    stream = driver.active.get_current_stream(dev)
    vals = list(bound_args.values())
    micro["main launch_metadata"] = med_us(lambda: kernel.launch_metadata(grid, stream, *vals))
    micro["get device+stream"] = med_us(lambda: driver.active.get_current_stream(driver.active.get_current_device()))
    lm = kernel.launch_metadata(grid, stream, *vals)
    def direct():
        kernel.run(grid[0], 1, 1, stream, kernel.function, kernel.packed_metadata, lm, None, None, *vals)
    micro["main kernel.run direct, 20 queued"] = med_us(direct, 20)
    torch.cuda.synchronize()
    fk = orig_finish.device_caches[dev]
    fb, fs, fo = fk[4](*fargs, **fkwargs)
    fkern = fk[0][compute_cache_key(fk[1], fs, fo)]
    fvals = list(fb.values())
    flm = fkern.launch_metadata(fgrid, stream, *fvals)
    micro["finish kernel.run direct"] = med_us(
        lambda: fkern.run(fgrid[0], 1, 1, stream, fkern.function, fkern.packed_metadata, flm, None, None, *fvals), 100)
except Exception as e:  # noqa
    micro["internals error"] = f"{type(e).__name__}: {e}"
torch.cuda.synchronize()
res["micro_us_median"] = micro
for k, v in micro.items():
    print(f"{k:45s} {v}")
json.dump(res, open(f"{OUT}/host_parts.json", "w"), indent=1)
