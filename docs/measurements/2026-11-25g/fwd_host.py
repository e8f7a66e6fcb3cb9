"""Host time of the dense forward before its kernel starts (paper shape, beta 0.1, filter none)."""
import cProfile, pstats, statistics, sys, time
import torch
sys.path.insert(0, ".")
from benchmarks.bench_linear_ce import make_inputs
from kernels import forward, linear_cross_entropy

h, w, y = make_inputs("random", 8192, 256000, 2304, "cuda")
f = sys.argv[1] if len(sys.argv) > 1 else "none"
marks = {}
orig = forward._lse_forward_kernel

class Wrap:
    def __getitem__(self, grid):
        launch = orig[grid]
        def run(*a, **k):
            marks["host_at_launch"] = time.perf_counter()
            ev = torch.cuda.Event(enable_timing=True); ev.record(); marks["ev"] = ev
            return launch(*a, **k)
        return run
forward._lse_forward_kernel = Wrap()

def fwd():
    hh = h.detach().requires_grad_(True); ww = w.detach().requires_grad_(True)
    return linear_cross_entropy(hh, ww, y, label_smoothing=0.1, filter=f)

rec = []
for i in range(12):
    torch.cuda.synchronize()
    a = torch.cuda.Event(enable_timing=True); b = torch.cuda.Event(enable_timing=True)
    t0 = time.perf_counter(); a.record()
    loss = fwd()
    b.record(); t1 = time.perf_counter(); torch.cuda.synchronize()
    if i >= 2:
        rec.append((1e3 * (marks["host_at_launch"] - t0), a.elapsed_time(marks["ev"]), 1e3 * (t1 - t0),
                    marks["ev"].elapsed_time(b), a.elapsed_time(b)))
    del loss
print("host_to_launch_ms gpu_a_to_launch_ms fwd_host_ms launch_to_end_ms fwd_gpu_ms:",
      [round(statistics.median(r[i] for r in rec), 3) for i in range(5)])
forward._lse_forward_kernel = orig
pr = cProfile.Profile()
for _ in range(5):
    torch.cuda.synchronize()
    pr.enable(); loss = fwd(); pr.disable()
    torch.cuda.synchronize(); del loss
st = pstats.Stats(pr); st.sort_stats("cumulative").print_stats(40)
