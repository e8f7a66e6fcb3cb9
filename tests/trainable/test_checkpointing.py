"""Mid-trial checkpoints without Ray: a trial resumed from its step-2 checkpoint runs steps 3-4 on the same batches,
learning rates, optimizer state and dropout draws as the uninterrupted trial (bitwise on CPU fp32), in this process
(ZeRO-2) and in two rank processes (ZeRO-3 and FSDP2: each rank's shard, merged as Ray Train merges them); a final
checkpoint is reported again without training. The process-death tests through Ray are
tests/sweeps/test_trial_recovery.py."""

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import torch

from sweeps import store
from trainable import checkpointing
from trainable.config import TrialConfig
from trainable.fault_injection import FAULT_ENV, fault_step
from trainable.worker import run_trial

def _trial(tiny_llama_config, data_dir, tmp_path, **train) -> TrialConfig:
    return TrialConfig.from_dict(dict(
        run_name="unit", trial_id="t0", family="tiny", learning_rate=1e-3, label_smoothing=0.1, seed=3,
        data_dir=data_dir, results_dir=str(tmp_path), custom_models={"tiny": {"config": tiny_llama_config}},
        sft={"max_examples": 16, "max_seq_len": 96},
        train={"max_steps": 4, "micro_batch_size": 2, "gradient_accumulation_steps": 2, "dropout": 0.1,
               "log_every": 1, "val_examples": 2, "val_every": 3, "checkpoint_every_steps": 2,
               "attention_check": False, **train},
        eval={"limit": 3, "batch_size": 4, "tasks": ["arc_easy"]}))


class Recorder:
    """The trial's reports, and a copy of each checkpoint folder (Ray Train's upload) under ``root``."""

    def __init__(self, root: Path):
        self.root, self.reports, self.checkpoints = root, [], {}

    def report(self, metrics):
        self.reports.append(metrics)

    def report_checkpoint(self, metrics, directory):
        self.reports.append(metrics)
        name = f"{metrics['phase']}{metrics['step']}"
        self.checkpoints[name] = shutil.copytree(directory, self.root / name)

    def losses(self):
        return {r["step"]: r["train_loss"] for r in self.reports if r["phase"] == "train"}


def _run(trial, recorder, resume_from=None):
    return run_trial(trial, torch.device("cpu"), 0, 1, recorder.report, recorder.report_checkpoint, resume_from,
                     writers=store.trial_writers())


@pytest.fixture(scope="module")
def uninterrupted(tiny_llama_config, data_dir, tmp_path_factory, one_rank_process_group):
    """The ZeRO-2 trial run through, with its checkpoints after steps 2 and 4 and its final one."""
    root = tmp_path_factory.mktemp("uninterrupted")
    trial = _trial(tiny_llama_config, data_dir, root)
    recorder = Recorder(root / "checkpoints")
    return trial, recorder, _run(trial, recorder)


def _resumed_run(trial, tmp_path, checkpoint):
    recorder = Recorder(tmp_path / "resumed")
    return recorder, _run(dataclasses.replace(trial, results_dir=str(tmp_path)), recorder, resume_from=checkpoint)


def _assert_same_continuation(full, uninterrupted, again, resumed):
    assert resumed["resumed_from_step"] == 2 and uninterrupted["resumed_from_step"] == 0
    assert sorted(again.losses()) == [3, 4] and again.losses() == {s: full.losses()[s] for s in (3, 4)}
    lrs = {r["step"]: r["lr"] for r in full.reports if r["phase"] == "train"}
    assert [r["lr"] for r in again.reports if r["phase"] == "train"] == [lrs[3], lrs[4]]
    for key in ("train_loss", "train_loss_first", "val_loss", "train_confidence", "train_tokens", "arc_easy_nll",
                "arc_easy_ece"):
        assert resumed[key] == uninterrupted[key], key


def test_a_resumed_trial_continues_where_the_checkpoint_stood(uninterrupted, tmp_path):
    trial, full, final = uninterrupted
    assert sorted(full.checkpoints) == ["done4", "train2", "train4"]
    assert checkpointing.loop_state(full.checkpoints["train2"]).step == 2
    again, resumed = _resumed_run(trial, tmp_path, full.checkpoints["train2"])
    _assert_same_continuation(full, final, again, resumed)


@pytest.mark.slow
def test_two_zero3_ranks_save_their_shards_and_resume_from_them(tiny_llama_config, data_dir, tmp_path, two_ranks):
    trial = _trial(tiny_llama_config, data_dir, tmp_path, zero_stage=3, engine="deepspeed", checkpoint_every_steps=None,
                   checkpoint_every_minutes=1e-9)  # the time rule, agreed across the ranks: due after every step
    full = two_ranks(trial, tmp_path / "full")  # from step 2: each step's flags are read at the next step
    assert sorted(p.name for p in (tmp_path / "full").iterdir() if p.is_dir()) == \
        ["done4", "train2", "train3", "train4"]
    shards = sorted(p.name for p in (tmp_path / "full" / "train2" / "deepspeed" / "trial").iterdir())
    assert [name for name in shards if "optim_states" in name] == ["zero_pp_rank_0_mp_rank_00_optim_states.pt",
                                                                   "zero_pp_rank_1_mp_rank_00_optim_states.pt"]
    assert {p.name for p in (tmp_path / "full" / "train2").glob("rng_rank*.pt")} == {"rng_rank0.pt", "rng_rank1.pt"}
    assert {p.name for p in (tmp_path / "full" / "train2").glob("plan_history_rank*.json")} == \
        {"plan_history_rank0.json", "plan_history_rank1.json"}  # each rank's fused head's (empty: the CPU path plans none)

    resumed = two_ranks(dataclasses.replace(trial, results_dir=str(tmp_path / "again")), tmp_path / "again",
                         resume_from=tmp_path / "full" / "train2")
    train = {r["step"]: r for r in full if r["phase"] == "train"}
    assert [(r["step"], r["train_loss"], r["lr"]) for r in resumed if r["phase"] == "train"] == \
        [(s, train[s]["train_loss"], train[s]["lr"]) for s in (3, 4)]
    for key in ("train_loss", "train_loss_first", "val_loss", "train_tokens", "arc_easy_nll", "arc_easy_ece"):
        assert resumed[-1][key] == full[-1][key], key
    assert resumed[-1]["resumed_from_step"] == 2 and resumed[-1]["world_size"] == 2


@pytest.mark.slow
def test_two_fsdp2_ranks_save_their_shards_and_resume_from_them(tiny_llama_config, data_dir, tmp_path, two_ranks):
    trial = _trial(tiny_llama_config, data_dir, tmp_path, engine="fsdp2", zero_stage=3, max_steps=3,
                   checkpoint_every_steps=2)
    full = two_ranks(trial, tmp_path / "full")
    saved = tmp_path / "full" / "train2" / checkpointing.DEEPSPEED_DIR / checkpointing.TAG
    assert {p.name for p in saved.iterdir()} == {".metadata", "__0_0.distcp", "__1_0.distcp", "schedule.json"}
    resumed = two_ranks(dataclasses.replace(trial, results_dir=str(tmp_path / "again")), tmp_path / "again",
                         resume_from=tmp_path / "full" / "train2")
    train = {r["step"]: r for r in full if r["phase"] == "train"}
    assert [(r["step"], r["train_loss"], r["lr"]) for r in resumed if r["phase"] == "train"] == \
        [(3, train[3]["train_loss"], train[3]["lr"])]
    for key in ("train_loss", "train_loss_first", "val_loss", "train_tokens", "arc_easy_nll", "arc_easy_ece"):
        assert resumed[-1][key] == full[-1][key], key
    assert resumed[-1]["world_size"] == 2 and resumed[-1]["engine"] == "fsdp2"


def test_a_resume_on_other_batches_would_show(uninterrupted, tmp_path):
    # the tests above can fail: resuming at step 2 with the batches after step 1 gives another step-3 loss
    trial, full, _ = uninterrupted
    shifted = shutil.copytree(full.checkpoints["train2"], tmp_path / "shifted")
    state = checkpointing.loop_state(shifted)
    (shifted / checkpointing.LOOP_FILE).write_text(json.dumps({**dataclasses.asdict(state), "step": 1}))
    again, _ = _resumed_run(trial, tmp_path, shifted)
    assert again.losses()[2] != full.losses()[3]


def test_a_finished_trial_is_reported_again_with_its_questions(uninterrupted, tmp_path):
    trial, full, final = uninterrupted
    record = json.loads((full.checkpoints["done4"] / checkpointing.TRIAL_FILE).read_text())
    assert record["config"] == json.loads(json.dumps(trial.to_dict())) and record["world_size"] == 1
    again, reported = _resumed_run(trial, tmp_path, full.checkpoints["done4"])
    assert reported == final and again.reports == [final] and not again.checkpoints
    assert store.read_questions(str(tmp_path), "unit").equals(store.read_questions(trial.results_dir, "unit"))


def test_a_checkpoint_of_another_length_is_refused(uninterrupted, tmp_path):
    trial, full, _ = uninterrupted
    longer = dataclasses.replace(trial, train=dataclasses.replace(trial.train, max_steps=6))
    with pytest.raises(ValueError, match="expected a checkpoint of a 6-step trial to resume, got one of 4 steps"):
        _resumed_run(longer, tmp_path, full.checkpoints["train2"])


def test_schedule_by_steps_and_by_minutes():
    by_steps = checkpointing.CheckpointSchedule(3, None, 1, torch.device("cpu"))
    assert [s for s in range(1, 10) if by_steps.due(s)] == [3, 6, 9]
    assert not any(checkpointing.CheckpointSchedule(None, None, 1, torch.device("cpu")).due(s) for s in range(9))
    by_time = checkpointing.CheckpointSchedule(None, 60.0, 1, torch.device("cpu"))
    assert not by_time.due(1)
    by_time.last -= 3601  # an hour since the last checkpoint
    assert by_time.due(2) and not by_time.due(3)  # the clock restarts at a checkpoint


def test_several_ranks_agree_on_the_time_rule_a_step_late_without_waiting_on_the_step(one_rank_process_group):
    """Under several ranks each step's flag is summed over the ranks behind its kernels and read at the next step
    (one rank decides at once: the test above); the one-rank group stands in for the ranks' all-reduce."""
    by_time = checkpointing.CheckpointSchedule(None, 60.0, 2, torch.device("cpu"))
    assert not by_time.due(1)
    by_time.last -= 3601  # an hour since the last checkpoint, seen by step 2's flag
    assert [by_time.due(s) for s in (2, 3, 4, 5)] == [False, True, False, False]
    both = checkpointing.CheckpointSchedule(4, 60.0, 2, torch.device("cpu"))
    assert [s for s in range(1, 9) if both.due(s)] == [4, 8]


def test_fault_step_reads_the_environment(monkeypatch):
    monkeypatch.delenv(FAULT_ENV, raising=False)
    assert fault_step() is None
    monkeypatch.setenv(FAULT_ENV, "3")
    assert fault_step() == 3
    monkeypatch.setenv(FAULT_ENV, "three")
    with pytest.raises(ValueError, match="CALSWEEP_FAULT_AT_STEP: expected an optimiser step >= 1, got 'three'"):
        fault_step()
