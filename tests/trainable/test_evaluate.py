"""The evaluate command line (trainable.evaluate) end to end on the miniature data: records, summary and
diagrams, rescoring them, one-line errors, an ATS head trained, saved and reused."""

from __future__ import annotations

import json

import pytest

from calibration.records import read_records
from calibration.rescore import main as rescore_main
from trainable.evaluate import main

SUMMARY_KEYS = ("accuracy", "ece", "rms_ce", "mce", "ace", "sce", "brier", "nll", "n_questions")  # rescore must reproduce


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
