"""ATS settings (the YAML key ``eval.ats`` of a trial, ``--ats-set`` of ``calsweep evaluate``).

Defaults are the authors' (github.com/Johnathan-Xie/adaptive-temperature-scaling: ``run_calibration.sh`` and
``calibration_configs/transformer_hidden_states/config.json``): Alpaca-GPT4, loss ``selective_smoothing`` with a
uniform target (``label_smoothing=1.0``) and ``smooth_loss_weight`` alpha = 0.5 in its class-balanced form, AdamW
at lr 5e-5 with a cosine schedule and no warmup, 2 epochs, 8 sequences per step (1 per GPU x 2 accumulated x 4
GPUs), gradients clipped at 1.0 (the Hugging Face Trainer's default), sequences cut at 1024 tokens (LLaMA-Factory's
``cutoff_len``). The head's architecture is fixed by the base model (``head.HeadSpec.for_model``).
"""

from __future__ import annotations

from dataclasses import dataclass

ATS_DATA_FILE = "alpaca/alpaca_gpt4_en_demo_llamafactory.json"  # 999 rows of Alpaca-GPT4 under the data root
ATS_HUB_ID = "vicgalle/alpaca-gpt4"  # the same data on the hub (52k rows), read when no data root is set


@dataclass(frozen=True)
class ATSConfig:
    """Train an ATS head on the frozen model after SFT and score every task again with it (``*_ats`` metrics)."""

    enabled: bool = False  # train the head and report *_ats metrics
    local_file: str = ATS_DATA_FILE  # Alpaca-format JSON (list) or JSONL under the data root
    hub_id: str = ATS_HUB_ID  # read instead when there is no data root
    max_examples: int | None = None  # first N rows after a seeded shuffle; None = all
    max_seq_len: int = 1024  # tokens per training sequence; longer ones are cut
    epochs: float = 2.0  # passes over the data when max_steps is null
    max_steps: int | None = None  # optimiser steps; None = run `epochs` epochs
    batch_size: int = 8  # sequences per optimiser step
    learning_rate: float = 5e-5  # AdamW, cosine schedule, no warmup
    alpha: float = 0.5  # weight of the uniform (smoothing) term on wrong tokens; 1 - alpha on right ones
    balanced: bool = True  # the authors' weighted_average: each term also weighted by the other class's share
    max_grad_norm: float = 1.0  # gradient clipping norm

    def problems(self) -> list[str]:
        """Every invalid field as 'key: expected X, got Y' (``common.config.build`` prefixes the path)."""
        problems = []
        for name in ("max_seq_len", "epochs", "batch_size", "learning_rate", "max_grad_norm"):
            if not getattr(self, name) > 0:
                problems.append(f"{name}: expected a number > 0, got {getattr(self, name)!r}")
        for name in ("max_examples", "max_steps"):
            if getattr(self, name) is not None and not getattr(self, name) > 0:
                problems.append(f"{name}: expected an integer > 0 or null, got {getattr(self, name)!r}")
        if not 0.0 <= self.alpha <= 1.0:
            problems.append(f"alpha: expected a number in [0, 1], got {self.alpha!r}")
        if not self.local_file.endswith((".json", ".jsonl")):
            problems.append(f"local_file: expected a .json or .jsonl file, got {self.local_file!r}")
        return problems
