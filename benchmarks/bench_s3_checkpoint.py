"""Time and bytes of a trial checkpoint written to and read back from an S3 bucket (a local S3 server this script
starts: no network needed).

    python benchmarks/bench_s3_checkpoint.py --out docs/measurements/2026-11-28-s3/checkpoint_1b.json  # on a GPU
    python benchmarks/bench_s3_checkpoint.py --shape tiny                                              # CPU, seconds

The model is ``bench_sft_throughput.SHAPES[--shape]`` (``1b``: Llama-3.2-1B's shape), random init, under the
engine a one-GPU trial trains it with (``trainable.config.engine_for``: DeepSpeed ZeRO-``--zero-stage``, or FSDP2),
after one optimiser step on random tokens so that the optimizer's state exists. The checkpoint is the trial's:
``trainable.checkpointing.save`` into a local folder (weights, optimizer state, RNG, loop and trial records),
uploaded as a warm trial's (``sweeps.checkpoints.persist``) to ``s3://calsweep-bench/ckpt`` on a local S3 server
over HTTP (``--server``: ``rclone_s3``, file-backed, for checkpoints of gigabytes; or moto's, ``local_s3``, which also
counts requests but keeps objects in memory and reads a whole object per ranged GET), downloaded again as a resumed trial's (``sweeps.checkpoints.latest``) and loaded into the
engine (``trainable.checkpointing.restore``). Printed and written: the checkpoint's size and files, the seconds and
MB/s of each phase, the requests (moto) and bytes the server saw; each phase is printed and written to ``--out``
(``complete: false``) as it ends, so that a run stopped midway keeps what it measured. The server keeps objects in
its process (memory, then temporary files), so the upload and download rates are those of a local server, an upper
bound for a remote one.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_sft_throughput import SHAPES  # noqa: E402 - the script's own folder
from local_s3 import local_s3  # noqa: E402
from rclone_s3 import rclone_s3  # noqa: E402

from common.disk_cache import atomic_write  # noqa: E402
from common.ports import free_port  # noqa: E402

RUN = "bench-ckpt"
SERVERS = {"rclone": rclone_s3, "moto": local_s3}


def _folder_bytes(folder: Path) -> tuple[int, int]:
    """Bytes and number of files under ``folder``."""
    files = [p for p in folder.rglob("*") if p.is_file()]
    return sum(p.stat().st_size for p in files), len(files)


def _one_rank_group(device) -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        return
    port = free_port()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=0, world_size=1)


def _engine(shape: str, zero_stage: int, seq_len: int, device):
    """The shape's random-init model under a one-rank trial's engine, after one optimiser step; (engine, name,
    parameters)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from trainable import deepspeed_setup, fsdp2_engine
    from trainable.config import TrainConfig, engine_for
    from trainable.lm_head import CausalLMWithFusedLoss
    from trainable.step_accounting import optimizer_step

    torch.manual_seed(0)
    config = AutoConfig.for_model("llama", **SHAPES[shape], attn_implementation="sdpa")
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    parameters = sum(p.numel() for p in model.parameters())
    train = TrainConfig(max_steps=1, micro_batch_size=1, gradient_accumulation_steps=1, zero_stage=zero_stage)
    name = engine_for(train, 1, device.type)
    build = fsdp2_engine.build_engine if name == "fsdp2" else deepspeed_setup.build_engine
    engine, _ = build(CausalLMWithFusedLoss(model, 0.1), train, 1e-5, 1, device, 1)
    ids = torch.randint(0, config.vocab_size, (1, seq_len))
    optimizer_step(engine, [{"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}], device, 1)
    return engine, name if name == "fsdp2" else f"deepspeed zero-{zero_stage}", parameters


def _traffic(s3, mark: int, moved_bytes: Callable[[], int], upload: bool) -> dict[str, int | None]:
    """Requests and body bytes the server answered since request ``mark`` (moto counts them); rclone counts none:
    its requests are None, its bytes ``moved_bytes()`` (what the bucket holds after an upload, what arrived on the
    local disk after a download)."""
    if s3.requests is None:
        moved = moved_bytes()
        return {"requests": None, "bytes_sent": moved if upload else 0, "bytes_received": 0 if upload else moved}
    requests = s3.requests[mark:]
    return {"requests": len(requests), "bytes_sent": sum(r.bytes_in for r in requests),
            "bytes_received": sum(r.bytes_out for r in requests)}


def measure(shape: str, zero_stage: int, seq_len: int, server: str = "rclone", progress: Callable[[str, dict], None] = lambda *_: None
            ) -> dict:
    """Save, upload, download and restore one checkpoint; seconds, bytes and requests of each phase.
    ``progress(phase, result so far)`` after each phase: a run stopped midway keeps what it measured."""
    import torch

    from sweeps import checkpoints
    from trainable import checkpointing
    from kernels.plan_history import PlanHistory

    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    _one_rank_group(device)
    engine, engine_name, parameters = _engine(shape, zero_stage, seq_len, device)
    state = checkpointing.LoopState(step=1, total_steps=1, train_loss_first=0.0, train_loss=0.0, confidence=0.0,
                                    val_loss=None, tokens=seq_len)
    result = {"shape": shape, "parameters": parameters, "engine": engine_name, "device": str(device),
              "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", "server": server}
    with tempfile.TemporaryDirectory(prefix="calsweep-bench-") as scratch, SERVERS[server]("calsweep-bench") as s3, \
            s3.exported():
        storage = f"s3://{s3.bucket}/ckpt"
        local = Path(scratch) / "checkpoint"
        start = time.perf_counter()
        checkpointing.save(engine, local, state, {"bench": shape}, 0, 1, PlanHistory())
        result["save_local_s"] = time.perf_counter() - start
        result["checkpoint_bytes"], result["checkpoint_files"] = _folder_bytes(local)
        progress("save", result)

        mark, start = len(s3.requests or ()), time.perf_counter()
        checkpoints.persist(storage, RUN, local, keep=1)
        result["upload_s"] = time.perf_counter() - start
        result["upload"] = _traffic(s3, mark, lambda: s3.object_bytes("ckpt/"), upload=True)
        progress("upload", result)
        shutil.rmtree(local)  # a node's disk holds one copy at a time

        mark, start = len(s3.requests or ()), time.perf_counter()
        with checkpoints.latest(storage, RUN) as downloaded:
            result["download_s"] = time.perf_counter() - start
            size, files = _folder_bytes(downloaded)
            result["download"] = _traffic(s3, mark, lambda: size, upload=False)
            progress("download", result)
            if (size, files) != (result["checkpoint_bytes"], result["checkpoint_files"]):
                raise RuntimeError(f"expected the checkpoint back whole ({result['checkpoint_bytes']} bytes in "
                                   f"{result['checkpoint_files']} files), got {size} bytes in {files} files")
            start = time.perf_counter()
            checkpointing.restore(engine, downloaded, 0)
            result["restore_s"] = time.perf_counter() - start
            progress("restore", result)
    gb = result["checkpoint_bytes"] / 1e9
    result["upload_gb_per_s"] = gb / result["upload_s"]
    result["download_gb_per_s"] = gb / result["download_s"]
    return result


def _count(requests: int | None) -> str:
    return "-" if requests is None else str(requests)


def table(result: dict) -> str:
    gb = result["checkpoint_bytes"] / 1e9
    lines = [f"{result['shape']} ({result['parameters'] / 1e6:,.1f}M params, {result['engine']}, "
             f"{result['device_name']}, {result['server']} server): checkpoint {gb:.2f} GB in "
             f"{result['checkpoint_files']} files",
             f"{'phase':<28}{'seconds':>9}{'GB/s':>8}{'requests':>10}{'GB over HTTP':>14}",
             f"{'save (local folder)':<28}{result['save_local_s']:>9.2f}{gb / result['save_local_s']:>8.2f}"
             f"{'-':>10}{'-':>14}",
             f"{'upload (persist)':<28}{result['upload_s']:>9.2f}{result['upload_gb_per_s']:>8.2f}"
             f"{_count(result['upload']['requests']):>10}{result['upload']['bytes_sent'] / 1e9:>14.2f}",
             f"{'download (latest)':<28}{result['download_s']:>9.2f}{result['download_gb_per_s']:>8.2f}"
             f"{_count(result['download']['requests']):>10}{result['download']['bytes_received'] / 1e9:>14.2f}",
             f"{'restore (into the engine)':<28}{result['restore_s']:>9.2f}{gb / result['restore_s']:>8.2f}"
             f"{'-':>10}{'-':>14}"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", default="1b", choices=sorted(SHAPES), help="model shape (tiny: CPU, seconds)")
    parser.add_argument("--zero-stage", type=int, default=0, choices=(0, 1, 2, 3),
                        help="the one-GPU trial's ZeRO stage (3: FSDP2 on a GPU, as a trial's layout picks it)")
    parser.add_argument("--seq-len", type=int, default=128, help="tokens of the one training step")
    parser.add_argument("--server", default="rclone", choices=sorted(SERVERS),
                        help="the local S3 server (moto: counts requests, for checkpoints of megabytes only)")
    parser.add_argument("--out", type=Path, default=None, help="JSON to write")
    args = parser.parse_args(argv)
    header = {"date": dt.date.today().isoformat(), "command": " ".join(["python", *sys.argv])}

    def write(result: dict) -> None:
        if args.out:
            text = json.dumps({**header, **result}, indent=2) + "\n"
            atomic_write(args.out, lambda handle: handle.write(text.encode()))

    def progress(phase: str, partial: dict) -> None:  # a 1B checkpoint is ~15 GB: minutes a phase
        seconds = partial.get(f"{phase}_s", partial.get("save_local_s"))
        print(f"[bench_s3_checkpoint] {phase} done in {seconds:.1f} s ({partial['checkpoint_bytes'] / 1e9:.2f} GB)",
              flush=True)
        write({**partial, "complete": False})

    result = {**header, **measure(args.shape, args.zero_stage, args.seq_len, args.server, progress), "complete": True}
    print(table(result))
    write(result)
    if args.out:
        print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
