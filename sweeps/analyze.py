"""The paper's tables and figures from the results store: ``python sweeps/analyze.py RESULTS [--filter] [--out]``.

    python sweeps/analyze.py results
    python sweeps/analyze.py results --filter dataset=alpaca,family=smollm2-135m,family=gemma3-270m --out fig/

writes into DIR (default RESULTS/analysis):

    table1.csv, table1.md          Table 1: Acc / ECE / RMS per SFT dataset x family x beta at the selected lr
    paired_ece.csv, paired_ece.md  ECE(beta) - ECE(0) over the same questions, paired bootstrap interval
    ece_intervals.csv              question-level ECE of every Table 1 cell with its bootstrap interval
    delta_ece.csv                  change in ECE from beta = 0 to the best beta, per model and task
    entropy_gap.csv                each model's entropy floor and normalised gap (calibration.entropy_bound)
    ece_vs_beta_<data>.png         ECE against beta per family and task (paired_ece_<data>.png: the differences)
    delta_ece_vs_vocab_<data>.png, delta_ece_vs_hidden_<data>.png    the paper's Figures 3 and 5
    entropy_gap.png                the paper's Figure 4, with the store's models on it
    reliability/<data>/<family>__<task>.png    reliability diagrams, beta = 0 (left) and the best beta (right)
    notes.md                       the selection rules, and everything left out with the reason

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

if __package__ in (None, ""):  # run as a script: make the repository's packages importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pandas as pd  # noqa: E402

from calibration.rank_entropy_bound import rank_entropy_floor, rank_entropy_gap  # noqa: E402
from sweeps.analysis import figures  # noqa: E402
from calibration.summary import SCORES  # noqa: E402
from sweeps.analysis.load import SCORE_NAMES, Results, load_results, parse_filter  # noqa: E402
from sweeps.analysis.questions import (CellKey, CellQuestions, cell_questions, ece_intervals,  # noqa: E402
                                       paired_differences)
from sweeps.analysis.select import BEST_BETA, SELECTION, best_betas, grid_points, table_one  # noqa: E402
from sweeps.analysis.tables import write_paired, write_table_one  # noqa: E402


def slug(name: str) -> str:
    """A file-name-safe form of a family or dataset name (hub ids contain '/')."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)


def analyze(root: str, filters: dict[str, set[str]], out: Path, *, n_boot: int = 1000, seed: int = 0,
            logit_std: float = 1.0, score: str = "loglik") -> list[Path]:
    """Write every output listed in the module doc into ``out``, read through ``score``; returns their paths
    (notes.md last)."""
    results = load_results(root, filters, score)
    notes = results.notes
    out.mkdir(parents=True, exist_ok=True)
    tasks = results.tasks
    table = table_one(grid_points(results.trials, tasks))
    written = write_table_one(table, tasks, results.n_bins, out, SCORE_NAMES[score])
    deltas = best_betas(table, tasks, notes)
    written.append(_csv(deltas, out / "delta_ece.csv"))
    written += _entropy_outputs(table, logit_std, out, notes)

    cells = cell_questions(table, results.questions, tasks)
    intervals = ece_intervals(cells, results.n_bins, n_boot, seed)
    paired = paired_differences(cells, results.n_bins, n_boot, seed, notes)
    written.append(_csv(intervals, out / "ece_intervals.csv"))
    written += write_paired(paired, n_boot, out)
    for dataset in sorted(table["sft_dataset"].unique()):
        written += _dataset_figures(dataset, tasks, intervals, paired, deltas, out)
    written += _reliability_pairs(deltas, cells, results.n_bins, out, notes)
    written.append(_write_notes(root, filters, results, n_boot, seed, logit_std, out))
    return written


def _csv(frame: pd.DataFrame, path: Path) -> Path:
    frame.to_csv(path, index=False)
    return path


def _dataset_figures(dataset: str, tasks: tuple[str, ...], intervals: pd.DataFrame, paired: pd.DataFrame,
                     deltas: pd.DataFrame, out: Path) -> list[Path]:
    """The figures of one SFT dataset for which it has points."""
    intervals, paired, deltas = (frame[frame["sft_dataset"] == dataset] for frame in (intervals, paired, deltas))
    name, written = slug(dataset), []
    if len(intervals):
        written.append(figures.ece_against_beta(intervals, dataset, tasks, out / f"ece_vs_beta_{name}.png"))
    if len(paired):
        written.append(figures.paired_against_beta(paired, dataset, tasks, out / f"paired_ece_{name}.png"))
    if len(deltas):
        for column, short in (("vocab_size", "vocab"), ("hidden_size", "hidden")):
            written.append(figures.delta_against_size(deltas, dataset, tasks, column,
                                                      out / f"delta_ece_vs_{short}_{name}.png"))
    return written


def _entropy_outputs(table: pd.DataFrame, logit_std: float, out: Path, notes: list[str]) -> list[Path]:
    """entropy_gap.csv (H_floor in nats and the normalised gap of each model) and entropy_gap.png."""
    models = table.drop_duplicates("family")[["family", "vocab_size", "hidden_size"]]
    unknown = models[models["vocab_size"].isna() | models["hidden_size"].isna()]
    if len(unknown):
        notes.append(f"no vocabulary or hidden size stored for {', '.join(unknown['family'])}: left off the size "
                     f"figures and entropy_gap")
    models = models.dropna().reset_index(drop=True)
    models["entropy_floor"] = [float(rank_entropy_floor(d, v, logit_std)) for d, v in
                               zip(models["hidden_size"], models["vocab_size"])]
    models["normalised_entropy_gap"] = [float(rank_entropy_gap(d, v, logit_std)) for d, v in
                                        zip(models["hidden_size"], models["vocab_size"])]
    return [_csv(models, out / "entropy_gap.csv"), figures.entropy_gap(models, logit_std, out / "entropy_gap.png")]


def _reliability_pairs(deltas: pd.DataFrame, cells: dict[CellKey, CellQuestions], n_bins: int, out: Path,
                       notes: list[str]) -> list[Path]:
    written, missing = [], {}
    for row in deltas.itertuples():
        base = cells.get((row.sft_dataset, row.family, 0.0, row.task))
        best = cells.get((row.sft_dataset, row.family, row.best_beta, row.task))
        if base is None or best is None:
            missing.setdefault(f"{row.sft_dataset}/{row.family}", []).append(row.task)
            continue
        folder = out / "reliability" / slug(row.sft_dataset)
        folder.mkdir(parents=True, exist_ok=True)
        written.append(figures.reliability_pair(base, best, row.best_beta,
                                                f"{row.sft_dataset}/{row.family} {row.task}", n_bins,
                                                folder / f"{slug(row.family)}__{row.task}.png"))
    notes += [f"{cell}: no questions stored at beta = 0 or at the best beta for {', '.join(tasks)}; no reliability "
              f"pair" for cell, tasks in missing.items()]
    return written


def _write_notes(root: str, filters: dict[str, set[str]], results: Results, n_boot: int, seed: int,
                 logit_std: float, out: Path) -> Path:
    shown = ",".join(f"{k}={v}" for k, values in sorted(filters.items()) for v in sorted(values)) or "none"
    lines = ["# Analysis notes", "",
             f"- store: `{root}`, filter: {shown}; {len(results.trials)} ok trials, tasks: {', '.join(results.tasks)}",
             f"- choice distribution of every metric: {SCORE_NAMES[results.score]} (`--score {results.score}`).",
             f"- Table 1: {SELECTION}.",
             f"- {BEST_BETA}.",
             f"- question-level ECE: {results.n_bins} equal-width bins; intervals: {n_boot} bootstrap resamples of "
             f"questions (percentile, 95%), seed {seed}.",
             f"- entropy gap: our rank bound (`calibration/rank_entropy_bound.py`) at RMS centred logit sigma = "
             f"{logit_std:g} (not the paper's eq. 14, which is `calibration/entropy_bound.py`).",
             "", "## Left out", ""]
    lines += [f"- {note}" for note in results.notes] or ["- nothing"]
    path = out / "notes.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def main(argv: Sequence[str] | None = None) -> list[Path]:
    parser = argparse.ArgumentParser(prog="python sweeps/analyze.py", description=__doc__.split("\n")[0],
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
    args = parser.parse_args(argv)
    remote = "://" in args.results
    out = Path(args.out) if args.out else Path("analysis") if remote else Path(args.results) / "analysis"
    try:
        written = analyze(args.results, parse_filter(args.filter), out, n_boot=args.n_boot, seed=args.seed,
                          logit_std=args.logit_std, score=args.score)
    except ValueError as exc:
        print(f"calsweep: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    print(written[-1].read_text(), end="")
    print(f"wrote {len(written)} files to {out}")
    return written


if __name__ == "__main__":
    main()
