"""ATS for a trial or the evaluate CLI: Alpaca-GPT4 through the SFT data path, then ``calibration.ats.train_head``.

``fit_ats_head(model, tokenizer, config, ...)`` tokenises ``config``'s data like SFT data (loss on the response
tokens only, the tokenizer's chat template when it has one), trains a new head on the frozen model and returns it;
``trial_head_path`` is where a trial keeps it.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from calibration.ats.config import ATSConfig
from calibration.ats.head import HeadSpec, TemperatureHead
from calibration.ats.train import train_head
from trainable.config import SFTConfig
from trainable.sft_data import build_sft_examples, iterate_batches


def ats_sft_config(config: ATSConfig) -> SFTConfig:
    """The SFT data settings that read ``config``'s Alpaca-format data."""
    return SFTConfig(dataset="alpaca", hub_id=config.hub_id, local_file=config.local_file,
                     max_examples=config.max_examples, max_seq_len=config.max_seq_len)


def ats_steps(n_examples: int, config: ATSConfig) -> int:
    """``config.max_steps``, else ``epochs`` passes over the examples in batches of ``batch_size`` (at least 1)."""
    return config.max_steps or max(1, math.ceil(config.epochs * (n_examples // config.batch_size)))


def fit_ats_head(model: Any, tokenizer: Any, config: ATSConfig, *, seed: int = 0, data_dir: str | None = None,
                 cache: str | Path | None = None, progress: bool = True) -> tuple[TemperatureHead, list[float]]:
    """A head trained on the frozen ``model`` with ``config`` (seeded data order and initialisation) and its
    per-step losses. ``cache``: directory for the tokenised examples (``trainable.sft_data``)."""
    import torch

    examples = build_sft_examples(ats_sft_config(config), tokenizer, seed, data_dir, cache=cache)
    if len(examples) < config.batch_size:
        raise ValueError(f"expected at least batch_size={config.batch_size} ATS examples with response tokens, got "
                         f"{len(examples)} (max_examples={config.max_examples}, max_seq_len={config.max_seq_len})")
    torch.manual_seed(seed)
    head = TemperatureHead(HeadSpec.for_model(model))
    batches = iterate_batches(examples, config.batch_size, tokenizer.pad_token_id, seed)
    losses = train_head(model, head, batches, ats_steps(len(examples), config), config, progress=progress)
    return head, losses


def trial_head_path(results_dir: str, run_name: str, trial_id: str) -> Path | None:
    """``<results_dir>/ats/<run>__<trial_id>.safetensors`` for a local store; None for a remote one (not kept)."""
    if "://" in results_dir:
        return None
    return Path(results_dir).expanduser() / "ats" / f"{run_name}__{trial_id}.safetensors"


def trial_ats_head(model: Any, tokenizer: Any, trial: Any, *, progress: bool = True) -> TemperatureHead:
    """The head of a trial (``trainable.config.TrialConfig``) with ``eval.ats`` enabled: trained on its SFT'd model
    with the trial's seed and data root, kept at ``trial_head_path`` when the store is local."""
    from calibration.ats.head import save_head
    from common.models import cache_dir

    head, losses = fit_ats_head(model, tokenizer, trial.eval.ats, seed=trial.seed, data_dir=trial.data_dir,
                                cache=cache_dir() / "sft", progress=progress)
    path = trial_head_path(trial.results_dir, trial.run_name, trial.trial_id)
    if path is not None:
        save_head(head, path)
    if progress:
        print(f"[calsweep] ATS head: {len(losses)} steps, loss {losses[0]:.4f} -> {losses[-1]:.4f}"
              + (f", saved {path}" if path else ""), flush=True)
    return head
