"""Score a causal LM on multiple-choice tasks and measure its calibration; the trainable calls ``evaluate_model``.

    python -m calibration.evaluate --model smollm2-135m --tasks mmlu,arc_easy,hellaswag --limit 20 --out results/eval

writes ``records.parquet`` (one row per question, both the reported and the held-out split), ``summary.json``
and ``reliability_<task>.png``; ``python -m calibration.rescore DIR`` recomputes any metric from them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import pyarrow as pa
from torch.nn.attention import SDPBackend

from calibration.bootstrap import Interval
from calibration.cli import fail
from calibration.records import SCHEMA, SCHEMA_VERSION, ats_split, build_records
from calibration.scoring import score_prompts, score_prompts_with_ats
from calibration.summary import ats_metrics, fit_temperatures, summarize
from calibration.task_config import TaskConfig, load_prompts, resolve_task, with_split
from common.provenance import git_revision

if TYPE_CHECKING:
    from calibration.ats.head import TemperatureHead

DEFAULT_TASKS = ("mmlu", "arc_easy", "hellaswag")


@dataclass
class EvalResult:
    """``summary[task][metric]`` on each task's reported split, and ``records`` (one row per question)."""

    summary: dict[str, dict[str, float]]
    records: pa.Table
    intervals: dict[str, dict[str, Interval]] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)


def evaluate_model(model: Any, tokenizer: Any, tasks: Sequence[str | TaskConfig] = DEFAULT_TASKS, *,
                   data_dir: str | Path | None = None, limit: int | None = None, batch_size: int = 8,
                   batch_tokens: int | None = None, progress: bool = True, heldout: bool = False, n_bins: int = 15,
                   n_boot: int = 0, share_prefix: bool = True,
                   attention: Sequence[SDPBackend] | None = None, plan_cache: str | Path | None = None,
                   ats_head: "TemperatureHead | None" = None) -> EvalResult:
    """Score ``tasks`` (the first ``limit`` questions of each) and summarise accuracy and calibration.

    The model is put in eval mode and restored afterwards. With ``heldout=True`` each task's ``fit_split`` is
    scored too (same ``limit``), a temperature is fitted on it and the ``*_ts`` metrics are reported.
    ``n_boot > 0`` adds percentile-bootstrap intervals. ``attention`` (the kernels a trial's attention check kept;
    None: any) narrows the scorer's own kernel set. ``plan_cache``: directory of tokenised plans reused across
    calls with the same tokenizer and prompts (``calibration.plan_cache``; None: tokenise every time).
    ``ats_head``: the same pass also scores with ATS (``calibration.ats``): records of split ``ats_split(split)``
    and the ``*_ats`` metrics.
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
            options = dict(batch_size=batch_size, batch_tokens=batch_tokens, share_prefix=share_prefix,
                           attention=attention, plan_cache=plan_cache, progress=progress,
                           desc=f"{part.name}/{part.split}")
            if ats_head is None:
                tables.append(build_records(part.name, part.split, questions, prompts,
                                            score_prompts(model, tokenizer, prompts, **options)))
                continue
            loglik, scaled = score_prompts_with_ats(model, tokenizer, prompts, ats_head, **options)
            tables.append(build_records(part.name, part.split, questions, prompts, loglik))
            tables.append(build_records(part.name, ats_split(part.split), questions, prompts, scaled))
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
    fields = {f.name for f in dataclasses.fields(TaskConfig)} - {"name", "dataset", "prompt_format"}
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


def _tasks(text: str) -> list[TaskConfig]:
    """``--tasks``' comma list as task configs; an unknown name raises ``ValueError`` naming it and the valid ones."""
    from calibration.task_config import TASKS
    from common.config import suggest

    names = [t.strip() for t in text.split(",") if t.strip()]
    unknown = [t for t in names if t not in TASKS]
    if unknown or not names:
        raise ValueError(f"--tasks: expected a comma list of {sorted(TASKS)}, got {text!r}"
                         f"{suggest(unknown[0], TASKS) if unknown else ''}")
    return [resolve_task(t) for t in names]


def _ats_config(overrides: Sequence[str]) -> Any:
    """``--ats-set KEY=VALUE`` items (values read as YAML) as an ``ATSConfig``; every problem in one ValueError."""
    import yaml

    from calibration.ats.config import ATSConfig
    from common.config import build

    values = {}
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--ats-set: expected KEY=VALUE, got {item!r}")
        values[key.strip()] = yaml.safe_load(value)
    return build(ATSConfig, values, "--ats-set")


def _ats_head(args: argparse.Namespace, config: Any, model: Any, tokenizer: Any, out: Path) -> Any:
    """The saved head of ``--ats-head``, a head trained and saved to OUT with ``--ats``, or None."""
    from calibration.ats.head import load_head, save_head

    if args.ats_head is not None:
        return load_head(args.ats_head)
    if not args.ats:
        return None
    from trainable.ats import fit_ats_head

    head, losses = fit_ats_head(model, tokenizer, config, data_dir=args.data_dir)
    print(f"ATS head: {len(losses)} steps, loss {losses[0]:.4f} -> {losses[-1]:.4f}; "
          f"saved {save_head(head, out / 'ats_head.safetensors')}")
    return head


def main(argv: Sequence[str] | None = None) -> EvalResult:
    import torch

    from common.datasource import DataSourceError, resolve_data_dir
    from calibration.records import write_records
    from calibration.report import format_table, write_diagrams, write_summary
    from common.models import load_pretrained, resolve_model

    parser = argparse.ArgumentParser(prog="python -m calibration.evaluate", description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="registry name (smollm2-135m, gemma3-270m), hub id or path")
    parser.add_argument("--tasks", default=",".join(DEFAULT_TASKS), help="comma list, e.g. mmlu,arc_easy,hellaswag")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="TASK.FIELD=VALUE",
                        help="edit a task: k_shot, split, fewshot_split, fit_split, subjects (repeatable)")
    parser.add_argument("--limit", type=int, default=None, help="first N questions of each task and split")
    parser.add_argument("--out", default=None, help="output directory (default results/eval/<model>)")
    parser.add_argument("--data-dir", default=None, help="local data root (default $CALSWEEP_DATA_DIR, else hub)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default=None,
                        help="default bfloat16 on GPU, float32 on CPU")
    parser.add_argument("--batch-size", type=int, default=8, help="rows per forward, at most")
    parser.add_argument("--batch-tokens", type=int, default=None,
                        help="padded row tokens (rows x width) per forward, at most (default: no cap)")
    parser.add_argument("--n-bins", type=int, default=15)
    parser.add_argument("--n-boot", type=int, default=1000, help="bootstrap resamples for intervals (0: none)")
    parser.add_argument("--no-heldout", action="store_true", help="skip the held-out split and temperature scaling")
    parser.add_argument("--no-share-prefix", action="store_true", help="recompute the k-shot prefix per question")
    parser.add_argument("--ats", action="store_true",
                        help="also train an ATS head on the frozen model (Alpaca-GPT4, the authors' defaults), save "
                             "it as OUT/ats_head.safetensors and report every metric again with it (*_ats)")
    parser.add_argument("--ats-head", default=None, metavar="FILE",
                        help="score with this saved ATS head instead of training one (implies --ats)")
    parser.add_argument("--ats-set", dest="ats_overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="an ATS setting (calibration/ats/config.py: max_steps, max_examples, epochs, "
                             "batch_size, learning_rate, alpha, ...; repeatable)")
    args = parser.parse_args(argv)

    try:
        configs = apply_overrides(_tasks(args.tasks), args.overrides)
        resolve_model(args.model)
        resolve_data_dir(args.data_dir)
        if args.limit is not None and args.limit < 1:
            raise ValueError(f"--limit: expected an integer >= 1 (or no --limit for every question), got {args.limit}")
        ats_config = _ats_config(args.ats_overrides)
        if args.ats_head is not None and not Path(args.ats_head).is_file():
            raise ValueError(f"--ats-head: expected a file written by calibration.ats.save_head, got {args.ats_head!r}")
    except (ValueError, DataSourceError) as exc:
        fail(parser.prog, str(exc))
    dtype = getattr(torch, args.dtype or ("bfloat16" if str(args.device).startswith("cuda") else "float32"))
    model, tokenizer = load_pretrained(args.model, dtype=dtype, device=args.device)
    out = Path(args.out or Path("results") / "eval" / Path(args.model).name)
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    try:
        head = _ats_head(args, ats_config, model, tokenizer, out)
        result = evaluate_model(model, tokenizer, configs, data_dir=args.data_dir, limit=args.limit,
                                batch_size=args.batch_size, batch_tokens=args.batch_tokens,
                                heldout=not args.no_heldout, n_bins=args.n_bins, n_boot=args.n_boot,
                                share_prefix=not args.no_share_prefix, ats_head=head)
    except (ValueError, DataSourceError) as exc:
        fail(parser.prog, str(exc))
    temperatures = {t: s["temperature"] for t, s in result.summary.items() if "temperature" in s}
    metadata = {**result.config, "model": args.model, "device": str(args.device), "dtype": str(dtype),
                "seconds": round(time.time() - started, 1), "date": time.strftime("%Y-%m-%d")}
    write_records(result.records, out / "records.parquet", metadata)
    write_summary(out / "summary.json", result.summary, result.intervals,
                  {**metadata, "score": "loglik", "temperatures": temperatures, "n_boot": args.n_boot})
    write_diagrams(out, result.records, split_of=result.config["report_splits"], n_bins=args.n_bins,
                   temperatures=temperatures, label=Path(args.model).name)
    print(format_table(result.summary, result.intervals))
    print(f"wrote {out}/records.parquet, summary.json, reliability_*.png")
    return result


if __name__ == "__main__":
    main()
