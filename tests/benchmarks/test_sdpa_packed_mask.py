"""benchmarks/sdpa_packed_mask.py: its mask is the packed rows' (checked against trainable.sequence_packing), and
the one attention call it compares runs on the CPU under the math kernel (the GPU kernels are the device's)."""

import torch
from torch.nn.attention import SDPBackend

from benchmarks import sdpa_packed_mask as probe
from trainable.sequence_packing import packed_causal_mask


class _Sdpa:
    _attn_implementation = "sdpa"

    def get_text_config(self):
        return self


def test_the_mask_is_the_one_packed_rows_get():
    positions = torch.cat([torch.arange(n) for n in probe.EXAMPLES])[:probe.WIDTH][None].repeat(2, 1)
    expected = packed_causal_mask(positions, _Sdpa())
    for contiguous in (False, True):
        assert torch.equal(probe.packed_mask(2, contiguous, torch.device("cpu")), expected)


def test_one_call_is_attention_and_its_gradients_in_float64():
    q, k, v, grad = (torch.randn(1, 2, 16, 8, dtype=torch.float64) for _ in range(4))
    mask = probe.packed_mask(1, True, torch.device("cpu"))[..., :16, :16]
    out, grads = probe.attention(q, k, v, grad, mask, [SDPBackend.MATH], torch.float64)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    scores = (leaves[0] @ leaves[1].transpose(-1, -2) / 8 ** 0.5).masked_fill(~mask, float("-inf"))
    expected = torch.softmax(scores, -1) @ leaves[2]
    expected.backward(grad)
    assert torch.allclose(out, expected.detach().float(), atol=1e-6)
    assert torch.allclose(grads, torch.cat([t.grad.flatten() for t in leaves]).float(), atol=1e-5)
