"""Where a sweep's time goes outside its trials' own work, from the store's rows (``sweeps.store``).

A row holds its trial's Tune-function span (``started_at`` to ``finished_at``: the driver's start to its row), when
the process that ran the driver started (``actor_started_at``: its Tune actor's start) and ``run_trial``'s own wall
times (``wall_load_s``, ``wall_train_s``, ``wall_eval_s``, ``wall_total_s``). Trials that ran one after another on
the same resources form a slot: each trial's end is followed by the earliest later start not yet taken (the trial
that replaced it). A trial's actor is new when its process started after the slot's previous trial ended (always
for the first trial of a slot), else reused. Per trial:

    gap_s          previous trial's row in the slot -> this trial's driver start (Tune's scheduling, actor start
                   or reuse); None for the first trial of a slot
    actor_start_s  a new actor's process start -> its driver's start: Ray's worker start, the imports of the
                   trainable and the trial's code, Tune's set-up; None for a reused actor (or a row without
                   ``actor_started_at``)
    schedule_s     gap_s - actor_start_s: previous trial's row -> the new actor's process start (Tune's stop of the
                   previous actor, the placement group's turnover, Ray's process spawn); with a reused actor,
                   gap_s
    framework_s    driver span - (load + train + scoring): the driver's own time, a Ray Train worker group's
                   start and stop, checkpoint and row writes
    overhead_s   gap_s + framework_s: time outside the trial's own load, training and scoring
    idle_s       overhead_s + load: from the previous trial's last scored question (an upper bound: its row
                 write counts here) to this trial's first optimiser step, the time its accelerator waits
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import mean
from typing import Any


@dataclass(frozen=True)
class TrialOverhead:
    """One trial's time outside its training and scoring (module docstring); seconds."""

    trial_id: str
    slot: int
    gap_s: float | None
    framework_s: float
    load_s: float
    actor_start_s: float | None = None

    @property
    def schedule_s(self) -> float | None:
        return None if self.gap_s is None else self.gap_s - (self.actor_start_s or 0.0)

    @property
    def overhead_s(self) -> float:
        return (self.gap_s or 0.0) + self.framework_s

    @property
    def idle_s(self) -> float:
        return self.overhead_s + self.load_s


def trial_overheads(rows: list[dict[str, Any]]) -> list[TrialOverhead]:
    """Each row's ``TrialOverhead``, in start order; rows without wall times (a failed trial) count their whole
    span as framework time. A trial takes the slot that was freed first before its start (Tune starts the next
    trial as soon as one ends), else a new one."""
    rows = sorted(rows, key=lambda r: r["started_at"])
    slot_ends: list[float] = []  # per slot, the end of its latest trial
    result = []
    for row in rows:
        start, end = row["started_at"].timestamp(), row["finished_at"].timestamp()
        free = [s for s, slot_end in enumerate(slot_ends) if slot_end <= start + 1e-3]
        if free:
            slot = min(free, key=lambda s: slot_ends[s])
            gap, freed = start - slot_ends[slot], slot_ends[slot]
            slot_ends[slot] = end
        else:
            slot, gap, freed = len(slot_ends), None, -math.inf
            slot_ends.append(end)
        process = row.get("actor_started_at")
        new_actor = process is not None and process.timestamp() >= freed
        own = sum(row.get(key) or 0.0 for key in ("wall_load_s", "wall_train_s", "wall_eval_s"))
        result.append(TrialOverhead(row["trial_id"], slot, gap, end - start - own, row.get("wall_load_s") or 0.0,
                                    start - process.timestamp() if new_actor else None))
    return result


def summary(overheads: list[TrialOverhead]) -> dict[str, Any]:
    """Means over the trials that follow another in their slot (the warm case) and the first trials' figures."""
    later = [o for o in overheads if o.gap_s is not None]
    first = [o for o in overheads if o.gap_s is None]
    return {
        "trials": len(overheads), "slots": len(first),
        "overhead_s_mean": mean(o.overhead_s for o in later) if later else None,
        "overhead_s_max": max(o.overhead_s for o in later) if later else None,
        "idle_s_mean": mean(o.idle_s for o in later) if later else None,
        "idle_s_max": max(o.idle_s for o in later) if later else None,
        "first_framework_s": [round(o.framework_s, 2) for o in first],
        "first_load_s": [round(o.load_s, 2) for o in first],
        "new_actor_start_s": [round(o.actor_start_s, 2) for o in overheads if o.actor_start_s is not None],
        "per_trial": [{"trial_id": o.trial_id, "slot": o.slot, "gap_s": o.gap_s, "schedule_s": o.schedule_s,
                       "actor_start_s": o.actor_start_s, "framework_s": o.framework_s, "load_s": o.load_s,
                       "overhead_s": o.overhead_s, "idle_s": o.idle_s} for o in overheads],
    }
