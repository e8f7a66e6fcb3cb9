"""What a trial holds its GPUs for besides training, so that the predicted GPU-hours (``sweeps.layout_report``) and
the measured ones (each stored trial's wall time x the GPUs it held) count the same thing.

For a model of P parameters on a layout of N GPUs, per trial (each term x N GPUs held):
    load    = P / LOAD_PARAMS_PER_S                           weights built (random init) or read, then sharded
    score   = Q x (SCORE_S_PER_QUESTION                       Q questions (the tasks at their limits, a k-shot
                   + P x SCORE_S_PER_QUESTION_PARAM)          one's counted k + 1 times:
              x (ENTROPY_SHARE + (1 - ENTROPY_SHARE) / N)     ``sweeps.layout_report.scored_questions``); where
                                                              the ranks share the questions
                                                              (``trainable.scoring_shard``), the calibration pass
                                                              is split, the entropy statistics stay rank 0's
    export  = 2P / EXPORT_BYTES_PER_S                         bf16 weights written (``train.save_model`` only)
per process a family's trials start (every trial when ``resources.warm_trials`` is off):
    start   = WORKER_START_S, + GROUP_START_S across GPUs     CUDA context, imports, the attention check; helper
                                                              ranks and NCCL
and per actor a family runs on, a new process or a warm one that ran another family:
    compile = COMPILE_S_PER_GRAPH x graphs + SCORE_COMPILE_S  graphs: 1, 2 when some but not all layers recompute
The actors of a family are as many as its trials that run at once: min(trials, GPUs // N) when the cluster's
GPUs are known, else 1. Warm actors of one width (N) are Tune's to reuse across families, so a family starts only
the processes its width's earlier families (the longest trials first, ``sweeps.search.trial_order``) left unstarted
(``started_processes``). The training term is ``trainable.layout.gpu_hours`` (tokens x FLOPs per token at the
recorded MFU), which excludes its compile warm-up.

Constants, measured on a 4 x H200 node (docs/measurements/2026-11-29e-h200x4: the mixed grid of llama-8b and
llama-1b on one GPU each, 250 steps, ``mixed_grid_250_h200x4.json``; and 8B on two GPUs under ZeRO-2 with the 1B
on one, 40 steps, ``sharded_grid_h200x4.json``; ARC-Easy 400 in both); the same for every shape.
"""

from __future__ import annotations

from collections.abc import Iterable

from trainable.layout import Layout, ModelShape
from trainable.scoring_shard import shares_questions

# warm loads (no first-process costs): 8B 0.4-2.6 s for 8.03e9 parameters (2 GPUs), 1B 0.4-1.7 s for 1.24e9
LOAD_PARAMS_PER_S = 3.5e9
# warm scoring of 400 ARC-Easy questions at the default batch: 1B 1.13-1.27 s (one GPU), 8B 2.25-2.27 s (two GPUs
# under ZeRO-2, each scoring every question, as then): a + P b through both means (1.21 s and 2.26 s)
SCORE_S_PER_QUESTION = 2.55e-3
SCORE_S_PER_QUESTION_PARAM = 3.9e-13
# the entropy statistics' share of a trial's scoring, rank 0's alone: 0.20-0.42 (bench_scoring_batch.py on an H200,
# 1B and 8B, ARC-Easy and MMLU + HellaSwag at the default batch: docs/measurements/2026-11-29d-h200)
ENTROPY_SHARE = 0.3
# the first trial's scoring in a process over a warm one's: 8B 3.3-4.0 s against 2.26
SCORE_COMPILE_S = 1.3
# a one-GPU process's first trial over a warm trial, outside compile: framework 1.0 s against 0.6 and load 1.5-5.2
# against 0.4 (1B: importing the model's code, the CUDA context), the attention check 3.1-3.4 s (its verdict is
# cached on the node for the later trials of the shape)
WORKER_START_S = 8.5
# across GPUs, on top: the 8B ZeRO-2 group's first framework 2.5-5.6 s (helper ranks started in the placement
# group) and first load 11.0-13.4 s against warm 0.5-2.6 (the process group's NCCL communicators), less the one-GPU
# process's share
GROUP_START_S = 8.0
# the first trial's warm-up over a warm trial's, per distinct compiled decoder-layer graph: 1B 11.3-12.7 s against
# 4.0 (1 graph); 8B two GPUs 9.7-9.8 against 3.5 (1 graph); 8B one GPU 26.2-26.7 against ~10 (2 graphs: recomputed
# and not)
COMPILE_S_PER_GRAPH = 7.5
# bf16 weights written to a local disk (not yet measured: an NVMe's sequential write, halved)
EXPORT_BYTES_PER_S = 1.0e9


def compiled_graphs(shape: ModelShape, layout: Layout) -> int:
    """Distinct decoder-layer graphs Inductor compiles: one, two when some but not all layers recompute."""
    recomputed = shape.layers if layout.checkpointed is True else int(layout.checkpointed)
    return 2 if 0 < recomputed < shape.layers else 1


def trial_seconds(shape: ModelShape, layout: Layout, questions: float, export: bool) -> float:
    """Wall seconds of one warm trial outside training: load + score + export (module docstring)."""
    load = shape.params / LOAD_PARAMS_PER_S
    score = questions * (SCORE_S_PER_QUESTION + shape.params * SCORE_S_PER_QUESTION_PARAM)
    if shares_questions(layout.workers, layout.zero_stage, layout.engine == "fsdp2"):
        score *= ENTROPY_SHARE + (1 - ENTROPY_SHARE) / layout.workers
    return load + score + (2 * shape.params / EXPORT_BYTES_PER_S if export else 0.0)


def process_start_seconds(layout: Layout) -> float:
    """Wall seconds a new process (or Ray Train group) adds to its first trial: start (module docstring)."""
    return WORKER_START_S + (GROUP_START_S if layout.workers > 1 else 0.0)


def compile_seconds(shape: ModelShape, layout: Layout) -> float:
    """Wall seconds a family's first trial in an actor adds: compile (module docstring)."""
    return COMPILE_S_PER_GRAPH * compiled_graphs(shape, layout) + SCORE_COMPILE_S


def actors(trials: int, workers: int, gpus: int | None, warm: bool) -> int:
    """Actors a family's ``trials`` run on: one per trial when cold, else one per trial run at once
    (``gpus // workers``, at least 1; 1 where the cluster's ``gpus`` are unknown)."""
    if not warm:
        return trials
    return min(trials, max(1, gpus // workers)) if gpus else min(trials, 1)


def started_processes(families: Iterable[tuple[str, int, int]], gpus: int | None, warm: bool) -> dict[str, int]:
    """Processes each family starts, for ``families`` as (name, workers, trials) in the order their trials run:
    cold, one per trial; warm, the family's ``actors`` less those its width's earlier families started."""
    started: dict[str, int] = {}
    by_width: dict[int, int] = {}
    for name, workers, trials in families:
        wanted = actors(trials, workers, gpus, warm)
        started[name] = wanted if not warm else max(0, wanted - by_width.get(workers, 0))
        by_width[workers] = by_width.get(workers, 0) + started[name]
    return started


def fixed_gpu_hours(shape: ModelShape, layout: Layout, trials: int, questions: float, export: bool,
                    gpus: int | None, warm: bool, started: int) -> float:
    """GPU-hours a family's ``trials`` hold besides training: (trials x ``trial_seconds`` + ``started`` processes x
    ``process_start_seconds`` + actors x ``compile_seconds``) x the layout's GPUs."""
    seconds = trials * trial_seconds(shape, layout, questions, export)
    seconds += started * process_start_seconds(layout)
    seconds += actors(trials, layout.workers, gpus, warm) * compile_seconds(shape, layout)
    return seconds * layout.workers / 3600
