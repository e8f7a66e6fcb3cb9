"""Do SDPA's kernels agree with PyTorch's float32 math kernel on one attention call with a packed-rows mask?

A (B, 1, T, T) boolean block-diagonal causal mask (examples of 300, 700, 48 and 1,000 tokens in a row of 2,048, the
shape ``trainable.sequence_packing.packed_causal_mask`` builds), bf16 q of (B, 2048, 32, 64) and k, v of
(B, 2048, 8, 64) as the 1B shape's projections give them, B 1 and 4, the mask broadcast over the batch or contiguous.
Each call is made in two layouts:
- ``contiguous``: q, k, v (B, 32, 2048, 64) contiguous, the output's gradient contiguous (the first version's call);
- ``model``: as transformers' Llama makes it: q a transposed view, k and v transposed and repeated to 32 heads
  (``repeat_kv``), the output's gradient the transposed view of a contiguous (B, 2048, 32, 64) tensor (the
  backward of ``attn_output.transpose(1, 2).contiguous()``);
and each either plain or ``recomputed``: inside ``torch.utils.checkpoint`` (non-reentrant), so its forward runs
again in the backward, as the attention check's forwards do (``recomputed_layers(..., always=True)``); and,
with ``--after-sum``, each after the same SDPA call under the same kernels with the backward of
``out.float().sum()``, as ``AttentionCalls.first_error`` ran it before each candidate's model forward until
issue 45. That gradient reaches SDPA contiguous in (B, H, T, D) order, not in the output's layout, and PyTorch's
cuDNN backward caches its graph (for the process) by q, k, v and the mask only: a later call in the model's layout
may run a graph built for the other gradient layout. So ``--after-sum`` is a run of its own, in a fresh process.
For each kernel set: the largest output error and the cosine of the q, k, v gradients against the float32 math
kernel's in the same layout. One call, no model: what ``trainable.attention_check`` decides for a whole model,
taken apart.

    python benchmarks/sdpa_packed_mask.py --out sdpa_packed_mask.json                  # on a GPU
    python benchmarks/sdpa_packed_mask.py --after-sum --out sdpa_packed_mask_after_sum.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.checkpoint import checkpoint

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from transformers.integrations.sdpa_attention import repeat_kv  # noqa: E402

KERNEL_SETS = {"cudnn": [SDPBackend.CUDNN_ATTENTION], "efficient": [SDPBackend.EFFICIENT_ATTENTION],
               "default": [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                           SDPBackend.MATH]}
EXAMPLES, HEADS, KV_HEADS, HEAD_DIM, WIDTH = (300, 700, 48, 1000), 32, 8, 64, 2048
LAYOUTS = ("contiguous", "model")


def packed_mask(batch: int, contiguous: bool, device: torch.device) -> torch.Tensor:
    """(batch, 1, WIDTH, WIDTH) bool: a token sees earlier tokens of its own example."""
    example = torch.cat([torch.full((n,), i) for i, n in enumerate(EXAMPLES)])[:WIDTH].to(device)
    causal = torch.ones(WIDTH, WIDTH, dtype=torch.bool, device=device).tril()
    mask = ((example[:, None] == example[None, :]) & causal)[None, None].expand(batch, 1, WIDTH, WIDTH)
    return mask.contiguous() if contiguous else mask


def attention(q, k, v, grad_out, mask, kernels, dtype, layout: str = "contiguous", recomputed: bool = False,
              after_sum: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(output (B, T, H, D), the q, k, v gradients flattened) of one SDPA call under ``kernels`` in ``dtype``: q and
    ``grad_out`` (B, T, H, D), k and v (B, T, H_kv, D), called in ``layout`` (``LAYOUTS``), in a checkpointed
    function with ``recomputed``; with ``after_sum`` the same call runs first with the gradient of its sum.
    ``grad_out`` None: that lone run (the backward of SDPA's own output summed; the output returned as SDPA's)."""
    if layout not in LAYOUTS:
        raise ValueError(f"expected a layout in {LAYOUTS}, got {layout!r}")
    if after_sum:
        attention(q, k, v, None, mask, kernels, dtype, layout)
    leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]

    def call(q, k, v):
        groups = q.shape[2] // k.shape[2]
        q, k, v = q.transpose(1, 2), repeat_kv(k.transpose(1, 2), groups), repeat_kv(v.transpose(1, 2), groups)
        if layout == "contiguous":
            q = q.contiguous()
        with sdpa_kernel(kernels):
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return out if layout == "contiguous" or grad_out is None else out.transpose(1, 2).contiguous()

    out = checkpoint(call, *leaves, use_reentrant=False) if recomputed else call(*leaves)
    if grad_out is None:  # the lone run's backward: SDPA's own output summed
        out.float().sum().backward()
        return out.detach().float(), torch.cat([t.grad.float().flatten() for t in leaves])
    if layout == "contiguous":  # out is (B, H, T, D): its gradient contiguous in that order
        out.backward(grad_out.to(dtype).transpose(1, 2).contiguous())
        out = out.transpose(1, 2)
    else:
        out.backward(grad_out.to(dtype))
    return out.detach().float(), torch.cat([t.grad.float().flatten() for t in leaves])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--after-sum", action="store_true",
                        help="each call after a lone run with the gradient of its sum (run it in its own process)")
    parser.add_argument("--out", default="sdpa_packed_mask.json")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("sdpa_packed_mask.py: needs a CUDA GPU (the kernels compared are GPU kernels)")
    device, results = torch.device("cuda"), {}
    torch.manual_seed(0)
    for batch in (1, 4):
        q, grad_out = (torch.randn(batch, WIDTH, HEADS, HEAD_DIM, device=device, dtype=torch.bfloat16)
                       for _ in range(2))
        k, v = (torch.randn(batch, WIDTH, KV_HEADS, HEAD_DIM, device=device, dtype=torch.bfloat16) for _ in range(2))
        for contiguous in (False, True):
            mask = packed_mask(batch, contiguous, device)
            for layout in LAYOUTS:
                for recomputed in (False, True):
                    ref_out, ref_grad = attention(q, k, v, grad_out, mask, [SDPBackend.MATH], torch.float32, layout,
                                                  recomputed)
                    for name, kernels in KERNEL_SETS.items():
                        key = (f"B{batch}_{name}_{'contiguous' if contiguous else 'broadcast'}_mask_{layout}"
                               f"{'_recomputed' if recomputed else ''}{'_after_sum' if args.after_sum else ''}")
                        try:
                            out, grad = attention(q, k, v, grad_out, mask, kernels, torch.bfloat16, layout, recomputed,
                                                  args.after_sum)
                            results[key] = {"out_max_error": float((out - ref_out).abs().max()),
                                            "grad_cosine": float(F.cosine_similarity(grad, ref_grad, dim=0))}
                        except RuntimeError as error:  # a kernel set that cannot run this call
                            results[key] = {"error": str(error).splitlines()[0][:200]}
                        print(f"{key:<62} {results[key]}", flush=True)
    record = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "after_sum": args.after_sum,
              "cudnn": torch.backends.cudnn.version(), "results": results}
    with open(args.out, "w") as f:
        json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
