"""Benchmark questions: MMLU, ARC-Easy and HellaSwag, read from local copies or the Hugging Face hub.

Every loader returns ``Question``s in a fixed order (MMLU: subjects alphabetically, then file order; ARC and
HellaSwag: file order), so "the first K questions" means the same thing on every machine. Local files follow
the official layouts described in ``shared/data/README.md``; a malformed row raises ``DataSourceError`` naming
the file and line.
"""

from __future__ import annotations

import csv
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from common.datasource import DataSourceError, load_hub_dataset, resolve_data_dir

LETTERS = "ABCDE"


@dataclass(frozen=True)
class Question:
    """One multiple-choice question; ``gold`` indexes ``choices``."""

    question_id: str
    subject: str
    stem: str
    choices: tuple[str, ...]
    gold: int


# ---- MMLU ------------------------------------------------------------------------------------------------

MMLU_SPLITS = {"dev": "dev", "val": "validation", "test": "test"}  # local name -> hub split


def load_mmlu(split: str, *, data_dir: str | Path | None = None,
              subjects: tuple[str, ...] | None = None) -> list[Question]:
    """MMLU ``split`` (dev | val | test), subjects sorted alphabetically, questions in file order."""
    _check_split("mmlu", split, MMLU_SPLITS)
    root = resolve_data_dir(data_dir)
    if root is not None:
        folder = root / "mmlu" / split
        files = sorted(folder.glob(f"*_{split}.csv"))
        if not files:
            raise DataSourceError(f"no MMLU files {folder}/<subject>_{split}.csv; expected the Hendrycks layout")
        questions = [q for f in files for q in _read_mmlu_csv(f, f.name[: -len(f"_{split}.csv")], split)]
    else:
        rows = load_hub_dataset("cais/mmlu", name="all", split=MMLU_SPLITS[split],
                                local_hint="mmlu/{dev,val,test}/<subject>_<split>.csv")
        counters: dict[str, int] = {}
        questions = []
        for row in rows:
            index = counters[row["subject"]] = counters.get(row["subject"], -1) + 1
            questions.append(Question(f"{row['subject']}/{split}/{index}", row["subject"], row["question"],
                                      tuple(row["choices"]), int(row["answer"])))
        questions.sort(key=lambda q: q.subject)  # stable: file order within a subject
    if subjects is not None:
        unknown = set(subjects) - {q.subject for q in questions}
        if unknown:
            raise ValueError(f"expected MMLU subjects, got unknown {sorted(unknown)}")
        questions = [q for q in questions if q.subject in subjects]
    return questions


def _read_mmlu_csv(path: Path, subject: str, split: str) -> list[Question]:
    questions = []
    with open(path, newline="", encoding="utf-8") as handle:
        reader = csv.reader(handle)
        for row in reader:
            if len(row) != 6 or row[5].strip() not in LETTERS[:4]:
                raise DataSourceError(f"{path}:{reader.line_num}: expected 6 fields question,A,B,C,D,answer "
                                      f"with answer in A-D, got {len(row)} fields ending {row[-1:]!r}")
            questions.append(Question(f"{subject}/{split}/{len(questions)}", subject, row[0], tuple(row[1:5]),
                                      LETTERS.index(row[5].strip())))
    return questions


# ---- ARC-Easy --------------------------------------------------------------------------------------------

ARC_SPLITS = {"train": ("Train", "train"), "dev": ("Dev", "validation"), "test": ("Test", "test")}


def load_arc_easy(split: str, *, data_dir: str | Path | None = None) -> list[Question]:
    """ARC-Easy ``split`` (train | dev | test) in file order; 3-5 choices, answer keys A-E or 1-5."""
    _check_split("arc_easy", split, ARC_SPLITS)
    root = resolve_data_dir(data_dir)
    if root is not None:
        path = root / "arc_easy" / f"ARC-Easy-{ARC_SPLITS[split][0]}.jsonl"
        return [_arc_question(record, f"{path}:{line}") for line, record in _read_jsonl(path)]
    rows = load_hub_dataset("allenai/ai2_arc", name="ARC-Easy", split=ARC_SPLITS[split][1],
                            local_hint="arc_easy/ARC-Easy-{Train,Dev,Test}.jsonl")
    return [_arc_question({"id": r["id"], "answerKey": r["answerKey"],
                           "question": {"stem": r["question"],
                                        "choices": [{"text": t, "label": lab}
                                                    for t, lab in zip(r["choices"]["text"], r["choices"]["label"])]}},
                          f"allenai/ai2_arc row {i}") for i, r in enumerate(rows)]


def _arc_question(record: dict[str, Any], where: str) -> Question:
    try:
        choices = record["question"]["choices"]
        labels = [c["label"] for c in choices]
        gold = labels.index(record["answerKey"])
        question = Question(record["id"], "arc_easy", record["question"]["stem"],
                            tuple(c["text"] for c in choices), gold)
    except (KeyError, TypeError, ValueError) as exc:
        raise DataSourceError(f"{where}: expected an AI2 ARC record {{id, question:{{stem, choices:[{{text,label}}]}}, "
                              f"answerKey in the labels}}, got {type(exc).__name__}: {exc}") from None
    if not 2 <= len(question.choices) <= len(LETTERS):
        raise DataSourceError(f"{where}: expected 2-{len(LETTERS)} choices, got {len(question.choices)}")
    return question


# ---- HellaSwag -------------------------------------------------------------------------------------------

HELLASWAG_SPLITS = {"train": "train", "val": "validation"}


def load_hellaswag(split: str, *, data_dir: str | Path | None = None) -> list[Question]:
    """HellaSwag ``split`` (train | val) in file order, with lm-evaluation-harness's preprocessing."""
    _check_split("hellaswag", split, HELLASWAG_SPLITS)
    root = resolve_data_dir(data_dir)
    if root is not None:
        path = root / "hellaswag" / f"hellaswag_{split}.jsonl"
        return [_hellaswag_question(record, i, f"{path}:{line}")
                for i, (line, record) in enumerate(_read_jsonl(path))]
    rows = load_hub_dataset("Rowan/hellaswag", name=None, split=HELLASWAG_SPLITS[split],
                            local_hint="hellaswag/hellaswag_{train,val}.jsonl")
    return [_hellaswag_question(dict(r), i, f"Rowan/hellaswag row {i}") for i, r in enumerate(rows)]


def hellaswag_preprocess(text: str) -> str:
    """lm-eval's cleanup: strip, ' [title]' -> '. ', drop '[...]' WikiHow artefacts, collapse double spaces."""
    text = text.strip().replace(" [title]", ". ")
    text = re.sub("\\[.*?\\]", "", text)
    return text.replace("  ", " ")


def _hellaswag_question(record: dict[str, Any], index: int, where: str) -> Question:
    """The question id is the row's position in the split (lm-eval's doc id): the files' ``ind`` repeats
    (433 of the 10,042 validation rows share an ``ind`` with another row)."""
    try:
        stem = hellaswag_preprocess(record["activity_label"] + ": " + record["ctx_a"] + " "
                                    + record["ctx_b"].capitalize())
        choices = tuple(hellaswag_preprocess(e) for e in record["endings"])
        gold = int(record["label"])
        question = Question(str(index), record["activity_label"], stem, choices, gold)
    except (KeyError, TypeError, ValueError) as exc:
        raise DataSourceError(f"{where}: expected a HellaSwag record {{ind, activity_label, ctx_a, ctx_b, "
                              f"endings, label}}, got {type(exc).__name__}: {exc}") from None
    if len(choices) != 4 or not 0 <= gold < 4:
        raise DataSourceError(f"{where}: expected 4 endings and label 0-3, got {len(choices)} endings, label {gold}")
    return question


# ---- shared ----------------------------------------------------------------------------------------------

LOADERS: dict[str, Callable[..., list[Question]]] = {
    "mmlu": load_mmlu, "arc_easy": load_arc_easy, "hellaswag": load_hellaswag}


def _check_split(dataset: str, split: str, known: dict[str, Any]) -> None:
    if split not in known:
        raise ValueError(f"expected a {dataset} split in {sorted(known)}, got {split!r}")


def _read_jsonl(path: Path):
    """Yield (line number, record) from a JSON-lines file; a bad line is a one-line ``DataSourceError``."""
    if not path.is_file():
        raise DataSourceError(f"missing {path}; expected the official JSON-lines file there")
    with open(path, encoding="utf-8") as handle:
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataSourceError(f"{path}:{line_number}: expected one JSON object per line, got {exc.msg}") from None
            if not isinstance(record, dict):
                raise DataSourceError(f"{path}:{line_number}: expected a JSON object, got {type(record).__name__}")
            yield line_number, record
