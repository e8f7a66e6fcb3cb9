"""benchmarks/sdpa_packed_mask.py: its mask is the packed rows' (checked against trainable.sequence_packing), its
``model`` layout gives SDPA the strides a Llama's attention gives it, and the one attention call it compares runs
on the CPU under the math kernel in every layout, plain or recomputed, fresh or after a call with the gradient of
its sum (the GPU kernels are the device's)."""

import pytest
import torch
from torch.nn.attention import SDPBackend
from transformers import AutoConfig, AutoModelForCausalLM

from benchmarks import sdpa_packed_mask as probe
from trainable.attention_check import AttentionCalls
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


@pytest.mark.parametrize("layout", probe.LAYOUTS)
@pytest.mark.parametrize("recomputed, after_sum", [(False, False), (True, False), (True, True)])
def test_one_call_is_attention_and_its_gradients_in_float64(layout, recomputed, after_sum):
    q, grad = (torch.randn(2, 16, 4, 8, dtype=torch.float64) for _ in range(2))  # (B, T, H, D)
    k, v = (torch.randn(2, 16, 2, 8, dtype=torch.float64) for _ in range(2))  # two key/value heads
    mask = probe.packed_mask(2, True, torch.device("cpu"))[..., 290:306, 290:306]  # an example boundary inside
    out, grads = probe.attention(q, k, v, grad, mask, [SDPBackend.MATH], torch.float64, layout, recomputed, after_sum)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    qh, kh, vh = (t.transpose(1, 2).repeat_interleave(4 // t.shape[2], dim=1) for t in leaves)
    scores = (qh @ kh.transpose(-1, -2) / 8 ** 0.5).masked_fill(~mask, float("-inf"))
    expected = (torch.softmax(scores, -1) @ vh).transpose(1, 2)
    expected.backward(grad)
    assert torch.allclose(out, expected.detach().float(), atol=1e-6)
    assert torch.allclose(grads, torch.cat([t.grad.flatten() for t in leaves]).float(), atol=1e-5)


def test_the_model_layout_is_the_one_a_llama_gives_sdpa():
    config = AutoConfig.for_model("llama", hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                  num_attention_heads=4, num_key_value_heads=2, head_dim=8, vocab_size=100,
                                  attn_implementation="sdpa")
    model = AutoModelForCausalLM.from_config(config)
    ids, positions = torch.randint(0, 100, (2, 16)), torch.arange(16).expand(2, 16)
    with AttentionCalls() as in_model:
        model(input_ids=ids, position_ids=positions, attention_mask=packed_causal_mask(positions, model.config))
    q, grad = (torch.randn(2, 16, 4, 8) for _ in range(2))
    k, v = (torch.randn(2, 16, 2, 8) for _ in range(2))
    mask = probe.packed_mask(2, True, torch.device("cpu"))[..., :16, :16]
    strides = {}
    for layout in probe.LAYOUTS:
        with AttentionCalls() as alone:
            probe.attention(q, k, v, grad, mask, [SDPBackend.MATH], torch.float32, layout)
        strides[layout] = [[t.stride() for t in args[:3]] for args, _ in alone.calls.values()]
    assert strides["model"] == [[t.stride() for t in args[:3]] for args, _ in in_model.calls.values()]
    assert strides["contiguous"] != strides["model"]
