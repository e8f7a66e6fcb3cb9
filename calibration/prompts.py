"""Prompt formats, written to reproduce lm-evaluation-harness's default task templates string for string.

A prompt is ``prefix + query`` followed by one of the ``continuations``. The prefix (task description and
k-shot examples) is the part shared by many questions; the scorer computes its KV cache once. lm-eval joins
examples with ``fewshot_delimiter="\\n\\n"`` and puts ``target_delimiter=" "`` before every answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from calibration.tasks import LETTERS, Question

FEWSHOT_DELIMITER = "\n\n"
TARGET_DELIMITER = " "


@dataclass(frozen=True)
class Prompt:
    """What the scorer sees for one question: context = prefix + query, scored continuations.

    ``choice_lengths`` are the character lengths lm-eval divides by for ``acc_norm`` (the choice text without
    the target delimiter).
    """

    prefix: str
    query: str
    continuations: tuple[str, ...]
    choice_lengths: tuple[int, ...]


@dataclass(frozen=True)
class PromptFormat:
    """How one task renders a question (``text``), its answer (``targets``) and the task description."""

    text: Callable[[Question], str]
    targets: Callable[[Question], tuple[str, ...]]
    description: Callable[[str], str]


def render(fmt: PromptFormat, question: Question, shots: list[Question]) -> Prompt:
    """``description + (text(s) + " " + target(s) + "\\n\\n") for s in shots`` as prefix, ``text(question)`` as query."""
    examples = "".join(fmt.text(s) + TARGET_DELIMITER + fmt.targets(s)[s.gold] + FEWSHOT_DELIMITER for s in shots)
    targets = fmt.targets(question)
    return Prompt(prefix=fmt.description(question.subject) + examples, query=fmt.text(question),
                  continuations=tuple(TARGET_DELIMITER + t for t in targets),
                  choice_lengths=tuple(len(t) for t in targets))


def _lettered_choices(question: Question) -> str:
    return "".join(f"\n{LETTERS[i]}. {choice}" for i, choice in enumerate(question.choices))


def _letters(question: Question) -> tuple[str, ...]:
    return tuple(LETTERS[: len(question.choices)])


def _mmlu_description(subject: str) -> str:
    return f"The following are multiple choice questions (with answers) about {subject.replace('_', ' ')}.\n\n"


def _no_description(subject: str) -> str:
    return ""


MMLU = PromptFormat(text=lambda q: q.stem.strip() + _lettered_choices(q) + "\nAnswer:",
                    targets=_letters, description=_mmlu_description)
"""lm-eval ``mmlu`` (default): question, ``A. ..`` to ``D. ..``, ``Answer:``; choices `` A``..`` D``."""

ARC_CLOZE = PromptFormat(text=lambda q: f"Question: {q.stem}\nAnswer:",
                         targets=lambda q: q.choices, description=_no_description)
"""lm-eval ``arc_easy``: ``Question: {stem}\\nAnswer:`` scored on the full text of each choice."""

ARC_LETTERED = PromptFormat(text=lambda q: f"Question: {q.stem}" + _lettered_choices(q) + "\nAnswer:",
                            targets=_letters, description=_no_description)
"""ARC with the choices listed as ``A. ..`` and scored on the letters (MMLU style, letters by position)."""

HELLASWAG = PromptFormat(text=lambda q: q.stem, targets=lambda q: q.choices, description=_no_description)
"""lm-eval ``hellaswag``: the preprocessed ``activity_label: ctx_a Ctx_b`` and the four preprocessed endings."""

FORMATS: dict[str, PromptFormat] = {
    "mmlu": MMLU, "arc_cloze": ARC_CLOZE, "arc_lettered": ARC_LETTERED, "hellaswag": HELLASWAG}
