"""lm-eval reads our local-file task YAMLs and builds the very prompts we score (no model run here)."""

from __future__ import annotations

import pytest

from calibration.agreement import compare, our_task, write_task_yamls
from calibration.task_config import load_prompts


def test_lm_eval_builds_the_same_prompts_from_the_same_files(mini_data, tmp_path):
    pytest.importorskip("lm_eval")
    from lm_eval.tasks import TaskManager

    tasks = ["calsweep_arc_easy", "calsweep_hellaswag", "calsweep_mmlu_anatomy"]
    include = write_task_yamls(tmp_path / "tasks", mini_data, ["anatomy"])
    manager = TaskManager(include_path=str(include), include_defaults=False)
    built = manager.load(tasks)["tasks"]
    assert sorted(built) == sorted(tasks)
    for name, task in built.items():
        task.build_all_requests(limit=None, rank=0, world_size=1)
        _, prompts = load_prompts(our_task(name), data_dir=mini_data)
        assert len(task.instances) == sum(len(p.continuations) for p in prompts)
        expected = [(p.prefix + p.query, c) for p in prompts for c in p.continuations]
        assert [tuple(i.arguments) for i in task.instances] == expected


def test_compare_counts_accuracy_and_disagreements():
    theirs = [{"loglik": [-1.0, -2.0], "acc": 1.0, "acc_norm": 0.0}, {"loglik": [-3.0, -1.0], "acc": 0.0,
                                                                       "acc_norm": 0.0}]
    ours = [{"loglik": [-1.0, -2.0], "loglik_norm": [-1.0, -0.5], "gold": 0},
            {"loglik": [-0.5, -1.0], "loglik_norm": [-0.5, -1.0], "gold": 0}]
    report = compare(theirs, ours)
    assert report["lm_eval_acc"] == 0.5 and report["ours_acc"] == 1.0 and report["acc_diff_points"] == 50.0
    assert report["predictions_differ"] == 1 and report["max_abs_loglik_diff"] == 2.5
    assert report["lm_eval_acc_norm"] == 0.0 and report["ours_acc_norm"] == 0.5
    mmlu_like = compare([{k: v for k, v in t.items() if k != "acc_norm"} for t in theirs], ours)
    assert "acc_norm_diff_points" not in mmlu_like  # lm-eval's MMLU reports acc only
    with pytest.raises(ValueError, match="expected calsweep_arc_easy"):
        our_task("arc_challenge")
