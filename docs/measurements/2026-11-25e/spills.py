import sys, torch
sys.path.insert(0, ".")
from kernels import backward, forward, linear_cross_entropy
orig, comp = forward._lse_forward_kernel, []
class W:
    def __getitem__(self, grid):
        def launch(*a, **k):
            r = orig[grid](*a, **k); comp.append((k.get("FILTERING"), k.get("HEAD_BY_PERM"), r)); return r
        return launch
forward._lse_forward_kernel = W()
n, v, d = 8192, 65536, 2304
h = torch.randn(n, d, device="cuda").bfloat16().requires_grad_(True); w = (torch.randn(v, d, device="cuda") / d**0.5).bfloat16().requires_grad_(True)
y = torch.randint(0, v, (n,), device="cuda")
for f in ("none", "exact"):
    for gh in (True, False):
        forward.GATHER_HEAD = gh
        for _ in range(2): linear_cross_entropy(h, w, y, filter=f).backward()
        torch.cuda.synchronize(); s, e = torch.cuda.Event(True), torch.cuda.Event(True)
        s.record(); linear_cross_entropy(h, w, y, filter=f); e.record(); e.synchronize(); print(f, "gather", gh, "fwd ms", s.elapsed_time(e))
seen = set()
for filt, byp, r in comp:
    if (filt, byp) in seen: continue
    seen.add((filt, byp)); print("forward FILTERING", filt, "HEAD_BY_PERM", byp, "regs", r.n_regs, "spills", r.n_spills)
try:
    for cache in backward._dz_kernel.device_caches.values():
        for k in cache[0].values():
            print("dz kernel regs", k.n_regs, "spills", k.n_spills)
except Exception as e:
    print("dz cache", type(e).__name__, e)
