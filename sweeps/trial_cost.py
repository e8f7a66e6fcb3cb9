"""What a trial holds its GPUs for besides training, so that the predicted GPU-hours (``sweeps.layout_report``) and
the measured ones (each stored trial's wall time x the GPUs it held) count the same thing.

For a model of P parameters on a layout of N GPUs, per trial (each term x N GPUs held):
    load    = P / LOAD_PARAMS_PER_S                           weights built (random init) or read, then sharded
    score   = Q x P x SCORE_S_PER_QUESTION_PARAM / N          Q questions (the tasks at their limits, a k-shot
                                                              one's counted k + 1 times:
                                                              ``sweeps.layout_report.scored_questions``); a
                                                              forward's FLOPs grow with P, the N ranks share them
    export  = 2P / EXPORT_BYTES_PER_S                         bf16 weights written (``train.save_model`` only)
and per actor, on its first trial (every trial when ``resources.warm_trials`` is off: each starts a new process):
    start   = WORKER_START_S, + GROUP_START_S across GPUs     process, CUDA context; helper ranks and NCCL
    compile = COMPILE_S_PER_GRAPH x graphs + SCORE_COMPILE_S  graphs: 1, 2 when some but not all layers recompute
The actors of a family are as many as its trials that run at once: min(trials, GPUs // N) when the cluster's
GPUs are known, else 1. The training term is ``trainable.layout.gpu_hours`` (tokens x FLOPs per token at the
recorded MFU), which excludes its compile warm-up.

Constants, measured on H100s (the mixed grid of docs/measurements/2026-11-27-h100x4-mixed/
mixed_grid_warm_h100x4.json: llama-1b on 1 GPU, llama-8b on 2 with 11/32 layers recomputed, 40 steps, ARC-Easy
400) and on an H200 (docs/measurements/2026-11-27-warm-thread: 1B one-GPU warm trials); the same for every shape.
"""

from __future__ import annotations

from trainable.layout import Layout, ModelShape

# warm loads (no first-process costs): 8B 2.2-2.9 s for 8.03e9 parameters (mixed grid, its 2nd 8B trials), 1B
# 0.30-0.32 s for 1.24e9 (the cold-path JSON of the same folder, warm 1B trials)
LOAD_PARAMS_PER_S = 3.5e9
# 1B warm scoring of 400 ARC-Easy questions: 1.5 s on an H200 (warm-thread): 1.5 / (400 x 1.236e9)
SCORE_S_PER_QUESTION_PARAM = 3.0e-12
# the first trial's scoring over the later ones' (its kernels built): 5.0 - 1.5 s (warm-thread)
SCORE_COMPILE_S = 3.5
# a one-GPU actor's first trial over a warm one's outside compile: framework 1.0-1.7 s + load 5.0-5.2 s (a warm
# load 0.3 s): importing torch and the model's code, the CUDA context (mixed grid, 1B trials)
WORKER_START_S = 6.0
# across GPUs, on top: the 8B actors' first framework 10.6-10.8 s (helper ranks started in the placement group) +
# first load 14.3-14.8 s (warm 2.2-2.9: the process group's NCCL communicators), less WORKER_START_S
GROUP_START_S = 17.0
# the first trial's training over its steady time, per distinct compiled decoder-layer graph: 1B (1 graph) 31.2 s
# wall - 1.7 framework - 5.1 load - 2.9 scoring - 9.2 steady training = 12 s; 8B (2 graphs: recomputed and not)
# 83.2 - 10.7 - 14.3 - 3 - 30.3 = 25 s
COMPILE_S_PER_GRAPH = 12.0
# bf16 weights written to a local disk (not yet measured: an NVMe's sequential write, halved)
EXPORT_BYTES_PER_S = 1.0e9


def compiled_graphs(shape: ModelShape, layout: Layout) -> int:
    """Distinct decoder-layer graphs Inductor compiles: one, two when some but not all layers recompute."""
    recomputed = shape.layers if layout.checkpointed is True else int(layout.checkpointed)
    return 2 if 0 < recomputed < shape.layers else 1


def trial_seconds(shape: ModelShape, layout: Layout, questions: float, export: bool) -> float:
    """Wall seconds of one warm trial outside training: load + score + export (module docstring)."""
    load = shape.params / LOAD_PARAMS_PER_S
    score = questions * shape.params * SCORE_S_PER_QUESTION_PARAM / layout.workers
    return load + score + (2 * shape.params / EXPORT_BYTES_PER_S if export else 0.0)


def actor_start_seconds(shape: ModelShape, layout: Layout) -> float:
    """Wall seconds an actor's first trial adds: start + compile (module docstring)."""
    start = WORKER_START_S + (GROUP_START_S if layout.workers > 1 else 0.0)
    return start + COMPILE_S_PER_GRAPH * compiled_graphs(shape, layout) + SCORE_COMPILE_S


def actors(trials: int, workers: int, gpus: int | None, warm: bool) -> int:
    """Processes that start (and compile) for a family's ``trials``: one per trial when cold, else one per trial
    run at once (``gpus // workers``, at least 1; 1 where the cluster's ``gpus`` are unknown)."""
    if not warm:
        return trials
    return min(trials, max(1, gpus // workers)) if gpus else min(trials, 1)


def fixed_gpu_hours(shape: ModelShape, layout: Layout, trials: int, questions: float, export: bool,
                    gpus: int | None, warm: bool) -> float:
    """GPU-hours a family's ``trials`` hold besides training: (trials x ``trial_seconds`` + actors x
    ``actor_start_seconds``) x the layout's GPUs."""
    seconds = trials * trial_seconds(shape, layout, questions, export)
    seconds += actors(trials, layout.workers, gpus, warm) * actor_start_seconds(shape, layout)
    return seconds * layout.workers / 3600
