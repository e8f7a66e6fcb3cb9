"""Tables as CSV (fractions, full precision, for code) and Markdown (percent, with the caption, for people)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from sweeps.analysis.select import SELECTION, TABLE_METRICS

TASK_NAMES = {"mmlu": "MMLU", "hellaswag": "HellaSwag", "arc_easy": "ARC-Easy"}
METRIC_NAMES = {"accuracy": "Acc", "ece": "ECE", "rms_ce": "RMS"}
TABLE_ONE_COLUMNS = ["sft_dataset", "family", "label_smoothing", "learning_rate", "n_trials", "vocab_size",
                     "hidden_size", "n_params"]


def markdown(frame: pd.DataFrame) -> str:
    """A GitHub Markdown table of ``frame``'s cells as they are (format them first)."""
    lines = ["| " + " | ".join(map(str, frame.columns)) + " |", "|" + " --- |" * len(frame.columns)]
    lines += ["| " + " | ".join(map(str, row)) + " |" for row in frame.itertuples(index=False)]
    return "\n".join(lines) + "\n"


def percent(value: float) -> str:
    return "-" if pd.isna(value) else f"{100 * value:.2f}"


def write_table_one(table: pd.DataFrame, tasks: tuple[str, ...], n_bins: int, out: Path,
                    distribution: str) -> list[Path]:
    """table1.csv and table1.md: per SFT dataset x family x beta, Acc / ECE / RMS of each task at the selected lr."""
    metrics = [f"{t}_{m}" for t in tasks for m in TABLE_METRICS]
    csv = out / "table1.csv"
    extra = ["mean_accuracy", "val_loss", "train_loss", "selected_by", "trials"]
    table[TABLE_ONE_COLUMNS + metrics + extra].to_csv(csv, index=False)
    shown = pd.DataFrame({"SFT data": table["sft_dataset"], "family": table["family"],
                          "beta": table["label_smoothing"].map("{:g}".format),
                          "lr": table["learning_rate"].map("{:g}".format), "n": table["n_trials"]})
    for task in tasks:
        for metric in TABLE_METRICS:
            shown[f"{TASK_NAMES[task]} {METRIC_NAMES[metric]}"] = table[f"{task}_{metric}"].map(percent)
    caption = (f"**Table 1.** Accuracy, ECE and RMS calibration error (%, top label of the {distribution}, {n_bins} "
               f"equal-width bins) on {', '.join(TASK_NAMES[t] for t in tasks)} after SFT with label smoothing beta; "
               f"{SELECTION}.")
    md = out / "table1.md"
    md.write_text(caption + "\n\n" + markdown(shown))
    return [csv, md]


def write_paired(paired: pd.DataFrame, n_boot: int, out: Path) -> list[Path]:
    """paired_ece.csv and paired_ece.md: ECE(beta) - ECE(0) over shared questions with its bootstrap interval."""
    csv = out / "paired_ece.csv"
    paired.to_csv(csv, index=False)
    verdict = paired.apply(lambda r: "lower" if r["high"] < 0 else "higher" if r["low"] > 0 else "not resolved",
                           axis=1) if len(paired) else pd.Series(dtype=str)
    shown = pd.DataFrame({
        "SFT data": paired["sft_dataset"], "family": paired["family"], "task": paired["task"].map(TASK_NAMES),
        "beta": paired["label_smoothing"].map("{:g}".format), "ECE(beta)": paired["ece_beta"].map(percent),
        "ECE(0)": paired["ece_beta0"].map(percent), "Delta ECE": paired["delta_ece"].map(percent),
        "95% interval": [f"[{percent(lo)}, {percent(hi)}]" for lo, hi in zip(paired["low"], paired["high"])],
        "ECE with LS": verdict, "questions": paired["n_questions"]})
    caption = (f"**Paired ECE difference.** Delta ECE = ECE(beta) - ECE(beta = 0) (%), each at its Table 1 lr, over "
               f"the questions both scored; percentile interval of {n_boot} paired bootstrap resamples of those "
               f"questions. 'lower': the whole interval is below 0.")
    md = out / "paired_ece.md"
    md.write_text(caption + "\n\n" + markdown(shown))
    return [csv, md]
