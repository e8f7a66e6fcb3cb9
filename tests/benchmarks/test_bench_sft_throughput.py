"""The throughput benchmark's rows, table and one real run of its CPU path (the GPU numbers need GPUs)."""

import json

import pytest


@pytest.fixture(scope="module")
def bench(benchmark_script):
    return benchmark_script("bench_sft_throughput")


def test_rows_parse_and_bad_rows_name_the_format(bench):
    assert bench.parse_row("8b:2:3:2:random") == dict(shape="8b", gpus=2, zero=3, batch=2, data="random")
    for bad in ("8b:2:3:2", "7b:2:3:2:random", "1b:2:4:2:random", "1b:x:3:2:random"):
        with pytest.raises(ValueError, match="1b:2:3:4:random|expected shape"):
            bench.parse_row(bad)


def test_table_compares_with_the_trainer_the_single_gpu_row_and_random_data(bench):
    def result(impl, row, rate):
        return {"impl": impl, "row": row, **bench.parse_row(row), "tokens_per_s_per_gpu": rate, "mfu": 0.3,
                "peak_gib": 30.0, "step_ms": 200.0}
    text = bench.table([result("calsweep", "1b:1:0:4:random", 40000.0),
                        result("Hugging Face Trainer", "1b:2:3:4:random", 30000.0),
                        result("calsweep", "1b:2:3:4:random", 39000.0),
                        result("calsweep", "1b:2:3:4:alpaca", 35100.0),
                        {"impl": "calsweep", "row": "8b:2:3:2:random", "error": "skipped: needs 2 GPUs"}])
    lines = text.splitlines()
    assert lines[3].split()[-3:] == ["1.30x", "0.97x", "-"]  # vs Trainer, vs its own 1-GPU row
    assert lines[4].split()[-1] == "0.90x"  # Alpaca against random tokens, same row otherwise
    assert "skipped: needs 2 GPUs" in lines[5]


@pytest.mark.slow
def test_cpu_run_of_the_trial_loop_and_the_trainer_on_packed_alpaca(bench, data_dir, tmp_path):
    """Both implementations through torchrun on one CPU rank, the real SFT path, packed rows, ZeRO-3."""
    out = tmp_path / "throughput.json"
    bench.main(["--cpu", "--rows", "tiny:1:3:2:alpaca", "--impls", "calsweep_eager,hf_trainer,calsweep_fsdp2",
                "--seq-len", "128", "--steps", "2", "--warmup", "1", "--data-dir", data_dir, "--out", str(out)])
    results = json.loads(out.read_text())
    assert [r.get("error") for r in results] == [None, None, None]
    for r in results:
        # 2 steps of 2 packed rows of 128 tokens: most of the 512 slots hold real tokens
        assert r["tokens_per_s_per_gpu"] > 0 and r["data"] == "alpaca" and r["zero"] == 3
        assert r["last_loss"] > 0
    # FSDP2 (fp32 master weights, fp32 on the CPU) takes the same steps as DeepSpeed's ZeRO-3 on the same rows:
    # the third step's loss agrees to float32 reduction order (measured: 10.75687 vs 10.75678)
    deepspeed, fsdp2 = results[0], results[2]
    assert fsdp2["engine"] == "fsdp2" and fsdp2["last_loss"] == pytest.approx(deepspeed["last_loss"], rel=1e-4)


def test_resume_keeps_what_ran_and_tries_again_only_rows_skipped_for_want_of_gpus(bench, tmp_path):
    out = tmp_path / "throughput.json"
    def record(row: str, **fields) -> dict:
        return {"impl": "calsweep", "impl_id": "calsweep", "row": row, **bench.parse_row(row), **fields}
    ran = record("tiny:1:0:2:random", tokens_per_s_per_gpu=600.0, mfu=0.0, peak_gib=0.0, step_ms=6000.0)
    failed = record("tiny:1:3:2:random", error="exit code 1")
    skipped = record("tiny:2:3:2:random", error="skipped: needs 2 GPUs, this host has 1")
    out.write_text(json.dumps([ran, failed, skipped]))
    bench.main(["--cpu", "--resume", "--rows", "tiny:1:0:2:random,tiny:1:3:2:random,tiny:2:3:2:random",
                "--impls", "calsweep", "--out", str(out)])
    results = json.loads(out.read_text())
    assert results[:2] == [ran, failed]  # neither run again (no torchrun on this call: it would take a minute)
    assert [r["row"] for r in results] == ["tiny:1:0:2:random", "tiny:1:3:2:random", "tiny:2:3:2:random"]
    assert results[2]["error"].startswith("skipped: needs 2 GPUs")


def test_a_micro_batch_that_does_not_divide_a_row_s_batch_is_refused_in_one_line(bench, tmp_path, capsys):
    with pytest.raises(SystemExit):
        bench.main(["--cpu", "--rows", "tiny:1:0:4:random,tiny:1:auto:2:random", "--micro-batch", "3",
                    "--out", str(tmp_path / "t.json")])
    assert "expected --micro-batch to divide the batch per GPU of every row with a stage, got 3 for " \
           "['tiny:1:0:4:random']" in capsys.readouterr().err
    assert not (tmp_path / "t.json").exists()


def test_node_shapes_come_from_node_llama_yaml_and_rows_may_take_fewer_layers(bench):
    import yaml

    declared = yaml.safe_load(bench.NODE_SHAPES.read_text())["custom_models"]
    assert {key: bench.SHAPES[key] for key in ("14b", "32b", "70b")} == \
        {key: declared[f"llama-{key}"]["config"] for key in ("14b", "32b", "70b")}
    assert bench.parse_row("32b@12L:4:auto:1:random")["shape"] == "32b@12L"
    assert bench.shape_config("32b@12L") == {**bench.SHAPES["32b"], "num_hidden_layers": 12}
    for bad in ("32b@L:4:auto:1:random", "32b@0L:4:auto:1:random", "32b@12:4:auto:1:random", "33b@12L:4:3:1:random"):
        with pytest.raises(ValueError, match="expected shape in .*@<layers>L|expected shape in"):
            bench.parse_row(bad)


def test_scaling_is_against_the_fewest_gpus_the_shape_ran_on(bench):
    def result(impl, row, rate):
        return {"impl": impl, "row": row, **bench.parse_row(row), "tokens_per_s_per_gpu": rate, "mfu": 0.3,
                "peak_gib": 30.0, "step_ms": 200.0}
    text = bench.table([result("calsweep", "8b:2:auto:4:random", 8000.0), result("calsweep", "8b:4:auto:4:random",
                                                                                  7600.0),
                        result("torchtitan settings", "8b:4:auto:4:random", 7000.0)])
    lines = text.splitlines()
    assert lines[1].split()[-2:] == ["-", "-"] and lines[2].split()[-2:] == ["0.95x", "-"]
    assert lines[3].split()[-2:] == ["-", "-"]  # no fewer-GPU row of its own implementation
