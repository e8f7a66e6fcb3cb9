"""Which part of the filtered forward is slow: time forward of exact under three code versions, then profile."""
import importlib, sys, torch
sys.path.insert(0, "."); sys.path.insert(0, sys.argv[1])
torch.manual_seed(0)
n, v, d = 8192, 256000, 2304
h = torch.randn(n, d, device="cuda").bfloat16(); w = (torch.randn(v, d, device="cuda") / d**0.5).bfloat16()
y = torch.randint(0, v, (n,), device="cuda")
hg = h.clone().requires_grad_(True)
for mod in ("kernels", "kernels_base", "kernels_5e7"):
    m = importlib.import_module(mod)
    for f in ("none", "exact"):
        for _ in range(2): m.linear_cross_entropy(hg, w, y, filter=f)
        torch.cuda.synchronize(); s, e = torch.cuda.Event(True), torch.cuda.Event(True)
        s.record(); [m.linear_cross_entropy(hg, w, y, filter=f) for _ in range(3)]; e.record(); e.synchronize()
        print(mod, f, "fwd ms (grad on)", s.elapsed_time(e) / 3, flush=True)
from kernels import linear_cross_entropy
hh = h.clone().requires_grad_(True)
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
    linear_cross_entropy(hh, w, y, filter="exact"); torch.cuda.synchronize()
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=15, max_name_column_width=70))
