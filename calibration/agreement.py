"""Check our scorer against lm-evaluation-harness on the same model, files and questions.

    pip install lm-eval   # not a calsweep dependency; only this check needs it
    python -m calibration.agreement --model /path/to/hf-model-dir --data-dir ../shared/data --limit 500 \\
        --out results/agreement

lm-eval reads the local files through task YAMLs with ``dataset_path: json`` written here (its default
``arc_easy`` and ``hellaswag`` templates, its own HellaSwag preprocessing), scores the first ``limit`` questions
(``--limit``, per MMLU subject), and we score the same questions with ``evaluate_model``; MMLU subjects use
lm-eval's own default MMLU template with only the data source swapped (``calsweep_mmlu_<subject>``). Reported: acc and acc_norm of both,
the largest per-choice log-likelihood difference and the number of questions whose prediction differs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from calibration.task_config import TASKS, TaskConfig

ARC_YAML = """task: calsweep_arc_easy
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data_dir}/arc_easy/ARC-Easy-Test.jsonl
output_type: multiple_choice
test_split: test
doc_to_text: "Question: {{{{question.stem}}}}\\nAnswer:"
doc_to_target: "{{{{(question.choices | map(attribute='label') | list).index(answerKey)}}}}"
doc_to_choice: "{{{{question.choices | map(attribute='text') | list}}}}"
metric_list:
  - metric: acc
  - metric: acc_norm
"""

HELLASWAG_YAML = """task: calsweep_hellaswag
dataset_path: json
dataset_kwargs:
  data_files:
    validation: {data_dir}/hellaswag/hellaswag_val.jsonl
output_type: multiple_choice
validation_split: validation
process_docs: !function calsweep_hellaswag_utils.process_docs
doc_to_text: "{{{{query}}}}"
doc_to_target: "{{{{label}}}}"
doc_to_choice: "choices"
metric_list:
  - metric: acc
  - metric: acc_norm
"""

HELLASWAG_UTILS = "from lm_eval.tasks.hellaswag.utils import process_docs  # lm-eval's own preprocessing\n"

MMLU_YAML = """include: {template}
task: calsweep_mmlu_{subject}
custom_dataset: !function calsweep_mmlu_utils.load_subject
dataset_kwargs:
  subject: {subject}
  data_dir: {data_dir}
description: "The following are multiple choice questions (with answers) about {words}.\\n\\n"
num_fewshot: 5
"""

MMLU_UTILS = '''"""Local Hendrycks CSVs as cais/mmlu rows, read by datasets' csv builder (not calsweep's reader)."""
import datasets

COLUMNS = ["question", "A", "B", "C", "D", "answer"]


def load_subject(subject, data_dir, **metadata):
    files = {split: f"{data_dir}/mmlu/{split}/{subject}_{split}.csv" for split in ("dev", "test")}
    raw = datasets.load_dataset("csv", data_files=files, column_names=COLUMNS, keep_default_na=False,
                                features=datasets.Features({c: datasets.Value("string") for c in COLUMNS}))
    return raw.map(lambda r: {"subject": subject, "choices": [r["A"], r["B"], r["C"], r["D"]],
                              "answer": "ABCD".index(r["answer"].strip())}, remove_columns=COLUMNS[1:])
'''

OURS = {"calsweep_arc_easy": TASKS["arc_easy"], "calsweep_hellaswag": TASKS["hellaswag"]}


def write_task_yamls(directory: Path, data_dir: Path, mmlu_subjects: Sequence[str] = ()) -> Path:
    """lm-eval task files for the local ARC-Easy test, HellaSwag val and MMLU subject copies under ``data_dir``.

    MMLU tasks include lm-eval's own ``mmlu/default/_default_template_yaml`` and only swap the data source.
    """
    import lm_eval

    directory.mkdir(parents=True, exist_ok=True)
    root = data_dir.resolve()
    (directory / "calsweep_arc_easy.yaml").write_text(ARC_YAML.format(data_dir=root))
    (directory / "calsweep_hellaswag.yaml").write_text(HELLASWAG_YAML.format(data_dir=root))
    (directory / "calsweep_hellaswag_utils.py").write_text(HELLASWAG_UTILS)
    (directory / "calsweep_mmlu_utils.py").write_text(MMLU_UTILS)
    template = Path(lm_eval.__file__).parent / "tasks" / "mmlu" / "default" / "_default_template_yaml"
    for subject in mmlu_subjects:
        (directory / f"calsweep_mmlu_{subject}.yaml").write_text(MMLU_YAML.format(
            template=template, subject=subject, data_dir=root, words=subject.replace("_", " ")))
    return directory


def our_task(lm_eval_task: str) -> TaskConfig:
    """Our task config for one of the lm-eval tasks written by ``write_task_yamls``."""
    if lm_eval_task.startswith("calsweep_mmlu_"):
        subject = lm_eval_task.removeprefix("calsweep_mmlu_")
        return dataclasses.replace(TASKS["mmlu"], name=lm_eval_task, subjects=(subject,))
    if lm_eval_task not in OURS:
        raise ValueError(f"expected calsweep_arc_easy, calsweep_hellaswag or calsweep_mmlu_<subject>, "
                         f"got {lm_eval_task!r}")
    return OURS[lm_eval_task]


def run_lm_eval(model_path: str, tasks: Sequence[str], include_path: Path, *, limit: int | None,
                batch_size: int, device: str) -> dict[str, list[dict[str, Any]]]:
    """{lm-eval task: [{loglik: per choice, acc, acc_norm if the task has it}] in document order}."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    results = lm_eval.simple_evaluate(
        model="hf", model_args={"pretrained": model_path, "dtype": "float32"}, tasks=list(tasks),
        task_manager=TaskManager(include_path=str(include_path)), limit=limit, batch_size=batch_size,
        device=device, log_samples=True, random_seed=0, numpy_random_seed=0, torch_random_seed=0)
    out = {}
    for task in tasks:
        samples = sorted(results["samples"][task], key=lambda s: s["doc_id"])
        out[task] = [{"loglik": [float(ll) for ll, _ in s["filtered_resps"]], "acc": float(s["acc"]),
                      **({"acc_norm": float(s["acc_norm"])} if "acc_norm" in s else {})} for s in samples]
    return out


def compare(theirs: list[dict[str, Any]], ours: list[dict[str, Any]]) -> dict[str, float]:
    """Both tools' acc and acc_norm (lm-eval's own per-question values), max |delta loglik|, differing answers."""
    if len(theirs) != len(ours):
        raise ValueError(f"expected the same questions from both, got {len(theirs)} and {len(ours)}")
    our_acc = [float(np.argmax(r["loglik"]) == r["gold"]) for r in ours]
    differ = sum(int(np.argmax(t["loglik"]) != np.argmax(r["loglik"])) for t, r in zip(theirs, ours))
    report = {
        "n_questions": len(ours),
        "lm_eval_acc": float(np.mean([t["acc"] for t in theirs])), "ours_acc": float(np.mean(our_acc)),
        "max_abs_loglik_diff": float(max(np.max(np.abs(np.subtract(t["loglik"], r["loglik"])))
                                         for t, r in zip(theirs, ours))),
        "predictions_differ": differ,
        "acc_diff_points": 100 * abs(np.mean([t["acc"] for t in theirs]) - np.mean(our_acc)),
    }
    if all("acc_norm" in t for t in theirs):  # lm-eval's MMLU reports acc only
        our_norm = [float(np.argmax(r["loglik_norm"]) == r["gold"]) for r in ours]
        report["lm_eval_acc_norm"] = float(np.mean([t["acc_norm"] for t in theirs]))
        report["ours_acc_norm"] = float(np.mean(our_norm))
        report["acc_norm_diff_points"] = 100 * abs(report["lm_eval_acc_norm"] - report["ours_acc_norm"])
    return report


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    from calibration.evaluate import evaluate_model
    from common.models import load_pretrained

    parser = argparse.ArgumentParser(prog="python -m calibration.agreement", description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="a local Hugging Face model directory both tools load")
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--tasks", default="calsweep_arc_easy,calsweep_hellaswag",
                        help="comma list of calsweep_arc_easy, calsweep_hellaswag, calsweep_mmlu_<subject>")
    parser.add_argument("--limit", type=int, default=500, help="first N questions of each task")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", required=True)
    parser.add_argument("--reuse-lm-eval", action="store_true",
                        help="reuse OUT/lm_eval_samples.json from an earlier run instead of running lm-eval")
    args = parser.parse_args(argv)

    out = Path(args.out)
    tasks = [t for t in args.tasks.split(",") if t]
    saved = out / "lm_eval_samples.json"
    if args.reuse_lm_eval:
        stored = json.loads(saved.read_text())
        theirs, timings = stored["samples"], {"lm_eval_seconds": stored["seconds"]}
    else:
        started = time.time()
        subjects = [t.removeprefix("calsweep_mmlu_") for t in tasks if t.startswith("calsweep_mmlu_")]
        include = write_task_yamls(out / "lm_eval_tasks", Path(args.data_dir), subjects)
        theirs = run_lm_eval(args.model, tasks, include, limit=args.limit, batch_size=args.batch_size,
                             device=args.device)
        timings = {"lm_eval_seconds": round(time.time() - started, 1)}
        saved.write_text(json.dumps({"samples": theirs, "seconds": timings["lm_eval_seconds"]}))
    model, tokenizer = load_pretrained(args.model, device=args.device)
    started = time.time()
    result = evaluate_model(model, tokenizer, [our_task(t) for t in tasks], data_dir=args.data_dir,
                            limit=args.limit, batch_size=args.batch_size)
    timings["ours_seconds"] = round(time.time() - started, 1)
    report: dict[str, Any] = {"model": args.model, "limit": args.limit, "date": time.strftime("%Y-%m-%d"),
                              **timings, "tasks": {}}
    for task in tasks:
        ours = [r for r in result.records.to_pylist() if r["task"] == our_task(task).name]
        report["tasks"][task] = compare(theirs[task], ours)
    (out / "agreement.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
