"""Reliability diagram: accuracy per equal-width confidence bin against the diagonal, over a confidence histogram."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from calibration.metrics import bin_edges, expected_calibration_error, reliability_bins  # noqa: E402

SIZE = (4.5, 5.5)  # inches of one diagram
HEIGHTS = [3, 1]  # accuracy panel above the histogram


def draw_reliability(top: plt.Axes, bottom: plt.Axes, confidence: np.ndarray, correct: np.ndarray, *,
                     n_bins: int = 15, title: str = "") -> None:
    """Draw into ``top`` acc(B_b) bars per bin with the gap to conf(B_b) and the y = x line, into ``bottom`` n_b."""
    count, acc, conf = reliability_bins(confidence, correct, n_bins)
    edges = bin_edges(n_bins)
    width = 1.0 / n_bins
    filled = count > 0
    top.bar(edges[:-1][filled], acc[filled], width=width, align="edge", color="tab:blue", edgecolor="black",
            label="accuracy")
    top.bar(edges[:-1][filled], (conf - acc)[filled], bottom=acc[filled], width=width, align="edge",
            color="tab:red", alpha=0.3, edgecolor="tab:red", hatch="//", label="gap to confidence")
    top.plot([0, 1], [0, 1], "k--", linewidth=1, label="perfect calibration")
    top.set(ylim=(0, 1), ylabel="accuracy", title=title)
    ece = expected_calibration_error(confidence, correct, n_bins)
    top.text(0.03, 0.9, f"ECE = {100 * ece:.1f}%\nN = {int(count.sum())}", transform=top.transAxes, va="top")
    top.legend(loc="lower right", fontsize="small")
    bottom.bar(edges[:-1], count, width=width, align="edge", color="tab:gray", edgecolor="black")
    bottom.set(xlim=(0, 1), xlabel="confidence", ylabel="questions")


def reliability_diagram(confidence: np.ndarray, correct: np.ndarray, path: str | Path, *, n_bins: int = 15,
                        title: str = "") -> Path:
    """Write one diagram (``draw_reliability``) to ``path``, in the format its suffix names (png, pdf, svg)."""
    fig, (top, bottom) = plt.subplots(2, 1, figsize=SIZE, sharex=True, gridspec_kw={"height_ratios": HEIGHTS})
    draw_reliability(top, bottom, confidence, correct, n_bins=n_bins, title=title)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
