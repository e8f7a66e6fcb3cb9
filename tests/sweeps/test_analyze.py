"""sweeps/analyze.py on a synthetic store of known numbers: every output is written and the tables hold the store's."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from matplotlib.image import imread

from calibration.probabilities import choice_probs, top_label
from calibration.summary import task_metrics
from sweeps import store
from sweeps.analysis.load import load_results, parse_filter
from sweeps.analyze import analyze, main

REPO = Path(__file__).resolve().parents[2]
N_QUESTIONS = 40
SPLITS = {"mmlu": "test", "hellaswag": "val", "arc_easy": "test"}  # reported splits
MODELS = {"small": (32_000, 64), "big": (262_144, 640), "only0": (49_152, 576)}  # vocab, hidden
# run, dataset, family, beta, lr, seed, correct answers out of N_QUESTIONS, final train loss, questions stored
TRIALS = [
    ("r1", "alpaca", "small", 0.0, 1e-5, 0, 20, 1.0, True),
    ("r1", "alpaca", "small", 0.0, 2e-5, 0, 30, 1.2, True),  # higher accuracy, but higher validation loss
    ("r1", "alpaca", "small", 0.1, 1e-5, 0, 25, 0.9, True),
    ("r1", "alpaca", "small", 0.1, 2e-5, 0, 25, 0.8, True),  # selected: accuracy tie, lower loss
    ("r1", "alpaca", "small", 0.2, 1e-5, 0, 28, 1.0, True),
    ("r1", "alpaca", "big", 0.0, 1e-5, 0, 22, 1.0, True),
    ("r1", "alpaca", "big", 0.1, 1e-5, 0, 24, 1.0, True),
    ("r1", "alpaca", "only0", 0.0, 1e-5, 0, 20, 1.0, True),  # no beta > 0: skipped with a note
    ("r2", "tulu3", "small", 0.0, 1e-5, 0, 18, 1.0, True),  # two seeds per point: means
    ("r2", "tulu3", "small", 0.0, 1e-5, 1, 22, 1.1, True),
    ("r2", "tulu3", "small", 0.1, 1e-5, 0, 26, 1.0, True),
    ("r2", "tulu3", "small", 0.1, 1e-5, 1, 24, 0.9, True),
    ("r2", "tulu3", "big", 0.0, 1e-5, 0, 21, 1.0, True),
    ("r2", "tulu3", "big", 0.1, 1e-5, 0, 23, 1.0, False),  # interrupted before its questions were written
]
# (dataset, family, beta) -> (selected lr, criterion): beta 0 has a validation loss at both lrs, so the lower one
# wins although its accuracy is lower; beta 0.1 has none, so accuracy decides (a tie, then the lower train loss)
SELECTED = {("alpaca", "small", 0.0): (1e-5, "val_loss"), ("alpaca", "small", 0.1): (2e-5, "accuracy")}
VAL_LOSS = {"small-b0-lr1e-05-s0": 2.0, "small-b0-lr2e-05-s0": 2.5}  # only tulu3 lacks them: accuracy decides there


def _trial_id(run: str, family: str, beta: float, lr: float, seed: int) -> str:
    return f"{family}-b{beta:g}-lr{lr:g}-s{seed}"


def _records(task: str, split: str, n_correct: int, beta: float, rng: np.random.Generator) -> pa.Table:
    """Four-choice questions: choice 0 is the top one; the first ``n_correct`` have gold 0, the rest gold 1."""
    margin = rng.uniform(0.0, 4.0, N_QUESTIONS) * (1.0 - 2.0 * beta)  # smoothing: less confident
    loglik = np.stack([margin, np.zeros(N_QUESTIONS), -np.ones(N_QUESTIONS), -np.ones(N_QUESTIONS)], axis=1) - 3.0
    loglik_norm = loglik / np.array([1.0, 2.0, 3.0, 4.0])  # choices of 1-4 tokens: another distribution
    gold = np.where(np.arange(N_QUESTIONS) < n_correct, 0, 1)
    confidence, correct = top_label(choice_probs(loglik), gold)
    return pa.table({
        "task": [task] * N_QUESTIONS, "split": [split] * N_QUESTIONS,
        "question_id": [f"{task}/{split}/{i}" for i in range(N_QUESTIONS)], "subject": ["s"] * N_QUESTIONS,
        "gold": gold.astype(np.int32), "n_choices": np.full(N_QUESTIONS, 4, np.int32),
        "loglik": loglik.tolist(), "loglik_norm": loglik_norm.tolist(), "confidence": confidence, "correct": correct})


def _write_store(root: Path) -> None:
    rng = np.random.default_rng(0)
    for run, dataset, family, beta, lr, seed, n_correct, loss, with_questions in TRIALS:
        trial_id = _trial_id(run, family, beta, lr, seed)
        vocab, hidden = MODELS[family]
        row = {"run_name": run, "trial_id": trial_id, "status": "ok", "family": family, "sft_dataset": dataset,
               "learning_rate": lr, "label_smoothing": beta, "seed": seed, "train_loss": loss,
               "val_loss": VAL_LOSS.get(trial_id) if run == "r1" else None,
               "vocab_size": vocab, "hidden_size": hidden, "n_params": 1000 * hidden,
               "config_json": json.dumps({"eval": {"n_bins": 15}})}
        tables = []
        for task, split in SPLITS.items():
            reported = _records(task, split, n_correct, beta, rng)
            arrays = {k: np.array(reported.column(k).to_pylist()) for k in ("loglik", "loglik_norm", "gold")}
            row |= {f"{task}_{name}": value for name, value in task_metrics(**arrays).items()}
            tables.append(reported)
        tables.append(_records("mmlu", "val", 0, 0.0, rng))  # held-out split: must stay out of the analysis
        store.write_trial(str(root), row)
        if with_questions:
            store.write_questions(str(root), run, trial_id, pa.concat_tables(tables))
    store.write_trial(str(root), {"run_name": "r1", "trial_id": "small-b0.3-failed", "status": "failed",
                                  "error": "RuntimeError: CUDA out of memory", "family": "small",
                                  "sft_dataset": "alpaca", "learning_rate": 1e-5, "label_smoothing": 0.3})


def _stored_trials(root: Path) -> pd.DataFrame:
    """The trial rows as plain Parquet gives them, independent of the code under test."""
    frame = pd.concat([pq.read_table(path).to_pandas() for path in sorted((root / "trials").glob("*.parquet"))])
    frame["trial"] = frame["run_name"] + "/" + frame["trial_id"]
    return frame.set_index("trial")


@pytest.fixture(scope="module")
def synthetic_store(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("results")
    _write_store(root)
    return root


@pytest.fixture(scope="module")
def analysed(synthetic_store) -> tuple[Path, list[Path]]:
    out = synthetic_store / "analysis"
    return out, analyze(str(synthetic_store), {}, out, n_boot=30)


def test_every_output_is_written(analysed):
    out, written = analysed
    expected = ["table1.csv", "table1.md", "paired_ece.csv", "paired_ece.md", "ece_intervals.csv", "delta_ece.csv",
                "entropy_gap.csv", "entropy_gap.png", "notes.md"]
    for dataset in ("alpaca", "tulu3"):
        expected += [f"ece_vs_beta_{dataset}.png", f"paired_ece_{dataset}.png",
                     f"delta_ece_vs_vocab_{dataset}.png", f"delta_ece_vs_hidden_{dataset}.png"]
    expected += [f"reliability/alpaca/{family}__{task}.png" for family in ("small", "big") for task in SPLITS]
    expected += [f"reliability/tulu3/small__{task}.png" for task in SPLITS]
    assert sorted(str(p.relative_to(out)) for p in written) == sorted(expected)
    for path in written:
        assert path.stat().st_size > 0
        if path.suffix == ".png":
            assert imread(path).ndim == 3
    pair = imread(out / "reliability/alpaca/small__mmlu.png")
    assert pair.shape[1] > pair.shape[0]  # two diagrams side by side


def test_table_one_holds_the_stored_numbers_at_the_selected_lr(analysed, synthetic_store):
    out, _ = analysed
    table = pd.read_csv(out / "table1.csv")
    stored = _stored_trials(synthetic_store)
    cells = {(d, f, b) for _, d, f, b, *_ in TRIALS}
    assert set(zip(table["sft_dataset"], table["family"], table["label_smoothing"])) == cells  # no failed beta 0.3
    metrics = [f"{t}_{m}" for t in SPLITS for m in ("accuracy", "ece", "rms_ce")]
    for row in table.itertuples():
        trials = stored.loc[row.trials.split(";")]
        assert set(trials["learning_rate"]) == {row.learning_rate} and len(trials) == row.n_trials
        assert trials["sft_dataset"].eq(row.sft_dataset).all() and trials["family"].eq(row.family).all()
        for metric in metrics:
            assert getattr(row, metric) == pytest.approx(trials[metric].mean(), rel=1e-12)
        assert row.vocab_size == MODELS[row.family][0] and row.hidden_size == MODELS[row.family][1]
    indexed = table.set_index(["sft_dataset", "family", "label_smoothing"])
    for key, (lr, criterion) in SELECTED.items():
        assert (indexed.at[key, "learning_rate"], indexed.at[key, "selected_by"]) == (lr, criterion)
    tulu = table[(table["sft_dataset"] == "tulu3") & (table["family"] == "small")]
    assert list(tulu["n_trials"]) == [2, 2]
    assert tulu["mmlu_accuracy"].tolist() == pytest.approx([20 / N_QUESTIONS, 25 / N_QUESTIONS])


def test_markdown_table_shows_the_csv_numbers_in_percent_with_its_caption(analysed):
    out, _ = analysed
    table = pd.read_csv(out / "table1.csv")
    text = (out / "table1.md").read_text()
    assert "highest mean accuracy over the tasks" in text and "MMLU ECE" in text and "HellaSwag RMS" in text
    rows = [line for line in text.splitlines() if line.startswith("| alpaca | small | 0.1 |")]
    assert len(rows) == 1
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    row = table[(table["sft_dataset"] == "alpaca") & (table["family"] == "small")
                & (table["label_smoothing"] == 0.1)].iloc[0]
    assert cells[3] == "2e-05" and cells[4] == "1"
    assert cells[5:8] == [f"{100 * row[m]:.2f}" for m in ("mmlu_accuracy", "mmlu_ece", "mmlu_rms_ce")]


def test_question_level_ece_matches_the_stored_ece(analysed, synthetic_store):
    out, _ = analysed
    intervals = pd.read_csv(out / "ece_intervals.csv")
    table = pd.read_csv(out / "table1.csv").set_index(["sft_dataset", "family", "label_smoothing"])
    single = intervals.join(table[[f"{t}_ece" for t in SPLITS]],
                            on=["sft_dataset", "family", "label_smoothing"])
    single = single[single["n_trials"] == 1]
    assert len(single) > 0 and (single["n_questions"] == N_QUESTIONS).all()
    for row in single.itertuples():  # the held-out mmlu/val rows did not leak in
        assert row.ece == pytest.approx(getattr(row, f"{row.task}_ece"), rel=1e-12)
    assert (intervals["low"] <= intervals["high"]).all()


def test_paired_differences_are_over_the_same_questions(analysed):
    out, _ = analysed
    paired = pd.read_csv(out / "paired_ece.csv")
    intervals = pd.read_csv(out / "ece_intervals.csv").set_index(["sft_dataset", "family", "task", "label_smoothing"])
    keys = set(zip(paired["sft_dataset"], paired["family"], paired["label_smoothing"]))
    assert keys == {("alpaca", "small", 0.1), ("alpaca", "small", 0.2), ("alpaca", "big", 0.1),
                    ("tulu3", "small", 0.1)}  # not only0 (no beta > 0), not tulu3/big (no questions at 0.1)
    for row in paired.itertuples():
        assert row.delta_ece == pytest.approx(row.ece_beta - row.ece_beta0, abs=1e-12)
        assert row.ece_beta0 == pytest.approx(intervals.at[(row.sft_dataset, row.family, row.task, 0.0), "ece"])
        assert row.low <= row.high and row.n_questions == N_QUESTIONS
    assert "paired bootstrap" in (out / "paired_ece.md").read_text()


def test_change_in_ece_uses_the_best_beta_of_table_one(analysed):
    out, _ = analysed
    table = pd.read_csv(out / "table1.csv")
    deltas = pd.read_csv(out / "delta_ece.csv")
    assert set(zip(deltas["sft_dataset"], deltas["family"])) == {("alpaca", "small"), ("alpaca", "big"),
                                                                  ("tulu3", "small"), ("tulu3", "big")}
    for row in deltas.itertuples():
        cell = table[(table["sft_dataset"] == row.sft_dataset) & (table["family"] == row.family)]
        ece = cell.set_index("label_smoothing")[f"{row.task}_ece"]
        assert row.best_beta == ece[ece.index > 0].idxmin()
        assert row.delta_ece == pytest.approx(ece[row.best_beta] - ece[0.0], abs=1e-12)
        assert (row.vocab_size, row.hidden_size) == MODELS[row.family]


def test_notes_say_what_was_left_out(analysed):
    out, _ = analysed
    notes = (out / "notes.md").read_text()
    assert "r1/small-b0.3-failed (failed)" in notes
    assert "alpaca/only0: no beta > 0 trial" in notes
    assert "r2/big-b0.1-lr1e-05-s0" in notes  # no questions stored
    entropy = pd.read_csv(out / "entropy_gap.csv")
    assert sorted(entropy["family"]) == ["big", "only0", "small"]
    assert (entropy["normalised_entropy_gap"].between(0, 1)).all()


def test_filters_select_a_subset(synthetic_store, tmp_path):
    results = load_results(str(synthetic_store), parse_filter("family=big,dataset=tulu3,task=mmlu"))
    assert set(results.trials["trial"]) == {"r2/big-b0-lr1e-05-s0", "r2/big-b0.1-lr1e-05-s0"}
    assert results.tasks == ("mmlu",) and set(results.questions["task"]) == {"mmlu"}
    assert parse_filter("family=a,family=b") == {"family": {"a", "b"}}
    written = analyze(str(synthetic_store), parse_filter("family=only0"), tmp_path, n_boot=5)
    assert sorted(p.name for p in written) == sorted(["delta_ece.csv", "ece_intervals.csv", "entropy_gap.csv",
                                               "entropy_gap.png", "ece_vs_beta_alpaca.png", "notes.md",
                                               "paired_ece.csv", "paired_ece.md", "table1.csv", "table1.md"])


@pytest.mark.parametrize("text,match", [("family", "KEY=VALUE"), ("colour=red", "KEY=VALUE"),
                                        ("task=piqa", "expected a task")])
def test_bad_filters_are_one_line_errors(text, match):
    with pytest.raises(ValueError, match=match):
        parse_filter(text)


def test_a_store_without_questions_still_gives_the_tables(synthetic_store, tmp_path):
    root = tmp_path / "results"
    shutil.copytree(synthetic_store / "trials", root / "trials")
    written = analyze(str(root), parse_filter("dataset=alpaca"), tmp_path / "out", n_boot=5)
    assert {p.name for p in written} >= {"table1.csv", "delta_ece.csv", "delta_ece_vs_vocab_alpaca.png",
                                         "entropy_gap.png", "notes.md"}
    assert not any(p.name.startswith(("ece_vs_beta", "paired_ece_")) or "reliability" in str(p) for p in written)
    assert len(pd.read_csv(tmp_path / "out" / "table1.csv")) == 6
    assert "no stored questions for 8 trial(s)" in (tmp_path / "out" / "notes.md").read_text()


def test_stores_with_nothing_to_analyse_are_errors(synthetic_store, tmp_path):
    with pytest.raises(ValueError, match="expected trial rows"):
        load_results(str(tmp_path / "empty"))
    with pytest.raises(ValueError, match="expected ok trials"):
        load_results(str(synthetic_store), {"family": {"nobody"}})


def test_length_normalised_score_reads_the_norm_columns_and_questions(synthetic_store, tmp_path):
    root = tmp_path / "results"
    shutil.copytree(synthetic_store, root, ignore=shutil.ignore_patterns("analysis"))
    for trial in ("r1/big-b0-lr1e-05-s0", "r2/big-b0.1-lr1e-05-s0"):  # rows written before the *_norm columns
        old = _stored_trials(root).loc[trial].to_dict()  # the second has no stored questions
        store.write_trial(str(root), {k: v for k, v in old.items() if not k.endswith(("_ece_norm", "_rms_ce_norm"))
                                      and k in store.TRIAL_SCHEMA.names and not pd.isna(v)})
    out = tmp_path / "out"
    analyze(str(root), {}, out, n_boot=5, score="loglik_norm")
    stored = _stored_trials(root)
    filled = _stored_trials(synthetic_store).loc["r1/big-b0-lr1e-05-s0"]  # from its questions: the same numbers
    stored.loc["r1/big-b0-lr1e-05-s0", [f"{t}_ece_norm" for t in SPLITS]] = [filled[f"{t}_ece_norm"] for t in SPLITS]
    table = pd.read_csv(out / "table1.csv")
    single = table[table["n_trials"] == 1]
    assert len(single) > 0
    for row in single.itertuples():
        for task in SPLITS:
            assert getattr(row, f"{task}_accuracy") == pytest.approx(stored.at[row.trials, f"{task}_accuracy_norm"])
            assert getattr(row, f"{task}_ece") == pytest.approx(stored.at[row.trials, f"{task}_ece_norm"], nan_ok=True)
    assert stored[[f"{t}_ece_norm" for t in SPLITS]].ne(stored[[f"{t}_ece" for t in SPLITS]].to_numpy()).any().any()
    intervals = pd.read_csv(out / "ece_intervals.csv").join(
        single.set_index(["sft_dataset", "family", "label_smoothing"])[[f"{t}_ece" for t in SPLITS]],
        on=["sft_dataset", "family", "label_smoothing"], how="inner")
    checked = [(row.ece, getattr(row, f"{row.task}_ece")) for row in intervals.itertuples()
               if not pd.isna(getattr(row, f"{row.task}_ece"))]
    assert checked and all(ece == pytest.approx(stored_ece, rel=1e-12) for ece, stored_ece in checked)
    notes = (out / "notes.md").read_text()
    assert "length-normalised log-likelihoods" in notes
    assert "computed from their stored questions (their rows predate those columns): r1/big-b0-lr1e-05-s0" in notes
    assert "no length-normalised ECE for 1 trial(s) (rows written before the store had it, and no stored " \
           "questions): r2/big-b0.1-lr1e-05-s0" in notes
    assert "length-normalised" in (out / "table1.md").read_text()
    with pytest.raises(ValueError, match="expected a score"):
        load_results(str(root), score="loglik_mean")


def test_command_line(synthetic_store, tmp_path):
    command = [sys.executable, str(REPO / "sweeps" / "analyze.py"), str(synthetic_store), "--filter",
               "family=only0,task=mmlu", "--out", str(tmp_path), "--n-boot", "5"]
    done = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "wrote 10 files" in done.stdout and "alpaca/only0: no beta > 0 trial" in done.stdout
    assert (tmp_path / "table1.md").is_file()


def test_command_line_errors_are_one_line(synthetic_store, capsys):
    with pytest.raises(SystemExit) as stopped:
        main([str(synthetic_store), "--filter", "colour=red"])
    error = capsys.readouterr().err
    assert stopped.value.code == 2 and error.count("\n") == 1 and "expected KEY=VALUE" in error


def test_store_reads_with_duckdb(synthetic_store):
    duckdb = pytest.importorskip("duckdb")
    trials = str(synthetic_store / "trials" / "*.parquet")
    count, ece = duckdb.connect().execute(f"select count(*), avg(mmlu_ece) from read_parquet('{trials}') "
                            f"where status = 'ok' and sft_dataset = 'alpaca'").fetchone()
    expected = _stored_trials(synthetic_store).query("status == 'ok' and sft_dataset == 'alpaca'")
    assert count == len(expected) and ece == pytest.approx(expected["mmlu_ece"].mean())


def test_schema_doc_lists_every_column_and_its_queries_run(synthetic_store):
    doc = (REPO / "docs" / "analysis.md").read_text()
    assert f"store schema version {store.SCHEMA_VERSION}" in doc
    for name in [*store.TRIAL_SCHEMA.names, *store.QUESTION_SCHEMA.names]:
        assert f"`{name}`" in doc or name in store.METRIC_COLUMNS, name
    for metric in store.TASK_METRICS:
        assert f"`{metric}`" in doc or metric.removesuffix("_ts") in doc, metric
    duckdb = pytest.importorskip("duckdb")
    sql = doc.split("```sql\n")[1].split("```")[0].replace("results/", f"{synthetic_store}/")
    for query in filter(str.strip, sql.split(";")):
        assert len(duckdb.connect().execute(query).fetchall()) > 0
