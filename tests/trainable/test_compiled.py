"""Compiled decoder layers give the eager loss and gradients through one graph AOTAutograd's cache keeps, each block
traces under the SDPA kernels enabled on entering it, and the eager forwards come back afterwards."""

import pytest
import torch
from torch._dynamo.utils import counters
from torch.nn.attention import SDPBackend
from transformers import AutoConfig, AutoModelForCausalLM

from trainable.attention_check import kernels as kernels_of
from trainable.compiled import compile_wanted, compiled_decoder_layers
from trainable.lm_head import CausalLMWithFusedLoss

SMALL = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=10, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=300, head_dim=8)


def _loss_and_grads(wrapped: CausalLMWithFusedLoss, batch: dict) -> tuple[torch.Tensor, list[torch.Tensor]]:
    wrapped.zero_grad()
    loss = wrapped(**batch)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in wrapped.parameters()]


def test_compiled_layers_match_eager_and_are_undone():
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model("llama", **SMALL))
    wrapped = CausalLMWithFusedLoss(model, label_smoothing=0.1)
    ids = torch.randint(0, 300, (2, 16), generator=torch.Generator().manual_seed(1))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}
    eager_loss, eager_grads = _loss_and_grads(wrapped, batch)
    torch._dynamo.reset()  # an earlier test's graphs of the same code object would make this compile a dynamic one
    counters.clear()
    with torch._functorch.config.patch(enable_autograd_cache=True), compiled_decoder_layers(model) as n:
        assert n == 10
        assert all("forward" in vars(layer) for layer in model.model.layers)
        loss, grads = _loss_and_grads(wrapped, batch)
    # 10 layers, more than Dynamo's default recompile limit (8): every layer ran compiled, through one graph
    assert counters["frames"]["ok"] == counters["frames"]["total"] > 0 and not counters["unimplemented"]
    assert counters["stats"]["unique_graphs"] == 1
    # a graph AOTAutograd's cache keeps (an ``sdpa_kernel`` call in it made the cache pass it by)
    assert counters["aot_autograd"]["autograd_cache_bypass"] == 0
    assert counters["aot_autograd"]["autograd_cache_saved"] + counters["aot_autograd"]["autograd_cache_hit"] == 1
    assert not any("forward" in vars(layer) for layer in model.model.layers)
    # float32 on CPU; fused kernels reorder sums: tolerance of a few float32 ulps of the values
    torch.testing.assert_close(loss, eager_loss, rtol=1e-5, atol=1e-6)
    for got, want in zip(grads, eager_grads):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_compile_defaults_to_cuda_only():
    assert compile_wanted(None, torch.device("cuda")) and not compile_wanted(None, torch.device("cpu"))
    assert compile_wanted(True, torch.device("cpu")) and not compile_wanted(False, torch.device("cuda"))
    with compiled_decoder_layers(torch.nn.Linear(2, 2), enabled=False) as n:
        assert n == 0


def _attention_ops_backend(seen: list[set[str]]):
    """A torch.compile backend (AOTAutograd, run eagerly) that appends the attention ops of each traced graph."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    def record(gm, example_inputs):
        seen.append({str(node.target) for node in gm.graph.nodes
                     if "attention" in str(node.target) or "softmax" in str(node.target)})
        return make_boxed_func(gm)

    return aot_autograd(fw_compiler=record, bw_compiler=record)


@pytest.mark.parametrize("first, then", [((SDPBackend.MATH,), None), (None, (SDPBackend.MATH,))])
def test_each_block_traces_under_the_kernels_enabled_on_entering_it(first, then):
    """Dynamo does not guard SDPA's kernel flags: a graph traced inside one ``sdpa_kernel`` block served a later
    block under other kernels (a warm actor's next trial) with the kernel it traced. CPU: SDPA's own choice is its
    flash kernel, math the decomposed softmax."""
    torch._dynamo.reset()
    seen: list[set[str]] = []
    backend = _attention_ops_backend(seen)  # one backend for both blocks, as one process's trials share inductor
    ops = {}
    for name, kernels in (("first", first), ("then", then)):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model("llama", **{**SMALL, "num_hidden_layers": 2}))
        wrapped = CausalLMWithFusedLoss(model, label_smoothing=0.1)
        ids = torch.randint(0, 300, (2, 16), generator=torch.Generator().manual_seed(1))
        positions = torch.cat([torch.arange(6), torch.arange(10)]).expand(2, 16)  # two packed examples a row
        traced = len(seen)
        with kernels_of(kernels), compiled_decoder_layers(model, backend=backend):
            wrapped(input_ids=ids, attention_mask=torch.ones_like(ids), labels=ids, position_ids=positions).backward()
        ops[name] = set().union(*seen[traced:])  # nothing when a graph traced before served the block
    for name, kernels in (("first", first), ("then", then)):
        flash = {"aten._scaled_dot_product_flash_attention_for_cpu.default",
                 "aten._scaled_dot_product_flash_attention_for_cpu_backward.default"}
        assert ops[name] and (flash <= ops[name]) == (kernels is None), (name, ops[name])


def test_each_later_shape_compiles_a_static_graph():
    """A warm actor's next trial of another shape (another hidden size, then sequence lengths) compiles graphs of its
    own static shapes, as a fresh process and the benchmark do (Dynamo's automatic dynamic shapes would trace
    symbolic sizes, SymInt inputs, on seeing the second shape), past Dynamo's recompile limit of 8 graphs a code
    object (beyond it the layers would run eager, the backend not called)."""
    torch._dynamo.reset()
    inputs: list[list] = []

    def record(gm, example_inputs):
        inputs.append(list(example_inputs))
        return gm.forward

    shapes = [(32, 16), (64, 24)] + [(32, length) for length in range(8, 16)]
    for hidden, length in shapes:
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(
            "llama", **{**SMALL, "num_hidden_layers": 2, "hidden_size": hidden, "head_dim": hidden // 4}))
        ids = torch.randint(0, 300, (2, length))
        with compiled_decoder_layers(model, backend=record):
            CausalLMWithFusedLoss(model, label_smoothing=0.1)(input_ids=ids, attention_mask=torch.ones_like(ids),
                                                               labels=ids).backward()
    assert len(inputs) == len(shapes) == 10
    for example in inputs:
        assert all(isinstance(x, torch.Tensor) and not any(isinstance(d, torch.SymInt) for d in x.shape)
                   for x in example), [type(x) for x in example]
