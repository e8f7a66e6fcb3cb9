from __future__ import annotations

import shutil

import pytest

from common import datasource
from common.datasource import DataSourceError
from calibration.tasks import hellaswag_preprocess, load_arc_easy, load_hellaswag, load_mmlu


def test_mmlu_order_fields_and_subjects(mini_data):
    questions = load_mmlu("test", data_dir=mini_data)
    assert [q.subject for q in questions] == ["anatomy"] * 4 + ["high_school_physics"] * 4
    first = questions[0]
    assert first.question_id == "anatomy/test/0"
    assert first.stem == "anatomy test question 0, with a comma?"
    assert first.choices == ("yes 0", "no", "maybe,\nsometimes", "never") and first.gold == 0
    assert [q.gold for q in questions[:4]] == [0, 1, 2, 3]
    only = load_mmlu("dev", data_dir=mini_data, subjects=("high_school_physics",))
    assert {q.subject for q in only} == {"high_school_physics"} and len(only) == 5
    with pytest.raises(ValueError, match="expected MMLU subjects"):
        load_mmlu("dev", data_dir=mini_data, subjects=("astrology",))
    with pytest.raises(ValueError, match="expected a mmlu split"):
        load_mmlu("validation", data_dir=mini_data)


def test_arc_handles_numeric_keys_and_three_or_five_choices(mini_data):
    questions = load_arc_easy("test", data_dir=mini_data)
    assert [len(q.choices) for q in questions] == [4, 4, 3, 5]
    assert [q.gold for q in questions] == [0, 0, 1, 2]
    assert questions[1].question_id == "Test_q2"


def test_hellaswag_applies_lm_eval_preprocessing(mini_data):
    first, second = load_hellaswag("val", data_dir=mini_data)
    assert first.stem == "Baking cookies: A woman mixes flour in a bowl. She"
    assert first.choices == ("jumps into a lake.", "paints the. wall.", "adds two eggs and stirs.", "sings loudly now.")
    assert first.gold == 2 and (first.question_id, second.question_id) == ("0", "1")  # row positions
    assert second.stem == "Home and Garden: How to water a plant"
    assert hellaswag_preprocess("  a [title] b [x]c  ") == "a. b c"


def test_malformed_rows_name_file_and_line(tmp_path, mini_data):
    root = tmp_path / "data"
    shutil.copytree(mini_data, root)
    csv_path = root / "mmlu" / "test" / "anatomy_test.csv"
    csv_path.write_text(csv_path.read_text() + "too,few,fields\n")
    with pytest.raises(DataSourceError, match=r"anatomy_test\.csv:9: expected 6 fields") as info:
        load_mmlu("test", data_dir=root)  # four rows of two lines each (a quoted newline), then the bad one
    assert "\n" not in str(info.value)

    arc = root / "arc_easy" / "ARC-Easy-Dev.jsonl"
    arc.write_text(arc.read_text() + '{"id": "x", "question": {"stem": "s", "choices": []}, "answerKey": "A"}\n')
    with pytest.raises(DataSourceError, match=r"ARC-Easy-Dev\.jsonl:5: expected an AI2 ARC record"):
        load_arc_easy("dev", data_dir=root)

    swag = root / "hellaswag" / "hellaswag_val.jsonl"
    swag.write_text(swag.read_text() + "not json\n")
    with pytest.raises(DataSourceError, match=r"hellaswag_val\.jsonl:3: expected one JSON object per line"):
        load_hellaswag("val", data_dir=root)


def test_missing_local_file_and_unreachable_hub_are_one_line_errors(tmp_path, monkeypatch):
    with pytest.raises(DataSourceError, match="missing .*ARC-Easy-Test.jsonl"):
        load_arc_easy("test", data_dir=tmp_path)

    def offline(*args, **kwargs):
        raise ConnectionError("offline\nmore detail")

    import datasets

    monkeypatch.setattr(datasets, "load_dataset", offline)
    monkeypatch.delenv(datasource.DATA_DIR_ENV, raising=False)
    with pytest.raises(DataSourceError, match=r"cannot load Rowan/hellaswag \(validation\).*offline") as info:
        load_hellaswag("val")
    assert "\n" not in str(info.value)


def test_hub_rows_map_to_the_same_questions(monkeypatch):
    rows = [{"question": "Q?", "subject": "anatomy", "choices": ["a", "b", "c", "d"], "answer": 2}]
    import calibration.tasks as tasks

    monkeypatch.setattr(tasks, "load_hub_dataset", lambda *a, **k: rows)
    monkeypatch.delenv(datasource.DATA_DIR_ENV, raising=False)
    (question,) = load_mmlu("test")
    assert question.question_id == "anatomy/test/0" and question.choices == ("a", "b", "c", "d")
    assert question.gold == 2


def test_real_files_have_the_documented_sizes(shared_data):
    assert len(load_mmlu("dev", data_dir=shared_data)) == 285
    assert len(load_mmlu("val", data_dir=shared_data)) == 1531
    arc = load_arc_easy("test", data_dir=shared_data)
    assert len(arc) == 2376 and {len(q.choices) for q in arc} == {3, 4, 5}
    assert len(load_hellaswag("val", data_dir=shared_data)) == 10042


def test_question_ids_are_unique_in_the_real_files(data_dir):
    """HellaSwag's ``ind`` repeats in the official validation file; ids must not (the store keys on them)."""
    for questions in (load_hellaswag("val", data_dir=data_dir), load_arc_easy("test", data_dir=data_dir),
                      load_mmlu("test", data_dir=data_dir)):
        ids = [q.question_id for q in questions]
        assert len(set(ids)) == len(ids)
