"""Tables as CSV (fractions, full precision, for code) and Markdown (percent, with the caption, for people); Table 1
also as LaTeX (the Markdown's cells and caption, a booktabs ``table`` float for a paper)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from calibration.task_config import TASKS
from sweeps.analysis.select import SELECTION, TABLE_METRICS

METRIC_NAMES = {"accuracy": "Acc", "ece": "ECE", "rms_ce": "RMS"}
TABLE_ONE_COLUMNS = ["sft_dataset", "family", "label_smoothing", "learning_rate", "n_trials", "n_seeds",
                     "vocab_size", "hidden_size", "n_params"]
INTERVALS = ("a 95% percentile interval over {n_boot} resamples of the cell's seeds, then of the questions "
             "(questions only where seeds = 1; seed draws from 2-3 seeds are coarse)")


def task_title(task: str) -> str:
    """How tables and figures name a registered task (``TaskConfig.title``)."""
    return TASKS[task].title


def markdown(frame: pd.DataFrame) -> str:
    """A GitHub Markdown table of ``frame``'s cells as they are (format them first)."""
    lines = ["| " + " | ".join(map(str, frame.columns)) + " |", "|" + " --- |" * len(frame.columns)]
    lines += ["| " + " | ".join(map(str, row)) + " |" for row in frame.itertuples(index=False)]
    return "\n".join(lines) + "\n"


_LATEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                  "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}


def latex_escape(text: str) -> str:
    """``text`` with LaTeX's special characters escaped, to be typeset as it reads."""
    return "".join(_LATEX_SPECIAL.get(char, char) for char in text)


def latex(frame: pd.DataFrame, caption: str, label: str) -> str:
    """A full-width LaTeX ``table*`` float of ``frame``'s cells as they are, every cell and the caption escaped;
    booktabs rules, scaled to the text width (``\\usepackage{booktabs,graphicx}``)."""
    body = frame.astype(str).to_latex(index=False, escape=True, column_format="l" * len(frame.columns))
    caption = latex_escape(caption.replace("`", ""))  # Markdown's code quotes
    return (f"\\begin{{table*}}[t]\n\\centering\n\\caption{{{caption}}}\n\\label{{{label}}}\n"
            f"\\resizebox{{\\textwidth}}{{!}}{{%\n{body}}}\n\\end{{table*}}\n")


def percent(value: float) -> str:
    return "-" if pd.isna(value) else f"{100 * value:.2f}"


def with_interval(value: float, low: float, high: float) -> str:
    """``12.34 [10.10, 14.56]`` in percent; the bare value where there is no interval."""
    return percent(value) if pd.isna(low) else f"{percent(value)} [{percent(low)}, {percent(high)}]"


def write_table_one(table: pd.DataFrame, intervals: pd.DataFrame, tasks: tuple[str, ...], n_bins: int, n_boot: int,
                    out: Path, distribution: str) -> list[Path]:
    """table1.csv, table1.md and table1.tex: per SFT dataset x family x beta, Acc / ECE / RMS of each task at the
    selected lr, the ECE with its seed-and-question interval (``intervals``: questions.INTERVAL_COLUMNS)."""
    metrics = [f"{t}_{m}" for t in tasks for m in TABLE_METRICS]
    by_cell = intervals.set_index(["sft_dataset", "family", "label_smoothing", "task"])
    table = table.copy()
    for task in tasks:
        keys = list(zip(table["sft_dataset"], table["family"], table["label_smoothing"], [task] * len(table)))
        found = by_cell.reindex(keys)
        for column in ("low", "high", "n_seeds"):
            table[f"{task}_ece_{column}"] = found[column].to_numpy()
    spread = [f"{t}_ece_{c}" for t in tasks for c in ("low", "high", "n_seeds")]
    csv = out / "table1.csv"
    extra = ["mean_accuracy", "val_loss", "train_loss", "selected_by", "trials"]
    table[TABLE_ONE_COLUMNS + metrics + spread + extra].to_csv(csv, index=False)
    shown = pd.DataFrame({"SFT data": table["sft_dataset"], "family": table["family"],
                          "beta": table["label_smoothing"].map("{:g}".format),
                          "lr": table["learning_rate"].map("{:g}".format), "n": table["n_trials"],
                          "seeds": table["n_seeds"]})
    for task in tasks:
        for metric in TABLE_METRICS:
            shown[f"{task_title(task)} {METRIC_NAMES[metric]}"] = (
                [with_interval(*v) for v in table[[f"{task}_ece", f"{task}_ece_low", f"{task}_ece_high"]].to_numpy()]
                if metric == "ece" else table[f"{task}_{metric}"].map(percent))
    caption = (f"Accuracy, ECE and RMS calibration error (%, top label of the {distribution}, {n_bins} "
               f"equal-width bins) on {', '.join(task_title(t) for t in tasks)} after SFT with label smoothing beta; "
               f"{SELECTION}; n: trials, seeds: distinct seeds among them. ECE in brackets: "
               f"{INTERVALS.format(n_boot=n_boot)}, from the trials with stored questions.")
    md, tex = out / "table1.md", out / "table1.tex"
    md.write_text(f"**Table 1.** {caption}\n\n" + markdown(shown))
    tex.write_text(latex(shown, caption, "tab:table1"))
    return [csv, md, tex]


def write_paired(paired: pd.DataFrame, n_boot: int, out: Path) -> list[Path]:
    """paired_ece.csv and paired_ece.md: ECE(beta) - ECE(0) over shared questions with its bootstrap interval."""
    csv = out / "paired_ece.csv"
    paired.to_csv(csv, index=False)
    verdict = paired.apply(lambda r: "lower" if r["high"] < 0 else "higher" if r["low"] > 0 else "not resolved",
                           axis=1) if len(paired) else pd.Series(dtype=str)
    shown = pd.DataFrame({
        "SFT data": paired["sft_dataset"], "family": paired["family"], "task": paired["task"].map(task_title),
        "beta": paired["label_smoothing"].map("{:g}".format), "ECE(beta)": paired["ece_beta"].map(percent),
        "ECE(0)": paired["ece_beta0"].map(percent), "Delta ECE": paired["delta_ece"].map(percent),
        "95% interval": [f"[{percent(lo)}, {percent(hi)}]" for lo, hi in zip(paired["low"], paired["high"])],
        "ECE with LS": verdict, "questions": paired["n_questions"],
        "seeds (beta / 0)": [f"{a} / {b}" for a, b in zip(paired["n_seeds"], paired["n_seeds_beta0"])]})
    caption = (f"**Paired ECE difference.** Delta ECE = ECE(beta) - ECE(beta = 0) (%), each the mean over its cell's "
               f"trials at its Table 1 lr, over the questions both scored; {INTERVALS.format(n_boot=n_boot)}, each "
               f"cell's seeds drawn on their own and the same questions for both (a paired bootstrap). 'lower': the "
               f"whole interval is below 0.")
    md = out / "paired_ece.md"
    md.write_text(caption + "\n\n" + markdown(shown))
    return [csv, md]


def write_ls_ts(frame: pd.DataFrame, n_boot: int, out: Path) -> list[Path]:
    """ls_ts.csv (temperature.LS_TS_COLUMNS, and ats.ADDED_COLUMNS when ``frame`` has them) and ls_ts.md: per family,
    task and beta > 0, ECE with neither, LS, TS, LS + TS, and with them ATS and LS + ATS, side by side."""
    csv = out / "ls_ts.csv"
    frame.to_csv(csv, index=False)
    ats = "ece_ats" in frame
    rows = []
    for (dataset, family, task), group in frame.groupby(["sft_dataset", "family", "task"], sort=True):
        by_beta = group.set_index("label_smoothing")
        if 0.0 not in by_beta.index:
            continue
        base = by_beta.loc[0.0]
        for beta, row in by_beta[by_beta.index > 0].iterrows():
            rows.append([dataset, family, task_title(task), f"{beta:g}", _shown(base, "ece"), _shown(row, "ece"),
                         _shown(base, "ece_ts"), _shown(row, "ece_ts"),
                         *([_shown(base, "ece_ats"), _shown(row, "ece_ats")] if ats else []),
                         " / ".join("n/a" if pd.isna(t) else f"{t:.3g}"
                                    for t in (base["temperature"], row["temperature"])),
                         f"{row['n_seeds']} / {base['n_seeds']}"])
    shown = pd.DataFrame(rows, columns=["SFT data", "family", "task", "beta", "neither (beta = 0)", "LS (beta)",
                                        "TS (beta = 0)", "LS + TS (beta)",
                                        *(["ATS (beta = 0)", "LS + ATS (beta)"] if ats else []), "T (0 / beta)",
                                        "seeds (beta / 0)"])
    caption = (f"**Label smoothing and temperature scaling.** ECE (%) at each Table 1 lr: as trained at beta = 0 "
               f"(neither) and at beta (LS), and after a temperature T fitted on the task's held-out split (TS, "
               f"LS + TS); means over the cell's trials; in brackets {INTERVALS.format(n_boot=n_boot)}, T held "
               f"fixed. n/a: no held-out split was scored (HellaSwag has none). TS leaves accuracy unchanged."
               + (" ATS: each trial's adaptive temperature scaling head (eval.ats, trained on Alpaca-GPT4 after SFT), "
                  "intervals where its questions are stored; n/a: trials run without eval.ats. ATS keeps each "
                  "token's ranking, so the accuracy of one-token choices (MMLU letters)." if ats else ""))
    md = out / "ls_ts.md"
    md.write_text(caption + "\n\n" + markdown(shown))
    return [csv, md]


def _shown(row: pd.Series, value: str) -> str:
    return "n/a" if pd.isna(row[value]) else with_interval(row[value], row[f"{value}_low"], row[f"{value}_high"])
