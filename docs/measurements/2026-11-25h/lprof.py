"""Host time per line of a forward with gradients (paper shape, beta 0.1, filter none), line_profiler."""
import os, sys
sys.path.insert(0, "/tmp/site"); sys.path.insert(0, ".")
import torch
from line_profiler import LineProfiler
from benchmarks.bench_linear_ce import make_inputs
from kernels import api, forward, function, _tl_utils, _host
from triton.runtime import jit

inputs = make_inputs("random", 8192, 256000, 2304, "cuda")
h, w = (t.detach().requires_grad_(True) for t in inputs[:2])
for _ in range(3): api.linear_cross_entropy(h, w, inputs[2], label_smoothing=0.1, filter="none")
torch.cuda.synchronize()
lp = LineProfiler(api.linear_cross_entropy, api._validate, forward.triton_forward, function.LinearCrossEntropyFunction.forward,
                  _tl_utils.tma_operand, jit.JITFunction.run, api.TargetRangeCheck.start, _host.AsyncHostCopy.__init__)
for _ in range(30):
    torch.cuda.synchronize()
    lp.runcall(api.linear_cross_entropy, h, w, inputs[2], label_smoothing=0.1, filter="none")
torch.cuda.synchronize()
import io
s = io.StringIO(); lp.print_stats(stream=s, stripzeros=True)
txt = s.getvalue()
open(os.path.join(os.environ.get("OUT", "/tmp"), "lprof.txt"), "w").write(txt)
# compact: lines over 1.5% of their function's time
for line in txt.splitlines():
    parts = line.split()
    if line.startswith(("Total time", "Function", "Timer unit")):
        print(line[:150])
    elif len(parts) > 5 and parts[0].isdigit() and parts[1].isdigit():
        try:
            if float(parts[4]) > 1.5:
                print(line[:150])
        except ValueError:
            pass
