"""Which settings a trial's result depends on, and how a stored trial's config differs from the current one.

A trial id names a point (family, lr, beta, seed) of a run; the rest of the trial config (SFT data, steps,
evaluation, ...) lives in the stored row's ``config_json``, its number of workers (data-parallel ranks: the data
each sees and the batch) in ``world_size``. Before a stored ``ok`` row is reused, its result settings are compared
with the current trial's: bookkeeping (run name, id, where results go), where the local data are read (not what
they are: local copies share one layout; local against hub does count), reporting and checkpoint cadence and
evaluation batching are not results, and random-init models other than the trial's own are ignored.
"""

from __future__ import annotations

import json
from typing import Any

from trainable.config import TrialConfig

NOT_RESULTS = frozenset({"run_name", "trial_id", "results_dir", "data_dir", "train.log_every", "eval.batch_size",
                         "eval.batch_tokens", "train.checkpoint_every_steps", "train.checkpoint_every_minutes",
                         "train.checkpoints_to_keep"})


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict) and value:
        flat: dict[str, Any] = {}
        for key, item in value.items():
            flat.update(_flatten(item, f"{prefix}.{key}" if prefix else str(key)))
        return flat
    return {prefix: value}


def result_settings(config: dict[str, Any]) -> dict[str, Any]:
    """Dotted key -> value of the settings in a trial config (``TrialConfig.to_dict()`` or a stored
    ``config_json``, read as JSON) that change the trial's result."""
    config = json.loads(json.dumps(config, sort_keys=True, default=str))  # tuples as lists, as stored
    model = (config.get("custom_models") or {}).get(config.get("family"))
    trimmed = {key: value for key, value in config.items() if key != "custom_models"}
    flat = {key: value for key, value in _flatten(trimmed).items() if key not in NOT_RESULTS}
    flat["data_source"] = "local" if config.get("data_dir") else "hub"
    if model is not None:
        flat.update(_flatten(model, "custom_model"))
    return flat


_DEFAULTS = result_settings(TrialConfig(run_name="", trial_id="", family="", learning_rate=0.0,
                                        label_smoothing=0.0).to_dict())


def differences(stored: dict[str, Any], current: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """key -> (stored value, current value) of the result settings that differ. A setting the stored config
    lacks (written before it existed) counts as its default; one the current config lacks (since removed) is
    not compared."""
    old, new = result_settings(stored), result_settings(current)
    return {key: (old.get(key, _DEFAULTS.get(key)), value) for key, value in sorted(new.items())
            if old.get(key, _DEFAULTS.get(key)) != value}


def row_differences(row: dict[str, Any], trial: TrialConfig, workers: int) -> dict[str, tuple[Any, Any]]:
    """``differences`` between a stored trial row and the trial about to run on ``workers`` workers (a row
    without ``world_size``, written before the trial ran, is compared on its config alone)."""
    changed = differences(json.loads(row["config_json"] or "{}"), trial.to_dict())
    if row.get("world_size") is not None and row["world_size"] != workers:
        changed["workers"] = (row["world_size"], workers)
    return changed


def describe(changed: dict[str, tuple[Any, Any]]) -> str:
    """'key: stored X, now Y; ...' of ``differences``."""
    return "; ".join(f"{key}: stored {json.dumps(old)}, now {json.dumps(new)}" for key, (old, new) in changed.items())
