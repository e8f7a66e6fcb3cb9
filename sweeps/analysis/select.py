"""Which trials stand for each table row and figure point.

A grid point is (SFT dataset, family, beta, lr); its metrics are means over its ok trials (seeds, runs).
Table 1 keeps one lr per (dataset, family, beta), chosen as SELECTION says. The best beta of a (dataset,
family, task) is the beta > 0 whose Table 1 ECE on that task is lowest, and the change in ECE is
Delta ECE = ECE(best beta) - ECE(beta = 0), both at their selected lr.
"""

from __future__ import annotations

import pandas as pd

SELECTION = ("lr chosen per (SFT dataset, family, beta) by the lowest validation loss on held-out SFT examples "
             "(`train.val_examples`) when every lr of the cell has one, else by the highest mean accuracy over the "
             "tasks, each on its reported split (column selected_by says which); ties to the lower final train loss, "
             "then to the smaller lr; both criteria are blind to calibration; metrics are means over the n ok trials "
             "(seeds, runs) at that lr")
BEST_BETA = "best beta: the beta > 0 with the lowest Table 1 ECE on the task (per SFT dataset and family)"
TABLE_METRICS = ("accuracy", "ece", "rms_ce")
CELL = ["sft_dataset", "family", "label_smoothing"]
MODEL_FACTS = ["vocab_size", "hidden_size", "n_params"]
DELTA_COLUMNS = ["sft_dataset", "family", "vocab_size", "hidden_size", "task", "best_beta", "ece_beta0",
                 "ece_best_beta", "delta_ece"]


def grid_points(trials: pd.DataFrame, tasks: tuple[str, ...]) -> pd.DataFrame:
    """A row per (dataset, family, beta, lr): mean metrics, ``mean_accuracy``, ``n_trials``, ``n_seeds`` (distinct
    seeds), ``trials``, model facts."""
    metrics = [f"{t}_{m}" for t in tasks for m in TABLE_METRICS]
    grouped = trials.groupby(CELL + ["learning_rate"], sort=True)
    points = grouped[metrics + ["train_loss", "val_loss"]].mean()
    points["n_trials"] = grouped.size()
    points["n_seeds"] = grouped["seed"].nunique(dropna=False)
    points["trials"] = grouped["trial"].agg(lambda names: ";".join(sorted(names)))
    points = points.reset_index()
    points["mean_accuracy"] = points[[f"{t}_accuracy" for t in tasks]].mean(axis=1)
    facts = trials.groupby("family")[MODEL_FACTS].first().astype("Int64")  # first non-null value per family
    return points.join(facts, on="family")


def table_one(points: pd.DataFrame) -> pd.DataFrame:
    """The grid point of the selected lr for each (dataset, family, beta), as SELECTION states."""
    chosen = []
    for _, cell in points.groupby(CELL, sort=True):
        if cell["val_loss"].notna().all():
            ranked = cell.sort_values(["val_loss", "train_loss", "learning_rate"]).assign(selected_by="val_loss")
        else:
            ranked = cell.sort_values(["mean_accuracy", "train_loss", "learning_rate"], ascending=[False, True, True],
                                      na_position="last").assign(selected_by="accuracy")
        chosen.append(ranked.head(1))
    return pd.concat(chosen).reset_index(drop=True)


def best_betas(table: pd.DataFrame, tasks: tuple[str, ...], notes: list[str]) -> pd.DataFrame:
    """DELTA_COLUMNS per (dataset, family, task) that has beta = 0 and some beta > 0; what is missing goes to notes."""
    rows = []
    for (dataset, family), group in table.groupby(["sft_dataset", "family"], sort=True):
        by_beta = group.set_index("label_smoothing")
        smoothed = by_beta[by_beta.index > 0]
        if 0.0 not in by_beta.index or smoothed.empty:
            missing = "beta = 0" if 0.0 not in by_beta.index else "beta > 0"
            notes.append(f"{dataset}/{family}: no {missing} trial, so no change in ECE, paired difference or "
                         f"reliability pair (betas present: {_betas(by_beta.index)})")
            continue
        for task in tasks:
            scored = smoothed[f"{task}_ece"].dropna()
            base = by_beta.at[0.0, f"{task}_ece"]
            if scored.empty or pd.isna(base):
                notes.append(f"{dataset}/{family}/{task}: no ECE at beta = 0 or at any beta > 0; no change in ECE")
                continue
            best = scored.idxmin()
            rows.append({"sft_dataset": dataset, "family": family, "vocab_size": group["vocab_size"].iloc[0],
                         "hidden_size": group["hidden_size"].iloc[0], "task": task, "best_beta": best,
                         "ece_beta0": base, "ece_best_beta": scored[best], "delta_ece": scored[best] - base})
    return pd.DataFrame(rows, columns=DELTA_COLUMNS)


def _betas(betas, shown: int = 8) -> str:
    """'0.1, 0.2, ..., 0.3 (12 betas)': the sorted betas, the first ``shown`` and the last where there are more."""
    values = sorted(set(betas))
    if len(values) <= shown:
        return ", ".join(f"{b:g}" for b in values)
    return ", ".join(f"{b:.3g}" for b in values[:shown - 1]) + f", ..., {values[-1]:.3g} ({len(values)} betas)"
