"""Score a causal LM on multiple-choice tasks and measure its calibration: ``evaluate_model``, which a trial's
worker and the ``calsweep evaluate`` command (``trainable.evaluate``) call; ``apply_overrides`` edits tasks.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

import pyarrow as pa
from torch.nn.attention import SDPBackend

from calibration.bootstrap import Interval
from calibration.records import SCHEMA, SCHEMA_VERSION, ats_split, build_records
from calibration.scoring import score_prompts, score_prompts_with_ats
from calibration.summary import ats_metrics, fit_temperatures, summarize
from calibration.task_config import DEFAULT_TASKS, TaskConfig, load_prompts, resolve_task, with_split
from common.provenance import git_revision

if TYPE_CHECKING:
    from calibration.ats.head import TemperatureHead


@dataclass
class EvalResult:
    """``summary[task][metric]`` on each task's reported split, and ``records`` (one row per question)."""

    summary: dict[str, dict[str, float]]
    records: pa.Table
    intervals: dict[str, dict[str, Interval]] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Shard:
    """One rank's share of the scoring: questions ``[n i / k, n (i + 1) / k)`` of each task's n, for ``index`` i of
    ``count`` k; ``gather`` (a collective every rank calls, once per task and split) returns every rank's records
    in rank order, so that each rank summarises the same records an unsharded pass gives."""

    index: int
    count: int
    gather: Callable[[pa.Table], list[pa.Table]]

    def __post_init__(self) -> None:
        if not 0 <= self.index < self.count:
            raise ValueError(f"expected 0 <= index < count, got index {self.index} of count {self.count}")

    def share(self, n: int) -> slice:
        """This rank's contiguous slice of ``n`` questions (a k-shot prefix shared within it)."""
        return slice(n * self.index // self.count, n * (self.index + 1) // self.count)

    def gathered(self, table: pa.Table) -> pa.Table:
        """Every rank's ``table``, concatenated in rank order."""
        return pa.concat_tables(self.gather(table))


def evaluate_model(model: Any, tokenizer: Any, tasks: Sequence[str | TaskConfig] = DEFAULT_TASKS, *,
                   data_dir: str | Path | None = None, limit: int | None = None, batch_size: int = 8,
                   batch_tokens: int | None = None, progress: bool = True, heldout: bool = False, n_bins: int = 15,
                   n_boot: int = 0, share_prefix: bool = True,
                   attention: Sequence[SDPBackend] | None = None, prompt_cache: str | Path | None = None,
                   ats_head: "TemperatureHead | None" = None, shard: Shard | None = None) -> EvalResult:
    """Score ``tasks`` (the first ``limit`` questions of each) and summarise accuracy and calibration.

    The model is put in eval mode and restored afterwards. With ``heldout=True`` each task's ``fit_split`` is
    scored too (same ``limit``), a temperature is fitted on it and the ``*_ts`` metrics are reported.
    ``n_boot > 0`` adds percentile-bootstrap intervals. ``attention`` (the kernels a trial's attention check kept;
    None: any) narrows the scorer's own kernel set. ``prompt_cache``: directory of tokenised plans reused across
    calls with the same tokenizer and prompts (``calibration.prompt_cache``; None: tokenise every time).
    ``ats_head``: the same pass also scores with ATS (``calibration.ats``): records of split ``ats_split(split)``
    and the ``*_ats`` metrics. ``shard``: this rank scores its share of each task and every rank gets all records
    (``Shard``); None: every question here.
    """
    configs = [resolve_task(t) for t in tasks]
    names = [c.name for c in configs]
    if len(set(names)) != len(names) or not names:
        raise ValueError(f"expected distinct task names, got {names}")
    tables, split_of, fit_split_of = [], {}, {}
    if ats_head is not None:
        ats_head.to(next(model.parameters()).device).eval()
    for config in configs:
        split_of[config.name] = config.split
        splits = [config]
        if heldout and config.fit_split is not None:
            fit_split_of[config.name] = config.fit_split
            splits.append(with_split(config, config.fit_split))
        for part in splits:
            questions, prompts = load_prompts(part, data_dir=data_dir, limit=limit)
            if shard is not None:
                mine = shard.share(len(questions))
                questions, prompts = questions[mine], prompts[mine]
            options = dict(batch_size=batch_size, batch_tokens=batch_tokens, share_prefix=share_prefix,
                           attention=attention, prompt_cache=prompt_cache, progress=progress,
                           desc=f"{part.name}/{part.split}")
            if ats_head is None:
                parts = [build_records(part.name, part.split, questions, prompts,
                                       score_prompts(model, tokenizer, prompts, **options))]
            else:
                loglik, scaled = score_prompts_with_ats(model, tokenizer, prompts, ats_head, **options)
                parts = [build_records(part.name, part.split, questions, prompts, loglik),
                         build_records(part.name, ats_split(part.split), questions, prompts, scaled)]
            tables += parts if shard is None else [shard.gathered(t) for t in parts]
    records = pa.concat_tables(tables).cast(SCHEMA)
    temperatures = fit_temperatures(records, fit_split_of=fit_split_of) if fit_split_of else None
    summary, intervals = summarize(records, split_of=split_of, n_bins=n_bins, temperatures=temperatures,
                                   n_boot=n_boot)
    for task, metrics in ats_metrics(records, split_of=split_of, n_bins=n_bins).items():
        summary[task] |= metrics
    run_config = {"tasks": [dataclasses.asdict(c) for c in configs], "report_splits": split_of,
                  "fit_splits": fit_split_of, "limit": limit, "batch_size": batch_size,
                  "batch_tokens": batch_tokens, "n_bins": n_bins,
                  "share_prefix": share_prefix, "ats": ats_head is not None, "schema_version": SCHEMA_VERSION,
                  "git_revision": git_revision()}
    return EvalResult(summary, records, intervals, run_config)


def apply_overrides(configs: list[TaskConfig], overrides: Sequence[str]) -> list[TaskConfig]:
    """``TASK.FIELD=VALUE`` edits (``k_shot`` int, ``subjects`` comma list, ``none`` for None); all errors at once."""
    by_name = {c.name: c for c in configs}
    fields = {f.name for f in dataclasses.fields(TaskConfig)} - {"name", "dataset", "prompt_format", "title"}
    edits: dict[str, dict[str, Any]] = {}
    problems = []
    for item in overrides:
        target, _, value = item.partition("=")
        task, _, name = target.partition(".")
        if not _ or task not in by_name or name not in fields:
            problems.append(f"TASK.FIELD=VALUE with TASK in {sorted(by_name)} and FIELD in {sorted(fields)}, "
                            f"got {item!r}")
            continue
        if value.lower() == "none":
            parsed: Any = None
        elif name == "k_shot":
            parsed = int(value) if value.isdigit() else problems.append(f"an integer k_shot, got {item!r}")
        elif name == "subjects":
            parsed = tuple(s for s in value.split(",") if s)
        else:
            parsed = value
        edits.setdefault(task, {})[name] = parsed
    if problems:
        raise ValueError("expected " + "; expected ".join(problems))
    return [dataclasses.replace(c, **edits.get(c.name, {})) for c in configs]
