"""Do SDPA's kernels agree with PyTorch's float32 math kernel on one attention call with a packed-rows mask?

A (B, 1, T, T) boolean block-diagonal causal mask (examples of 300, 700, 48 and 1,000 tokens in a row of 2,048, the
shape ``trainable.sequence_packing.packed_causal_mask`` builds), bf16 q, k, v of (B, 32, 2048, 64), B 1 and 4, the
mask broadcast over the batch or contiguous. For each kernel set: the largest output error and the cosine of the
q, k, v gradients against the float32 math kernel's. One call, no model: what ``trainable.attention_check`` decides
for a whole model, taken apart.

    python benchmarks/sdpa_packed_mask.py --out sdpa_packed_mask.json     # on a GPU
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

KERNEL_SETS = {"cudnn": [SDPBackend.CUDNN_ATTENTION], "efficient": [SDPBackend.EFFICIENT_ATTENTION],
               "default": [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                           SDPBackend.MATH]}
EXAMPLES, HEADS, HEAD_DIM, WIDTH = (300, 700, 48, 1000), 32, 64, 2048


def packed_mask(batch: int, contiguous: bool, device: torch.device) -> torch.Tensor:
    """(batch, 1, WIDTH, WIDTH) bool: a token sees earlier tokens of its own example."""
    example = torch.cat([torch.full((n,), i) for i, n in enumerate(EXAMPLES)])[:WIDTH].to(device)
    causal = torch.ones(WIDTH, WIDTH, dtype=torch.bool, device=device).tril()
    mask = ((example[:, None] == example[None, :]) & causal)[None, None].expand(batch, 1, WIDTH, WIDTH)
    return mask.contiguous() if contiguous else mask


def attention(q, k, v, grad_out, mask, kernels, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(output, the q, k, v gradients flattened) of one SDPA call under ``kernels`` in ``dtype``."""
    q, k, v = (t.detach().to(dtype).requires_grad_() for t in (q, k, v))
    with sdpa_kernel(kernels):
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    out.backward(grad_out.to(dtype))
    return out.detach().float(), torch.cat([t.grad.float().flatten() for t in (q, k, v)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="sdpa_packed_mask.json")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("sdpa_packed_mask.py: needs a CUDA GPU (the kernels compared are GPU kernels)")
    device, results = torch.device("cuda"), {}
    torch.manual_seed(0)
    for batch in (1, 4):
        q, k, v, grad_out = (torch.randn(batch, HEADS, WIDTH, HEAD_DIM, device=device, dtype=torch.bfloat16)
                             for _ in range(4))
        for contiguous in (False, True):
            mask = packed_mask(batch, contiguous, device)
            ref_out, ref_grad = attention(q, k, v, grad_out, mask, [SDPBackend.MATH], torch.float32)
            for name, kernels in KERNEL_SETS.items():
                key = f"B{batch}_{name}_{'contiguous' if contiguous else 'broadcast'}"
                try:
                    out, grad = attention(q, k, v, grad_out, mask, kernels, torch.bfloat16)
                    results[key] = {"out_max_error": float((out - ref_out).abs().max()),
                                    "grad_cosine": float(F.cosine_similarity(grad, ref_grad, dim=0))}
                except RuntimeError as error:  # a kernel set that cannot run this call
                    results[key] = {"error": str(error).splitlines()[0][:200]}
                print(f"{key:<28} {results[key]}")
    record = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "cudnn": torch.backends.cudnn.version(), "results": results}
    with open(args.out, "w") as f:
        json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
