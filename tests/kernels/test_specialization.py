"""One compiled kernel per head and flags, whatever the batch.

Triton compiles a kernel once per key: its constexprs and options, and per other argument the type plus, unless the
argument is marked ``do_not_specialize``, whether an integer is 1 or a multiple of 16 (a pointer: 16-byte aligned).
A trial's head runs at the attention check's one row, at its training batch and at every scoring batch (as many
rows as that batch reads): each new key is a compile of a second or more with the GPU idle (a fresh H200,
2026-11-29: 20 compiles of the head's kernels in a sweep's first trial, four of `_lse_forward_kernel` in its
scoring alone). Here the launches of a trial's calls run under the interpreter, their keys are taken as Triton's
JIT takes them (``native_specialize_impl``), and each kernel must have one key per constexprs and options.
"""

from __future__ import annotations

import inspect
from collections import defaultdict

import pytest
import torch

if torch.cuda.is_available():
    pytest.skip("interpreter tests run on CPU-only machines", allow_module_level=True)
pytest.importorskip("triton")

from triton._C.libtriton import native_specialize_impl  # noqa: E402
from triton.backends.compiler import BaseBackend  # noqa: E402
from triton.runtime import interpreter  # noqa: E402

from kernels import backward, forward, head_sum, linear_cross_entropy, plan_triton  # noqa: E402
from kernels.plan_history import PlanHistory  # noqa: E402
from kernels.testing import make_case  # noqa: E402

V, D = 700, 40
KERNELS = {name: fn for module in (forward, backward, plan_triton, head_sum) for name, fn in vars(module).items()
           if isinstance(fn, interpreter.InterpretedFunction) and name.endswith("_kernel")}


def launch_key(kernel: interpreter.InterpretedFunction, args: tuple, kwargs: dict) -> tuple[tuple, tuple]:
    """(constexprs and options, the other arguments' specialisation) of one launch, as ``triton.jit`` keys it."""
    params = inspect.signature(kernel.fn).parameters
    bound = dict(zip(params, args)) | {k: v for k, v in kwargs.items() if k in params}
    plain = set(kernel.kwargs.get("do_not_specialize") or ())
    flags, runtime = [], []
    for name, param in params.items():
        if "constexpr" in str(param.annotation):
            flags.append((name, bound[name]))
        else:
            runtime.append(native_specialize_impl(BaseBackend, bound[name], False, name not in plain, True))
    options = tuple(sorted((k, v) for k, v in kwargs.items() if k not in params))
    return tuple(flags) + options, tuple(runtime)


@pytest.fixture
def launches(monkeypatch: pytest.MonkeyPatch) -> dict[str, dict[tuple, set[tuple]]]:
    """kernel name -> constexprs and options -> the specialisations launched with them."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    seen: dict[str, dict[tuple, set[tuple]]] = defaultdict(lambda: defaultdict(set))
    for name, kernel in KERNELS.items():
        def record(*args, _name=name, _kernel=kernel, **kwargs):  # noqa: ANN002, ANN003, ANN202
            flags, runtime = launch_key(_kernel, args, kwargs)
            seen[_name][flags].add(runtime)
        monkeypatch.setattr(kernel, "pre_run_hooks", [*kernel.pre_run_hooks, record])
    return seen


def _step(weight: torch.Tensor, n: int, beta: float, history: PlanHistory, seed: int) -> None:
    """A training step's head: loss over n rows, backward into the hidden states and the head."""
    hidden, _, targets = make_case(n, V, D, torch.bfloat16, ignore_frac=0.1, seed=seed)
    h = hidden.requires_grad_(True)
    w = weight.detach().requires_grad_(True)
    linear_cross_entropy(h, w, targets, label_smoothing=beta, plan_history=history).backward()


@pytest.mark.parametrize("beta", [0.0, 0.1])
def test_a_trials_batches_compile_each_kernel_once(launches, beta: float) -> None:
    """The attention check's one row (48 tokens), two training steps of 3 rows (144; the second goes dense after
    the first planned a flat softmax), scoring reads of 5, 37, 64 and 129 rows: every kernel launched under one
    set of constexprs has one specialisation. Before the row-dependent sizes were left unspecialised, scoring's
    `_lse_forward_kernel` took four here and `_finish_kernel` two."""
    _, weight, _ = make_case(1, V, D, torch.bfloat16, seed=0)
    history = PlanHistory()
    for step, n in enumerate((48, 144, 144)):
        _step(weight, n, beta, history, seed=step)
    with torch.no_grad():
        for n in (5, 37, 64, 129):
            hidden, _, targets = make_case(n, V, D, torch.bfloat16, seed=10 + n)
            linear_cross_entropy(hidden, weight, targets, reduction="none")
    assert {"_lse_forward_kernel", "_finish_kernel", "_dz_kernel"} <= set(launches)
    several = {name: counts for name, by_flags in launches.items()
               if (counts := [len(keys) for keys in by_flags.values() if len(keys) > 1])}
    assert not several, f"compiled more than once under one set of constexprs: {several}"


def _keys(launched: dict[str, dict[tuple, set[tuple]]]) -> dict[str, set[tuple]]:
    return {name: {(flags, key) for flags, keys in by_flags.items() for key in keys} for name, by_flags in
            launched.items()}


@pytest.mark.parametrize(("beta", "peaked"), [(0.0, True), (0.1, False), (0.1, True)])
def test_precompile_compiles_what_a_trial_launches(launches, monkeypatch: pytest.MonkeyPatch, beta: float,
                                                   peaked: bool) -> None:
    """A trial's head calls (as above: its check, four steps, scoring; peaked rows are a trained model's, whose
    backward the filter skips, flat ones a random init's, dense with kept logits from the second step on) launch
    nothing that ``kernels.precompile.head_calls`` did not. Kept-logits chunks of 256 entries, D = 160 (production's
    proportions: the stand-in head keeps logits at its 256 rows where the trial's does): the trial's head has
    V = 3 x 256 + 188, the stand-in 2 x 256 + 188."""
    from kernels import precompile
    from kernels.tuning import BackwardTiles, ForwardTiles

    monkeypatch.setattr(forward, "TILES", ForwardTiles(keep_vocab=256, keep_min_dim=32))
    monkeypatch.setattr(backward, "TILES", BackwardTiles(dz_elements=128 * 512, chunk_vocab=512))
    vocab, dim, rows = 3 * 256 + 188, 160, 64
    assert precompile.stand_in_vocab(vocab, 256) == 2 * 256 + 188
    assert forward.kept_chunks(rows, vocab, dim) > 0
    calls = precompile.head_calls(vocab, dim, torch.bfloat16, torch.device("cpu"), rows, beta, None, "exact")
    assert len(calls) == 3
    for call in calls:
        call()
    ahead = _keys(launches)
    launches.clear()
    history = PlanHistory()
    for step, n in enumerate((48, rows, rows, rows)):
        hidden, weight, targets = make_case(n, vocab, dim, torch.bfloat16, peaked=peaked, seed=step)
        linear_cross_entropy(hidden.requires_grad_(), weight.requires_grad_(), targets, label_smoothing=beta,
                             plan_history=history).backward()
    with torch.no_grad():
        for n in (5, 64):
            hidden, weight, targets = make_case(n, vocab, dim, torch.bfloat16, seed=20 + n)
            linear_cross_entropy(hidden, weight, targets, label_smoothing=beta, reduction="none")
    assert any(("KEEP_LOGITS", True) in flags
               for flags in launches["_lse_forward_kernel"]) != peaked
    missed = {name: n for name, keys in _keys(launches).items() if (n := len(keys - ahead.get(name, set())))}
    assert not missed, f"launched by the trial, not precompiled: {missed}"
