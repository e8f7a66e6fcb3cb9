"""A new user's bad input is one line before anything trains: run names that would write outside the store or be
hidden from its readers, an override with no value, and an override's problem blamed on the override."""

from pathlib import Path

import pytest

from sweeps.config import ConfigError, load_sweep
from sweeps.launch import main

TINY = Path(__file__).with_name("tiny_sweep.yaml")


@pytest.mark.parametrize("name", ["", "_scratch", ".hidden", "../../escape", "a/b", "a\\b", "..", " x"])
def test_run_names_that_are_no_file_name_are_refused(name):
    with pytest.raises(ConfigError) as error:
        load_sweep(TINY, {"name": name})
    assert error.value.problems == [f"--name {name!r}: name: expected a run name of letters, digits and . _ - + = "
                                    f"that starts with a letter or digit (no path separator, no leading '.' or "
                                    f"'_'), got {name!r}"]


@pytest.mark.parametrize("name", ["tiny", "paper_alpaca", "run-2.1", "A+B=c"])
def test_ordinary_run_names_pass(name):
    assert load_sweep(TINY, {"name": name}).name == name


def test_an_override_without_a_value_is_refused_not_read_as_null():
    with pytest.raises(ConfigError) as error:
        load_sweep(TINY, assignments=["train.max_steps="])
    assert error.value.problems == ["override 'train.max_steps=': expected a VALUE after '=', got nothing (write "
                                    "train.max_steps=null for none)"]
    assert load_sweep(TINY, assignments=["train.max_steps=null"]).train.max_steps is None


def test_an_overrides_problem_is_blamed_on_the_override_and_the_files_on_the_file(tmp_path):
    config = tmp_path / "sweep.yaml"
    config.write_text(TINY.read_text().replace("seed: 0", "seed: 0\nlearning_rates: [-1.0]").replace(
        "learning_rates: [1.0e-3]\n", ""))
    with pytest.raises(ConfigError) as error:
        load_sweep(config, assignments=["train.max_steps=abc", "name=_x"])
    problems = error.value.problems
    assert "override 'train.max_steps=abc': train.max_steps: expected int | None, got 'abc'" in problems
    with pytest.raises(ConfigError) as error:
        load_sweep(config, assignments=["name=_x"])
    problems = error.value.problems
    assert len(problems) == 2 and problems[0].startswith("override 'name=_x': name: expected a run name")
    assert problems[1].startswith("sweep.yaml.learning_rates: ")


def test_dry_run_and_resume_refuse_a_bad_name_in_one_line(tmp_path, capsys):
    assert main(["--config", str(TINY), "--results-dir", str(tmp_path), "--dry-run", "name=../../escape"]) == 2
    assert main(["--results-dir", str(tmp_path), "--resume", "../x"]) == 2
    errors = capsys.readouterr().err.splitlines()
    assert len(errors) == 2 and errors[0].startswith("calsweep: error: override 'name=../../escape': name: expected")
    assert errors[1].startswith("calsweep: error: --resume: expected a run name") and "got '../x'" in errors[1]
    assert list(tmp_path.iterdir()) == [] and not (tmp_path.parent / "escape").exists()


def _dry_run_errors(capsys, data_dir, results: Path, *assignments: str, config: Path = TINY) -> list[str]:
    """The lines `launch.py --dry-run` prints to stderr for ``config`` with ``assignments`` (exit 2 expected)."""
    assert main(["--config", str(config), "--dry-run", "--data-dir", data_dir, "--results-dir", str(results),
                 *assignments]) == 2
    return capsys.readouterr().err.splitlines()


@pytest.mark.parametrize("memory", ["0", "-80", ".inf"])
def test_a_gpu_memory_of_nothing_is_refused_naming_the_key_not_the_layout(memory):
    with pytest.raises(ConfigError) as error:
        load_sweep(TINY, assignments=[f"resources.gpu_memory_gb={memory}"])
    assert error.value.problems == [f"override 'resources.gpu_memory_gb={memory}': resources.gpu_memory_gb: expected "
                                    f"GiB per GPU > 0, or null to detect it, got "
                                    f"{float(memory.replace('.inf', 'inf'))!r}"]
    assert load_sweep(TINY, assignments=["resources.gpu_memory_gb=40"]).resources.gpu_memory_gb == 40.0


def test_max_failures_of_minus_one_retries_forever_and_below_is_refused():
    assert load_sweep(TINY, assignments=["resources.max_failures=-1"]).resources.max_failures == -1
    with pytest.raises(ConfigError) as error:
        load_sweep(TINY, assignments=["resources.max_failures=-2"])
    assert error.value.problems == ["override 'resources.max_failures=-2': resources.max_failures: expected an "
                                    "integer >= 0 (retries of a failed trial) or -1 (retry without end), got -2"]


def test_a_fraction_of_a_gpu_for_a_trial_of_several_workers_is_refused(data_dir, tmp_path, capsys):
    errors = _dry_run_errors(capsys, data_dir, tmp_path, "resources.workers_per_trial=2",
                             "resources.gpus_per_worker=0.5")
    assert errors == ["calsweep: error: resources.gpus_per_worker: 0.5 would put tiny-llama's 2 workers per trial on "
                      "one GPU (NCCL runs one rank of a trial per GPU); expected 1 or another whole number for a "
                      "sweep with tiny-llama, or resources.workers_per_trial: 1"]
    for fine in (["resources.workers_per_trial=2", "resources.gpus_per_worker=1"],
                 ["resources.workers_per_trial=1", "resources.gpus_per_worker=0.5"]):
        assert main(["--config", str(TINY), "--dry-run", "--data-dir", data_dir, "--results-dir", str(tmp_path),
                     *fine]) == 0, capsys.readouterr().err


@pytest.mark.parametrize("assignment, expected", [
    ("custom_models.tiny-llama.config.num_key_value_heads=3",
     "custom_models.tiny-llama.config.num_key_value_heads: 3 does not divide num_attention_heads (4); expected one of "
     "[1, 2, 4]"),
    ("custom_models.tiny-llama.config.hiden_size=64",
     "custom_models.tiny-llama.config: 'hiden_size' (did you mean 'hidden_size'?) is no key of transformers' "
     "LlamaConfig (it would be ignored); expected keys such as ['vocab_size', 'hidden_size', "),
    ("custom_models.tiny-llama.tokenizer={tmp}/no-such-tokenizer",
     "custom_models.tiny-llama.tokenizer: '{tmp}/no-such-tokenizer' does not load (unknown model family "
     "'{tmp}/no-such-tokenizer'; expected one of ["),
    ("sft.local_file={tmp}/empty.json",
     "sft: alpaca does not load: SFT data file '{tmp}/empty.json' (sft.local_file) holds no examples; expected a "
     "JSON list or JSON Lines file of at least one alpaca row"),
])
def test_a_custom_model_or_sft_file_that_would_fail_in_the_trial_is_one_line_at_dry_run(
        data_dir, tmp_path, capsys, assignment, expected):
    (tmp_path / "empty.json").write_text("[]")
    errors = _dry_run_errors(capsys, data_dir, tmp_path / "results", assignment.format(tmp=tmp_path))
    assert len(errors) == 1 and errors[0].startswith(f"calsweep: error: {expected.format(tmp=tmp_path)}"), errors
