"""The pre-training attention check against PyTorch's math kernel, on a real model and batch (CPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend

from trainable.attention_check import (MATH, AttentionCalls, agreement, choose_attention, choose_attention_once,
                                       loss_and_input_grad)
from trainable.compiled import decoder_layers
from trainable.lm_head import CausalLMWithFusedLoss
from common.models import load_model, load_tokenizer, resolve_model
from common.ports import free_port
from trainable.sft_data import build_sft_examples, collate
from trainable.config import SFTConfig, TrialConfig

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wrapped_and_batch(tiny_llama_config, data_dir):
    specs = TrialConfig.from_dict(dict(run_name="a", trial_id="t", family="tiny", learning_rate=1e-3,
                                       label_smoothing=0.1, custom_models={"tiny": {"config": tiny_llama_config}}
                                       )).custom_specs()
    spec = resolve_model("tiny", specs)
    tokenizer = load_tokenizer(spec, specs)
    model = load_model(spec, seed=0, attention_dropout=0.5)  # dropout on: the check must switch it off
    examples = build_sft_examples(SFTConfig(max_examples=6, max_seq_len=96), tokenizer, 0, data_dir)
    return CausalLMWithFusedLoss(model, 0.1), collate(examples[:4], tokenizer.pad_token_id, 8)


def counted_loss(wrapped, batch):
    """(a list that grows by one per forward, the loss function of ``batch`` that appends to it)."""
    forwards = []

    def loss():
        forwards.append(1)
        return wrapped(**batch)

    return forwards, loss


def test_sdpa_s_own_kernel_agrees_with_math_and_is_kept(wrapped_and_batch):
    wrapped, batch = wrapped_and_batch
    wrapped.train()
    choice = choose_attention(wrapped.model, lambda: wrapped(**batch))
    assert choice.name == "default" and choice.backends is None and choice.report["default"].startswith("agrees")
    assert wrapped.training and all(p.grad is None for p in wrapped.parameters())  # mode restored, no .grad


def test_a_kernel_set_that_cannot_run_is_skipped_for_the_next(wrapped_and_batch):
    wrapped, batch = wrapped_and_batch
    candidates = (("cudnn_only", (SDPBackend.CUDNN_ATTENTION,)), ("math", MATH))  # no cuDNN kernel on CPU
    choice = choose_attention(wrapped.model, lambda: wrapped(**batch), candidates)
    assert choice.name == "math" and choice.backends == MATH
    assert choice.report["cudnn_only"].startswith("fails:") and choice.report["math"] == "reference"


def test_the_ranks_keep_a_candidate_only_if_it_agrees_on_all_of_them(wrapped_and_batch, one_rank_process_group):
    wrapped, batch = wrapped_and_batch  # a one-rank gloo group: the and-reduction runs and keeps the agreement
    assert choose_attention(wrapped.model, lambda: wrapped(**batch)).name == "default"


def test_one_rank_checks_each_key_once(wrapped_and_batch):
    """A warm process's later trial of the same key takes the first check's choice: no forward runs."""
    wrapped, batch = wrapped_and_batch
    forwards, loss = counted_loss(wrapped, batch)
    first = choose_attention_once("test-key", wrapped.model, loss)
    checked = len(forwards)
    assert first.name == "default" and checked >= 2  # the math reference and SDPA's own choice
    assert choose_attention_once("test-key", wrapped.model, loss) is first and len(forwards) == checked
    assert choose_attention_once("test-other-key", wrapped.model, loss).name == "default" and len(forwards) > checked


def test_a_later_process_of_the_node_takes_the_saved_verdict(wrapped_and_batch, tmp_path):
    """The verdict saved in the node cache serves a process that has not checked (this one's memory emptied): no
    forward runs; another key, or an unreadable file, checks again."""
    import trainable.attention_check as check

    wrapped, batch = wrapped_and_batch
    forwards, loss = counted_loss(wrapped, batch)
    first = choose_attention_once("node-key", wrapped.model, loss, tmp_path)
    checked = len(forwards)
    saved = list(tmp_path.glob("*.json"))
    assert checked >= 2 and len(saved) == 1 and json.loads(saved[0].read_text())["name"] == first.name
    check._CHOSEN.clear()  # as a fresh process of the node
    again = choose_attention_once("node-key", wrapped.model, loss, tmp_path)
    assert len(forwards) == checked and (again.name, again.backends, again.report) == \
        (first.name, first.backends, first.report)
    check._CHOSEN.clear()
    saved[0].write_text("{")  # a torn or foreign file: checked again and rewritten
    assert choose_attention_once("node-key", wrapped.model, loss, tmp_path).name == first.name
    assert len(forwards) > checked and json.loads(saved[0].read_text())["name"] == first.name


def test_a_saved_fallback_keeps_its_kernels(tmp_path):
    from trainable.attention_check import AttentionChoice, _save, _saved

    choice = AttentionChoice("flash_efficient", (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                                                 SDPBackend.MATH), {"default": "differs: cos 0.0020"})
    _save(choice, "k", tmp_path)
    assert _saved("k", tmp_path) == choice and _saved("other", tmp_path) is None


def test_the_input_gradient_matches_autograd_through_the_whole_model(wrapped_and_batch):
    wrapped, batch = wrapped_and_batch
    wrapped.eval()
    embeds = wrapped.model.get_input_embeddings()(batch["input_ids"]).detach().requires_grad_(True)
    hidden = wrapped.model.get_decoder()(inputs_embeds=embeds, attention_mask=batch["attention_mask"]).last_hidden_state
    targets = torch.cat([batch["labels"][:, 1:], torch.full_like(batch["labels"][:, :1], -100)], dim=1)
    loss, _, _ = wrapped.head(hidden, targets, label_smoothing=0.1)
    loss.backward()
    got_loss, got_grad = loss_and_input_grad(lambda: wrapped(**batch), wrapped.model.get_input_embeddings(), MATH)
    assert got_loss == pytest.approx(float(loss), rel=1e-6)
    torch.testing.assert_close(got_grad, embeds.grad.float().flatten(), rtol=1e-4, atol=1e-7)


def test_agreement_tolerates_rounding_and_rejects_a_wrong_kernel():
    g = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    noise = 1e-3 * torch.randn(1000, generator=torch.Generator().manual_seed(1))
    assert agreement(2.2450, g + noise, 2.2437, g)[0]  # bf16-size differences
    assert not agreement(5.19, g, 2.24, g)[0]  # the loss of a forward that sees the wrong tokens
    assert not agreement(2.24, torch.randn(1000, generator=torch.Generator().manual_seed(2)), 2.24, g)[0]


def test_a_candidate_that_fails_on_the_recorded_calls_runs_no_model_forward(wrapped_and_batch):
    """cuDNN has no CPU kernel: the recorded attention calls show it before any forward of the model runs with it."""
    wrapped, batch = wrapped_and_batch
    forwards, loss = counted_loss(wrapped, batch)
    candidates = (("cudnn_only", (SDPBackend.CUDNN_ATTENTION,)), ("default", None))
    choice = choose_attention(wrapped.model, loss, candidates)
    assert choice.name == "default" and choice.report["cudnn_only"].startswith("fails:")
    assert len(forwards) == 2  # the math reference and the default: none under cuDNN


def test_the_check_recomputes_every_layer_in_its_backward(wrapped_and_batch):
    """One layer's activations at a time: each decoder layer's attention runs again in the backward of each forward."""
    wrapped, batch = wrapped_and_batch
    attention_runs = []
    layers = decoder_layers(wrapped.model)
    handles = [layer.self_attn.register_forward_hook(lambda *_: attention_runs.append(1)) for layer in layers]
    try:
        choose_attention(wrapped.model, lambda: wrapped(**batch), (("default", None),))
    finally:
        for handle in handles:
            handle.remove()
    assert len(attention_runs) == 2 * 2 * len(layers)  # (math, default) x (forward, recompute) x layers
    assert all("forward" not in vars(layer) for layer in layers)  # the plain forwards are back


def test_attention_calls_are_recorded_once_per_kind():
    q = torch.randn(1, 2, 8, 4)
    with AttentionCalls() as calls:
        for _ in range(3):
            F.scaled_dot_product_attention(q, q, q, is_causal=True)
        F.scaled_dot_product_attention(q[:, :, :4], q[:, :, :4], q[:, :, :4], is_causal=True)
    assert len(calls.calls) == 2
    assert calls.first_error(None) is None and calls.first_error(MATH) is None
    assert "No viable backend" in calls.first_error((SDPBackend.CUDNN_ATTENTION,))  # no cuDNN kernel on CPU


def test_the_recorded_calls_run_backward_with_a_gradient_in_the_output_s_layout():
    """As the model's backward does (the output's transposed view made contiguous), not a sum's gradient (stride 0,
    or contiguous once cast): cuDNN keys its cached backward graphs by q, k, v and the mask, not by the output
    gradient's strides, so a lone backward in another layout left a graph that read the model's gradient wrongly."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class AttentionStrides(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.outputs, self.gradients = [], []  # strides of each attention forward's output, backward's gradient

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            result = func(*args, **(kwargs or {}))
            if "attention" in str(func):
                if "backward" in str(func):
                    self.gradients.append(args[0].stride())
                else:
                    self.outputs.append(result[0].stride())
            return result

    q = torch.randn(1, 8, 2, 4).transpose(1, 2)  # (B, H, T, D) as a Llama's projection gives it: a transposed view
    k, v = torch.randn(1, 2, 8, 4), torch.randn(1, 2, 8, 4)
    with AttentionCalls() as calls:
        F.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(8, 8, dtype=torch.bool).tril())
    with AttentionStrides() as seen:
        assert calls.first_error(None) is None
    assert seen.gradients and seen.gradients == seen.outputs


# one rank of a two-rank gloo group under FSDP2: choose_attention with this rank's candidates; writes its choice
RANK = """
import datetime, json, os, sys
import torch, torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.nn.attention import SDPBackend
from common.models import load_model, resolve_model
from trainable.attention_check import choose_attention
from trainable.compiled import decoder_layers
from trainable.config import TrialConfig
config, out = json.loads(sys.argv[1]), sys.argv[2]
rank = int(os.environ["RANK"])
dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=60))
specs = TrialConfig.from_dict(dict(run_name="a", trial_id="t", family="tiny", learning_rate=1e-3, label_smoothing=0.1,
                                   custom_models={"tiny": {"config": config}})).custom_specs()
model = load_model(resolve_model("tiny", specs), seed=0)
for layer in decoder_layers(model):
    fully_shard(layer)
fully_shard(model)
ids = torch.randint(0, 100, (1, 32), generator=torch.Generator().manual_seed(rank))
first = ("cudnn_only", (SDPBackend.CUDNN_ATTENTION,)) if rank == 0 else ("sdpa_own", None)
choice = choose_attention(model, lambda: model(input_ids=ids, labels=ids).loss, (first, ("default", None)))
with open(os.path.join(out, f"choice{rank}.json"), "w") as f:
    json.dump({"name": choice.name, "report": choice.report}, f)
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)
"""


@pytest.mark.slow
def test_a_kernel_failing_on_one_rank_is_dropped_by_all_before_any_collective(tiny_llama_config, tmp_path):
    """Under FSDP2 a candidate whose kernel raises on rank 0 only: its forward (which gathers every layer) runs on no
    rank, both ranks go on to the next candidate, and nothing waits in a collective (the group's timeout: 60 s)."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
           "WORLD_SIZE": "2", "OMP_NUM_THREADS": "1"}
    ranks = [subprocess.Popen([sys.executable, "-c", RANK, json.dumps(tiny_llama_config), str(tmp_path)],
                              env={**env, "RANK": str(r), "LOCAL_RANK": str(r)}, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for r in range(2)]
    logs = [process.communicate(timeout=240)[0] for process in ranks]
    assert all(process.returncode == 0 for process in ranks), logs[0][-3000:] + logs[1][-3000:]
    choices = [json.loads((tmp_path / f"choice{r}.json").read_text()) for r in range(2)]
    assert [c["name"] for c in choices] == ["default", "default"]
    assert choices[0]["report"]["cudnn_only"].startswith("fails:")
    assert choices[1]["report"]["sdpa_own"] == "fails on another rank"
