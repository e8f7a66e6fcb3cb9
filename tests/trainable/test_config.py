"""Sweep YAML validation: every bad entry is named, all at once; the CLI turns them into one line, exit 2."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from common.config import ConfigError
from sweeps.config import load_sweep, sweep_from_dict, sweep_to_dict, trial_id
from trainable.config import TrainConfig, TrialConfig

REPO = Path(__file__).resolve().parents[2]


def test_default_config_is_the_four_trial_grid():
    sweep = load_sweep()
    assert sweep.trial_points() == [("smollm2-135m", 5e-5, 0.0, 0), ("smollm2-135m", 5e-5, 0.1, 0),
                                    ("gemma3-270m", 5e-5, 0.0, 0), ("gemma3-270m", 5e-5, 0.1, 0)]


@pytest.mark.parametrize("entry, message", [
    ({"label_smoothing": [0.0, 1.0]}, "label smoothing beta in [0, 1), got 1.0"),
    ({"label_smoothing": [-0.1]}, "label smoothing beta in [0, 1), got -0.1"),
    ({"learning_rates": [0.0]}, "learning rate > 0, got 0.0"),
    ({"learning_rates": [-1e-5]}, "learning rate > 0, got -1e-05"),
    ({"families": ["no-such-model"]}, "unknown model family 'no-such-model'"),
    ({"trian": {}}, "config.trian: unknown key (did you mean 'train'?)"),
    ({"eval": {"tasks": ["hellaswg"]}}, "got ['hellaswg'] (did you mean 'hellaswag'?)"),
    ({"families": ["smolm2-135m"]}, "(did you mean 'smollm2-135m'?)"),
    ({"sft": {"max_seq_len": 1}}, "config.sft.max_seq_len: expected an integer >= 2"),
    ({"learning_rates": ["fast"]}, "config.learning_rates: expected a learning rate > 0, got 'fast'"),
    ({"seeds": [0, 0]}, "config.seeds: expected distinct values, got [0, 0]"),
    ({"seed": 1, "seeds": [2]}, "config.seeds: expected either `seed: N` or `seeds: [N, ...]`, got both"),
    ({"seeds": [0, 1], "search": {"method": "optuna"}}, "expected one seed with search.method 'optuna'"),
    ({"search": {"asha": {"metric": "val_loss"}}}, "'val_loss' is reported only with train.val_examples > 0"),
    ({"search": {"asha": {"metric": "val_los"}}}, "metric: expected one of ['train_loss', 'val_loss'] (what trials "
                                                  "report while training), got 'val_los' (did you mean 'val_loss'?)"),
    ({"search": {"method": "optuna", "objectives": {"mmlu_ecee": "min"}}},
     "search.objectives: 'mmlu_ecee' is no metric a trial reports (did you mean 'mmlu_ece'?)"),
    ({"train": {"zero_stage": 4}}, "config.train.zero_stage: expected 0, 1, 2, 3 or 'auto', got 4"),
    ({"train": {"engine": "fsdp"}}, "config.train.engine: expected one of ['auto', 'deepspeed', 'fsdp2'], got 'fsdp'"),
    ({"train": {"engine": "fsdp2", "zero_stage": 2}},
     "config.train.zero_stage: expected 3 or 'auto' with engine 'fsdp2' (it shards like ZeRO-3), got 2"),
    ({"train": {"engine": "fsdp2", "precision": "fp16"}},
     "config.train.precision: expected auto, bf16 or fp32 with engine 'fsdp2' (no fp16 loss scaling), got 'fp16'"),
    ({"train": {"engine": "fsdp2", "deepspeed": {"zero_optimization": {"stage": 3}}}},
     "config.train.deepspeed: expected no DeepSpeed config with engine 'fsdp2', got {'zero_optimization'"),
    ({"train": {"loss_filter": "fast"}},
     "config.train.loss_filter: expected one of ['exact', 'loose', 'none'], got 'fast'"),
    ({"eval": {"tasks": ["squad"]}}, "got ['squad']"),
    ({"eval": {"batch_tokens": 0}},
     "config.eval.batch_tokens: expected 'auto', a whole number > 0 or null (no cap), got 0"),
    ({"eval": {"batch_tokens": "lots"}},
     "config.eval.batch_tokens: expected 'auto', a whole number > 0 or null (no cap), got 'lots'"),
    ({"eval": {"batch_size": 0}}, "config.eval.batch_size: expected 'auto' or a whole number > 0, got 0"),
    ({"train": {"micro_batch_size": "eight"}}, "config.train.micro_batch_size: expected int, got 'eight'"),
    ({"train": {"micro_batch_size": 2.5}}, "config.train.micro_batch_size: expected int, got 2.5"),
    ({"train": {"checkpoint_every_steps": 0}}, "config.train.checkpoint_every_steps: expected a number > 0, got 0"),
    ({"train": {"checkpoint_every_minutes": -5}},
     "config.train.checkpoint_every_minutes: expected a number > 0, got -5.0"),
    ({"train": {"checkpoints_to_keep": 0}}, "config.train.checkpoints_to_keep: expected a number > 0, got 0"),
    ({"train": {"checkpoint_every_step": 10}}, "unknown key (did you mean 'checkpoint_every_steps'?)"),
])
def test_bad_entries_are_named(entry, message):
    with pytest.raises(ConfigError, match=None) as info:
        sweep_from_dict(entry)
    assert message in str(info.value)


def test_all_problems_reported_together():
    with pytest.raises(ConfigError) as info:
        sweep_from_dict({"label_smoothing": [1.5], "learning_rates": [0], "train": {"precision": "int8"}})
    text = str(info.value)
    assert "precision" in text  # field-level problems come first; grid checks follow once those are fixed
    with pytest.raises(ConfigError) as info:
        sweep_from_dict({"label_smoothing": [1.5], "learning_rates": [0]})
    assert "1.5" in str(info.value) and "learning rate > 0, got 0" in str(info.value)


def test_trial_ids_are_deterministic_and_distinct():
    assert trial_id("a", 1e-5, 0.1, 0) == trial_id("a", 1e-5, 0.1, 0)
    assert len({trial_id("a", 1e-5, b, s) for b in (0.0, 0.1) for s in (0, 1)}) == 4


def test_numbers_that_yaml_reads_as_strings_are_numbers(tmp_path):
    path = tmp_path / "sweep.yaml"
    path.write_text("learning_rates: [5e-5, 1e-4]\ntrain: {weight_decay: 1e-2, max_steps: 1e2}\n"
                    "custom_models: {m: {config: {rope_theta: 1e4}}}\nfamilies: [smollm2-135m]\n")
    sweep = load_sweep(path)
    assert sweep.learning_rates == (5e-5, 1e-4) and sweep.train.weight_decay == 0.01
    assert sweep.train.max_steps == 100 and isinstance(sweep.train.max_steps, int)
    assert sweep.custom_models["m"].config["rope_theta"] == 1e4  # free-form settings too: read as YAML 1.2
    quoted = sweep_from_dict({"learning_rates": ["5e-5"], "train": {"micro_batch_size": "8"}})
    assert quoted.learning_rates == (5e-5,) and quoted.train.micro_batch_size == 8


def test_the_default_yaml_states_no_default_of_the_code():
    """Defaults live in the dataclasses only: every key of default.yaml changes one (else it is a second copy)."""
    from sweeps.config import DEFAULT_CONFIG, SweepConfig

    code = sweep_to_dict(SweepConfig())

    def restated(data: dict, defaults: dict, where: str) -> list[str]:
        found = []
        for key, value in data.items():
            if isinstance(value, dict) and isinstance(defaults.get(key), dict):
                found += restated(value, defaults[key], f"{where}{key}.")
            elif json.loads(json.dumps(defaults.get(key))) == value:
                found.append(f"{where}{key}")
        return found

    assert restated(yaml.safe_load(DEFAULT_CONFIG.read_text()), code, "") == []
    assert SweepConfig().learning_rates == load_sweep().learning_rates == (5e-5,)


def test_dotted_assignments_are_parsed_as_yaml_and_validated_like_the_file():
    sweep = load_sweep(None, assignments=["train.max_steps=100", "eval.limit=null", "learning_rates=[5e-5]",
                                          "seeds=[0, 1, 2]"])
    assert sweep.train.max_steps == 100 and sweep.eval.limit is None and sweep.learning_rates == (5e-5,)
    assert sweep.trial_seeds == (0, 1, 2) and sweep.train.micro_batch_size == 2  # the file's other settings kept
    with pytest.raises(ConfigError, match=r"override 'train.max_stpes=3': train.max_stpes: unknown key \(did you mean 'max_steps'"):
        load_sweep(None, assignments=["train.max_stpes=3"])
    with pytest.raises(ConfigError) as info:
        load_sweep(None, assignments=["train", "eval.limit.x=1", "eval.limit=[", "x..y=1"])
    text = str(info.value)
    assert "'train': expected KEY=VALUE" in text and "eval.limit is 20, not a mapping" in text
    assert "'eval.limit=[': the value is not valid YAML" in text and "'x..y=1': expected KEY=VALUE" in text


def test_seeds_axis_runs_every_point_per_seed_and_single_seed_still_works():
    sweep = sweep_from_dict({"families": ["smollm2-135m"], "learning_rates": [1e-5], "label_smoothing": [0.0, 0.1],
                             "seeds": [0, 1, 2]})
    points = sweep.trial_points()
    assert len(points) == 6 and [p.seed for p in points[:3]] == [0, 1, 2]
    ids = {sweep.trial(p).trial_id for p in points}
    assert len(ids) == 6 and all(sweep.trial(p).seed == p.seed for p in points)
    single = sweep_from_dict({"families": ["smollm2-135m"], "seed": 7})
    assert single.trial_seeds == (7,) and {p.seed for p in single.trial_points()} == {7}
    assert sweep_from_dict(sweep_to_dict(sweep)) == sweep and sweep_from_dict(sweep_to_dict(single)) == single


def test_trial_config_round_trips_through_a_dict():
    trial = load_sweep().trial(load_sweep().trial_points()[1])
    assert TrialConfig.from_dict(trial.to_dict()) == trial


def _launch(tmp_path, *args):
    """`sweeps/launch.py ARGS` with a results store under tmp_path, never the checkout's own results/."""
    command = [sys.executable, str(REPO / "sweeps" / "launch.py"), "--results-dir", str(tmp_path / "results"), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def test_cli_reports_a_bad_config_in_one_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"label_smoothing": [1.0], "families": ["tiny"]}))
    out = _launch(tmp_path, "--config", str(bad), "--dry-run")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    lines = out.stderr.splitlines()  # one line per problem, all at once
    assert len(lines) == 2 and all(line.startswith("calsweep: error: bad.yaml.") for line in lines)
    assert "got 1.0" in lines[0] and "unknown model family 'tiny'" in lines[1]


def test_cli_reports_a_missing_data_dir_in_one_line(tmp_path):
    out = _launch(tmp_path, "--data-dir", str(tmp_path / "nowhere"), "--dry-run")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "nowhere" in out.stderr and "Hugging Face hub" in out.stderr


def _trial_ids(stdout: str) -> list[str]:
    """The trial ids a dry run lists, before its layout table."""
    return stdout.split("\nLayouts on ")[0].split()


def test_cli_dry_run_lists_trials_and_layouts(tmp_path):
    out = _launch(tmp_path, "--dry-run")
    assert out.returncode == 0, out.stderr
    assert len(_trial_ids(out.stdout)) == 4
    # each family's layout, the memory model's peak per GPU and the sweep's predicted GPU-hours
    assert "  smollm2-135m: 1 GPU, FSDP2, micro-batch 2 x 2; peak " in out.stdout
    assert "  gemma3-270m: 1 GPU, FSDP2, micro-batch 2 x 2; peak " in out.stdout
    assert "2 trial(s)," in out.stdout and "  sweep: " in out.stdout and " GPU-hours" in out.stdout


def test_cli_families_runs_one_half_of_a_grid(tmp_path):
    out = _launch(tmp_path, "--families", "gemma3-270m", "--dry-run")
    assert out.returncode == 0, out.stderr
    assert [t.split("_")[0] for t in _trial_ids(out.stdout)] == ["gemma3-270m", "gemma3-270m"]
    bad = _launch(tmp_path, "--families", "gemma3-270m,nosuch", "--dry-run")
    assert bad.returncode == 2 and "unknown model family 'nosuch'" in bad.stderr and "Traceback" not in bad.stderr


def test_the_default_engine_runs_zero3_and_one_gpu_layouts_on_fsdp2_and_the_rest_on_deepspeed():
    from trainable.config import engine_for

    assert TrainConfig().engine == "auto"
    assert engine_for(TrainConfig(zero_stage=3), 2, "cuda") == engine_for(TrainConfig(zero_stage=3), 2, "cpu") == \
        engine_for(TrainConfig(zero_stage=3), 1, "cpu") == "fsdp2"
    assert [engine_for(TrainConfig(zero_stage=stage), 2, "cuda") for stage in (0, 1, 2, "auto")] == ["deepspeed"] * 4
    # one GPU: FSDP2 whatever the stage (nothing to shard); one CPU rank: DeepSpeed
    assert [engine_for(TrainConfig(zero_stage=stage), 1, "cuda") for stage in (0, 2, "auto")] == ["fsdp2"] * 3
    assert [engine_for(TrainConfig(zero_stage=stage), 1, "cpu") for stage in (0, 2, "auto")] == ["deepspeed"] * 3
    # asking for what only DeepSpeed has keeps DeepSpeed; an explicit engine wins
    for world_size in (1, 2):
        assert engine_for(TrainConfig(zero_stage=3, deepspeed={"zero_optimization": {"reduce_bucket_size": 7}}),
                          world_size, "cuda") == \
            engine_for(TrainConfig(zero_stage=3, precision="fp16"), world_size, "cuda") == \
            engine_for(TrainConfig(zero_stage=3, engine="deepspeed"), world_size, "cuda") == "deepspeed"
    assert engine_for(TrainConfig(zero_stage=0, engine="deepspeed"), 1, "cuda") == "deepspeed"
    assert engine_for(TrainConfig(engine="fsdp2"), 2, "cpu") == "fsdp2"
