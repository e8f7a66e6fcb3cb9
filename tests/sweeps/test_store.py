"""The Parquet store: schema, one row per trial id, atomic writes that leave readers a valid store."""

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sweeps import store


def _row(trial_id: str, status: str = "ok", **extra):
    return {"run_name": "r", "trial_id": trial_id, "status": status, "family": "f", "learning_rate": 1e-5,
            "label_smoothing": 0.1, "seed": 0, "mmlu_ece": 0.2, **extra}


def _records(n: int) -> pa.Table:
    return pa.table({"task": ["mmlu"] * n, "split": ["test"] * n, "question_id": [str(i) for i in range(n)],
                     "subject": ["s"] * n, "gold": [0] * n, "n_choices": [4] * n,
                     "loglik": [[-1.0, -2.0, -3.0, -4.0]] * n, "loglik_norm": [[-1.0, -2.0, -3.0, -4.0]] * n,
                     "confidence": [0.6] * n, "correct": [True] * n})


def test_round_trip_and_schema_version(tmp_path):
    store.write_trial(str(tmp_path), _row("a"))
    table = store.read_trials(str(tmp_path))
    assert table.schema.equals(store.trial_schema(), check_metadata=False)
    row = table.to_pylist()[0]
    assert row["schema_version"] == store.SCHEMA_VERSION and row["mmlu_ece"] == 0.2 and row["arc_easy_ece"] is None


def test_rewriting_a_trial_keeps_one_row(tmp_path):
    store.write_trial(str(tmp_path), _row("a", status="failed", error="RuntimeError: boom"))
    store.write_trial(str(tmp_path), _row("a"))
    store.write_trial(str(tmp_path), _row("b"))
    table = store.read_trials(str(tmp_path))
    assert sorted(table.column("trial_id").to_pylist()) == ["a", "b"]
    assert store.trial_statuses(str(tmp_path), "r") == {"a": "ok", "b": "ok"}


def test_half_written_files_are_invisible(tmp_path):
    store.write_trial(str(tmp_path), _row("a"))
    (tmp_path / "trials" / ".r__b.123.tmp").write_bytes(b"PAR1 truncated")  # a writer killed mid-write
    assert store.read_trials(str(tmp_path)).num_rows == 1


def test_questions_table(tmp_path):
    store.write_questions(str(tmp_path), "r", "a", _records(5))
    table = store.read_questions(str(tmp_path), "r")
    assert table.num_rows == 5 and set(table.column("trial_id").to_pylist()) == {"a"}
    assert pq.read_table(next((tmp_path / "questions").glob("*.parquet"))).num_rows == 5


def test_empty_store_and_unknown_columns(tmp_path):
    assert store.read_trials(str(tmp_path / "none")).num_rows == 0
    with pytest.raises(ValueError, match="unknown"):
        store.write_trial(str(tmp_path), _row("a", mmlu_accuracy_typo=1.0))


def test_metric_columns_cover_every_task_metric():
    columns = store.metric_columns()
    assert "hellaswag_rms_ce" in columns and "arc_easy_ece_ts" in columns and "arc_easy_lettered_ece" in columns


def test_old_trial_files_read_with_later_columns_null(tmp_path):
    """A file written before a task had columns (here: without arc_easy_lettered's, its columns in another order)
    reads as it was, matched by name, the later columns null."""
    old = pa.schema([f for f in reversed(store.trial_schema()) if not f.name.startswith("arc_easy_lettered_")])
    row = {"schema_version": store.SCHEMA_VERSION, "run_name": "r", "trial_id": "a", "status": "ok", "mmlu_ece": 0.25}
    (tmp_path / "trials").mkdir()
    pq.write_table(pa.Table.from_pylist([row], schema=old), tmp_path / "trials" / "r__a.parquet")
    stored = store.read_trials(str(tmp_path)).to_pylist()[0]
    assert stored["mmlu_ece"] == 0.25 and stored["arc_easy_lettered_ece"] is None and stored["status"] == "ok"


def test_rows_of_earlier_runs_load_with_the_trial_result_s_later_fields_null():
    """The store of the 2026-11-23 sweep (written before tokens_per_s_steady, mfu and the layout were stored) reads
    with its values as written and the new columns null, through the analysis loader too."""
    from sweeps.analysis.load import load_results

    root = str(Path(__file__).parents[2] / "docs" / "results" / "2026-11-23" / "store")
    rows = store.read_trials(root).to_pylist()
    assert len(rows) == 18 and all(r["status"] == "ok" and r["mmlu_ece"] is not None for r in rows)
    assert all(r[name] is None for r in rows for name in ("tokens_per_s_steady", "mfu", "zero_stage",
                                                           "activation_checkpointing"))
    trials = load_results(root).trials
    assert len(trials) == 18 and trials["mfu"].isna().all() and trials["n_params"].notna().all()


def test_remove_trial_deletes_its_row_and_questions_only(tmp_path):
    for trial in ("a", "b"):
        store.write_trial(str(tmp_path), _row(trial))
        store.write_questions(str(tmp_path), "r", trial, _records(2))
    store.remove_trial(str(tmp_path), "r", "a")
    store.remove_trial(str(tmp_path), "r", "missing")  # nothing to delete: fine
    assert store.read_trials(str(tmp_path)).column("trial_id").to_pylist() == ["b"]
    assert set(store.read_questions(str(tmp_path)).column("trial_id").to_pylist()) == {"b"}
    assert store.stored_trial(str(tmp_path), "r", "b")["status"] == "ok"
    assert store.stored_trial(str(tmp_path), "r", "a") is None


def test_a_saved_model_folder_is_moved_in_whole_replaced_and_removed_with_its_trial(tmp_path):
    model = tmp_path / "model"
    (model / "sub").mkdir(parents=True)
    (model / "config.json").write_text("{}")
    (model / "sub" / "weights.bin").write_bytes(b"\x00\x01")
    root = str(tmp_path / "results")
    path = store.write_model(root, "run", "t1", model)
    assert path == str(tmp_path / "results" / "models" / "run__t1")
    assert (Path(path) / "sub" / "weights.bin").read_bytes() == b"\x00\x01"
    (model / "config.json").unlink()
    (model / "tokenizer.json").write_text("{}")
    store.write_model(root, "run", "t1", model)  # a rerun's model replaces the folder, no file of the old one stays
    assert sorted(p.name for p in Path(path).iterdir()) == ["sub", "tokenizer.json"]
    assert [p.name for p in (tmp_path / "results" / "models").iterdir()] == ["run__t1"]  # no temporary left
    store.remove_trial(root, "run", "t1")
    assert not Path(path).exists()


def _damage_pages(path: Path) -> None:
    """Flip the middle third of a Parquet file's column data, leaving its footer whole (a bad disk or copy)."""
    group = pq.ParquetFile(path).metadata.row_group(0)
    chunks = [group.column(i) for i in range(group.num_columns)]
    first = min(c.data_page_offset for c in chunks)
    last = max(c.data_page_offset + c.total_compressed_size for c in chunks)
    data = bytearray(path.read_bytes())
    for i in range(first + (last - first) // 3, first + 2 * (last - first) // 3):
        data[i] ^= 0x5A
    path.write_bytes(bytes(data))


def test_a_damaged_file_is_named_by_the_store_analyze_and_rescore(tmp_path, capsys):
    from calibration import rescore
    from sweeps import analyze

    for trial_id in "abc":
        store.write_trial(str(tmp_path), _row(trial_id))
        store.write_questions(str(tmp_path), "r", trial_id, _records(50))
    trials, questions = tmp_path / "trials" / "r__b.parquet", tmp_path / "questions" / "r__b.parquet"
    _damage_pages(trials)
    _damage_pages(questions)
    with pytest.raises(store.DamagedFileError, match=f"^{trials}: damaged Parquet file, it cannot be read"):
        store.read_trials(str(tmp_path))
    with pytest.raises(store.DamagedFileError, match=f"^{questions}: damaged Parquet file"):
        store.read_questions(str(tmp_path), "r")
    with pytest.raises(SystemExit) as stopped:
        analyze.main([str(tmp_path), "--n-boot", "10"])
    with pytest.raises(SystemExit):
        rescore.main([str(questions)])
    errors = capsys.readouterr().err.splitlines()
    assert stopped.value.code == 2 and len(errors) == 2
    assert errors[0].startswith(f"calsweep: error: {trials}: damaged Parquet file")
    assert f"{str(questions)!r}: damaged Parquet file, its data cannot be read" in errors[1]


def test_preflight_names_a_damaged_trial_file(tmp_path, data_dir):
    from sweeps.config import load_sweep
    from sweeps.preflight import preflight

    sweep = load_sweep(Path(__file__).with_name("tiny_sweep.yaml"), {"results_dir": str(tmp_path),
                                                                     "data_dir": data_dir})
    store.write_trial(str(tmp_path), {**_row("a"), "run_name": sweep.name})
    _damage_pages(tmp_path / "trials" / "tiny__a.parquet")
    problems = preflight(sweep).problems
    assert problems == [problem for problem in problems if problem.startswith(
        f"results store: {tmp_path / 'trials' / 'tiny__a.parquet'}: damaged Parquet file")] and len(problems) == 1
