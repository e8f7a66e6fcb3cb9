"""trial_vs_row.py: its kernel categories and busy-time union, and a real run on the CPU of the row, the sweep's
trial, the trial with the old synced checkpoint clock and one lever (the GPU's figures need a GPU)."""

import collections
import json

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import _cur_sdpa_kernel_backends
from torch.overrides import TorchFunctionMode

from sweeps import warm_trial
from trainable import checkpointing


@pytest.fixture(scope="module")
def script(benchmark_script):
    return benchmark_script("trial_vs_row")


@pytest.mark.parametrize("kernel, expected", [
    ("_lse_forward_kernel", "LS-CE kernel"),
    ("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0", "fused elementwise"),
    ("fmha_cutlassF_bf16_aligned_64x64_rf_sm80", "attention"),
    ("pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128>>", "attention"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "GEMM"),
    ("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NTT", "GEMM"),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdamMathFunctor>", "optimizer"),
    ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "FSDP/NCCL copies"),
    ("Memcpy HtoD (Pinned -> Device)", "FSDP/NCCL copies"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>", "other"),
])
def test_kernels_fall_in_their_category(script, kernel, expected):
    assert script.category(kernel) == expected


def test_busy_time_counts_overlapping_kernels_once(script):
    assert script._union_us([(0, 10), (5, 12), (20, 21), (20.5, 20.7)]) == pytest.approx(13)
    assert script._union_us([]) == 0


def test_the_table_names_each_path_s_attention_kernels(script):
    profile = {"attention ms": 1.0, "wall ms": 2.0}
    row = script.Measured("row", 100.0, 10.0, 1000.0, profile, {"cudnn_generated_fort_native_sdpa_sm90_fprop": 0.4},
                          {"graphs": 1, "graph_breaks": 0, "recompiles": 0}, "unchecked", {})
    trial = row._replace(name="trial", tokens_per_s=50.0, attention_kernels={"fmha_cutlassF_bf16_aligned": 0.9})
    lines = script.table([row, trial]).splitlines()
    assert "0.500" in lines[2]  # the trial against its row
    assert "attention kernels of row (ms/step): cudnn_generated_fort_native_sdpa_sm90_fprop 0.4" in lines
    assert "attention kernels of trial (ms/step): fmha_cutlassF_bf16_aligned 0.9" in lines


def test_row_trial_and_a_lever_on_the_cpu(script, data_dir, tmp_path, capsys):
    out = tmp_path / "tvr.json"
    script.main(["--shape", "tiny", "--seq-len", "128", "--max-examples", "48", "--steps", "2", "--warmup", "1",
                 "--profile-steps", "1", "--levers", "row_data", "--data-dir", data_dir, "--out", str(out)])
    record = json.loads(out.read_text())
    paths = {p["name"]: p for p in record["paths"]}
    assert list(paths) == ["row", "trial", "trial_synced_clock", "trial:row_data"]
    assert all(p["tokens_per_s"] > 0 and p["ms_per_step"] > 0 and p["profile"]["wall ms"] > 0 for p in paths.values())
    assert all(p["attention_kernels"] == {} for p in paths.values())  # no GPU kernels on the CPU
    # the trial's rows are its own packing of the sweep's examples; the lever hands it the row's batches
    assert paths["trial"]["tokens_per_step"] == paths["trial_synced_clock"]["tokens_per_step"]
    assert paths["trial:row_data"]["tokens_per_step"] == pytest.approx(paths["row"]["tokens_per_step"], rel=0.35)
    assert paths["row"]["attention"] == "unchecked" and paths["trial"]["attention"] in ("default", "flash_efficient",
                                                                                        "math")
    assert list(paths["trial"]["attention_report"])[0] == "default"  # the check ran: SDPA's own choice first
    trial = record["trial"]
    assert trial["train"]["pack"] and trial["train"]["pack_length"] == 128 and trial["learning_rate"] == 1e-4
    assert checkpointing.CheckpointSchedule.__name__ == "CheckpointSchedule"  # the old clock's stand-in is gone
    assert "trial_synced_clock" in capsys.readouterr().out


def test_unknown_lever_is_refused_naming_it(script, capsys):
    with pytest.raises(SystemExit):
        script.main(["--levers", "no_reports,warp_drive"])
    assert "warp_drive" in capsys.readouterr().err


class SdpaCalls(TorchFunctionMode):
    """Within the block, counts the ``scaled_dot_product_attention`` calls by what SDPA picks its kernel from: each
    tensor's shape, dtype and strides, the other arguments, the kernels enabled and the grad mode."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: collections.Counter = collections.Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            described = [_described(a) for a in args] + [(k, _described(v)) for k, v in sorted(kwargs.items())]
            self.calls[(tuple(described), tuple(_cur_sdpa_kernel_backends()), torch.is_grad_enabled())] += 1
        return func(*args, **kwargs)


def _described(value):
    return (tuple(value.shape), value.dtype, value.stride()) if isinstance(value, torch.Tensor) else value


def test_the_trial_trains_with_the_row_s_attention_calls(script, data_dir, tmp_path):
    """The row's and the trial's training steps call SDPA alike (CPU, eager): the same q, k, v and packed-mask
    layouts, flags and kernels; the checked trial adds only its check's one-row calls."""
    args = script.parse_args(["--shape", "tiny", "--seq-len", "128", "--max-examples", "48", "--steps", "1",
                              "--warmup", "1", "--profile-steps", "1", "--data-dir", data_dir])
    device = torch.device("cpu")
    warm_trial.process_group(device)
    trial, sweep = script.sweep_trial(args, tmp_path / "results")
    calls = {}
    for lever in ("row", "no_attention_check", None):
        with SdpaCalls() as recorded:
            if lever == "row":
                script.run_row(args, device, trial.train.micro_batch_size)
            else:
                script.run_trial_path(args, device, trial, sweep, "trial", lever)
        calls[lever] = recorded.calls
    row = set(calls["row"])
    assert row and all(q[0][0] == trial.train.micro_batch_size for (q, *_), *_ in row)
    mask = dict(next(iter(row))[0][3:])["attn_mask"]
    assert mask[0] == (trial.train.micro_batch_size, 1, 128, 128) and mask[1] == torch.bool  # the packed rows' mask
    assert set(calls["no_attention_check"]) == row
    checked = set(calls[None])
    assert row <= checked and all(q[0][0] == 1 for (q, *_), *_ in checked - row)  # the check's probe: one row
