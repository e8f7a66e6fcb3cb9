"""The figures: ECE and its paired change against beta, ECE with and without temperature scaling, Delta ECE against
vocabulary and hidden size (the paper's Figures 3 and 5), the normalised entropy gap (Figure 4) and reliability
pairs. Each is written once per format of ``formats`` (``FORMATS``: PNG, and PDF / SVG as vector graphics for a
paper), at ``path`` with that suffix; each function returns the files it wrote."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.ticker import NullFormatter  # noqa: E402

from calibration.entropy.bound import normalised_entropy_gap  # noqa: E402
from calibration.entropy.rank_bound import rank_entropy_gap as rank_gap  # noqa: E402
from calibration.reliability import HEIGHTS, SIZE, draw_reliability  # noqa: E402
from sweeps.analysis.questions import CellQuestions  # noqa: E402
from sweeps.analysis.tables import task_title  # noqa: E402

REFERENCE_VOCABS = (32_000, 128_256, 262_144)  # Llama-2 / Mistral, Llama-3, Gemma-3
HIDDEN_RANGE = (8, 16_384)
FORMATS = ("png", "pdf", "svg")  # what --format accepts


def _per_task(tasks: tuple[str, ...], title: str) -> tuple[plt.Figure, list[plt.Axes]]:
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.2 * len(tasks), 3.8), squeeze=False)
    fig.suptitle(title, fontsize="medium")
    for ax, task in zip(axes[0], tasks):
        ax.set_title(task_title(task))
    return fig, list(axes[0])


def _save(fig: plt.Figure, path: Path, formats: Sequence[str]) -> list[Path]:
    """``fig`` at ``path`` once per format (its suffix replaced), closed afterwards."""
    fig.tight_layout()
    paths = [path.with_suffix(f".{fmt}") for fmt in formats]
    for target in paths:
        fig.savefig(target, dpi=120)
    plt.close(fig)
    return paths


def _colours(frame: pd.DataFrame) -> dict[str, str]:
    """One colour per family of a figure, the same in all its panels."""
    return {family: f"C{i % 10}" for i, family in enumerate(sorted(frame["family"].unique()))}


def _interval_lines(ax: plt.Axes, rows: pd.DataFrame, value: str, colours: dict[str, str], low: str = "low",
                    high: str = "high", style: str = "-", suffix: str = "") -> None:
    """One line per family against beta, bars from ``low`` to ``high`` (a percentile interval need not hold the
    estimate, so the bars are clipped at it; none where it is missing); families are nudged apart along x so
    their bars do not overlap. Labels carry the seeds behind each line."""
    families = sorted(rows["family"].unique())
    span = float(np.ptp(rows["label_smoothing"])) if len(rows) else 0.0
    for i, family in enumerate(families):
        group = rows[rows["family"] == family].sort_values("label_smoothing")
        estimate = 100 * group[value].to_numpy(float)
        bars = np.nan_to_num([estimate - 100 * group[low].to_numpy(float),
                              100 * group[high].to_numpy(float) - estimate]).clip(min=0)
        nudge = (i - (len(families) - 1) / 2) * 0.015 * (span or 1.0)
        seeds = sorted(set(group["n_seeds"]))
        shown = f"{seeds[0]}" if len(seeds) == 1 else f"{seeds[0]}-{seeds[-1]}"
        ax.errorbar(group["label_smoothing"] + nudge, estimate, yerr=bars, marker="o", capsize=3, linestyle=style,
                    color=colours[family], label=f"{family}{suffix} (seeds: {shown})")


def ece_against_beta(intervals: pd.DataFrame, dataset: str, tasks: tuple[str, ...], path: Path,
                     formats: Sequence[str] = ("png",)) -> list[Path]:
    """ECE (%) against beta per family and task, with the seed-and-question interval of each point."""
    fig, axes = _per_task(tasks, f"SFT on {dataset}: ECE at each beta (95% bootstrap interval over seeds, then "
                                 f"questions)")
    colours = _colours(intervals)
    for ax, task in zip(axes, tasks):
        _interval_lines(ax, intervals[intervals["task"] == task], "ece", colours)
        ax.set(xlabel="label smoothing beta", ylabel="ECE (%)")
    axes[0].legend(fontsize="small")
    return _save(fig, path, formats)


def paired_against_beta(paired: pd.DataFrame, dataset: str, tasks: tuple[str, ...], path: Path,
                        formats: Sequence[str] = ("png",)) -> list[Path]:
    """ECE(beta) - ECE(0) (%) per family and task with its paired bootstrap interval; below 0: LS lowers ECE."""
    fig, axes = _per_task(tasks, f"SFT on {dataset}: ECE(beta) - ECE(0), paired over shared questions (95% over "
                                 f"seeds, then questions)")
    colours = _colours(paired)
    for ax, task in zip(axes, tasks):
        _interval_lines(ax, paired[paired["task"] == task], "delta_ece", colours)
        ax.axhline(0, color="black", linewidth=0.8)
        ax.set(xlabel="label smoothing beta", ylabel="Delta ECE (%)")
    axes[0].legend(fontsize="small")
    return _save(fig, path, formats)


def delta_against_size(deltas: pd.DataFrame, dataset: str, tasks: tuple[str, ...], column: str, path: Path,
                       formats: Sequence[str] = ("png",)) -> list[Path]:
    """Delta ECE (%) from beta = 0 to the best beta against ``column`` (vocab_size, hidden_size), a point per model."""
    label = {"vocab_size": "vocabulary size", "hidden_size": "hidden size"}[column]
    fig, axes = _per_task(tasks, f"SFT on {dataset}: change in ECE from beta = 0 to the best beta, by {label}")
    for ax, task in zip(axes, tasks):
        rows = deltas[(deltas["task"] == task) & deltas[column].notna()]
        x, y = rows[column].astype(float).to_numpy(), 100 * rows["delta_ece"].to_numpy()
        ax.scatter(x, y)
        for xi, yi, family, beta in zip(x, y, rows["family"], rows["best_beta"]):
            ax.annotate(f"{family} (beta={beta:g})", (xi, yi), fontsize="x-small", xytext=(3, 3),
                        textcoords="offset points")
        ax.axhline(0, color="black", linewidth=0.8)
        ax.set(xscale="log", xlabel=label, ylabel="Delta ECE (%)")
        ax.xaxis.set_minor_formatter(NullFormatter())  # log-axis minor labels collide
    return _save(fig, path, formats)


def ls_ts_against_beta(frame: pd.DataFrame, dataset: str, tasks: tuple[str, ...], path: Path,
                       formats: Sequence[str] = ("png",)) -> list[Path]:
    """ECE (%) against beta per family and task, as trained (solid: beta = 0 is neither, beta > 0 is LS), after
    temperature scaling (dashed: TS at beta = 0, LS + TS above) and, where ``frame`` has it, after ATS (dotted: ATS,
    LS + ATS), with their seed-and-question intervals."""
    ats = frame[frame["ece_ats"].notna()] if "ece_ats" in frame else frame.iloc[:0]
    fig, axes = _per_task(tasks, f"SFT on {dataset}: ECE as trained (solid), after temperature scaling (dashed)"
                                 + (" and after ATS (dotted)" if len(ats) else "") + ", 95% over seeds, then questions")
    colours = _colours(frame)
    for ax, task in zip(axes, tasks):
        rows = frame[frame["task"] == task]
        _interval_lines(ax, rows, "ece", colours, "ece_low", "ece_high")
        scaled = rows[rows["ece_ts"].notna()]
        if scaled.empty:
            ax.text(0.5, 0.9, "TS n/a (no held-out split)", transform=ax.transAxes, ha="center", fontsize="small")
        else:
            _interval_lines(ax, scaled, "ece_ts", colours, "ece_ts_low", "ece_ts_high", "--", " + TS")
        if len(ats[ats["task"] == task]):
            _interval_lines(ax, ats[ats["task"] == task], "ece_ats", colours, "ece_ats_low", "ece_ats_high", ":",
                            " + ATS")
        ax.set(xlabel="label smoothing beta", ylabel="ECE (%)")
        ax.legend(fontsize="x-small")
    return _save(fig, path, formats)


def entropy_against_floor(trials: pd.DataFrame, path: Path,
                          formats: Sequence[str] = ("png",)) -> list[Path]:
    """Figure 4's axes, (log |V| - H) / log |V| against D: each trial at its eq. 14 floor (open) and at its measured
    mean entropy (filled), joined; a dashed eq. 14 curve per family at its median rho."""
    hidden = np.geomspace(*HIDDEN_RANGE, 200)
    fig, ax = plt.subplots(figsize=(7, 4.8))
    colours = _colours(trials)
    for family, group in trials.groupby("family"):
        vocab, rho = int(group["vocab_size"].iloc[0]), float(group["rho"].median())
        ax.plot(hidden, normalised_entropy_gap(vocab, hidden, rho), linestyle="--", linewidth=0.8,
                color=colours[family], label=f"eq. 14, |V| = {vocab:,}, rho = {rho:.3g}")
        spread = 1 + 0.04 * (np.arange(len(group)) - (len(group) - 1) / 2)  # trials side by side around D
        x = group["hidden_size"].to_numpy(float) * spread
        ax.vlines(x, group["entropy_gap"], group["floor_gap"], color=colours[family], linewidth=0.8)
        ax.scatter(x, group["floor_gap"], facecolors="none", edgecolors=colours[family], zorder=3)
        ax.scatter(x, group["entropy_gap"], color=colours[family], zorder=3,
                   label=f"{family}: floor (open), measured (filled), {len(group)} trial(s)")
    ax.set(xscale="log", xlabel="hidden size D", ylabel="normalised entropy gap (log|V| - H) / log|V|",
           title="Eq. 14 entropy floor and measured mean entropy per trial")
    ax.legend(fontsize="x-small")
    return _save(fig, path, formats)


def rank_entropy_gap(models: pd.DataFrame, logit_std: float, path: Path,
                     formats: Sequence[str] = ("png",)) -> list[Path]:
    """Our rank bound's gap against hidden size for reference vocabularies and the models' own, models on it
    (the figure of stores without measured entropy)."""
    hidden = np.geomspace(*HIDDEN_RANGE, 200)
    vocabs = sorted(set(REFERENCE_VOCABS) | set(models["vocab_size"].astype(int)))
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    colours = {}
    for vocab in vocabs:
        (line,) = ax.plot(hidden, rank_gap(hidden, vocab, logit_std), label=f"V = {vocab:,}")
        colours[vocab] = line.get_color()
    for model in models.itertuples():
        gap = rank_gap(model.hidden_size, model.vocab_size, logit_std)
        ax.scatter(model.hidden_size, gap, color=colours[int(model.vocab_size)], edgecolor="black", zorder=3)
        ax.annotate(model.family, (model.hidden_size, gap), fontsize="x-small", xytext=(3, 3),
                    textcoords="offset points")
    ax.set(xscale="log", xlabel="hidden size d", ylabel="normalised entropy gap",
           title=f"Our rank bound (no measured entropy stored), RMS centred logit sigma = {logit_std:g}")
    ax.legend(fontsize="small")
    return _save(fig, path, formats)


def reliability_pair(base: CellQuestions, best: CellQuestions, best_beta: float, label: str, n_bins: int,
                     path: Path, formats: Sequence[str] = ("png",)) -> list[Path]:
    """``calibration.reliability`` diagrams of beta = 0 (left) and the best beta (right), side by side."""
    fig, axes = plt.subplots(2, 2, figsize=(2 * SIZE[0], SIZE[1]), sharex=True,
                             gridspec_kw={"height_ratios": HEIGHTS})
    for column, (cell, beta) in enumerate(((base, 0.0), (best, best_beta))):
        draw_reliability(axes[0, column], axes[1, column], cell.confidence.ravel(), cell.correct.ravel(),
                         n_bins=n_bins, title=f"{label}, beta = {beta:g}")
    return _save(fig, path, formats)
