"""End to end on the miniature data: the seam (evaluate_model), then rescore from the stored records (the evaluate
command line: tests/trainable/test_evaluate.py)."""

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




def _sharded(model, tokenizer, count: int, **options) -> list[EvalResult]:
    """``evaluate_model`` on ``count`` threads, each a rank with its ``Shard``; their gather meets at a barrier."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from calibration.evaluate import Shard

    barrier, posted = threading.Barrier(count), {}

    def gather(rank: int, table: pa.Table) -> list[pa.Table]:
        posted[rank] = table
        barrier.wait()
        tables = [posted[r] for r in range(count)]
        barrier.wait()  # every rank has read this round before any posts the next
        return tables

    with ThreadPoolExecutor(count) as pool:
        runs = [pool.submit(evaluate_model, model, tokenizer, progress=False,
                            shard=Shard(rank, count, lambda table, rank=rank: gather(rank, table)), **options)
                for rank in range(count)]
        return [run.result(timeout=600) for run in runs]


@pytest.mark.parametrize("count", [2, 3])
def test_ranks_sharing_the_questions_give_the_records_and_summary_of_one_pass(llama, tokenizer, shared_data, count):
    """Real 5-shot MMLU (a subject's prefix split between ranks), ARC-Easy with its held-out split and HellaSwag:
    each rank scores its contiguous share, and every rank holds the one-pass records in the one-pass order, their
    log-likelihoods within 1e-5 (float32, other batches), and the same summary."""
    options = dict(tasks=("mmlu", "arc_easy", "hellaswag"), data_dir=shared_data, limit=7, heldout=True)
    whole = evaluate_model(llama, tokenizer, progress=False, **options)
    for result in _sharded(llama, tokenizer, count, **options):
        for column in ("task", "split", "question_id", "gold", "correct"):
            assert result.records[column].to_pylist() == whole.records[column].to_pylist(), column
        for ours, one_pass in zip(result.records["loglik"].to_pylist(), whole.records["loglik"].to_pylist()):
            np.testing.assert_allclose(ours, one_pass, rtol=0, atol=1e-5)
        for task, metrics in whole.summary.items():
            assert result.summary[task] == pytest.approx(metrics, abs=1e-6), task


def test_a_rank_whose_share_is_empty_still_meets_the_others(llama, tokenizer, mini_data):
    """Three ranks over two HellaSwag questions: rank 0 scores none and still takes part in each gather."""
    whole = evaluate_model(llama, tokenizer, ("hellaswag",), data_dir=mini_data, progress=False)
    results = _sharded(llama, tokenizer, 3, tasks=("hellaswag",), data_dir=mini_data)
    assert [r.records.num_rows for r in results] == [2, 2, 2]
    assert results[0].records["question_id"].to_pylist() == whole.records["question_id"].to_pylist()


def test_a_shard_outside_its_count_is_refused():
    from calibration.evaluate import Shard

    with pytest.raises(ValueError, match="expected 0 <= index < count, got index 2 of count 2"):
        Shard(2, 2, lambda table: [table])
