"""Pre-flight: every problem a sweep would meet only inside a trial is found before Ray starts, one line each,
all at once; ASHA's max_t is derived from the trials' steps so that no trial is stopped before it is scored."""

import dataclasses
from pathlib import Path

import pytest
import yaml

from sweeps import launch, search, store
from sweeps.config import load_sweep, sweep_from_dict
from sweeps.preflight import preflight, stale_problems

TINY = Path(__file__).with_name("tiny_sweep.yaml")


def _tiny(data_dir: str, results: Path, **changes) -> dict:
    config = yaml.safe_load(TINY.read_text())
    config.update(data_dir=data_dir, results_dir=str(results), **changes)
    return config


def test_a_sound_sweep_passes_and_gets_its_asha_max_t(data_dir, tmp_path):
    config = _tiny(data_dir, tmp_path / "results", search={"asha": {"metric": "val_loss"}})
    config["train"].update(val_examples=4, val_every=1)
    checked = preflight(sweep_from_dict(config))
    assert checked.problems == [] and checked.changed == {}
    assert checked.sweep.search.asha.max_t == 3  # 2 steps + 1: ASHA stops a trial once its step reaches max_t
    assert not (tmp_path / "results").exists()  # checking created nothing


def test_every_problem_is_one_line_and_all_come_at_once(tmp_path):
    empty = tmp_path / "data"
    empty.mkdir()
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    config = _tiny(str(empty), blocker, families=["tiny-llama", "calsweep-test/no-such-model"],
                   search={"asha": {"metric": "train_loss", "max_t": 2}})
    problems = preflight(sweep_from_dict(config)).problems
    expected = ["families: 'calsweep-test/no-such-model' is no registry family nor existing local path, and its hub "
                "config cannot be read", "eval.tasks: mmlu (test) does not load", "eval.tasks: arc_easy (test)",
                "eval.tasks: hellaswag (val) does not load", "sft: alpaca does not load: SFT data file",
                "search.asha.max_t: 2 stops every trial of 2 steps before it is scored",
                f"results_dir: {str(blocker)!r} is a file"]
    assert len(problems) == len(expected), problems
    for problem, start in zip(problems, expected):
        assert start in problem and "\n" not in problem


def test_a_missing_local_path_is_named(data_dir, tmp_path):
    (tmp_path / "model").mkdir()  # exists, but holds no model config
    config = _tiny(data_dir, tmp_path / "results", families=[str(tmp_path / "model")])
    problems = preflight(sweep_from_dict(config)).problems
    assert len(problems) == 1 and "is a local path without a readable model config" in problems[0]


def test_max_seq_len_too_short_for_any_prompt_is_refused(data_dir, tmp_path):
    config = _tiny(data_dir, tmp_path / "results")
    config["sft"]["max_seq_len"] = 12
    problems = preflight(sweep_from_dict(config)).problems
    assert len(problems) == 1 and problems[0].startswith("sft.max_seq_len: 12 tokens hold no response token")
    assert "tiny-llama's tokenizer" in problems[0] and "expected at least" in problems[0]


def test_asha_max_t_from_epochs_and_the_sft_rows():
    sweep = sweep_from_dict({"families": ["smollm2-135m"], "sft": {"max_examples": 64},
                             "train": {"epochs": 2.0, "micro_batch_size": 2, "gradient_accumulation_steps": 2,
                                       "val_examples": 8}})
    assert search.trial_steps(sweep, None) == 28  # (64 - 8) // 2 // 2 = 14 steps per epoch
    assert search.trial_steps(sweep, 40) == 16  # fewer rows than max_examples
    unlimited = dataclasses.replace(sweep, sft=dataclasses.replace(sweep.sft, max_examples=None))
    assert search.trial_steps(unlimited, None) is None and search.trial_steps(unlimited, 1000) == 496
    with pytest.raises(ValueError, match="cannot be derived"):
        search.with_max_t(sweep_from_dict({"families": ["smollm2-135m"], "train": {"val_examples": 2},
                                           "search": {"asha": {}}}), None)


def test_derived_max_t_lets_rays_asha_reach_the_final_report():
    """The real scheduler: max_t equal to the trial's steps stops it at its last progress report (before the final,
    scored one); the derived max_t does not, and still stops bad trials early."""
    from ray.tune.experiment import Trial

    sweep = sweep_from_dict({"families": ["smollm2-135m"], "train": {"max_steps": 6, "val_examples": 2},
                             "search": {"asha": {"metric": "val_loss", "grace_period": 2}}})
    steps = search.trial_steps(sweep, None)
    for max_t, stopped_at_last in ((steps, True), (search.with_max_t(sweep, steps).search.asha.max_t, False)):
        scheduler = search.scheduler(dataclasses.replace(sweep, search=dataclasses.replace(
            sweep.search, asha=dataclasses.replace(sweep.search.asha, max_t=max_t))))
        trial = Trial("trainable", config={}, stub=True)
        scheduler.on_trial_add(None, trial)
        actions = [scheduler.on_trial_result(None, trial, {"step": s, "val_loss": 1.0}) for s in range(1, steps + 1)]
        assert (actions[-1] == "STOP") is stopped_at_last and "STOP" not in actions[:-1]
    assert search.asha_problems(sweep, steps) == []  # null max_t: nothing to contradict


def test_dry_run_reports_preflight_problems_in_one_line_each(data_dir, tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    args = ["--config", str(TINY), "--dry-run", "--data-dir", data_dir]
    assert launch.main([*args, "--results-dir", str(blocker), "sft.max_seq_len=12", "learning_rates=[5e-5]"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 and lines[0].startswith("calsweep: error: sft.max_seq_len: 12") and "is a file" in lines[1]
    assert launch.main(["seeds=[0, 1]", *args, "--results-dir", str(tmp_path / "results")]) == 0  # any order
    listed = capsys.readouterr().out.split("\nLayouts on ")[0].split()
    assert len(listed) == 4 and len({line.split("_s")[-1] for line in listed}) == 4


def test_stored_rows_of_another_config_are_named_with_both_values(data_dir, tmp_path, capsys):
    sweep = load_sweep(TINY, {"results_dir": str(tmp_path), "data_dir": data_dir})
    first = sweep.trial_points()[0]
    trial = sweep.trial(first)
    store.write_trial(str(tmp_path), {"run_name": "tiny", "trial_id": trial.trial_id, "status": "ok",
                                      "family": first.family, "learning_rate": first.learning_rate,
                                      "label_smoothing": first.label_smoothing, "seed": first.seed,
                                      "config_json": store.config_json(trial.to_dict())})
    assert preflight(sweep).changed == {}
    edited = load_sweep(TINY, {"results_dir": str(tmp_path), "data_dir": data_dir},
                        ["train.max_steps=3", "eval.batch_size=2"])  # batching is not a result setting
    changed = preflight(edited).changed
    assert changed == {trial.trial_id: "train.max_steps: stored 2, now 3"}
    args = ["--config", str(TINY), "--dry-run", "--data-dir", data_dir, "--results-dir", str(tmp_path),
            "train.max_steps=3"]
    assert launch.main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "1 ok trial(s) of run 'tiny'" in err and "train.max_steps: stored 2, now 3" in err
    assert launch.main([*args, "--rerun-changed"]) == 0
    assert "Re-running 1 trial(s) stored from another config" in capsys.readouterr().out


def test_a_study_with_rows_of_another_config_needs_another_name():
    study = sweep_from_dict({"families": ["smollm2-135m"], "search": {"method": "optuna"}})
    grid = sweep_from_dict({"families": ["smollm2-135m"]})
    changed = {"a": "eval.limit: stored 4, now null", "b": "eval.limit: stored 4, now null"}
    assert [line.split("; ")[-1] for line in stale_problems(grid, changed)] == [
        "pass --rerun-changed to re-run them, or choose another --name"]
    assert stale_problems(study, changed)[0].startswith("results store: 2 ok trial(s) of run 'default' (a, b) come "
                                                        "from another config (eval.limit: stored 4, now null)")
    assert stale_problems(study, changed)[0].endswith("choose another --name (a study does not re-run its points)")


def test_a_model_folder_without_a_tokenizer_is_named_once(data_dir, tmp_path, tiny_llama_config):
    from transformers import LlamaConfig

    folder = tmp_path / "weights-only"
    LlamaConfig(**tiny_llama_config).save_pretrained(folder)  # a readable config, but no tokenizer files
    config = _tiny(data_dir, tmp_path / "results", families=[str(folder)],
                   custom_models={"tiny-llama": {"tokenizer": "calsweep-test/no-such-tokenizer"}})
    problems = preflight(sweep_from_dict(config)).problems
    assert len(problems) == 1 and problems[0].startswith(f"families: {str(folder)!r}: its tokenizer")
    config.update(families=["tiny-llama"])
    problems = preflight(sweep_from_dict(config)).problems  # the tokenizer's family is named, not twice
    assert len(problems) == 1 and "'calsweep-test/no-such-tokenizer' is no registry family" in problems[0]


def test_a_tokenizer_only_folder_is_checked_as_a_tokenizer(data_dir, tmp_path):
    from common.models import load_tokenizer, resolve_model

    folder = tmp_path / "tokenizer"
    load_tokenizer(resolve_model("smollm2-135m")).save_pretrained(folder)  # tokenizer files, no config.json
    assert not (folder / "config.json").exists()
    config = _tiny(data_dir, tmp_path / "results")
    config["custom_models"]["tiny-llama"]["tokenizer"] = str(folder)
    assert preflight(sweep_from_dict(config)).problems == []
    empty = tmp_path / "empty"
    empty.mkdir()
    config["custom_models"]["tiny-llama"]["tokenizer"] = str(empty)
    problems = preflight(sweep_from_dict(config)).problems
    assert len(problems) == 1 and problems[0].startswith(f"custom_models.tiny-llama.tokenizer: {str(empty)!r} does "
                                                         f"not load as a tokenizer (")


@pytest.mark.parametrize("change,expected", [
    ({"architecture": "nosucharch"}, "custom_models.tiny-llama.architecture: 'nosucharch' is no transformers model "
                                     "type; expected one such as 'llama'"),
    ({"config": {"hidden_size": -64}}, "custom_models.tiny-llama.config: builds no llama causal LM (Trying to "
                                       "create tensor with negative dimension -64"),
    ({"config": {"hidden_size": "abc"}}, "custom_models.tiny-llama.config: builds no llama causal LM ("),
    ({"config": {"num_key_value_heads": 3}}, "custom_models.tiny-llama.config.num_key_value_heads: 3 does not divide "
                                             "num_attention_heads (4); expected one of [1, 2, 4]"),
    ({"config": {"hiden_size": 64}}, "custom_models.tiny-llama.config: 'hiden_size' (did you mean 'hidden_size'?) is "
                                     "no key of transformers' LlamaConfig (it would be ignored); expected keys such as "
                                     "['vocab_size', 'hidden_size', "),
    ({"config": {"rope_theta": 5e5, "attn_implementation": "eager"}}, None)])  # consumed by the class: valid
def test_a_custom_models_config_is_built_at_preflight(data_dir, tmp_path, change, expected):
    config = _tiny(data_dir, tmp_path / "results")
    model = config["custom_models"]["tiny-llama"]
    model.update({**change, "config": {**model["config"], **change.get("config", {})}})
    problems = preflight(sweep_from_dict(config)).problems
    if expected is None:
        assert problems == []
        return
    assert len(problems) == 1 and problems[0].startswith(expected), problems
