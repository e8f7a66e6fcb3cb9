"""CUDA time per kernel of the filtered forward, ours vs kernels_base, Gemma's shape (random data)."""
import importlib, sys, torch
sys.path.insert(0, "."); sys.path.insert(0, sys.argv[1])
n, v, d = 8192, 262144, 640
h = (torch.randn(n, d, device="cuda")).bfloat16().requires_grad_(True)
w = (torch.randn(v, d, device="cuda") * 0.15).bfloat16()
y = torch.randint(0, v, (n,), device="cuda")
for mod in ("kernels", "kernels_base", "kernels", "kernels_base"):
    m = importlib.import_module(mod)
    for _ in range(3): m.linear_cross_entropy(h, w, y)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(5): m.linear_cross_entropy(h, w, y)
        torch.cuda.synchronize()
    tot = {}
    for e in prof.key_averages():
        tot[e.key[:40]] = e.self_device_time_total / 5
    top = sorted(tot.items(), key=lambda kv: -kv[1])[:6]
    print(mod, "total us/step", round(sum(tot.values())), [(k, round(t)) for k, t in top], flush=True)
