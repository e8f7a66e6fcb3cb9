"""Scoring split across ranks. Under ZeRO-0/1/2 every rank holds the whole trained model, and under FSDP2 every rank
gathers a plain copy of it (``trainable.fsdp2_weights.gathered_copy``: the scoring phase's planned memory is the same
on each rank), so each rank scores a contiguous share of each task's questions and the ranks all-gather the records
(``calibration.evaluate.Shard``): the calibration pass takes 1/N of its forwards on N GPUs (the entropy statistics
stay rank 0's). DeepSpeed's ZeRO-3 scores on rank 0's gathered copy, or through forwards that are collectives where
no copy fits: every question where it runs.
"""

from __future__ import annotations

import pyarrow as pa
import torch.distributed as dist

from calibration.evaluate import Shard


def shares_questions(world_size: int, zero_stage: int, fsdp2: bool) -> bool:
    """Whether the ranks share the questions: several ranks, each able to score the whole model (FSDP2, or ZeRO
    stage < 3)."""
    return world_size > 1 and (fsdp2 or zero_stage < 3)


def scoring_shard(rank: int, world_size: int, zero_stage: int, fsdp2: bool) -> Shard | None:
    """This rank's ``Shard`` where the ranks share the questions (``shares_questions``); else None."""
    return Shard(rank, world_size, all_gather_tables) if shares_questions(world_size, zero_stage, fsdp2) else None


def all_gather_tables(table: pa.Table) -> list[pa.Table]:
    """Every rank's ``table`` in rank order (a collective of the default process group)."""
    tables: list[pa.Table | None] = [None] * dist.get_world_size()
    dist.all_gather_object(tables, table)
    return tables
