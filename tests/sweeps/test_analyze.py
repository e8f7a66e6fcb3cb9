"""sweeps/analyze.py on synthetic stores of known numbers: every output is written and the tables hold the store's;
intervals count seeds, temperature scaling is read or fitted, and the entropy gap places measured entropy."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from xml.etree import ElementTree
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from matplotlib.image import imread

from calibration.entropy.bound import entropy_floor
from calibration.entropy.statistics import STATS as ENTROPY_STATS
from calibration.probabilities import choice_probs, top_label
from calibration.summary import TASK_METRICS, task_metrics
from calibration.temperature import fit_temperature
from sweeps import store
from sweeps.analysis.entropy import entropy_outputs
from sweeps.analysis.load import load_results, parse_filter
from sweeps.analysis.questions import cell_questions, ece_intervals, paired_differences
from sweeps.analysis.select import grid_points, table_one
from sweeps.analysis.tables import write_table_one
from sweeps.analysis.figures import ls_ts_against_beta
from sweeps.analysis.temperature import ls_ts_table, scaled_questions
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
    expected = ["table1.csv", "table1.md", "table1.tex", "paired_ece.csv", "paired_ece.md", "ece_intervals.csv",
                "delta_ece.csv", "entropy_gap.csv", "entropy_gap.png", "ls_ts.csv", "ls_ts.md", "notes.md"]
    for dataset in ("alpaca", "tulu3"):  # ls_ts: every trial stored held-out MMLU questions, so T is fitted
        expected += [f"ece_vs_beta_{dataset}.png", f"paired_ece_{dataset}.png", f"ls_ts_{dataset}.png",
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
    assert cells[3] == "2e-05" and cells[4] == "1" and cells[5] == "1"  # one trial, one seed
    ece = f"{100 * row['mmlu_ece']:.2f} [{100 * row['mmlu_ece_low']:.2f}, {100 * row['mmlu_ece_high']:.2f}]"
    assert cells[6:9] == [f"{100 * row['mmlu_accuracy']:.2f}", ece, f"{100 * row['mmlu_rms_ce']:.2f}"]
    assert "resamples of the cell's seeds, then of the questions (questions only where seeds = 1" in text


def test_latex_table_one_holds_the_markdown_cells_escaped(analysed):
    out, _ = analysed
    text, md = (out / "table1.tex").read_text(), (out / "table1.md").read_text()
    assert text.startswith("\\begin{table*}") and text.rstrip().endswith("\\end{table*}")
    assert "\\toprule" in text and "\\bottomrule" in text and "\\label{tab:table1}" in text
    caption = text.split("\\caption{", 1)[1].split("}\n", 1)[0]
    assert "95\\% percentile interval" in caption and "%" not in caption.replace("\\%", "")  # no bare comment sign
    md_rows = [[c.strip() for c in line.strip("|").split("|")] for line in md.splitlines()
               if line.startswith("| ") and not line.startswith(("| SFT data", "| ---"))]
    body = text.split("\\midrule\n", 1)[1].split("\\bottomrule", 1)[0]
    tex_rows = [[c.strip().replace("\\_", "_") for c in line.removesuffix("\\\\").split(" & ")]
                for line in body.strip().splitlines()]
    assert tex_rows == md_rows and len(tex_rows) == len(pd.read_csv(out / "table1.csv"))


def test_figures_in_every_format_asked_for(synthetic_store, tmp_path):
    written = main([str(synthetic_store), "--filter", "dataset=alpaca,task=mmlu", "--out", str(tmp_path),
                    "--n-boot", "5", "--format", "pdf,svg"])
    figures = [p for p in written if p.suffix not in (".csv", ".md", ".tex")]
    assert not [p for p in figures if p.suffix == ".png"] and not list(tmp_path.rglob("*.png"))
    stems = {p.with_suffix("") for p in figures}
    assert {p.with_suffix("").relative_to(tmp_path).as_posix() for p in figures} >= {
        "ece_vs_beta_alpaca", "entropy_gap", "reliability/alpaca/small__mmlu"}
    assert sorted(figures) == sorted(stem.with_suffix(f".{f}") for stem in stems for f in ("pdf", "svg"))
    for path in figures:
        if path.suffix == ".pdf":
            assert path.read_bytes().startswith(b"%PDF-")
        else:
            root = ElementTree.parse(path).getroot()
            assert root.tag == "{http://www.w3.org/2000/svg}svg" and len(root.findall(".//{*}path")) > 10


@pytest.mark.parametrize("formats", ["png,jpeg", "pfd", ""])
def test_unknown_figure_formats_are_one_line_errors(synthetic_store, tmp_path, capsys, formats):
    with pytest.raises(SystemExit) as stopped:
        main([str(synthetic_store), "--out", str(tmp_path), "--format", formats])
    error = capsys.readouterr().err
    assert stopped.value.code == 2 and error.count("\n") == 1 and "--format: expected" in error
    assert ("did you mean 'pdf'" in error) == (formats == "pfd") and not list(tmp_path.iterdir())


def test_question_level_ece_matches_the_stored_ece(analysed, synthetic_store):
    out, _ = analysed
    intervals = pd.read_csv(out / "ece_intervals.csv")
    table = pd.read_csv(out / "table1.csv").set_index(["sft_dataset", "family", "label_smoothing"])
    cells = intervals.join(table[[f"{t}_ece" for t in SPLITS]],  # every cell's trials share their questions
                           on=["sft_dataset", "family", "label_smoothing"])
    assert len(cells) > 0 and (cells["n_questions"] == N_QUESTIONS).all()
    assert set(cells["n_trials"]) == {1, 2} and (cells["n_seeds"] == cells["n_trials"]).all()
    for row in cells.itertuples():  # the held-out mmlu/val rows did not leak in; 2 seeds: Table 1's mean
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
                                               "paired_ece.csv", "paired_ece.md", "table1.csv", "table1.md",
                                               "table1.tex", "ls_ts.csv", "ls_ts.md", "ls_ts_alpaca.png"])


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
                                      and k in store.trial_schema().names and not pd.isna(v)})
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
    assert "wrote 14 files" in done.stdout and "alpaca/only0: no beta > 0 trial" in done.stdout
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
    for name in [*store.trial_schema().names, *store.QUESTION_SCHEMA.names]:
        assert f"`{name}`" in doc or name in store.metric_columns(), name
    for metric in TASK_METRICS:
        assert f"`{metric}`" in doc or metric.removesuffix("_ts") in doc, metric
    duckdb = pytest.importorskip("duckdb")
    sql = doc.split("```sql\n")[1].split("```")[0].replace("results/", f"{synthetic_store}/")
    for query in filter(str.strip, sql.split(";")):
        assert len(duckdb.connect().execute(query).fetchall()) > 0


def _seed_store(root: Path, spread: float, n: int = 400) -> None:
    """One family at beta 0 and 0.1, three seeds each, n MMLU questions; seed s's top-choice margins are larger
    by spread * s (so its confidence and ECE differ from the other seeds')."""
    margins = np.random.default_rng(7).uniform(0.0, 2.0, n)
    gold = np.where(np.arange(n) < 0.6 * n, 0, 1)
    for beta in (0.0, 0.1):
        for seed in range(3):
            loglik = np.zeros((n, 4)) - 1.0
            loglik[:, 0] = (margins + spread * seed) * (1 - beta)
            confidence, correct = top_label(choice_probs(loglik), gold)
            trial_id = _trial_id("s", "m", beta, 1e-5, seed)
            row = {"run_name": "s", "trial_id": trial_id, "status": "ok", "family": "m", "sft_dataset": "alpaca",
                   "learning_rate": 1e-5, "label_smoothing": beta, "seed": seed, "train_loss": 1.0,
                   "vocab_size": 1000, "hidden_size": 16, "config_json": json.dumps({"eval": {"n_bins": 15}})}
            row |= {f"mmlu_{k}": v for k, v in task_metrics(loglik, loglik, gold).items()}
            store.write_trial(str(root), row)
            store.write_questions(str(root), "s", trial_id, pa.table({
                "task": ["mmlu"] * n, "split": ["test"] * n, "question_id": [f"q{i}" for i in range(n)],
                "subject": ["s"] * n, "gold": gold.astype(np.int32), "n_choices": np.full(n, 4, np.int32),
                "loglik": loglik.tolist(), "loglik_norm": loglik.tolist(), "confidence": confidence,
                "correct": correct}))


def test_intervals_count_the_seeds_and_widen_with_their_spread(tmp_path):
    widths = {}
    for spread in (0.0, 1.5):
        root = tmp_path / f"spread{spread}"
        _seed_store(root, spread)
        results = load_results(str(root))
        table = table_one(grid_points(results.trials, results.tasks))
        cells = cell_questions(table, results.questions, results.tasks)
        intervals = ece_intervals(cells, 15, 200, 0)
        paired = paired_differences(cells, 15, 200, 0, [])
        write_table_one(table, intervals, results.tasks, 15, 200, root, "softmax")
        written = pd.read_csv(root / "table1.csv")
        assert list(written["n_seeds"]) == [3, 3] and list(written["mmlu_ece_n_seeds"]) == [3, 3]
        assert list(intervals["ece"]) == pytest.approx(list(written["mmlu_ece"]), rel=1e-12)  # Table 1's means
        assert "| 3 | 3 |" in (root / "table1.md").read_text()  # trials, seeds
        assert (paired["n_seeds"] == 3).all() and (paired["n_seeds_beta0"] == 3).all()
        widths[spread] = (intervals["high"] - intervals["low"]).to_numpy(), (paired["high"] - paired["low"]).iloc[0]
    assert (widths[1.5][0] > 2 * widths[0.0][0]).all() and widths[1.5][1] > 2 * widths[0.0][1]


def _question_file(root: Path, trial: str) -> pd.DataFrame:
    """A trial's stored questions as plain Parquet gives them."""
    return pq.read_table(root / "questions" / f"{trial.replace('/', '__')}.parquet").to_pandas()


def _ece_after(questions: pd.DataFrame, task: str, temperature: float) -> float:
    """The trial's own summary of its reported split at ``temperature`` (calibration.summary.task_metrics)."""
    rows = questions[(questions["task"] == task) & (questions["split"] == SPLITS[task])]
    loglik = np.stack(rows["loglik"].to_numpy())
    return task_metrics(loglik, np.stack(rows["loglik_norm"].to_numpy()), rows["gold"].to_numpy(),
                        temperature=temperature)["ece"]


def test_temperature_is_fitted_on_stored_held_out_questions_else_n_a(analysed, synthetic_store):
    out, _ = analysed
    ls_ts = pd.read_csv(out / "ls_ts.csv")
    interrupted = (ls_ts["sft_dataset"] == "tulu3") & (ls_ts["family"] == "big") & (ls_ts["label_smoothing"] == 0.1)
    assert set(ls_ts.loc[(ls_ts["task"] == "mmlu") & ~interrupted, "ts_source"]) == {"fitted"}
    assert set(ls_ts.loc[(ls_ts["task"] != "mmlu") | interrupted, "ts_source"]) == {"unavailable"}  # none held out
    assert ls_ts.loc[ls_ts["task"] != "mmlu", "ece_ts"].isna().all()
    single = ls_ts[(ls_ts["task"] == "mmlu") & (ls_ts["n_trials"] == 1) & ~interrupted]
    table = pd.read_csv(out / "table1.csv").set_index(["sft_dataset", "family", "label_smoothing"])
    for row in single.itertuples():
        trial = table.at[(row.sft_dataset, row.family, row.label_smoothing), "trials"]
        questions = _question_file(synthetic_store, trial)
        heldout = questions[(questions["task"] == "mmlu") & (questions["split"] == "val")]
        temperature = fit_temperature(np.stack(heldout["loglik"].to_numpy()), heldout["gold"].to_numpy())
        assert row.temperature == pytest.approx(temperature, rel=1e-12)
        assert row.ece_ts == pytest.approx(_ece_after(questions, "mmlu", temperature), rel=1e-12)
        assert row.ece == pytest.approx(table.at[(row.sft_dataset, row.family, row.label_smoothing), "mmlu_ece"])
    text = (out / "ls_ts.md").read_text()
    assert "LS + TS (beta)" in text and "| n/a | n/a |" in text
    assert "temperature scaling: stored T and ECE after TS" in (out / "notes.md").read_text()


def test_stored_temperature_columns_are_read_first(synthetic_store, tmp_path):
    root = tmp_path / "results"
    shutil.copytree(synthetic_store, root, ignore=shutil.ignore_patterns("analysis"))
    stored = {}
    for trial, row in _stored_trials(root).query("sft_dataset == 'alpaca' and family == 'small' and status == 'ok'"
                                                 ).iterrows():
        questions = _question_file(root, trial)
        stored[trial] = {f"{task}_ece_ts": _ece_after(questions, task, t) for task, t in (("mmlu", 2.0),
                                                                                          ("arc_easy", 0.5))}
        store.write_trial(str(root), {k: v for k, v in row.to_dict().items() if k in store.trial_schema().names
                                      and not pd.isna(v)} | stored[trial] | {"mmlu_temperature": 2.0,
                                                                             "arc_easy_temperature": 0.5})
    results = load_results(str(root), parse_filter("dataset=alpaca,family=small"))
    table = table_one(grid_points(results.trials, results.tasks))
    temperatures, scaled = scaled_questions(results)
    ls_ts = ls_ts_table(table, temperatures, ece_intervals(cell_questions(table, results.questions, results.tasks),
                                                           15, 5, 0),
                        ece_intervals(cell_questions(table, scaled, results.tasks), 15, 5, 0), results.tasks, [])
    assert imread(ls_ts_against_beta(ls_ts, "alpaca", results.tasks, tmp_path / "ls_ts.png")[0]).ndim == 3
    ls_ts, table = ls_ts.set_index(["task", "label_smoothing"]), table.set_index("label_smoothing")
    for beta in table.index:
        trial = table.at[beta, "trials"]
        for task, temperature in (("mmlu", 2.0), ("arc_easy", 0.5)):  # stored T wins over a fit on mmlu/val
            assert ls_ts.at[(task, beta), "ts_source"] == "stored"
            assert ls_ts.at[(task, beta), "temperature"] == temperature
            assert ls_ts.at[(task, beta), "ece_ts"] == pytest.approx(stored[trial][f"{task}_ece_ts"], rel=1e-12)
            assert ls_ts.at[(task, beta), "ece_ts_low"] <= ls_ts.at[(task, beta), "ece_ts_high"]  # from questions
        assert ls_ts.at[("hellaswag", beta), "ts_source"] == "unavailable"
    normalised = load_results(str(root), parse_filter("dataset=alpaca,family=small"), score="loglik_norm")
    sources = scaled_questions(normalised)[0].groupby("task")["source"].agg(set)
    assert sources.to_dict() == {"mmlu": {"fitted"}, "arc_easy": {"unavailable"},  # stored T is of loglik
                                 "hellaswag": {"unavailable"}}


def test_old_store_entropy_gap_is_our_rank_bound_and_says_so(analysed):
    out, _ = analysed
    assert "no selected trial stores the measured entropy columns" in (out / "notes.md").read_text()
    assert "normalised_entropy_gap" in pd.read_csv(out / "entropy_gap.csv")


def test_entropy_gap_places_each_trial_s_measured_entropy_beside_its_floor(synthetic_store, tmp_path):
    trials = load_results(str(synthetic_store)).trials
    measured = trials["trial"] != "r1/small-b0-lr1e-05-s0"  # one trial from before the columns: left off, noted
    log_v, hidden = np.log(trials["vocab_size"].astype(float)), trials["hidden_size"].astype(float)
    rho = log_v / np.sqrt(hidden) * (1 + trials["label_smoothing"])  # a floor between 0 and log |V|
    floor = entropy_floor(trials["vocab_size"].astype(float), hidden, rho)
    trials.loc[measured, list(ENTROPY_STATS)] = np.column_stack([
        np.full(len(trials), 4.0), rho / 4.0, rho / 5.0, rho, floor, (floor + log_v) / 2])[measured.to_numpy()]
    notes: list[str] = []
    written, line = entropy_outputs(trials, 1.0, tmp_path, notes)
    assert [p.name for p in written] == ["entropy_gap.csv", "entropy_gap.png"] and imread(written[1]).ndim == 3
    rows = pd.read_csv(written[0]).set_index("trial")
    assert set(rows.index) == set(trials["trial"][measured]) and "eq. 14" in line
    assert notes == ["no measured entropy for 1 trial(s), left off entropy_gap: r1/small-b0-lr1e-05-s0"]
    log_v = np.log(rows["vocab_size"].astype(float))
    np.testing.assert_allclose(rows["floor_gap"], (log_v - rows["entropy_floor"]) / log_v, rtol=1e-12)
    np.testing.assert_allclose(rows["entropy_gap"], rows["floor_gap"] / 2, rtol=1e-12)  # halfway to log |V|
    assert rows["floor_gap"].between(0.05, 0.95).all()


@pytest.mark.skipif(not set(ENTROPY_STATS) <= set(store.trial_schema().names),
                    reason="the store schema does not have the entropy-floor columns yet")
def test_entropy_columns_written_to_the_store_reach_the_figure(synthetic_store, tmp_path):
    root = tmp_path / "results"
    shutil.copytree(synthetic_store, root, ignore=shutil.ignore_patterns("analysis"))
    trial, row = next(iter(_stored_trials(root).query("family == 'small'").iterrows()))
    stats = {"sigma_c": 3.0, "sigma_h_max": 0.01, "sigma_h_p999": 0.008, "rho": 0.03, "mean_entropy": 9.0,
             "entropy_floor": float(entropy_floor(row["vocab_size"], row["hidden_size"], 0.03))}
    store.write_trial(str(root), {k: v for k, v in row.to_dict().items() if k in store.trial_schema().names
                                  and not pd.isna(v)} | stats)
    out = tmp_path / "out"
    analyze(str(root), parse_filter("family=small,task=mmlu"), out, n_boot=5)
    gap = pd.read_csv(out / "entropy_gap.csv")
    assert list(gap["trial"]) == [trial] and gap.loc[0, "entropy_floor"] == stats["entropy_floor"]


def test_ats_columns_come_from_ats_questions_else_the_trial_column_and_old_stores_read_n_a(synthetic_store, analysed,
                                                                                           tmp_path):
    """alpaca/small trials get ATS question rows (split '<split>+ats') for MMLU and ARC-Easy, scored at T = 3, and
    a stored hellaswag_ece_ats without questions; the rest of the store (and the old store) has no ATS."""
    root = tmp_path / "results"
    shutil.copytree(synthetic_store, root, ignore=shutil.ignore_patterns("analysis"))
    expected = {}
    for trial, row in _stored_trials(root).query("sft_dataset == 'alpaca' and family == 'small' and status == 'ok'"
                                                 ).iterrows():
        questions = _question_file(root, trial)
        ats = questions[questions["split"].isin(["test"]) & questions["task"].isin(["mmlu", "arc_easy"])].copy()
        ats["split"] = "test+ats"
        ats["loglik"] = [list(np.asarray(ll) / 3.0) for ll in ats["loglik"]]
        ats["confidence"] = [choice_probs(np.asarray(ll)[None])[0].max() for ll in ats["loglik"]]
        expected[trial] = {task: _ece_after(questions, task, 3.0) for task in ("mmlu", "arc_easy")}
        table = pa.Table.from_pandas(pd.concat([questions, ats], ignore_index=True), preserve_index=False)
        store.write_questions(str(root), *trial.split("/"), table.drop(["schema_version", "run_name", "trial_id"]))
        store.write_trial(str(root), {k: v for k, v in row.to_dict().items() if k in store.trial_schema().names
                                      and not pd.isna(v)} | {"hellaswag_ece_ats": 0.123, "mmlu_ece_ats": 0.9})
    out = tmp_path / "out"
    written = analyze(str(root), parse_filter("dataset=alpaca,family=small"), out, n_boot=20)
    assert out / "ls_ts_alpaca.png" in written
    ls_ts = pd.read_csv(out / "ls_ts.csv").set_index(["task", "label_smoothing"])
    table = pd.read_csv(out / "table1.csv").set_index("label_smoothing")
    for beta in table.index:
        trial = table.at[beta, "trials"]
        for task in ("mmlu", "arc_easy"):  # the questions win over the stored column
            assert ls_ts.at[(task, beta), "ece_ats"] == pytest.approx(expected[trial][task], rel=1e-9)
            assert ls_ts.at[(task, beta), "ece_ats_low"] <= ls_ts.at[(task, beta), "ece_ats_high"]
        assert ls_ts.at[("hellaswag", beta), "ece_ats"] == 0.123 and pd.isna(ls_ts.at[("hellaswag", beta),
                                                                                       "ece_ats_low"])
        assert ls_ts.at[("mmlu", beta), "ats_trials"] == 1
    markdown = (out / "ls_ts.md").read_text()
    assert "| ATS (beta = 0) | LS + ATS (beta) |" in markdown and "12.30" in markdown
    assert "adaptive temperature scaling: ECE after ATS" in (out / "notes.md").read_text()
    old, _ = analysed  # a store without ATS reads as before, its ATS columns empty
    old_ls_ts = pd.read_csv(old / "ls_ts.csv")
    assert old_ls_ts["ece_ats"].isna().all() and (old_ls_ts["ats_trials"] == 0).all()
    assert "n/a | n/a | n/a | n/a" in (old / "ls_ts.md").read_text()
