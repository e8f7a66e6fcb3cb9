"""Loss and gradients of the Triton kernels under TRITON_INTERPRET on four cases (filters exact and loose, dense,
softcap with beta), saved for a bitwise comparison of two commits (kernel_bitwise.json):

    PYTHONPATH=<checkout of e92e5b7> python kernel_bitwise.py base.pt
    python kernel_bitwise.py new.pt       # in this branch's checkout
    python -c "import torch; a, b = torch.load('base.pt'), torch.load('new.pt'); \
               print({k: [torch.equal(x, y) for x, y in zip(a[k], b[k])] for k in a})"
"""
import os, sys
os.environ["TRITON_INTERPRET"] = "1"
import torch
from kernels import linear_cross_entropy, forward
from kernels.testing import make_case
print(forward.__file__, file=sys.stderr)
out = {}
cases = [("filtered_exact", dict(filter="exact", label_smoothing=0.1), dict(peaked=True, seed=3)),
         ("filtered_loose", dict(filter="loose", label_smoothing=0.0), dict(seed=4)),
         ("dense_none", dict(filter="none", label_smoothing=0.1), dict(seed=5)),
         ("softcap", dict(filter="exact", label_smoothing=0.1, softcap=3.0), dict(seed=6))]
for name, kw, case in cases:
    h, w, y = make_case(300, 700, 64, torch.bfloat16, ignore_frac=0.1, **case)
    h = h.clone().requires_grad_(True); w = w.clone().requires_grad_(True)
    loss = linear_cross_entropy(h, w, y, **kw)
    loss.backward()
    out[name] = (loss.detach(), h.grad, w.grad)
torch.save(out, sys.argv[1])
