"""FSDP2 over 8 ranks, as HSDP (2 replica groups x 4 shards: ``trainable.fsdp2_engine.device_mesh``) and as a full
8-way shard, trains a tiny Llama to the same losses as one rank taking the same 8 sequences a step (8
micro-batches): gloo on the CPU, float32, 3 optimiser steps. The ranks are told fake node names: HSDP's replica
groups are whole nodes' ranks whether a node's ranks are consecutive or interleaved (as Ray may place them).
"""

import os
from functools import partial
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

SMALL = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=300, head_dim=8)
SEQUENCES, STEPS = 8, 3  # sequences of an optimiser step, however many ranks share them
# world -> its runs: name -> (HSDP replica groups (1: a full shard), rank -> its fake node's name)
MESHES = {8: {"hsdp": (2, lambda rank: f"node{rank // 4}"), "interleaved": (2, lambda rank: f"node{rank % 2}"),
              "shard": (1, lambda rank: "node0")},
          1: {"shard": (1, lambda rank: "node0")}}


def _model() -> CausalLMWithFusedLoss:
    torch.manual_seed(0)  # every rank the same weights: fully_shard keeps each rank's slice of its own
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model("llama", **SMALL, attn_implementation="sdpa"))
    return CausalLMWithFusedLoss(model, label_smoothing=0.1)


def _step_batches(step: int) -> list[dict[str, torch.Tensor]]:
    """The step's 8 one-sequence micro-batches: prompts and responses of different lengths."""
    g = torch.Generator().manual_seed(100 + step)
    batches = []
    for _ in range(SEQUENCES):
        prompt, response = (int(n) for n in torch.randint(2, 20, (2,), generator=g))
        ids = torch.randint(1, 300, (prompt + response,), generator=g).tolist()
        batches.append(collate([{"input_ids": ids, "labels": [-100] * prompt + ids[prompt:]}], pad_token_id=0))
    return batches


def _rank_losses(rank: int, world: int, port: int, out: str) -> None:
    """One rank: for each of ``MESHES[world]``, the 3 steps' global mean losses and the mesh's dimensions."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from trainable.fsdp2_engine import build_engine, init_sharded
    from trainable.step_accounting import PendingLoss, optimizer_step

    cpu, accumulation = torch.device("cpu"), SEQUENCES // world
    results = {}
    for run, (replicas, node) in MESHES[world].items():
        train = TrainConfig(micro_batch_size=1, gradient_accumulation_steps=accumulation, precision="fp32",
                            engine="fsdp2", zero_stage=3, warmup_ratio=0.0, compile=False, fsdp_replicas=replicas)
        engine, _ = build_engine(_model(), train, 1e-2, STEPS, cpu, world, node=node(rank))
        losses = []
        for step in range(STEPS):
            mine = _step_batches(step)[rank * accumulation:(rank + 1) * accumulation]
            losses.append(PendingLoss(optimizer_step(engine, mine, cpu, world), accumulation, world).value())
        weight = engine.module.model.model.layers[0].mlp.up_proj.weight
        results[run] = {"losses": losses, "mesh": weight.device_mesh.mesh.tolist(),
                        "placements": [type(p).__name__ for p in weight.placements]}
    if world == 1:  # the same model built on the meta device, each rank's shards allocated and initialised
        with torch.device("meta"):
            meta = _model()
        engine, _ = build_engine(meta, train, 1e-2, STEPS, cpu, world, partial(init_sharded, device=cpu, std=0.02))
        model = engine.module.model.model
        built = _model().model.model
        results["meta"] = {"rotary": torch.equal(model.rotary_emb.inv_freq, built.rotary_emb.inv_freq),
                           "norm": float(model.norm.weight.full_tensor().mean()),
                           "std": float(model.layers[0].mlp.up_proj.weight.full_tensor().std()),
                           "loss": PendingLoss(optimizer_step(engine, _step_batches(0), cpu, world), accumulation,
                                               world).value()}
    if rank == 0:
        torch.save(results, f"{out}/world{world}.pt")
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # no interpreter teardown: gloo's threads still running can std::terminate the rank


@pytest.mark.slow
def test_hsdp_and_a_full_shard_over_8_ranks_give_one_rank_s_losses(tmp_path):
    run_rank = ("import importlib.util, sys; spec = importlib.util.spec_from_file_location('ranks', sys.argv[1]); "
                "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); "
                "m._rank_losses(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2]), "OMP_NUM_THREADS": "1"}
    ranks = [subprocess.Popen([sys.executable, "-c", run_rank, __file__, str(rank), str(world), str(port),
                               str(tmp_path)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for world, port in ((8, free_port()), (1, free_port())) for rank in range(world)]
    logs = [process.communicate(timeout=300)[0] for process in ranks]
    failed = [log[-3000:] for process, log in zip(ranks, logs) if process.returncode != 0]
    assert not failed, failed[0]
    eight, ones = torch.load(tmp_path / "world8.pt"), torch.load(tmp_path / "world1.pt")
    one, meta = ones["shard"], ones["meta"]
    # HSDP's 2-D mesh, a row (shard group) per node: consecutive ranks, or every other rank
    assert eight["hsdp"]["mesh"] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert eight["interleaved"]["mesh"] == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert eight["hsdp"]["placements"] == eight["interleaved"]["placements"] == ["Replicate", "Shard"]
    assert eight["shard"]["mesh"] == list(range(8)) and eight["shard"]["placements"] == ["Shard"]
    assert len(set(one["losses"])) == STEPS  # the steps train: each loss differs from the last
    for run in ("hsdp", "interleaved", "shard"):
        # float32; the ranks reduce in another order than one rank's accumulation: a few ulps, grown by 2 updates
        assert eight[run]["losses"] == pytest.approx(one["losses"], rel=1e-5), run
    # built on the meta device: the rotary buffers as built on the CPU, norms 1, matrices N(0, 0.02^2), and a first
    # loss near log(vocabulary) = 5.70, as the CPU-built model's
    assert meta["rotary"] and meta["norm"] == 1.0 and meta["std"] == pytest.approx(0.02, rel=0.05)
    assert meta["loss"] == pytest.approx(one["losses"][0], abs=0.05)


@pytest.mark.parametrize("nodes, replicas, rows", [
    ("aaaabbbb", 2, [[0, 1, 2, 3], [4, 5, 6, 7]]),  # consecutive: init_device_mesh's rows
    ("abababab", 2, [[0, 2, 4, 6], [1, 3, 5, 7]]),  # interleaved
    ("aaabccdd", 2, [[0, 1, 2, 3], [4, 5, 6, 7]]),  # uneven nodes that pack: 3 + 1, 2 + 2
    ("ccaaaabb", 2, [[0, 1, 6, 7], [2, 3, 4, 5]]),
    ("aaaaaaaa", 2, [[0, 1, 2, 3], [4, 5, 6, 7]]),  # one node of two rows (HSDP within a node)
    ("aaaaaabb", 4, [[0, 1], [2, 3], [4, 5], [6, 7]]),
])
def test_replica_rows_are_whole_nodes(nodes, replicas, rows):
    from trainable.fsdp2_engine import replica_rows

    assert replica_rows(list(nodes), replicas) == rows


@pytest.mark.parametrize("nodes, replicas", [("aaaaaabbbbbbcccc", 2), ("aaabbbbb", 2), ("aaaaaabb", 2)])
def test_replica_rows_refuse_a_placement_that_splits_a_node(nodes, replicas):
    from trainable.fsdp2_engine import replica_rows

    counts = {node: nodes.count(node) for node in dict.fromkeys(nodes)}
    with pytest.raises(ValueError, match=f"got ranks per node {counts}".replace("{", r"\{").replace("}", r"\}")):
        replica_rows(list(nodes), replicas)
