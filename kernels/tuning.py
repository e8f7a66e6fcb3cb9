"""Every tuned constant of the kernels, each with its rule and the measurement behind it (H100 unless said).

Tile choices change speed and memory, never which values are summed: the results are the same for any of them
up to float32 summation order (the tests under TRITON_INTERPRET swap in small ones). The modules that launch the
kernels import these names; ``choose_order`` (kernels/forward.py) is the one choice made per shape, by a rule.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ForwardTiles:
    block_n: int = 128  # rows per tile; also the row granularity of the gradient filter
    block_v: int = 256  # vocabulary entries per tile; also the vocabulary granularity of the filter
    block_k: int = 64
    num_warps: int = 8
    num_stages: int = 4
    keep_vocab: int = 8192  # width of a chunk of logits kept for a dense backward (a multiple of block_v)
    keep_stages: int = 3  # pipeline stages while kept logits leave by TMA (their 64 KiB tile needs the memory)
    # Logits are kept where recomputing one (2 D flops) costs more than its traffic (6 bytes), D >~ 720. 2026-11-25:
    # paper shape (D = 2304) 59.8 / 60.9 ms fwd+bwd against 60.5 / 64.0; Gemma-3-270M (D = 640) 20.8 against 20.0.
    keep_min_dim: int = 1024


@dataclass(frozen=True)
class BackwardTiles:
    extra_bytes: int = 136 << 20  # dZ chunk + float32 dE accumulator: 84 MiB at D = 640, 136 MiB at D = 2304
    dz_elements: int = 1 << 25  # largest dZ chunk (chunk rows x chunk_vocab): 64 MiB in bf16
    chunk_vocab: int = 4096  # multiple of block_v; dE is read and written once per vocabulary chunk
    workspace_vocab: int = 32768  # widest vocabulary chunk whose dZ lives in dC's unwritten rows (dense path)
    dz_block_v: int = 256  # vocabulary width of a dZ recompute tile; divides the filter tile (forward block_v)
    # dZ tiles taken in groups this wide over all rows, so a wave's E and C rows stay in L2. 2026-11-26 (ab16, paper
    # shape): dZ kernels of a step 10.74 ms at 8 (10.71 at 4) against 11.25 at 16.
    dz_group_v: int = 8
    dz_stages: int = 3
    # rows and warps of a program converting kept logits: 2026-11-25, paper shape's 8 chunks 0.81 ms at 8 rows and
    # 4 warps (2.65 TB/s) against 1.36 at 128 rows
    kept_rows: int = 8
    kept_warps: int = 4


# Forward: per-split partial results (max, sum, logit sum: 12 bytes per token and split) may take this many bytes.
SPLIT_BUFFER_BYTES = 4 << 20
# Forward: each program gets at least this many tiles (pipeline start and result stores spread; measured orders: 62+).
MIN_TILES_PER_PROGRAM = 64
# Forward's finishing kernel: tokens and hidden columns per program.
FINISH_BLOCK_R, FINISH_BLOCK_D = 16, 128

# Backward: the staircase runs where the plan keeps at most this share of tiles, else dense. 2026-11-25, real rows:
# Gemma-3-270M keeping 45% 17-19 ms filtered against 20-21 dense; SmolLM2-135M keeping 80-86% 7.6-8.8 against 5.5.
STAIRCASE_MAX_SHARE = 0.6
# Backward: bytes of gathered head rows a filtered backward holds (the widest piece: 76 tiles at D = 640 in bf16).
# 2026-11-25, Gemma-3-270M real rows: 15.3 ms fwd+bwd at beta 0 against 15.4 with 16 MiB; 440.7 MiB in all.
GATHER_BUFFER_BYTES = 24 << 20
# Backward: share of the sorted vocabulary's tiles queued before the host waits for the plan (keeps the GPU busy;
# results do not depend on it; a plan that turns out dense computes this share twice).
PREFIX_SHARE = 0.08

# Plan: tokens per program of the cutoff kernel (one 128-byte line of each tile row), and tiles per step.
CUTOFF_BLOCK_I, CUTOFF_BLOCK_T = 32, 128
# Plan: (tiles x tokens) masses per step of a block's walk: many loads in flight.
KEPT_ELEMENTS = 8192

# Head column sum: a 16 KiB bf16 tile per load; programs per SM. 2026-11-26 (ab13): a few hundred KiB of partials
# against torch.sum's 132 MiB (Gemma-3-270M's head) and 281 MiB (the paper's).
HEAD_SUM_BLOCK_R, HEAD_SUM_BLOCK_D = 32, 256
HEAD_SUM_PROGRAMS_PER_SM = 4

# Plan history: after a plan that went dense, this many calls of that head and filter minus one skip planning (every
# tile computed), and the next plans again. SmolLM2-135M's real rows keep 86%: the plan buys nothing there.
PROBE_EVERY = 16
