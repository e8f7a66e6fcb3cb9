"""Recompute metrics, binning and temperature from stored log-likelihoods: no model, no GPU.

    python -m calibration.rescore results/eval/smollm2-135m --n-bins 10 --temperature fit --score loglik_norm

reads ``DIR/records.parquet`` (written by ``calsweep evaluate``), prints the metrics table and
writes ``DIR/rescore_<score>_b<bins>_t<temperature>.json`` (and reliability diagrams with ``--plots``). A sweep
store's per-question file works too (``python -m calibration.rescore results/questions/<run>__<trial>.parquet``):
its outputs go to ``<results>/rescore/<run>__<trial>/`` (or ``--out``), never into the store's tables. So do
lm-evaluation-harness's per-sample logs of any multiple-choice task (``lm_eval ... --log_samples``: a
``samples_<task>_<date>.jsonl`` file, or the folder holding them, one task each): outputs go to ``rescore/`` beside
them, and lm-eval's own accuracy is printed next to ours.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from common.usage_error import fail
from calibration.lm_eval_samples import read_samples, samples_files
from calibration.records import read_records, read_store_questions
from calibration.report import format_table, write_diagrams, write_summary
from calibration.summary import SCORES, fit_temperatures, summarize


def rescore(source: str | Path, *, n_bins: int = 15, temperature: str = "1", score: str = "loglik",
            n_boot: int = 1000, plots: bool = False, out: str | Path | None = None) -> dict[str, Any]:
    """Summary of ``source``'s records (an evaluate directory, a store's per-question file, or lm-eval samples) under
    new settings; ``temperature`` is ``fit`` or a number; outputs go to ``out`` (default: beside the records, see
    above)."""
    source = Path(source)
    if samples_files(source) and not (source / "records.parquet").is_file():
        records, metadata = read_samples(samples_files(source))
        default_out = (source if source.is_dir() else source.parent) / "rescore"
    elif source.is_file():
        records, metadata = read_store_questions(source)
        default_out = source.parent.parent / "rescore" / source.stem
    else:
        source = source / "records.parquet"
        records, metadata = read_records(source)
        default_out = source.parent
    directory = Path(out) if out else default_out
    directory.mkdir(parents=True, exist_ok=True)
    split_of = metadata.get("report_splits") or {t: s for t, s in zip(records["task"].to_pylist(),
                                                                       records["split"].to_pylist())}
    if temperature == "fit":
        fit_splits = metadata.get("fit_splits") or {}
        if not fit_splits:
            raise ValueError(f"expected held-out records in {source} for --temperature fit, got none "
                             f"(evaluate without --no-heldout)")
        temperatures = fit_temperatures(records, fit_split_of=fit_splits, score=score)
    else:
        try:
            value = float(temperature)
        except ValueError:
            raise ValueError(f"expected --temperature fit or a positive number, got {temperature!r}") from None
        temperatures = {task: value for task in split_of} if value != 1.0 else None
    summary, intervals = summarize(records, split_of=split_of, n_bins=n_bins, score=score,
                                   temperatures=temperatures, n_boot=n_boot)
    settings = {**metadata, "n_bins": n_bins, "score": score, "temperatures": temperatures or {},
                "n_boot": n_boot, "rescored_from": str(source)}
    write_summary(directory / f"rescore_{score}_b{n_bins}_t{temperature}.json", summary, intervals, settings)
    if plots:
        write_diagrams(directory, records, split_of=split_of, n_bins=n_bins, score=score,
                       temperatures=temperatures, label=str(metadata.get("model", "")))
    print(format_table(summary, intervals))
    for task, theirs in metadata.get("lm_eval", {}).items():
        print(f"{task}: lm-eval's own " + ", ".join(f"{metric} {value:.4f}" for metric, value in theirs.items())
              + f"; here accuracy {summary[task]['accuracy']:.4f}, accuracy_norm {summary[task]['accuracy_norm']:.4f}")
    return summary


def main(argv: Sequence[str] | None = None, prog: str = "python -m calibration.rescore") -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    parser.add_argument("source", help="an output directory of calsweep evaluate, a sweep store's "
                                       "per-question file (results/questions/<run>__<trial>.parquet), or lm-eval's "
                                       "samples_<task>_<date>.jsonl (--log_samples) or the folder holding them")
    parser.add_argument("--n-bins", type=int, default=15)
    parser.add_argument("--temperature", default="1", help="'fit' (on the held-out split) or a number")
    parser.add_argument("--score", choices=SCORES, default="loglik", help="which log-likelihood the softmax uses")
    parser.add_argument("--n-boot", type=int, default=1000)
    parser.add_argument("--plots", action="store_true", help="rewrite the reliability diagrams")
    parser.add_argument("--out", default=None, help="output directory (default: the evaluate directory, or "
                                                    "<results>/rescore/<run>__<trial>/ for a store file)")
    args = parser.parse_args(argv)
    try:
        _check_source(Path(args.source))
        return rescore(args.source, n_bins=args.n_bins, temperature=args.temperature, score=args.score,
                       n_boot=args.n_boot, plots=args.plots, out=args.out)
    except ValueError as exc:  # the source's and the settings' problems: records of another schema, bad --temperature
        fail(parser.prog, str(exc))


def _check_source(source: Path) -> None:
    """Raise ``ValueError`` (one line) unless ``source`` is an evaluate directory, a Parquet file or lm-eval
    samples."""
    path = source / "records.parquet" if source.is_dir() else source
    if samples_files(source) and not path.is_file():
        return
    if not path.is_file():
        found = "a directory without records.parquet or samples_*.jsonl" if source.is_dir() else "nothing"
        raise ValueError(f"{str(source)!r}: expected an output directory of calsweep evaluate (holding "
                         f"records.parquet), a store's questions/<run>__<trial>.parquet file or lm-eval's "
                         f"samples_<task>_<date>.jsonl files, found {found}")
    if path.suffix == ".jsonl":
        raise ValueError(f"{str(source)!r}: expected lm-eval's samples file name samples_<task>_<date>.jsonl, got "
                         f"{path.name!r}")
    try:
        pq.read_schema(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise ValueError(f"{str(path)!r}: expected a Parquet file ({' '.join(str(exc).split())[:160]})") from None
    try:  # a readable footer over damaged pages fails only here, or later as a puzzle ('Invalid number of indices')
        pq.read_table(path)
    except (pa.ArrowException, OSError) as exc:
        raise ValueError(f"{str(path)!r}: damaged Parquet file, its data cannot be read "
                         f"({' '.join(str(exc).split())[:160]}); expected a whole file (restore it from a copy)") \
            from None


if __name__ == "__main__":
    main()
