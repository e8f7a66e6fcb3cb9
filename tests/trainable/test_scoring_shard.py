"""Scoring split across ranks (``trainable.scoring_shard``): which layouts share the questions, the records'
all-gather over a real two-process gloo group, and two-rank trials scoring as one pass over their trained model."""

import datetime
import json
import os

import pyarrow as pa
import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

from common.ports import free_port
from trainable.scoring_shard import all_gather_tables, scoring_shard


@pytest.mark.parametrize("rank, world_size, stage, fsdp2, shared", [
    (1, 2, 2, False, True),  # ZeRO-2 across two GPUs: every rank holds the model
    (0, 4, 0, False, True),
    (0, 2, 1, False, True),
    (0, 1, 0, False, False),  # one rank: nothing to share
    (1, 2, 3, True, True),  # FSDP2: each rank's gathered copy
    (0, 2, 3, False, False),  # DeepSpeed's ZeRO-3: rank 0's gathered copy, or partitioned forwards (collectives)
])
def test_only_ranks_that_each_hold_the_whole_model_share_the_questions(rank, world_size, stage, fsdp2, shared):
    shard = scoring_shard(rank, world_size, stage, fsdp2)
    assert (shard is not None) == shared
    if shard:
        assert (shard.index, shard.count, shard.gather) == (rank, world_size, all_gather_tables)


def _rank(rank: int, port: int, out: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=60))
    try:
        mine = pa.table({"question_id": [f"q{rank}a", f"q{rank}b"][: rank + 1]})
        out[rank] = [t["question_id"].to_pylist() for t in all_gather_tables(mine)]
    finally:
        dist.destroy_process_group()


def test_the_ranks_records_are_gathered_in_rank_order_on_every_rank():
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_rank, args=(free_port(), out), nprocs=2, join=True)
        assert dict(out) == {0: [["q0a"], ["q1a", "q1b"]], 1: [["q0a"], ["q1a", "q1b"]]}


@pytest.mark.slow
@pytest.mark.parametrize("engine, stage", [("deepspeed", 2), ("fsdp2", 3)])
def test_two_ranks_sharing_the_questions_score_the_trained_model_as_one_pass(engine, stage, two_ranks,
                                                                              tiny_llama_config, data_dir, tmp_path):
    """A two-rank trial (ZeRO-2: each rank's own model; FSDP2: each rank's gathered copy) scores 7 ARC-Easy and 7
    5-shot MMLU questions, each rank its share: the stored questions and the reported metrics are those of one pass
    over the exported model here, log-likelihoods within 1e-5 (float32, other batches)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from calibration.evaluate import evaluate_model
    from sweeps import store
    from trainable.config import TrialConfig

    trial = TrialConfig.from_dict(dict(
        run_name="unit", trial_id="t0", family="tiny", learning_rate=1e-3, label_smoothing=0.1, seed=3,
        data_dir=data_dir, results_dir=str(tmp_path), custom_models={"tiny": {"config": tiny_llama_config}},
        sft={"max_examples": 8, "max_seq_len": 96},
        train={"max_steps": 2, "micro_batch_size": 2, "engine": engine, "zero_stage": stage, "attention_check": False,
               "save_model": True},
        eval={"limit": 7, "tasks": ["arc_easy", "mmlu"]}))
    final = two_ranks(trial, tmp_path / "ranks")[-1]
    assert final["world_size"] == 2 and final["engine"] == engine
    model = AutoModelForCausalLM.from_pretrained(final["model_path"], attn_implementation="sdpa").eval()
    whole = evaluate_model(model, AutoTokenizer.from_pretrained(final["model_path"]), ("arc_easy", "mmlu"),
                           data_dir=data_dir, limit=7, progress=False)
    stored = store.read_questions(str(tmp_path), "unit")
    assert stored["question_id"].to_pylist() == whole.records["question_id"].to_pylist()  # 14, in one pass's order
    for ours, one_pass in zip(stored["loglik"].to_pylist(), whole.records["loglik"].to_pylist()):
        assert ours == pytest.approx(one_pass, abs=1e-5)
    other = json.loads((tmp_path / "ranks" / "reports1.json").read_text())[-1]  # rank 1 gathered the same records
    for task in ("arc_easy", "mmlu"):
        assert final[f"{task}_n_questions"] == other[f"{task}_n_questions"] == 7
        assert final[f"{task}_ece"] == other[f"{task}_ece"]
        for metric in ("accuracy", "ece", "nll"):
            assert final[f"{task}_{metric}"] == pytest.approx(whole.summary[task][metric], abs=1e-5), (task, metric)
