"""GPU ms of the dZ recompute at a Gemma piece's shape, TMA vs pointer loads."""
import sys, torch
sys.path.insert(0, ".")
from kernels import backward
bf = torch.bfloat16; dev = "cuda"
for rows, vc in ((8192, 3328), (2048, 13056)):
    e = torch.randn(8192, 640, device=dev).to(bf); head = (torch.randn(13056, 640, device=dev) / 25).to(bf)
    y = torch.randint(0, 262144, (8192,), device=dev); lse = torch.full((8192,), 12.0, device=dev); g = torch.ones(8192, device=dev)
    gs = torch.ones(1, device=dev); kept = torch.full((64,), 1024, dtype=torch.long, device=dev)
    flat = torch.empty(rows * 13056, device=dev, dtype=bf)
    for tma in (True, False, True, False):
        backward.DZ_TMA = tma
        rc = backward._Recompute(e, y, lse, g, gs, head, kept, 262144, 0.0, None)
        z = flat.as_strided((rows, vc), (-(-vc // 256) * 256, 1))
        for _ in range(5): rc(z, 0, rows, 0, vc, 0)
        s, t = torch.cuda.Event(True), torch.cuda.Event(True); torch.cuda.synchronize(); s.record()
        for _ in range(20): rc(z, 0, rows, 0, vc, 0)
        t.record(); t.synchronize(); print(f"rows {rows} vc {vc} TMA {tma}: {s.elapsed_time(t) / 20 * 1000:.1f} us", flush=True)
