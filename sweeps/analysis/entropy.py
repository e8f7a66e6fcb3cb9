"""The entropy-gap outputs (the paper's Figure 4): each trial's measured entropy beside its eq. 14 floor.

Trials that measured ``calibration.entropy.statistics.STATS`` on their own head and evaluation hidden states are
placed on Figure 4's axes, normalised entropy gap (log |V| - H) / log |V| against hidden size D, twice: at their
floor H = H_min(|V|, D, rho) and at their measured mean entropy H = mean_entropy (>= the floor, so its gap is
lower). A store whose selected trials measured none of it (rows written before the columns existed) gets the
figure as it was before: our rank bound (``calibration.entropy.rank_bound``) per model at a stated logit scale.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from calibration.entropy.statistics import STATS
from calibration.entropy.rank_bound import rank_entropy_floor, rank_entropy_gap
from sweeps.analysis import figures

TRIAL_FACTS = ["trial", "sft_dataset", "family", "label_smoothing", "learning_rate", "seed", "vocab_size",
               "hidden_size"]
MEASURED = f"measured per trial ({', '.join(STATS)}; calibration/entropy/statistics.py)"


def entropy_outputs(trials: pd.DataFrame, logit_std: float, out: Path, notes: list[str],
                    formats: Sequence[str] = ("png",)) -> tuple[list[Path], str]:
    """entropy_gap.csv and the entropy_gap figure (one file per format), and one line for the notes saying what
    they show."""
    sized = trials.dropna(subset=["vocab_size", "hidden_size"])
    unknown = sorted(set(trials["family"]) - set(sized["family"]))
    if unknown:
        notes.append(f"no vocabulary or hidden size stored for {', '.join(unknown)}: left off the size figures and "
                     f"entropy_gap")
    measured = sized.dropna(subset=list(STATS))
    if measured.empty:
        return _rank_bound(sized, logit_std, out, formats), (
            f"entropy gap: no selected trial stores the measured entropy columns ({', '.join(STATS)}), so "
            f"entropy_gap.png shows our rank bound (`calibration/entropy/rank_bound.py`) at RMS centred logit sigma "
            f"= {logit_std:g} per model, as before those columns existed (not the paper's eq. 14)")
    missing = sorted(set(sized["trial"]) - set(measured["trial"]))
    if missing:
        notes.append(f"no measured entropy for {len(missing)} trial(s), left off entropy_gap: {', '.join(missing)}")
    rows = measured[TRIAL_FACTS + list(STATS)].sort_values(["family", "label_smoothing", "trial"])
    log_v = np.log(rows["vocab_size"].astype(float))
    rows = rows.assign(floor_gap=(log_v - rows["entropy_floor"]) / log_v,
                       entropy_gap=(log_v - rows["mean_entropy"]) / log_v).reset_index(drop=True)
    rows.to_csv(out / "entropy_gap.csv", index=False)
    return [out / "entropy_gap.csv", *figures.entropy_against_floor(rows, out / "entropy_gap.png", formats)], (
        f"entropy gap: eq. 14 (`calibration/entropy/bound.py`) at each trial's rho = sigma_c * sigma_h_max, "
        f"{MEASURED}, beside the trial's mean next-token entropy on its evaluation prompts")


def _rank_bound(sized: pd.DataFrame, logit_std: float, out: Path, formats: Sequence[str]) -> list[Path]:
    """Per model: our rank bound's floor (nats) and gap at its hidden and vocabulary size."""
    models = sized.drop_duplicates("family")[["family", "vocab_size", "hidden_size"]].reset_index(drop=True)
    models["entropy_floor"] = [float(rank_entropy_floor(d, v, logit_std)) for d, v in
                               zip(models["hidden_size"], models["vocab_size"])]
    models["normalised_entropy_gap"] = [float(rank_entropy_gap(d, v, logit_std)) for d, v in
                                        zip(models["hidden_size"], models["vocab_size"])]
    models.to_csv(out / "entropy_gap.csv", index=False)
    return [out / "entropy_gap.csv", *figures.rank_entropy_gap(models, logit_std, out / "entropy_gap.png", formats)]
