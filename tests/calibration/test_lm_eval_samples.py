"""lm-eval's samples files as records: gold from an index or a choice's text, log-likelihoods from filtered_resps,
length normalisation by the choice's characters, one filter; files of other kinds are one-line errors. (A real file,
written by lm_eval itself, is read in tests/trainable/test_worker.py.)"""

import json
import math
import re

import numpy as np
import pytest

from calibration.lm_eval_samples import read_samples, samples_files
from calibration.rescore import main as rescore_main

CHOICES = ["Sunlight.", "Most ecosystems are on land.", "CO2."]


def _sample(doc_id: int, loglik: list[float], target, filter_name: str = "none") -> dict:
    """One line as lm-eval 0.4 writes it for a multiple-choice task (numbers as strings, as it serialises them)."""
    return {"doc_id": doc_id, "doc": {"question": f"q{doc_id}"}, "target": target,
            "arguments": {f"gen_args_{i}": {"arg_0": f"Question: q{doc_id}\nAnswer:", "arg_1": f" {c}"}
                          for i, c in enumerate(CHOICES)},
            "resps": [[[str(ll), "False"]] for ll in loglik], "filtered_resps": [[str(ll), "False"] for ll in loglik],
            "filter": filter_name, "metrics": ["acc", "acc_norm"],
            "acc": float(np.argmax(loglik) == _index(target))}


def _index(target) -> int:
    """lm-eval's gold of a target: an index (maybe as text) or a choice's text; -1 for none."""
    if isinstance(target, int) or str(target).isdigit():
        return int(target)
    return CHOICES.index(target) if target in CHOICES else -1


def _write(directory, task: str, lines: list[dict]):
    path = directory / f"samples_{task}_2026-11-24T23-22-41.777858.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_gold_loglik_and_normalisation(tmp_path):
    path = _write(tmp_path, "arc", [_sample(1, [-9.0, -30.0, -4.0], "0"), _sample(0, [-3.0, -2.0, -8.0], CHOICES[1]),
                                    _sample(1, [-1.0, -9.0, -9.0], 0, filter_name="take_first")])
    records, metadata = read_samples(samples_files(path))
    rows = records.to_pylist()
    assert [r["question_id"] for r in rows] == ["0", "1"] and [r["gold"] for r in rows] == [1, 0]  # filter 'none'
    assert rows[1]["loglik"] == [-9.0, -30.0, -4.0] and rows[1]["split"] == "lm_eval" and rows[1]["task"] == "arc"
    assert rows[1]["loglik_norm"] == [-9.0 / len(CHOICES[0]), -30.0 / len(CHOICES[1]), -4.0 / len(CHOICES[2])]
    probs = np.exp([-9.0, -30.0, -4.0]) / np.exp([-9.0, -30.0, -4.0]).sum()
    assert rows[1]["confidence"] == pytest.approx(probs.max(), rel=1e-12) and rows[1]["correct"] is False
    assert metadata["lm_eval"] == {"arc": {"acc": 0.5}} and metadata["report_splits"] == {"arc": "lm_eval"}


def test_a_folder_of_tasks_is_rescored_with_lm_eval_s_accuracy_beside_ours(tmp_path, capsys):
    _write(tmp_path, "arc", [_sample(i, [-1.0 - i, -2.0, -3.0], i % 3) for i in range(6)])
    _write(tmp_path, "piqa", [_sample(i, [-2.0, -1.0, -5.0], 1) for i in range(4)])
    summary = rescore_main([str(tmp_path), "--n-boot", "0"])
    assert sorted(summary) == ["arc", "piqa"] and summary["piqa"]["accuracy"] == 1.0
    assert summary["arc"]["accuracy"] == pytest.approx(2 / 6) and math.isfinite(summary["arc"]["ece"])
    out = capsys.readouterr().out
    assert "arc: lm-eval's own acc 0.3333; here accuracy 0.3333" in out
    assert (tmp_path / "rescore" / "rescore_loglik_b15_t1.json").is_file()


@pytest.mark.parametrize("line,message", [
    ({"doc_id": 0, "doc": {}, "target": "Paris", "arguments": {"gen_args_0": {"arg_0": "Q", "arg_1": {}}},
      "filtered_resps": ["Paris is"], "filter": "none"}, "expected a multiple-choice task's samples"),
    (_sample(0, [-1.0, -2.0, -3.0], "Mars"), "expected target to be a choice index in \\[0, 3\\) or one of"),
    (_sample(0, [-1.0, -2.0, -3.0], 5), "expected target to be a choice index"),
])
def test_other_samples_are_one_line_errors(tmp_path, capsys, line, message):
    _write(tmp_path, "task", [line])
    with pytest.raises(SystemExit) as stopped:
        rescore_main([str(tmp_path)])
    error = capsys.readouterr().err
    assert stopped.value.code == 2 and error.count("\n") == 1
    assert error.startswith("python -m calibration.rescore: error: ") and re.search(message, error)


def test_a_jsonl_of_another_name_is_named(tmp_path, capsys):
    (tmp_path / "results.jsonl").write_text("{}\n")
    with pytest.raises(SystemExit):
        rescore_main([str(tmp_path / "results.jsonl")])
    assert "expected lm-eval's samples file name samples_<task>_<date>.jsonl" in capsys.readouterr().err
