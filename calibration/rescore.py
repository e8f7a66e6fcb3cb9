"""Recompute metrics, binning and temperature from stored log-likelihoods: no model, no GPU.

    python -m calibration.rescore results/eval/smollm2-135m --n-bins 10 --temperature fit --score loglik_norm

reads ``DIR/records.parquet`` (written by ``python -m calibration.evaluate``), prints the metrics table and
writes ``DIR/rescore_<score>_b<bins>_t<temperature>.json`` (and reliability diagrams with ``--plots``).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Sequence

from calibration.records import read_records
from calibration.report import format_table, write_diagrams, write_summary
from calibration.summary import SCORES, fit_temperatures, summarize


def rescore(directory: str | Path, *, n_bins: int = 15, temperature: str = "1", score: str = "loglik",
            n_boot: int = 1000, plots: bool = False) -> dict[str, Any]:
    """Summary of ``directory``'s records under new settings; ``temperature`` is ``fit`` or a number."""
    directory = Path(directory)
    records, metadata = read_records(directory / "records.parquet")
    split_of = metadata.get("report_splits") or {t: s for t, s in zip(records["task"].to_pylist(),
                                                                       records["split"].to_pylist())}
    if temperature == "fit":
        fit_splits = metadata.get("fit_splits") or {}
        if not fit_splits:
            raise ValueError(f"expected held-out records in {directory} for --temperature fit, got none "
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
                "n_boot": n_boot, "rescored_from": str(directory / "records.parquet")}
    write_summary(directory / f"rescore_{score}_b{n_bins}_t{temperature}.json", summary, intervals, settings)
    if plots:
        write_diagrams(directory, records, split_of=split_of, n_bins=n_bins, score=score,
                       temperatures=temperatures, label=str(metadata.get("model", "")))
    print(format_table(summary, intervals))
    return summary


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m calibration.rescore", description=__doc__.split("\n")[0])
    parser.add_argument("directory", help="an output directory of python -m calibration.evaluate")
    parser.add_argument("--n-bins", type=int, default=15)
    parser.add_argument("--temperature", default="1", help="'fit' (on the held-out split) or a number")
    parser.add_argument("--score", choices=SCORES, default="loglik", help="which log-likelihood the softmax uses")
    parser.add_argument("--n-boot", type=int, default=1000)
    parser.add_argument("--plots", action="store_true", help="rewrite the reliability diagrams")
    args = parser.parse_args(argv)
    return rescore(args.directory, n_bins=args.n_bins, temperature=args.temperature, score=args.score,
                   n_boot=args.n_boot, plots=args.plots)


if __name__ == "__main__":
    main()
