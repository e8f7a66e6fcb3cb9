"""docs/config.md: generated from the config dataclasses, current, and true to the defaults it states."""

from dataclasses import dataclass

import pytest
import yaml

from sweeps import config_reference
from sweeps.config import SweepConfig, sweep_from_dict


def test_docs_config_md_is_current():
    assert config_reference.REFERENCE.read_text() == config_reference.render(), (
        f"docs/config.md is stale: regenerate it with `{config_reference.COMMAND}`")


def test_every_field_of_every_section_is_listed_with_its_comment():
    by_path = {section.path: section for section in config_reference.sections()}
    assert {"", "sft", "train", "eval", "eval.ats", "resources", "search", "search.asha", "tracking",
            "tracking.mlflow", "tracking.wandb", "custom_models.<name>"} <= set(by_path)
    train = {key.name: key for key in by_path["train"].keys}
    assert {"pack", "pack_length", "adam_betas", "adam_eps"} <= set(train)
    assert train["loss_filter"].default == "`exact`" and "gradient filter" in train["loss_filter"].meaning
    gpus = {key.name: key for key in by_path["resources"].keys}["gpus_per_worker"]
    assert gpus.meaning.startswith("null: 1 when the cluster has GPUs") and "memory probe" in gpus.meaning  # above
    assert {key.name for key in by_path[""].keys} == set(SweepConfig.__dataclass_fields__)


def test_the_stated_defaults_load_as_the_defaults():
    """Every default written in the reference, read back as YAML into a sweep, gives the default sweep."""
    data: dict = {}
    for section in config_reference.sections():
        if "<name>" in section.path or section.path in ("search.asha", "tracking.mlflow", "tracking.wandb"):
            continue  # entries of a mapping, or sections that are off (null) by default
        target = data
        for part in filter(None, section.path.split(".")):
            target = target.setdefault(part, {})
        for key in section.keys:
            if not key.default.startswith("see "):
                target[key.name] = yaml.safe_load(key.default.strip("`"))
    assert data["train"]["adam_betas"] == [0.9, 0.999]
    assert sweep_from_dict(data) == sweep_from_dict({})


def test_a_field_without_a_comment_is_named():
    @dataclass(frozen=True)
    class Undocumented:
        """A section."""

        size: int = 1  # how many
        width: int = 2

    with pytest.raises(ValueError, match=r"Undocumented\.width has no source comment"):
        list(config_reference.sections(Undocumented))


def test_the_command_writes_the_reference(tmp_path, monkeypatch, capsys):
    config_reference.main([])
    assert capsys.readouterr().out == config_reference.render()
    monkeypatch.setattr(config_reference, "REFERENCE", tmp_path / "config.md")
    config_reference.main(["--write"])
    assert (tmp_path / "config.md").read_text() == config_reference.render()
