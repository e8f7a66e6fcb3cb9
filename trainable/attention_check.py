"""Before training: do the attention kernels a trial would use compute what PyTorch's math kernel computes?

``scaled_dot_product_attention`` picks a kernel (cuDNN, Flash, memory-efficient, math) per call from the shapes,
dtype and mask, and a fast kernel can be wrong for a shape its library mishandles while raising nothing. On one
real training micro-batch, in eval mode (no dropout), ``choose_attention`` computes the loss and its gradient
with respect to the input embeddings (which flows back through every attention call) under the candidate kernel
sets in turn (SDPA's own choice first) and keeps the first that agrees with the math kernel:

    |loss - loss_math| <= LOSS_RTOL * |loss_math| + 1e-3   and   cos(grad, grad_math) >= MIN_COSINE.

Disagreement between correct kernels is rounding (bf16: ~1e-3 relative); a wrong kernel differs by far more.

Memory: the check's forwards recompute every decoder layer in the backward (``recomputed_layers(..., always=True)``),
so they keep one layer's activations at a time, and the worker checks on one row of the micro-batch (SDPA picks its
kernel by head size, sequence length, dtype and mask, not by the batch): its peak is the trial's states plus
``trainable.layout.check_activation_bytes``, below the training step's (``trainable.layout.phase_peaks``).

Once per node: a verdict is a function of its key (model config, batch shapes and dtypes, engine, precision, GPU,
torch and cuDNN versions), so ``choose_attention_once`` keeps it in ``<directory>/<hash of the key>.json`` and a
later process of the node (the next sweep's first trial, another actor) reads it instead of checking again.

Several ranks: a candidate's model forward holds collectives (ZeRO-3's and FSDP2's gathers), so a rank whose
kernel raised mid-forward would leave the others waiting in one. Each rank first runs the candidate alone on the
attention calls it recorded in the reference forward (``AttentionCalls``, no collective); the candidate's forward
runs only where it ran on every rank.
"""

from __future__ import annotations

import json
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.overrides import TorchFunctionMode

from common.disk_cache import atomic_write, cache_key
from trainable.compiled import decoder_layers
from trainable.recompute import recomputed_layers

LOSS_RTOL = 0.02
MIN_COSINE = 0.99

MATH = (SDPBackend.MATH,)
# name -> kernels SDPA may pick from, fastest set first; None: SDPA's own choice among all of them
CANDIDATES: tuple[tuple[str, tuple[SDPBackend, ...] | None], ...] = (
    ("default", None),
    ("flash_efficient", (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH)),
    ("math", MATH),
)


@dataclass(frozen=True)
class AttentionChoice:
    """The kernel set a trial trains with, and what each candidate measured against the math kernel."""

    name: str
    backends: tuple[SDPBackend, ...] | None
    report: dict[str, str]  # candidate name -> "agrees ..." | "differs ..." | "fails: <error>"

    def context(self):
        """The kernels to train and score with, as a context manager."""
        return kernels(self.backends)


def kernels(backends: Sequence[SDPBackend] | None):
    """``sdpa_kernel(backends)``, or no restriction (SDPA's own choice) for None."""
    return sdpa_kernel(list(backends)) if backends is not None else nullcontext()


def loss_and_input_grad(loss_fn: Callable[[], torch.Tensor], embedding: torch.nn.Module,
                        backends: Sequence[SDPBackend] | None) -> tuple[float, torch.Tensor]:
    """(loss, d loss / d embedding output) of one forward under ``backends``; parameters' .grad untouched."""
    captured: list[torch.Tensor] = []
    handle = embedding.register_forward_hook(lambda module, args, output: captured.append(output))
    try:
        with torch.enable_grad(), kernels(backends):
            loss = loss_fn()
            (grad,) = torch.autograd.grad(loss, captured[-1])
    finally:
        handle.remove()
    return float(loss.detach()), grad.detach().float().flatten()


def agreement(loss: float, grad: torch.Tensor, ref_loss: float, ref_grad: torch.Tensor) -> tuple[bool, str]:
    """(agrees, description) of a candidate's loss and input gradient against the math kernel's."""
    cosine = float(torch.nn.functional.cosine_similarity(grad, ref_grad, dim=0, eps=1e-30))
    agrees = abs(loss - ref_loss) <= LOSS_RTOL * abs(ref_loss) + 1e-3 and cosine >= MIN_COSINE
    return agrees, f"{'agrees' if agrees else 'differs'}: loss {loss:.4f} vs {ref_loss:.4f}, grad cosine {cosine:.4f}"


class AttentionCalls(TorchFunctionMode):
    """Within the block, records the first ``scaled_dot_product_attention`` call of each kind (shapes, dtypes, mask
    and flags): inputs detached, so ``first_error`` can rerun them alone."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: dict[tuple, tuple[tuple, dict[str, Any]]] = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            key = tuple(_signature(value) for value in args) + tuple(
                (name, _signature(value)) for name, value in sorted(kwargs.items()))
            self.calls.setdefault(key, (tuple(_detached(value) for value in args),
                                        {name: _detached(value) for name, value in kwargs.items()}))
        return func(*args, **kwargs)

    def first_error(self, backends: Sequence[SDPBackend] | None) -> str | None:
        """The first line of the error a recorded call raises under ``backends`` (forward and backward), or None.
        The backward's output gradient is laid out as the output, as the model's is: PyTorch caches cuDNN's backward
        graph by q, k, v and the mask, not by that gradient's strides, so a lone backward in another layout (a
        sum's gradient, contiguous once cast) would leave a graph that misreads the model's gradient next."""
        try:
            with torch.enable_grad(), kernels(backends):
                for args, kwargs in self.calls.values():
                    q, k, v = (t.clone().requires_grad_(t.is_floating_point()) for t in args[:3])
                    out = F.scaled_dot_product_attention(q, k, v, *args[3:], **kwargs)
                    torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
        except RuntimeError as error:  # e.g. no kernel of the set supports this shape or device
            return str(error).splitlines()[0]
        return None


def _signature(value: Any) -> Any:
    return (tuple(value.shape), value.dtype, value.device.type) if isinstance(value, torch.Tensor) else value


def _detached(value: Any) -> Any:
    return value.detach() if isinstance(value, torch.Tensor) else value


def choose_attention(model: torch.nn.Module, loss_fn: Callable[[], torch.Tensor],
                     candidates: Sequence[tuple[str, tuple[SDPBackend, ...] | None]] = CANDIDATES
                     ) -> AttentionChoice:
    """The first candidate whose loss and input gradient agree with the math kernel's (math itself if none).

    ``model`` is the Hugging Face model (its input embedding is hooked); ``loss_fn()`` runs one forward of a fixed
    batch and returns the scalar loss. The model is in eval mode during the check and restored afterwards; every
    decoder layer recomputes its activations in the check's backward. With torch.distributed initialised a
    candidate runs its forward only if it ran alone on every rank's recorded attention calls, and is kept only if it
    agrees on every rank, so all ranks run the same forwards (as ZeRO-3's gathers need) and train with the same
    kernels.
    """
    was_training = model.training
    model.eval()
    embedding = model.get_input_embeddings()
    report: dict[str, str] = {}
    try:
        with recomputed_layers(model, len(decoder_layers(model)), always=True):
            with AttentionCalls() as calls:
                ref_loss, ref_grad = loss_and_input_grad(loss_fn, embedding, MATH)
            for name, backends in candidates:
                if backends == MATH:
                    break
                error = calls.first_error(backends)
                if not _on_every_rank(error is None, ref_grad.device):
                    report[name] = f"fails: {error}" if error else "fails on another rank"
                    continue
                try:
                    loss, grad = loss_and_input_grad(loss_fn, embedding, backends)
                    agrees, report[name] = agreement(loss, grad, ref_loss, ref_grad)
                except RuntimeError as error:  # one rank alone: nothing waits on it
                    agrees, report[name] = False, f"fails: {str(error).splitlines()[0]}"
                if _on_every_rank(agrees, ref_grad.device):
                    return AttentionChoice(name, backends, report)
    finally:
        model.train(was_training)
    report["math"] = "reference"
    return AttentionChoice("math", MATH, report)


_CHOSEN: dict[str, AttentionChoice] = {}  # this process's one-rank checks: key -> choice


def choose_attention_once(key: str, model: torch.nn.Module, loss_fn: Callable[[], torch.Tensor],
                          directory: Path | None = None) -> AttentionChoice:
    """``choose_attention``, run once per ``key`` (model config, batch shapes and dtypes, engine, precision, device:
    SDPA picks its kernel by those, not by the values): a warm actor's later trials take this process's answer, and
    with ``directory`` (the node cache) any process of the node takes the verdict saved there by the first (read on
    every rank only where every rank finds it, so all ranks run the same forwards or none)."""
    several = torch.distributed.is_available() and torch.distributed.is_initialized() and \
        torch.distributed.get_world_size() > 1
    if not several and key in _CHOSEN:
        return _CHOSEN[key]
    saved = _saved(key, directory)
    device = next(model.parameters()).device
    if _on_every_rank(saved is not None, device):
        choice = saved
    else:
        choice = choose_attention(model, loss_fn)
        if directory is not None and (not several or torch.distributed.get_rank() == 0):
            _save(choice, key, directory)
    if not several:
        _CHOSEN[key] = choice
    return choice


def _verdict_path(key: str, directory: Path) -> Path:
    cudnn = str(torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None)
    return Path(directory) / f"{cache_key(key, torch.__version__, cudnn)[:24]}.json"


def _saved(key: str, directory: Path | None) -> AttentionChoice | None:
    """The verdict saved for ``key`` in ``directory``, or None (none saved, or unreadable)."""
    if directory is None:
        return None
    try:
        saved = json.loads(_verdict_path(key, directory).read_text())
        backends = None if saved["backends"] is None else tuple(SDPBackend.__members__[b] for b in saved["backends"])
        return AttentionChoice(saved["name"], backends, saved["report"])
    except (OSError, ValueError, KeyError):
        return None


def _save(choice: AttentionChoice, key: str, directory: Path) -> None:
    path = _verdict_path(key, directory)
    backends = None if choice.backends is None else [b.name for b in choice.backends]
    text = json.dumps({"key": key, "name": choice.name, "backends": backends, "report": choice.report}, indent=1)
    atomic_write(path, lambda handle: handle.write(text.encode()))


def _on_every_rank(flag: bool, device: torch.device) -> bool:
    """``flag`` and-reduced over the torch.distributed group (just ``flag`` without one)."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return flag
    if torch.distributed.get_backend() != "nccl":
        device = torch.device("cpu")
    value = torch.tensor([int(flag)], device=device)
    torch.distributed.all_reduce(value, op=torch.distributed.ReduceOp.MIN)
    return bool(value.item())
