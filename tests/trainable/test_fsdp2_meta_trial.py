"""An FSDP2 trial's loader (``trainable.worker._loaded``) over 2 gloo ranks builds the model on the meta device: no
rank allocates the whole model, and the trial's first loss is the one of today's path (the whole model built on
each rank, then sharded). A random-init Llama draws each rank's shards (another draw than the whole model's: the
first losses agree to a hundredth); stored weights (a local folder) are rank 0's, broadcast tensor by tensor (the
same weights: the same losses). Allocations are counted by c10's CPU allocator (every thread's allocations and frees,
gloo's worker threads included, whose frees the profiler misses), read off PyTorch's profiler (``profile_memory``):
the peak of live bytes while the loader runs. On one rank (``load_sharded`` alone: a one-rank trial builds whole),
stored Llama (tied) and Gemma 3 models built on meta compute the stored model's loss exactly (every weight and
buffer broadcast).
"""

import ctypes
import gc
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from common.ports import free_port

# 22.6M parameters (90 MB in float32), most of them outside the embeddings (25 MB each): a rank's shards (45 MB)
# and one whole tensor in flight stay well under the whole model
CONFIG = dict(hidden_size=128, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=4,
              num_key_value_heads=2, head_dim=32, vocab_size=49152, tie_word_embeddings=False,
              max_position_embeddings=256)
WORLD = 2
SLACK = 4 * 2**20  # the loader's other allocations (the first batch, the optimizer's bookkeeping), bytes


def _trial(family: str, data_dir: str, results: str):
    from trainable.config import TrialConfig

    return TrialConfig.from_dict(dict(
        run_name="meta", trial_id=f"t{len(family)}", family=family, learning_rate=1e-3, label_smoothing=0.1, seed=3,
        data_dir=data_dir, results_dir=results, custom_models={"tiny": {"config": CONFIG}},
        sft={"max_examples": 8, "max_seq_len": 64},
        train={"max_steps": 2, "micro_batch_size": 1, "log_every": 1, "engine": "fsdp2", "attention_check": False,
               "checkpoint_every_minutes": None},
        eval={"tasks": []}))


def _count_every_threads_cpu_bytes() -> None:
    """Turn on c10's own count of live CPU bytes (the ``caffe2_report_cpu_memory_usage`` flag of ``libc10``): each
    allocation event the profiler records then carries the process's live total, frees on threads the profiler does
    not watch included (a tensor gloo broadcast is freed on gloo's worker thread when its work object goes last)."""
    library = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libc10.so"))
    ctypes.c_bool.in_dll(library, "FLAGS_caffe2_report_cpu_memory_usage").value = True


def _peak_bytes(prof) -> int:
    """The peak of live CPU bytes over a profile, above those live before it: c10's count (``total_allocated``) on
    each CPU allocation and free the profiler recorded, less the count before the first."""
    from torch._C._profiler import _EventType

    events, stack = [], list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        event = stack.pop()
        stack.extend(event.children)
        if event.tag == _EventType.Allocation and event.extra_fields.device.type == "cpu":
            events.append(event)
    first = min(events, key=lambda event: event.start_time_ns).extra_fields
    before = first.total_allocated - first.alloc_size
    return max(event.extra_fields.total_allocated for event in events) - before


def _rank(rank: int, port: int, out: str, data_dir: str, saved: str) -> None:
    """One rank: for the random-init family and the saved folder, the loader's peak and shard bytes, the trial's
    first two losses, and today's path's peak and first loss on the same first batch."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(WORLD),
                      LOCAL_RANK=str(rank))
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    from common.models import load_model, resolve_model
    from trainable import worker
    from trainable.fsdp2_engine import build_engine
    from trainable.lm_head import CausalLMWithFusedLoss
    from trainable.step_accounting import PendingLoss, optimizer_step

    _count_every_threads_cpu_bytes()
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    cpu, results = torch.device("cpu"), {}
    for name, family in (("random", "tiny"), ("saved", saved)):
        trial = _trial(family, data_dir, str(Path(out) / "results"))
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            setup = worker._loaded(trial, cpu, rank, WORLD, None)
        loaded_peak = _peak_bytes(prof)
        local = [p.to_local() for p in setup.model.parameters()]
        up = setup.model.model.layers[0].mlp.up_proj.weight.full_tensor()  # (2048, 128): a half on each rank
        trained = worker.train(trial, setup, cpu, rank, WORLD, lambda metrics: None, None)
        setup.engine.destroy()
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:  # today's path
            whole = load_model(resolve_model(family, trial.custom_specs()), seed=trial.seed, device=cpu)
            wrapped = CausalLMWithFusedLoss(whole, trial.label_smoothing, trial.train.loss_impl,
                                            trial.train.loss_filter)
            engine, _ = build_engine(wrapped, trial.train, trial.learning_rate, setup.total_steps, cpu, WORLD)
        today_peak = _peak_bytes(prof)
        today = PendingLoss(optimizer_step(engine, [setup.first_batch], cpu, WORLD), 1, WORLD).value()
        results[name] = {"first": trained.first_loss, "last": trained.step_loss, "today": today,
                         "std": float(up.std()), "halves_differ": not torch.equal(*up.chunk(2)),
                         "loaded_peak": loaded_peak, "today_peak": today_peak,
                         "shard_bytes": sum(t.numel() * t.element_size() for t in local),
                         "largest_bytes": 4 * max(p.numel() for p in whole.parameters()),
                         "model_bytes": 4 * setup.facts["n_params"]}
        del setup, local, up, whole, wrapped, engine  # freed here, not inside the next profile's window
        gc.collect()
    torch.save(results, f"{out}/rank{rank}.pt")
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # no interpreter teardown: gloo's threads still running can std::terminate the rank


@pytest.mark.slow
def test_an_fsdp2_trial_builds_on_meta_and_no_rank_holds_the_whole_model(tmp_path, data_dir, smollm2_tokenizer):
    from common.models import load_model, resolve_model
    from trainable.config import TrialConfig

    saved = tmp_path / "saved"  # a stored model: the random-init family's weights, with its tokenizer
    spec = resolve_model("tiny", TrialConfig.from_dict(dict(run_name="x", trial_id="x", family="tiny",
                                                            learning_rate=1e-3, label_smoothing=0.0, seed=0,
                                                            custom_models={"tiny": {"config": CONFIG}})).custom_specs())
    load_model(spec, seed=11).save_pretrained(saved)
    smollm2_tokenizer.save_pretrained(saved)
    port = free_port()
    run_rank = ("import importlib.util, sys; spec = importlib.util.spec_from_file_location('ranks', sys.argv[1]); "
                "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); "
                "m._rank(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5], sys.argv[6])")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2]), "OMP_NUM_THREADS": "1"}
    ranks = [subprocess.Popen([sys.executable, "-c", run_rank, __file__, str(rank), str(port), str(tmp_path),
                               data_dir, str(saved)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for rank in range(WORLD)]
    logs = [process.communicate(timeout=300)[0] for process in ranks]
    failed = [log[-3000:] for process, log in zip(ranks, logs) if process.returncode != 0]
    assert not failed, failed[0]
    rows = [torch.load(tmp_path / f"rank{rank}.pt") for rank in range(WORLD)]
    for rank, row in enumerate(rows):
        random, stored = row["random"], row["saved"]
        model = random["model_bytes"]
        assert random["shard_bytes"] == stored["shard_bytes"] == model // WORLD  # each rank its half
        # today's path allocates the whole model on every rank; the meta build its shards alone
        assert random["today_peak"] >= model, (rank, random)
        # its shards, and one shard's copy in flight (FSDP2 copies each new shard of ``to_empty`` into its storage)
        in_flight = random["largest_bytes"] // WORLD
        assert random["loaded_peak"] <= random["shard_bytes"] + in_flight + SLACK, (rank, random)
        if rank:  # rank 0 reads the stored model into its host memory (by design); the others never hold it: their
            # shards, a shard's copy and one whole tensor broadcast at a time
            assert stored["loaded_peak"] <= stored["shard_bytes"] + in_flight + stored["largest_bytes"] + SLACK, \
                (rank, stored)
            assert stored["loaded_peak"] < model
        # the same stored weights: the same first loss. A random init drawn shard by shard: N(0, 0.02^2) with the
        # two ranks' halves apart, another draw than the whole model's: a first loss near log(49152) = 10.80 + the
        # logits' variance / 2 as the whole model's, apart by the spread of the target logit's mean over the batch's
        # tokens (0.036 here)
        assert stored["first"] == pytest.approx(stored["today"], rel=1e-6)
        assert random["std"] == pytest.approx(0.02, rel=0.02) and random["halves_differ"]
        assert random["first"] == pytest.approx(random["today"], abs=0.1)
        assert stored["first"] != pytest.approx(random["first"], abs=1e-4)  # two models, two losses
        for losses in (random, stored):
            assert losses["last"] < losses["first"]  # it trains


@pytest.mark.parametrize("architecture, extra", [
    ("llama", {"tie_word_embeddings": True}),  # the head is the embedding: one tensor under two names
    ("gemma3_text", {}),  # tied too; buffers outside the state dict: the embedding's scale, two rotary tables
])
def test_stored_weights_built_on_meta_are_the_stored_model(architecture, extra, tmp_path, one_rank_process_group):
    """A model of a stored folder's config built on the meta device, sharded and filled from the stored model
    (``load_sharded``) computes the stored model's loss exactly: every weight and buffer is rank 0's."""
    from functools import partial

    from transformers import AutoConfig, AutoModelForCausalLM

    from trainable.config import TrainConfig
    from trainable.fsdp2_engine import build_engine, load_sharded
    from trainable.lm_head import CausalLMWithFusedLoss

    config = AutoConfig.for_model(architecture, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, head_dim=8, vocab_size=300, **extra)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    source = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(source.config, dtype=torch.float32)
    cpu = torch.device("cpu")
    train = TrainConfig(engine="fsdp2", zero_stage=3, precision="fp32", compile=False)
    engine, _ = build_engine(CausalLMWithFusedLoss(model, 0.1), train, 1e-3, 1, cpu, 1,
                             partial(load_sharded, device=cpu, source=source))
    stored = CausalLMWithFusedLoss(AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32), 0.1)
    ids = torch.randint(1, 300, (2, 16), generator=torch.Generator().manual_seed(1))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}
    with torch.no_grad():
        assert float(engine(**batch)) == float(stored(**batch))
    assert (engine.module.model.get_output_embeddings().weight is
            engine.module.model.get_input_embeddings().weight) == config.tie_word_embeddings
