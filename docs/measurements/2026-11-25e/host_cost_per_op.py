"""Host microseconds per call of each op of a staircase piece (tiny shapes: the host, not the GPU, bounds)."""
import sys, time, torch
sys.path.insert(0, ".")
from kernels import backward, _tl_utils
dev = "cuda"
r, vc, d, V = 256, 512, 640, 4096
bf = torch.bfloat16
acc = torch.zeros(r, d, device=dev); dz = torch.randn(r, vc, device=dev).to(bf); head = torch.randn(vc, d, device=dev).to(bf)
e = torch.randn(r, d, device=dev).to(bf); part = torch.empty(vc, d, device=dev, dtype=bf); u = torch.randn(d, device=dev).to(bf)
w = torch.randn(V, d, device=dev).to(bf); dw = torch.zeros_like(w); ids = torch.randperm(V, device=dev)[:vc]
flat = torch.empty(r * vc, device=dev, dtype=bf)
def t(name, fn, k=300):
    for _ in range(20): fn()
    torch.cuda.synchronize(); t0 = time.perf_counter()
    for _ in range(k): fn()
    t1 = time.perf_counter(); torch.cuda.synchronize()
    print(f"{name:55s} {1e6 * (t1 - t0) / k:7.1f} us", flush=True)
t("addmm acc out_dtype=f32", lambda: torch.addmm(acc, dz, head, alpha=1.0, out_dtype=torch.float32, out=acc))
t("addmm_ fp32 acc (fp32 operands)", lambda: acc.addmm_(dz.float(), head.float()))
t("addmm bias (uniform row) out=part", lambda: torch.addmm(u, dz.T, e, alpha=1.0, out=part))
t("addmm beta=0 out=part", lambda: torch.addmm(part, dz.T, e, beta=0.0, alpha=1.0, out=part))
t("mm out=part", lambda: torch.mm(dz.T, e, out=part))
t("copy_ uniform + addmm_", lambda: (part.copy_(u.expand_as(part)), part.addmm_(dz.T, e)))
t("addmm_ part", lambda: part.addmm_(dz.T, e))
t("index_copy_", lambda: dw.index_copy_(0, ids, part))
t("index_select out", lambda: torch.index_select(w, 0, ids, out=part))
t("as_strided + 3 slices", lambda: (flat.as_strided((r, vc), (vc, 1)), acc[0:r], e[0:r], ids[0:vc]))
y = torch.zeros(r, dtype=torch.long, device=dev); lse = torch.zeros(r, device=dev); g = torch.ones(r, device=dev)
gs = torch.ones(1, device=dev); kept = torch.full((2,), 100, dtype=torch.long, device=dev)
for tma in (True, False):
    if not tma:
        backward.tma_operand = lambda tt, block: (tt, False)
    rc = backward._Recompute(e, y, lse, g, gs, head, kept, V, 0.0, None)
    z = flat.as_strided((r, vc), (vc, 1))
    t(f"dz launch, TMA {tma}", lambda: rc(z, 0, r, 0, vc, 0))
