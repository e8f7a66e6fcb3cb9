"""An optimiser step's loss is the mean over all its response tokens, whatever the micro-batches and ranks hold.

Two gloo ranks of DeepSpeed (ZeRO stage 0 on the CPU, where the averaged gradients stay readable in
``param.grad`` until the step) with two micro-batches each, of very different response lengths, must give the
gradient of one big batch: sum over all 4 micro-batches' response tokens of the loss / their count.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from transformers import AutoConfig, AutoModelForCausalLM

from common.ports import free_port
from trainable.config import TrainConfig
from trainable.lm_head import CausalLMWithFusedLoss
from trainable.sft_data import collate
from trainable.step_accounting import StepClock, global_mean_loss, step_loss_divisor, warmup_step_count

SMALL = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=300, head_dim=8)
WORLD, ACCUMULATION = 2, 2


def _model() -> CausalLMWithFusedLoss:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model("llama", **SMALL, attn_implementation="sdpa"))
    return CausalLMWithFusedLoss(model, label_smoothing=0.1)


def _micro_batches() -> list[list[dict[str, torch.Tensor]]]:
    """rank -> its micro-batches; response tokens per micro-batch: 2, 40, 25, 3 (prompts of other lengths)."""
    g = torch.Generator().manual_seed(5)
    batches = []
    for prompt, response in ((30, 2), (4, 40), (10, 25), (20, 3)):
        ids = torch.randint(1, 300, (prompt + response,), generator=g).tolist()
        labels = [-100] * prompt + ids[prompt:]
        batches.append(collate([{"input_ids": ids, "labels": labels}], pad_token_id=0))
    return [batches[:2], batches[2:]]


def _rank_gradients(rank: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(WORLD),
                      LOCAL_RANK=str(rank), DS_ACCELERATOR="cpu")
    from trainable.node_setup import skip_deepspeed_shm_op

    skip_deepspeed_shm_op()  # as a trial does: else both ranks JIT-build DeepSpeed's shm op at once on a cold cache
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    from trainable.deepspeed_setup import build_engine

    wrapped = _model()
    train = TrainConfig(micro_batch_size=1, gradient_accumulation_steps=ACCUMULATION, zero_stage=0, precision="fp32")
    engine, _ = build_engine(wrapped, train, 1e-3, 1, torch.device("cpu"), WORLD)
    micro = _micro_batches()[rank]
    divisor = step_loss_divisor(micro, torch.device("cpu"), WORLD)
    summed = torch.zeros(())
    for index, batch in enumerate(micro):
        loss = engine(**batch, loss_divisor=divisor)
        engine.backward(loss)  # the last one is the accumulation boundary: gradients are all-reduced here
        if index < len(micro) - 1:
            engine.step()
        summed += loss.detach()
    mean = global_mean_loss(summed, ACCUMULATION, WORLD)
    torch.save({"mean": mean, "grads": [p.grad.clone() for p in engine.module.parameters()]}, f"{out}/{rank}.pt")
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # no interpreter teardown: threads it would destroy still running can std::terminate the rank


def _big_batch_reference() -> tuple[float, list[torch.Tensor], list[torch.Tensor]]:
    """(mean loss, its gradients, the gradients of the old mean of per-micro-batch means) in one process."""
    wrapped = _model()
    batches = [b for rank in _micro_batches() for b in rank]
    tokens = sum(int((b["labels"][:, 1:] != -100).sum()) for b in batches)
    one = torch.tensor(1.0)
    wrapped.zero_grad()
    loss = sum(wrapped(**b, loss_divisor=one) for b in batches) / tokens
    loss.backward()
    grads = [p.grad.clone() for p in wrapped.parameters()]
    wrapped.zero_grad()
    (sum(wrapped(**b) for b in batches) / len(batches)).backward()
    return float(loss.detach()), grads, [p.grad.clone() for p in wrapped.parameters()]


@pytest.mark.slow
def test_two_ranks_with_accumulation_give_the_one_big_batch_gradient(tmp_path):
    port = free_port()
    # fresh interpreters: a fork would inherit the session's process group and DeepSpeed's cached groups
    run_rank = ("import importlib.util, sys; spec = importlib.util.spec_from_file_location('ranks', sys.argv[1]); "
                "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); "
                "m._rank_gradients(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2]), "OMP_NUM_THREADS": "1"}
    ranks = [subprocess.Popen([sys.executable, "-c", run_rank, __file__, str(rank), str(port), str(tmp_path)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for rank in range(WORLD)]
    logs = [process.communicate(timeout=300)[0] for process in ranks]
    assert all(process.returncode == 0 for process in ranks), logs[0][-3000:] + logs[1][-3000:]
    mean, grads, mean_of_means_grads = _big_batch_reference()
    for rank in range(WORLD):
        got = torch.load(tmp_path / f"{rank}.pt")
        # float32 on the CPU; the ranks sum in another order than the one process: a few float32 ulps
        assert got["mean"] == pytest.approx(mean, rel=1e-5)
        for g, want in zip(got["grads"], grads):
            torch.testing.assert_close(g, want, rtol=1e-4, atol=1e-6)
    # the test can tell: averaging per-micro-batch means (the old rule) gives another gradient
    assert not all(torch.allclose(a, b, rtol=1e-2) for a, b in zip(mean_of_means_grads, grads))


def test_step_clock_splits_warm_up_from_steady_steps(monkeypatch):
    now = [100.0]
    monkeypatch.setattr("trainable.step_accounting.time.time", lambda: now[0])
    clock = StepClock(world_size=2, warmup_steps=1)
    assert clock.rate() == 0 and clock.steady_rate() is None
    clock.tokens, now[0] = 50, 110.0  # step 1 (compiles): 10 s
    clock.step_done(1)
    clock.tokens, now[0] = 150, 111.0  # step 2: 100 tokens in 1 s
    clock.step_done(2)
    clock.stop()
    assert clock.warmup_s() == 10.0
    assert clock.steady_rate() == 200.0  # 100 tokens on each of 2 ranks per second
    assert clock.rate() == 200.0
    assert [warmup_step_count(n) for n in (1, 2, 6, 40, 1000)] == [1, 1, 1, 4, 10]


def test_step_clock_leaves_validation_and_checkpoints_out(monkeypatch):
    now = [100.0]
    monkeypatch.setattr("trainable.step_accounting.time.time", lambda: now[0])
    clock = StepClock(world_size=1, warmup_steps=1)
    with clock.paused():  # a validation pass in the warm-up: 5 s
        now[0] = 105.0
    clock.tokens, clock.rows, now[0] = 50, 2, 115.0  # step 1: 10 s of training
    clock.step_done(1)
    with clock.paused():  # a checkpoint: 30 s
        now[0] = 145.0
    clock.tokens, clock.rows, now[0] = 150, 4, 147.0  # step 2: 100 tokens in 2 s
    clock.step_done(2)
    clock.stop()
    assert clock.warmup_s() == 10.0 and clock.steady_rate() == 50.0 and clock.rate() == 50.0
    assert clock.mean_row_tokens() == 37.5
