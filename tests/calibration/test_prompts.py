from __future__ import annotations

import dataclasses

import pytest

from calibration.prompts import ARC_CLOZE, ARC_LETTERED, HELLASWAG, MMLU, render
from calibration.task_config import TASKS, TaskConfig, load_prompts
from calibration.tasks import Question

ALGEBRA = Question("abstract_algebra/test/0", "abstract_algebra", " Find the order of 2 in Z_5. ",
                   ("1", "2", "4", "5"), 2)
SHOT = Question("abstract_algebra/dev/0", "abstract_algebra", "Is 7 prime?", ("yes", "no", "both", "neither"), 0)


def test_mmlu_matches_lm_eval_default_template():
    prompt = render(MMLU, ALGEBRA, [SHOT])
    assert prompt.prefix == ("The following are multiple choice questions (with answers) about abstract algebra.\n\n"
                             "Is 7 prime?\nA. yes\nB. no\nC. both\nD. neither\nAnswer: A\n\n")
    assert prompt.query == "Find the order of 2 in Z_5.\nA. 1\nB. 2\nC. 4\nD. 5\nAnswer:"
    assert prompt.continuations == (" A", " B", " C", " D") and prompt.choice_lengths == (1, 1, 1, 1)


def test_arc_cloze_and_lettered():
    question = Question("x", "arc_easy", "Which is a planet?", ("Moon", "Mars", "Sun"), 1)
    cloze = render(ARC_CLOZE, question, [])
    assert (cloze.prefix, cloze.query) == ("", "Question: Which is a planet?\nAnswer:")
    assert cloze.continuations == (" Moon", " Mars", " Sun") and cloze.choice_lengths == (4, 4, 3)
    lettered = render(ARC_LETTERED, question, [])
    assert lettered.query == "Question: Which is a planet?\nA. Moon\nB. Mars\nC. Sun\nAnswer:"
    assert lettered.continuations == (" A", " B", " C")


def test_hellaswag_scores_endings_after_the_context():
    question = Question("1", "Baking", "Baking: She mixes. She", ("adds eggs.", "sleeps."), 0)
    prompt = render(HELLASWAG, question, [])
    assert (prompt.prefix, prompt.query, prompt.continuations) == ("", "Baking: She mixes. She",
                                                                   (" adds eggs.", " sleeps."))


def test_load_prompts_takes_first_k_shots_per_subject(mini_data):
    questions, prompts = load_prompts(TASKS["mmlu"], data_dir=mini_data, limit=5)
    assert len(questions) == 5 and questions[4].subject == "high_school_physics"
    assert prompts[0].prefix.count("Answer:") == 5 and "anatomy dev question 4" in prompts[0].prefix
    assert "about high school physics." in prompts[4].prefix and "anatomy" not in prompts[4].prefix
    two_shot = dataclasses.replace(TASKS["arc_easy"], k_shot=2)
    _, arc = load_prompts(two_shot, data_dir=mini_data)
    assert arc[0].prefix == ("Question: Which is a mammal?\nAnswer: cat\n\n"
                             "Question: What melts ice fastest?\nAnswer: salt\n\n")


def test_task_config_reports_every_problem(mini_data):
    with pytest.raises(ValueError) as info:
        TaskConfig("bad", "mmlu2", "cloze", k_shot=3, subjects=("a",))
    message = str(info.value)
    assert "dataset in" in message and "prompt_format in" in message and "fewshot_split" in message
    with pytest.raises(ValueError, match="expected 9 k-shot examples"):
        load_prompts(dataclasses.replace(TASKS["mmlu"], k_shot=9), data_dir=mini_data)
