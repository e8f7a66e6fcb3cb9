"""Compile a head's Triton kernels ahead of its first calls, in background threads, while the caller loads its model.

A kernel compiles at the first launch of each new specialisation, with the GPU idle: on a fresh H200 host
(2026-11-29) a sweep's first trial compiled the head's kernels one after another in its attention check, its first
steps and its scoring, about a second each. ``head_calls`` are the kinds of call a trial makes, on a few random rows
of a stand-in head: forward and backward under the trial's filter on peaked rows (a trained model's distribution:
the filtered backward), the same dense with kept logits (a flat softmax: the steps after a plan that went dense) and
the forward alone (validation, scoring). ``precompile`` runs them one per thread; LLVM and ptxas run outside the GIL,
so they compile side by side and beside the caller's load. The stand-in head has the trial's hidden size, dtype,
label smoothing and softcap, and a vocabulary of the same residue modulo the kept-logits chunk (every width the
kernels specialise or branch on divides it) of at most three chunks: the same compiled kernels for tens of MiB.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch

from kernels.api import linear_cross_entropy
from kernels.plan_history import PlanHistory
from kernels.tuning import GATHER_BUFFER_BYTES, BackwardTiles, ForwardTiles

ROWS = 256  # rows of the calls with gradients: two row blocks
SCORING_ROWS = 37  # any count: the row-dependent sizes are not specialised on (tests/kernels/test_specialization.py)
PEAKED_TARGETS = 64  # distinct targets of the peaked rows: they sort first, the filter skips the tiles behind them
PEAK = 30.0  # the peaked rows' target logit (the others ~ N(0, PEAK^2 / D))
CUBLAS_WORKSPACE_BYTES = 96 << 20  # cuBLAS's and cuBLASLt's workspaces of a new stream (32 + 64 MiB on an H200)


def stand_in_vocab(vocab: int, period: int = ForwardTiles.keep_vocab) -> int:
    """The vocabulary up to three kept-logits chunks (``period`` entries each), else two chunks plus its residue: the
    same tiles whole, and room to keep logits."""
    return vocab if vocab <= 3 * period else 2 * period + vocab % period


def head_calls(vocab: int, dim: int, dtype: torch.dtype, device: torch.device, tokens: int, label_smoothing: float,
               softcap: float | None, filter: str) -> list[Callable[[], None]]:
    """The kinds of head call of a trial whose micro-batch holds ``tokens`` rows (see the module docstring), on a
    stand-in head drawn here. The dense call is left out where it would not keep logits as the trial's does
    (``forward.kept_chunks``)."""
    from kernels import forward  # imports Triton: only where the kernels run

    v = stand_in_vocab(vocab, forward.TILES.keep_vocab)
    weight = (torch.randn(v, dim, generator=torch.Generator(device=device).manual_seed(0), device=device)
              * dim**-0.5).to(dtype)
    options = dict(label_smoothing=label_smoothing, softcap=softcap)

    def with_gradients(run_filter: str, peaked: bool) -> Callable[[], None]:
        def call() -> None:
            g = torch.Generator(device=device).manual_seed(1)
            targets = torch.randint(0, PEAKED_TARGETS if peaked else v, (ROWS,), generator=g, device=device)
            hidden = weight[targets] * PEAK if peaked else torch.randn(ROWS, dim, generator=g, device=device).to(dtype)
            linear_cross_entropy(hidden.requires_grad_(), weight.detach().requires_grad_(), targets,
                                 filter=run_filter, plan_history=PlanHistory(), **options).backward()
        return call

    def forward_only() -> None:
        g = torch.Generator(device=device).manual_seed(2)
        hidden = torch.randn(SCORING_ROWS, dim, generator=g, device=device).to(dtype)
        with torch.no_grad():
            linear_cross_entropy(hidden, weight, torch.randint(0, v, (SCORING_ROWS,), generator=g, device=device),
                                 reduction="none", **options)

    keeps_alike = (forward.kept_chunks(tokens, vocab, dim) > 0) == (forward.kept_chunks(ROWS, v, dim) > 0)
    dense = [with_gradients("none", peaked=False)] if keeps_alike and filter != "none" else []
    return [with_gradients(filter, peaked=True), *dense, forward_only]


def precompile_bytes(vocab: int, dim: int, itemsize: int) -> int:
    """What ``precompile`` allocates at most on the device: the stand-in head and two calls' head gradients, and per
    call with gradients its rows' hidden states, their gradients and float32 accumulator, a dZ chunk, the filter's
    gathered head rows, per vocabulary entry 24 bytes (the filter's order and positions, the tiles' statistics) and
    the cuBLAS workspaces of its thread's stream (``CUBLAS_WORKSPACE_BYTES``). The 1B head (V 128256, D 2048) on an
    H200 (2026-11-29): 386 MiB measured at most over six precompiles, 508 MiB here."""
    v = stand_in_vocab(vocab)
    per_call = (ROWS * (dim * (2 * itemsize + 4) + BackwardTiles.chunk_vocab * itemsize) + 24 * v
                + GATHER_BUFFER_BYTES + CUBLAS_WORKSPACE_BYTES)
    return 3 * v * dim * itemsize + 2 * per_call


def precompile(vocab: int, dim: int, dtype: torch.dtype, device: torch.device, tokens: int, label_smoothing: float,
               softcap: float | None, filter: str) -> Callable[[], None]:
    """Start ``head_calls`` in daemon threads, each on its own stream of ``device``; returns the join. A call that
    raises prints one line at the join: its kernels compile at the trial's own calls."""
    failures: list[str] = []

    def run(call: Callable[[], None]) -> None:
        try:
            torch.cuda.set_device(device)
            with torch.cuda.stream(torch.cuda.Stream(device)):
                call()
                torch.cuda.current_stream(device).synchronize()
        except Exception as error:  # noqa: BLE001 - work ahead only: the trial's own calls compile what is left
            failures.append(f"{type(error).__name__}: {error}".splitlines()[0])

    calls = head_calls(vocab, dim, dtype, device, tokens, label_smoothing, softcap, filter)
    threads = [threading.Thread(target=run, args=(call,), daemon=True, name="calsweep-precompile") for call in calls]
    for thread in threads:
        thread.start()

    def join() -> None:
        for thread in threads:
            thread.join()
        # each thread's stream left cuBLAS workspaces (96 MiB a call on an H200), which PyTorch keeps per handle and
        # stream for the process's life: a sweep's eighth trial peaked 776 MiB over its prediction
        torch._C._cuda_clearCublasWorkspaces()
        for failure in failures:
            print(f"[calsweep] precompiling the head's kernels failed (they compile at first use): {failure}",
                  flush=True)

    return join
