"""End to end on the miniature data: the seam, the evaluate CLI, then rescore from the stored records."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from calibration.evaluate import EvalResult, apply_overrides, evaluate_model
from calibration.metrics import expected_calibration_error, rms_calibration_error
from calibration.probabilities import choice_probs, pad, top_label
from calibration.records import SCHEMA, read_records
from calibration.rescore import main as rescore_main
from calibration.task_config import TASKS
from trainable.evaluate_cli import main

SUMMARY_KEYS = {"accuracy", "ece", "rms_ce", "mce", "ace", "sce", "brier", "nll", "n_questions", "accuracy_norm",
                "ece_norm", "rms_ce_norm", "mean_confidence_norm"}


def test_seam_contract(llama, tokenizer, mini_data):
    llama.train()
    try:
        result = evaluate_model(llama, tokenizer, data_dir=mini_data, limit=3, progress=False)
        assert isinstance(result, EvalResult) and llama.training
    finally:
        llama.eval()  # a session fixture: leave it as the other tests expect it
    assert set(result.summary) == {"mmlu", "arc_easy", "hellaswag"}
    for values in result.summary.values():
        assert SUMMARY_KEYS <= set(values) and all(isinstance(v, float) for v in values.values())
    assert result.summary["hellaswag"]["n_questions"] == 2.0 and result.summary["mmlu"]["n_questions"] == 3.0
    records = result.records
    assert records.schema.equals(SCHEMA) and records.num_rows == 3 + 3 + 2
    row = records.slice(0, 1).to_pylist()[0]
    assert row["task"] == "mmlu" and row["question_id"] == "anatomy/test/0" and row["n_choices"] == 4
    probs = choice_probs(pad(records["loglik"].to_pylist()))
    np.testing.assert_allclose(records["confidence"].to_numpy(), np.nanmax(probs, axis=1))
    assert records["loglik_norm"].to_pylist()[0] == records["loglik"].to_pylist()[0]  # letters: length 1


def test_heldout_adds_temperature_scaled_metrics(llama, tokenizer, mini_data):
    result = evaluate_model(llama, tokenizer, ("arc_easy", "hellaswag"), data_dir=mini_data, progress=False,
                            heldout=True, n_boot=20)
    assert set(result.records["split"].to_pylist()) == {"test", "dev", "val"}
    assert "temperature" in result.summary["arc_easy"] and "ece_ts" in result.summary["arc_easy"]
    assert "temperature" not in result.summary["hellaswag"]  # no held-out split
    assert "ece_norm_ts" not in result.summary["arc_easy"]  # the length-normalised read is never rescaled
    # HellaSwag's endings differ in length: its *_norm metrics are those of softmax(loglik_norm), by hand
    rows = [r for r in result.records.to_pylist() if r["task"] == "hellaswag"]
    gold = np.array([r["gold"] for r in rows])
    probs = choice_probs(pad([r["loglik_norm"] for r in rows]))
    confidence, correct = top_label(probs, gold)
    assert not np.allclose(probs, choice_probs(pad([r["loglik"] for r in rows])))
    hellaswag = result.summary["hellaswag"]
    assert hellaswag["ece_norm"] == pytest.approx(expected_calibration_error(confidence, correct, 15), abs=1e-12)
    assert hellaswag["rms_ce_norm"] == pytest.approx(rms_calibration_error(confidence, correct, 15), abs=1e-12)
    assert hellaswag["mean_confidence_norm"] == pytest.approx(confidence.mean(), abs=1e-12)
    interval = result.intervals["arc_easy"]["ece"]
    assert interval.low <= interval.estimate <= interval.high


def test_overrides_report_every_problem():
    configs = apply_overrides([TASKS["mmlu"]], ["mmlu.k_shot=2", "mmlu.subjects=anatomy,virology"])
    assert configs[0].k_shot == 2 and configs[0].subjects == ("anatomy", "virology")
    with pytest.raises(ValueError) as info:
        apply_overrides([TASKS["mmlu"]], ["mmlu.shots=2", "arc.k_shot=1"])
    assert str(info.value).count("TASK.FIELD=VALUE") == 2


def test_cli_writes_records_summary_and_diagrams_then_rescore_recomputes(model_dir, mini_data, tmp_path, capsys):
    out = tmp_path / "eval"
    main(["--model", str(model_dir), "--tasks", "mmlu,arc_easy_lettered", "--limit", "4", "--out", str(out),
          "--data-dir", str(mini_data), "--n-boot", "10", "--set", "mmlu.k_shot=1"])
    table = capsys.readouterr().out
    assert "mmlu" in table and "arc_easy_lettered T=" in table
    records, metadata = read_records(out / "records.parquet")
    assert metadata["report_splits"] == {"mmlu": "test", "arc_easy_lettered": "test"}
    assert metadata["fit_splits"] == {"mmlu": "val", "arc_easy_lettered": "dev"}
    assert metadata["tasks"][0]["k_shot"] == 1 and metadata["git_revision"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["summary"]["mmlu"]["n_questions"] == 4 and len(summary["intervals"]["mmlu"]["ece"]) == 2
    for name in ("reliability_mmlu.png", "reliability_mmlu_ts.png", "reliability_arc_easy_lettered.png"):
        assert (out / name).read_bytes()[:4] == b"\x89PNG"

    same = rescore_main([str(out), "--n-boot", "0"])
    for metric in SUMMARY_KEYS:
        assert same["mmlu"][metric] == pytest.approx(summary["summary"]["mmlu"][metric], abs=1e-12)
    fitted = rescore_main([str(out), "--temperature", "fit", "--n-bins", "5", "--n-boot", "0", "--plots"])
    assert fitted["mmlu"]["temperature"] == pytest.approx(summary["summary"]["mmlu"]["temperature"])
    assert (out / "rescore_loglik_b5_tfit.json").exists()
    normed = rescore_main([str(out), "--score", "loglik_norm", "--n-boot", "0"])
    assert normed["mmlu"]["accuracy"] == pytest.approx(summary["summary"]["mmlu"]["accuracy_norm"])
    for metric in ("ece", "rms_ce"):
        assert normed["mmlu"][metric] == pytest.approx(summary["summary"]["mmlu"][f"{metric}_norm"], abs=1e-12)


def test_records_of_another_schema_version_are_refused(tmp_path):
    pq.write_table(pa.table({"task": ["x"]}).replace_schema_metadata({b"calsweep.schema_version": b"0"}),
                   tmp_path / "records.parquet")
    with pytest.raises(ValueError, match="expected records schema version 1"):
        read_records(tmp_path / "records.parquet")


def test_rescore_reads_a_sweep_stores_question_file_and_writes_beside_the_store(llama, tokenizer, mini_data,
                                                                                 tmp_path):
    from sweeps.store import write_questions

    result = evaluate_model(llama, tokenizer, ("arc_easy", "hellaswag"), data_dir=mini_data, progress=False,
                            heldout=True)
    path = write_questions(str(tmp_path / "results"), "run", "trial", result.records)
    fitted = rescore_main([path, "--temperature", "fit", "--n-boot", "0"])
    for metric in ("accuracy", "ece", "temperature", "ece_ts"):
        assert fitted["arc_easy"][metric] == pytest.approx(result.summary["arc_easy"][metric], abs=1e-12)
    assert fitted["hellaswag"]["n_questions"] == result.summary["hellaswag"]["n_questions"]  # its test split only
    written = tmp_path / "results" / "rescore" / "run__trial" / "rescore_loglik_b15_tfit.json"
    assert json.loads(written.read_text())["report_splits"] == {"arc_easy": "test", "hellaswag": "val"}


@pytest.mark.parametrize("argv, message", [
    (["--model", "smollm2-135m", "--tasks", "nope"], "--tasks: expected a comma list of"),
    (["--model", "smollm2-135m", "--tasks", "hellaswg"], "(did you mean 'hellaswag'?)"),
    (["--model", "smollm2-135m", "--tasks", "mmlu", "--set", "mmlu.shots=2"], "TASK.FIELD=VALUE"),
    (["--model", "no-such-model", "--tasks", "mmlu"], "unknown model family 'no-such-model'"),
    (["--model", "smollm2-135m", "--limit", "0"], "--limit: expected an integer >= 1"),
    (["--model", "smollm2-135m", "--ats", "--ats-set", "alpah=0.2"], "--ats-set.alpah: unknown key (did you mean "),
    (["--model", "smollm2-135m", "--ats", "--ats-set", "alpha"], "--ats-set: expected KEY=VALUE, got 'alpha'"),
    (["--model", "smollm2-135m", "--ats-head", "nothing.safetensors"], "--ats-head: expected a file written by"),
])
def test_evaluate_cli_bad_inputs_are_one_line_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.count("\n") == 1 and message in err
    assert err.startswith("calsweep evaluate: error: ")


def test_rescore_cli_bad_sources_are_one_line_errors(tmp_path, capsys):
    text = tmp_path / "notes.txt"
    text.write_text("not parquet")
    empty = tmp_path / "empty"
    empty.mkdir()
    other = tmp_path / "other.parquet"
    pq.write_table(pa.table({"task": ["x"]}), other)
    for source, message in ((tmp_path / "missing", "found nothing"), (empty, "a directory without records.parquet"),
                            (text, "expected a Parquet file"), (other, "missing")):
        with pytest.raises(SystemExit) as info:
            rescore_main([str(source)])
        err = capsys.readouterr().err
        assert info.value.code == 2 and err.count("\n") == 1 and message in err, err
        assert err.startswith("python -m calibration.rescore: error: ") and str(source) in err


def test_rescore_cli_bad_temperature_is_a_one_line_error(model_dir, mini_data, tmp_path, capsys):
    out = tmp_path / "eval"
    main(["--model", str(model_dir), "--tasks", "arc_easy", "--limit", "2", "--out", str(out),
          "--data-dir", str(mini_data), "--n-boot", "0", "--no-heldout"])
    capsys.readouterr()
    for argv, message in (([str(out), "--temperature", "hot"], "expected --temperature fit or a positive number"),
                          ([str(out), "--temperature", "fit"], "for --temperature fit")):
        with pytest.raises(SystemExit):
            rescore_main(argv)
        assert message in capsys.readouterr().err


def test_cli_trains_an_ats_head_saves_it_and_scores_with_a_saved_one(model_dir, mini_data, shared_data, tmp_path):
    """--ats on a model without SFT: a head trained on Alpaca-GPT4 (here 2 steps), saved, *_ats metrics and
    'test+ats' records; --ats-head scores with the saved head and gives the same numbers."""
    common = ["--model", str(model_dir), "--tasks", "mmlu", "--limit", "3", "--data-dir", str(mini_data),
              "--n-boot", "0", "--no-heldout"]
    settings = [f"local_file={shared_data / 'alpaca' / 'alpaca_gpt4_en_demo_llamafactory.json'}", "max_steps=2",
                "max_examples=8", "max_seq_len=64", "batch_size=4", "learning_rate=0.01", "balanced=false"]
    trained = main(common + ["--out", str(tmp_path / "a"), "--ats"] + [x for s in settings for x in ("--ats-set", s)])
    head = tmp_path / "a" / "ats_head.safetensors"
    assert head.is_file() and trained.config["ats"]
    records, _ = read_records(tmp_path / "a" / "records.parquet")
    assert sorted(set(records["split"].to_pylist())) == ["test", "test+ats"]
    mmlu = trained.summary["mmlu"]
    assert mmlu["ece_ats"] != mmlu["ece"] and mmlu["accuracy_ats"] == mmlu["accuracy"]
    loaded = main(common + ["--out", str(tmp_path / "b"), "--ats-head", str(head)])
    for name in ("ece_ats", "nll_ats", "mean_confidence_ats"):
        assert loaded.summary["mmlu"][name] == pytest.approx(mmlu[name], abs=1e-9)
