"""Task registry: which data, split, prompt format and k-shot examples make up each named task.

Defaults follow lm-evaluation-harness: MMLU 5-shot from dev (first five per subject), ARC-Easy and HellaSwag
zero-shot. ``fit_split`` is the held-out split temperature scaling is fitted on (None: no held-out split).

``TASKS`` is the one place a task is declared: a sweep config accepts its name (``eval.tasks``), the results store
has its metric columns (``sweeps.store.trial_schema``), the console and the analysis show it. A new
multiple-choice task over a loaded dataset is one entry here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from calibration.prompts import FORMATS, Prompt, render
from calibration.tasks import LOADERS, Question


@dataclass(frozen=True)
class TaskConfig:
    name: str  # the name results are reported under
    dataset: str  # key of calibration.tasks.LOADERS
    prompt_format: str  # key of calibration.prompts.FORMATS
    split: str = "test"  # the split that is scored and reported
    fewshot_split: str | None = None  # where the k-shot examples come from (first k, per subject for MMLU)
    k_shot: int = 0
    fit_split: str | None = None  # held-out split for temperature scaling
    subjects: tuple[str, ...] | None = None  # MMLU subset; None = all 57
    title: str = ""  # how tables and figures name it; "" = name
    questions: int | None = None  # in the scored split, as published (what a sweep's GPU-hours plan for)

    def __post_init__(self) -> None:
        if not self.title:
            object.__setattr__(self, "title", self.name)  # frozen: the one write, at construction
        problems = []
        if self.dataset not in LOADERS:
            problems.append(f"dataset in {sorted(LOADERS)}, got {self.dataset!r}")
        if self.prompt_format not in FORMATS:
            problems.append(f"prompt_format in {sorted(FORMATS)}, got {self.prompt_format!r}")
        if self.k_shot < 0 or (self.k_shot > 0 and self.fewshot_split is None):
            problems.append(f"k_shot >= 0 with a fewshot_split when k_shot > 0, got k_shot={self.k_shot}, "
                            f"fewshot_split={self.fewshot_split!r}")
        if self.subjects is not None and self.dataset != "mmlu":
            problems.append(f"subjects only for mmlu, got subjects for {self.dataset!r}")
        if problems:
            raise ValueError(f"task {self.name!r}: expected " + "; expected ".join(problems))


TASKS: dict[str, TaskConfig] = {  # in the order tables show them (the paper's Table 1: MMLU, HellaSwag, ARC-Easy)
    "mmlu": TaskConfig("mmlu", "mmlu", "mmlu", split="test", fewshot_split="dev", k_shot=5, fit_split="val",
                       title="MMLU", questions=14042),
    "hellaswag": TaskConfig("hellaswag", "hellaswag", "hellaswag", split="val", fewshot_split="train",
                            title="HellaSwag", questions=10042),
    "arc_easy": TaskConfig("arc_easy", "arc_easy", "arc_cloze", split="test", fewshot_split="train",
                           fit_split="dev", title="ARC-Easy", questions=2376),
    "arc_easy_lettered": TaskConfig("arc_easy_lettered", "arc_easy", "arc_lettered", split="test",
                                    fewshot_split="train", fit_split="dev", title="ARC-Easy (lettered)",
                                    questions=2376),
}
DEFAULT_TASKS = ("mmlu", "arc_easy", "hellaswag")  # what a trial and the evaluate CLI score unless told, in this order


def resolve_task(task: str | TaskConfig) -> TaskConfig:
    """A registry name or a ready ``TaskConfig``."""
    if isinstance(task, TaskConfig):
        return task
    if task not in TASKS:
        raise ValueError(f"expected a task in {sorted(TASKS)} or a TaskConfig, got {task!r}")
    return TASKS[task]


def with_split(config: TaskConfig, split: str) -> TaskConfig:
    """The same task scored on another split (e.g. its ``fit_split``)."""
    return dataclasses.replace(config, split=split)


def load_prompts(config: TaskConfig, *, data_dir: str | Path | None = None,
                 limit: int | None = None) -> tuple[list[Question], list[Prompt]]:
    """The first ``limit`` questions of ``config.split`` and their prompts, k-shot examples included."""
    if limit is not None and limit < 1:
        raise ValueError(f"expected limit >= 1 or None, got {limit}")
    kwargs = {"subjects": config.subjects} if config.dataset == "mmlu" else {}
    questions = LOADERS[config.dataset](config.split, data_dir=data_dir, **kwargs)[:limit]
    shots_by_subject: dict[str, list[Question]] = {}
    if config.k_shot > 0:
        pool = LOADERS[config.dataset](config.fewshot_split, data_dir=data_dir, **kwargs)
        for question in pool:
            key = question.subject if config.dataset == "mmlu" else ""
            shots_by_subject.setdefault(key, []).append(question)
    fmt = FORMATS[config.prompt_format]
    prompts = []
    for question in questions:
        pool = shots_by_subject.get(question.subject if config.dataset == "mmlu" else "", [])
        shots = [s for s in pool if s.question_id != question.question_id][: config.k_shot]
        if len(shots) < config.k_shot:
            raise ValueError(f"expected {config.k_shot} k-shot examples for {config.name}/{question.subject} "
                             f"in split {config.fewshot_split!r}, got {len(shots)}")
        prompts.append(render(fmt, question, shots))
    return questions, prompts
