"""Score a model on the calibration tasks without SFT, optionally with an ATS head trained here: ``calsweep evaluate``.

    calsweep evaluate --model smollm2-135m --tasks mmlu,arc_easy,hellaswag --limit 20 --out results/eval

(also ``python -m trainable.evaluate``) writes ``records.parquet`` (one row per question, both the reported
and the held-out split), ``summary.json`` and ``reliability_<task>.png``; ``calsweep rescore DIR`` recomputes any
metric from them. It lives in trainable, not calibration, because ``--ats`` trains the head on SFT-tokenised data
(``trainable.ats``).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any, Sequence

import torch
import yaml

from calibration.ats.config import ATSConfig
from calibration.ats.head import load_head, save_head
from common.usage_error import fail
from calibration.evaluate import DEFAULT_TASKS, EvalResult, apply_overrides, evaluate_model
from calibration.records import write_records
from calibration.report import format_table, write_diagrams, write_summary
from calibration.task_config import TASKS, TaskConfig, resolve_task
from common.config import build, suggest
from common.datasource import DataSourceError, resolve_data_dir
from common.models import load_pretrained, resolve_model
from trainable.ats import fit_ats_head


def _tasks(text: str) -> list[TaskConfig]:
    """``--tasks``' comma list as task configs; an unknown name raises ``ValueError`` naming it and the valid ones."""
    names = [t.strip() for t in text.split(",") if t.strip()]
    unknown = [t for t in names if t not in TASKS]
    if unknown or not names:
        raise ValueError(f"--tasks: expected a comma list of {sorted(TASKS)}, got {text!r}"
                         f"{suggest(unknown[0], TASKS) if unknown else ''}")
    return [resolve_task(t) for t in names]


def _ats_config(overrides: Sequence[str]) -> Any:
    """``--ats-set KEY=VALUE`` items (values read as YAML) as an ``ATSConfig``; every problem in one ValueError."""
    values = {}
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--ats-set: expected KEY=VALUE, got {item!r}")
        values[key.strip()] = yaml.safe_load(value)
    return build(ATSConfig, values, "--ats-set")


def _ats_head(args: argparse.Namespace, config: Any, model: Any, tokenizer: Any, out: Path) -> Any:
    """The saved head of ``--ats-head``, a head trained and saved to OUT with ``--ats``, or None."""
    if args.ats_head is not None:
        return load_head(args.ats_head)
    if not args.ats:
        return None
    head, losses = fit_ats_head(model, tokenizer, config, data_dir=args.data_dir)
    print(f"ATS head: {len(losses)} steps, loss {losses[0]:.4f} -> {losses[-1]:.4f}; "
          f"saved {save_head(head, out / 'ats_head.safetensors')}")
    return head


def main(argv: Sequence[str] | None = None, prog: str = "calsweep evaluate") -> EvalResult:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
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
