"""The paper's tables and figures from the results store: ``python sweeps/analyze.py RESULTS [--filter] [--out]``.

    python sweeps/analyze.py results
    python sweeps/analyze.py results --filter dataset=alpaca,family=smollm2-135m,family=gemma3-270m --out fig/

writes into DIR (default RESULTS/analysis):

    table1.csv, table1.md, .tex    Table 1: Acc / ECE / RMS per SFT dataset x family x beta at the selected lr, with
                                   ECE intervals over seeds and questions and the number of seeds (.tex: LaTeX)
    paired_ece.csv, paired_ece.md  ECE(beta) - ECE(0) over the same questions, paired bootstrap interval
    ece_intervals.csv              question-level ECE of every Table 1 cell with its bootstrap interval
    ls_ts.csv, ls_ts.md            label smoothing, temperature scaling, both, ATS and LS + ATS side by side (LS/TS/ATS)
    delta_ece.csv                  change in ECE from beta = 0 to the best beta, per model and task
    entropy_gap.csv                each trial's eq. 14 floor and measured entropy (older stores: our rank bound)
    ece_vs_beta_<data>.png         ECE against beta per family and task (paired_ece_<data>.png: the differences)
    ls_ts_<data>.png               ECE against beta as trained, after temperature scaling and after ATS
    delta_ece_vs_vocab_<data>.png, delta_ece_vs_hidden_<data>.png    the paper's Figures 3 and 5
    entropy_gap.png                the paper's Figure 4, each trial's measured entropy beside its floor
    reliability/<data>/<family>__<task>.png    reliability diagrams, beta = 0 (left) and the best beta (right)
    notes.md                       the selection rules, and everything left out with the reason

Figures are PNG; ``--format png,pdf,svg`` writes each in every format listed (PDF and SVG: vector graphics).
Filters (``KEY=VALUE``, comma separated, a key repeated is an OR): run, dataset, family, task.
``--score loglik_norm`` reads every table and figure through the length-normalised choice distribution (lm-eval's
acc_norm) instead of the summed log-likelihoods, e.g. for HellaSwag, whose summed-likelihood confidence saturates.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Sequence

import pandas as pd

from calibration.summary import SCORES
from common.config import suggest
from sweeps.analysis import figures
from sweeps.analysis.figures import FORMATS
from sweeps.analysis.ats import ats_trials, describe_ats, with_ats
from sweeps.analysis.entropy import entropy_outputs
from sweeps.analysis.load import SCORE_NAMES, Results, load_results, parse_filter
from sweeps.analysis.questions import (CellKey, CellQuestions, cell_questions, ece_intervals,
                                       paired_differences)
from sweeps.analysis.select import BEST_BETA, SELECTION, best_betas, grid_points, table_one
from sweeps.analysis.tables import INTERVALS, write_ls_ts, write_paired, write_table_one
from sweeps.analysis.temperature import describe_sources, ls_ts_table, scaled_questions


def slug(name: str) -> str:
    """A file-name-safe form of a family or dataset name (hub ids contain '/')."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)


def analyze(root: str, filters: dict[str, set[str]], out: Path, *, n_boot: int = 1000, seed: int = 0,
            logit_std: float = 1.0, score: str = "loglik", formats: Sequence[str] = ("png",)) -> list[Path]:
    """Write every output listed in the module doc into ``out``, read through ``score``, each figure once per
    format of ``formats``; returns their paths (notes.md last)."""
    results = load_results(root, filters, score)
    notes = results.notes
    out.mkdir(parents=True, exist_ok=True)
    tasks, n_bins = results.tasks, results.n_bins
    table = table_one(grid_points(results.trials, tasks))
    cells = cell_questions(table, results.questions, tasks)
    intervals = ece_intervals(cells, n_bins, n_boot, seed)
    written = write_table_one(table, intervals, tasks, n_bins, n_boot, out, SCORE_NAMES[score])
    deltas = best_betas(table, tasks, notes)
    written.append(_csv(deltas, out / "delta_ece.csv"))
    entropy_files, entropy_note = entropy_outputs(results.trials, logit_std, out, notes, formats)
    written += entropy_files

    paired = paired_differences(cells, n_bins, n_boot, seed, notes)
    written.append(_csv(intervals, out / "ece_intervals.csv"))
    written += write_paired(paired, n_boot, out)
    temperatures, scaled = scaled_questions(results)
    ts_intervals = ece_intervals(cell_questions(table, scaled, tasks), n_bins, n_boot, seed)
    ls_ts = ls_ts_table(table, temperatures, intervals, ts_intervals, tasks, notes)
    by_trial = ats_trials(results)
    ats_intervals = ece_intervals(cell_questions(table, results.ats, tasks), n_bins, n_boot, seed)
    ls_ts = with_ats(ls_ts, table, by_trial, ats_intervals, tasks, notes)
    written += write_ls_ts(ls_ts, n_boot, out)
    for dataset in sorted(table["sft_dataset"].unique()):
        written += _dataset_figures(dataset, tasks, intervals, paired, deltas, ls_ts, out, formats)
    written += _reliability_pairs(deltas, cells, n_bins, out, notes, formats)
    applied = [entropy_note, describe_sources(temperatures, score), describe_ats(by_trial)]
    written.append(_write_notes(root, filters, results, n_boot, seed, applied, out))
    return written


def _csv(frame: pd.DataFrame, path: Path) -> Path:
    frame.to_csv(path, index=False)
    return path


def _dataset_figures(dataset: str, tasks: tuple[str, ...], intervals: pd.DataFrame, paired: pd.DataFrame,
                     deltas: pd.DataFrame, ls_ts: pd.DataFrame, out: Path, formats: Sequence[str]) -> list[Path]:
    """The figures of one SFT dataset for which it has points (ls_ts: where some trial has a temperature or ATS)."""
    intervals, paired, deltas, ls_ts = (frame[frame["sft_dataset"] == dataset]
                                        for frame in (intervals, paired, deltas, ls_ts))
    name, written = slug(dataset), []
    if len(intervals):
        written += figures.ece_against_beta(intervals, dataset, tasks, out / f"ece_vs_beta_{name}.png", formats)
    if ls_ts["ece_ts"].notna().any() or ls_ts["ece_ats"].notna().any():
        written += figures.ls_ts_against_beta(ls_ts, dataset, tasks, out / f"ls_ts_{name}.png", formats)
    if len(paired):
        written += figures.paired_against_beta(paired, dataset, tasks, out / f"paired_ece_{name}.png", formats)
    if len(deltas):
        for column, short in (("vocab_size", "vocab"), ("hidden_size", "hidden")):
            written += figures.delta_against_size(deltas, dataset, tasks, column,
                                                  out / f"delta_ece_vs_{short}_{name}.png", formats)
    return written


def _reliability_pairs(deltas: pd.DataFrame, cells: dict[CellKey, CellQuestions], n_bins: int, out: Path,
                       notes: list[str], formats: Sequence[str]) -> list[Path]:
    written, missing = [], {}
    for row in deltas.itertuples():
        base = cells.get((row.sft_dataset, row.family, 0.0, row.task))
        best = cells.get((row.sft_dataset, row.family, row.best_beta, row.task))
        if base is None or best is None:
            missing.setdefault(f"{row.sft_dataset}/{row.family}", []).append(row.task)
            continue
        folder = out / "reliability" / slug(row.sft_dataset)
        folder.mkdir(parents=True, exist_ok=True)
        written += figures.reliability_pair(base, best, row.best_beta, f"{row.sft_dataset}/{row.family} {row.task}",
                                            n_bins, folder / f"{slug(row.family)}__{row.task}.png", formats)
    notes += [f"{cell}: no questions stored at beta = 0 or at the best beta for {', '.join(tasks)}; no reliability "
              f"pair" for cell, tasks in missing.items()]
    return written


def _write_notes(root: str, filters: dict[str, set[str]], results: Results, n_boot: int, seed: int,
                 applied: list[str], out: Path) -> Path:
    shown = ",".join(f"{k}={v}" for k, values in sorted(filters.items()) for v in sorted(values)) or "none"
    lines = ["# Analysis notes", "",
             f"- store: `{root}`, filter: {shown}; {len(results.trials)} ok trials, tasks: {', '.join(results.tasks)}",
             f"- choice distribution of every metric: {SCORE_NAMES[results.score]} (`--score {results.score}`).",
             f"- Table 1: {SELECTION}.",
             f"- {BEST_BETA}.",
             f"- question-level ECE: {results.n_bins} equal-width bins, the mean of the cell's trials' ECEs; "
             f"intervals: {INTERVALS.format(n_boot=n_boot)}, seed {seed}.",
             *(f"- {line}." for line in applied),
             "", "## Left out", ""]
    lines += [f"- {note}" for note in results.notes] or ["- nothing"]
    path = out / "notes.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def parse_formats(text: str) -> tuple[str, ...]:
    """``png,pdf`` -> ("png", "pdf") (each once, in order); ``ValueError`` naming a format not in ``FORMATS``."""
    formats = tuple(dict.fromkeys(part.strip().lower().lstrip(".") for part in text.split(",") if part.strip()))
    unknown = [f for f in formats if f not in FORMATS]
    if unknown or not formats:
        raise ValueError(f"--format: expected a comma-separated list of {', '.join(FORMATS)}, got {text!r}"
                         f"{suggest(unknown[0], FORMATS) if unknown else ''}")
    return formats


def main(argv: Sequence[str] | None = None, prog: str = "python sweeps/analyze.py") -> list[Path]:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("results", help="results store root (local path or pyarrow URI, e.g. s3://bucket/results)")
    parser.add_argument("--filter", default=None, metavar="KEY=VALUE,...",
                        help="keep trials matching: run, dataset, family, task (repeat a key for OR)")
    parser.add_argument("--out", default=None, help="output directory (default RESULTS/analysis, or ./analysis "
                                                    "for a remote store)")
    parser.add_argument("--n-boot", type=int, default=1000, help="bootstrap resamples of questions per interval")
    parser.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    parser.add_argument("--score", choices=SCORES, default="loglik",
                        help="choice distribution: summed or length-normalised log-likelihoods (lm-eval's acc_norm)")
    parser.add_argument("--logit-std", type=float, default=1.0,
                        help="RMS centred logit sigma (nats) at which the entropy gap is drawn")
    parser.add_argument("--format", default="png", metavar="FORMAT,...",
                        help=f"figure formats, comma separated, of {', '.join(FORMATS)} (pdf, svg: vector graphics)")
    args = parser.parse_args(argv)
    remote = "://" in args.results
    out = Path(args.out) if args.out else Path("analysis") if remote else Path(args.results) / "analysis"
    try:
        written = analyze(args.results, parse_filter(args.filter), out, n_boot=args.n_boot, seed=args.seed,
                          logit_std=args.logit_std, score=args.score, formats=parse_formats(args.format))
    except ValueError as exc:
        print(f"calsweep: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    print(written[-1].read_text(), end="")
    print(f"wrote {len(written)} files to {out}")
    return written


if __name__ == "__main__":
    main()
