"""sweeps.failures: a failed trial's root error in one line (through Ray Train's real ``WorkerGroupError``, whose
text cuts each worker's traceback short), which errors recur (no retry), and the console's out-of-memory line."""

import traceback

import pytest
import torch
from ray.train import WorkerGroupError
from ray.train.v2._internal.exceptions import UserExceptionWithTraceback
from ray.train.v2._internal.execution.worker_group.poll import WorkerGroupPollStatus, WorkerStatus

from common.datasource import DataSourceError
from sweeps.failures import describe, one_line, recurs, retry_reason
from trainable.trial_memory import out_of_memory_peak_gib, peak_on_out_of_memory
from trainable.worker import NonFiniteLossError

# PyTorch's caching allocator's message (c10/cuda/CUDACachingAllocator.cpp), as a GPU trial raises it
CUDA_OOM = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.53 "
            "GiB is free. Including non-PyTorch memory, this process has 77.65 GiB memory in use. Of the allocated "
            "memory 75.12 GiB is allocated by PyTorch, and 1.98 GiB is reserved by PyTorch but unallocated. If "
            "reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
            "to avoid fragmentation.  See documentation for Memory Management  "
            "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)")


def _raised_in_a_worker(error: BaseException, depth: int = 12) -> UserExceptionWithTraceback:
    """``error`` raised ``depth`` calls deep, wrapped with its traceback as Ray Train's worker wraps it."""
    def call(level: int) -> None:
        if level == 0:
            raise error
        call(level - 1)

    try:
        call(depth)
    except BaseException as exc:  # noqa: BLE001 - any error a worker raises
        return UserExceptionWithTraceback(exc, traceback.format_exc())


def _worker_group_error(errors: dict[int, BaseException]) -> WorkerGroupError:
    """The error Ray Train's controller raises from ``trainer.fit()`` for these workers' errors (its own code)."""
    statuses = {rank: WorkerStatus(running=False, error=_raised_in_a_worker(error)) for rank, error in errors.items()}
    return WorkerGroupPollStatus(statuses).get_worker_group_error()


def test_one_line_is_the_innermost_cause():
    try:
        try:
            raise KeyError("tokenizer")
        except KeyError as exc:
            raise RuntimeError("loading\nfailed") from exc
    except RuntimeError as exc:
        assert one_line(exc) == "KeyError: 'tokenizer'"
    assert one_line(ValueError("two\n  lines")) == "ValueError: two lines"


def test_a_worker_group_errors_line_is_its_first_failing_ranks_whole_error():
    error = _worker_group_error({1: torch.OutOfMemoryError(CUDA_OOM), 0: RuntimeError("Connection closed by peer")})
    assert "Output truncated" in str(error) and f"OutOfMemoryError: {CUDA_OOM}" not in str(error)  # Ray cut it
    assert one_line(error) == "RuntimeError: Connection closed by peer"  # rank 0 failed too: the lowest rank's
    alone = _worker_group_error({1: torch.OutOfMemoryError(CUDA_OOM)})
    assert one_line(alone) == f"torch.OutOfMemoryError: {' '.join(CUDA_OOM.split())}"
    assert out_of_memory_peak_gib(alone.worker_failures[1]) == pytest.approx(75.12)  # "75.12 GiB is allocated"


def test_a_worker_error_ray_kept_only_as_text_is_its_last_error_line():
    error = WorkerGroupError("[Rank 0 Error Snippet]:\nTraceback (most recent call last):\n  File \"w.py\", line 3\n"
                             "common.datasource.DataSourceError: missing /data/hellaswag/hellaswag_val.jsonl\n",
                             {})
    assert one_line(error) == "common.datasource.DataSourceError: missing /data/hellaswag/hellaswag_val.jsonl"


def test_an_out_of_memory_error_carries_its_ranks_peak():
    with pytest.raises(torch.OutOfMemoryError) as raised, peak_on_out_of_memory(torch.device("cpu")):
        raise torch.OutOfMemoryError("CUDA out of memory.")
    assert raised.value.gpu_peak_gib is None and out_of_memory_peak_gib(raised.value) is None  # the CPU has none
    marked = torch.OutOfMemoryError(CUDA_OOM)
    marked.gpu_peak_gib = 70.5  # what peak_on_out_of_memory sets on CUDA: it wins over the message
    assert out_of_memory_peak_gib(marked) == 70.5
    assert out_of_memory_peak_gib(torch.OutOfMemoryError("Of the allocated memory 512.00 MiB is allocated by "
                                                         "PyTorch")) == 0.5


@pytest.mark.parametrize("error, again", [
    (ValueError("expected at least micro_batch_size=2 packed rows per rank, got 1"), False),
    (KeyError("input_ids"), False),
    (TypeError("forward() got an unexpected keyword argument 'labels'"), False),
    (DataSourceError("the hub did not answer"), True),  # the hub may answer the next time
    (NonFiniteLossError("training loss is nan at step 3"), False),
    (torch.OutOfMemoryError(CUDA_OOM), True),  # a co-tenant's peak may not coincide again
    (RuntimeError("Connection closed by peer"), True),  # a lost peer
    (OSError("No space left on device"), True),
])
def test_only_errors_that_can_go_otherwise_are_retried(error, again):
    assert recurs(error) is not again
    assert recurs(_worker_group_error({0: error})) is not again  # the worker's error decides, not Ray's wrapper


def test_an_out_of_memory_row_says_its_layout_and_peaks():
    row = {"status": "failed", "error": f"torch.OutOfMemoryError: {CUDA_OOM}", "world_size": 2, "engine": "fsdp2",
           "zero_stage": 3, "micro_batch_size": 4, "gradient_accumulation_steps": 2, "activation_checkpointing": 8,
           "gpu_peak_predicted_gib": 61.04, "gpu_peak_gib": 75.12}
    assert describe(row) == ("out of GPU memory on 2 workers, ZeRO-3 (fsdp2), micro-batch 4 x 2, 8 layers recomputed; "
                             f"peak planned 61.0 GiB, measured 75.1 GiB: torch.OutOfMemoryError: {CUDA_OOM}")
    on_cpu = {**row, "gpu_peak_predicted_gib": None, "gpu_peak_gib": None}
    assert "peak planned n/a, measured n/a: " in describe(on_cpu)
    assert retry_reason(row, "ray.exceptions.RayTaskError: whatever").startswith("out of GPU memory on 2 workers")
    assert describe({**row, "error": "ValueError: bad"}) == "ValueError: bad"


def test_a_retry_without_the_drivers_row_says_why():
    assert retry_reason(None, "ray.exceptions.ActorDiedError: the actor died") == (
        "its driver or node failed: ray.exceptions.ActorDiedError: the actor died")
    store_error = "sweeps.store.StoreWriteError: results store /r/trials: could not write x.parquet (Is a directory)"
    assert retry_reason(None, store_error) == f"its row could not be written: {store_error}"
