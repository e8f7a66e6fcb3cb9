"""Warm trials in real sweeps (`python sweeps/launch.py`: Ray Tune, DeepSpeed on CPU): six one-step trials one at a
time warm (one reused Tune actor), and two of them cold (a Ray Train worker group per trial, about 25 s each on two
CPUs): the fourth (the first at the second learning rate) and the sixth. The warm sweep's time per trial outside the
trials' own load, training and scoring is printed and bounded (measured while the cold sweep runs beside it, on a
busier machine than a sweep's own); the two trials' losses and scores are the same bit for bit warm and cold, though
warm they run in a process three and five other trials have used."""

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sweeps import store
from sweeps.overhead import summary, trial_overheads

REPO = Path(__file__).resolve().parents[2]
CONFIG = Path(__file__).with_name("tiny_sweep.yaml")
ONE_AT_A_TIME = ["train.max_steps=1", "train.dropout=0.1", "train.gradient_accumulation_steps=1",
                 "eval.tasks=[arc_easy]", "resources.max_concurrent_trials=1"]
SIX = ["learning_rates=[1.0e-3,3.0e-3]", "label_smoothing=[0.0,0.1,0.2]"]  # run in this order: learning rate outer
COLD = ["learning_rates=[3.0e-3]", "label_smoothing=[0.0,0.2]"]  # the fourth and the sixth of SIX
WARM_BOUND_S = 10.0  # Must: <= 10 s per trial outside its own work
SAME = ("train_loss", "train_loss_plain", "train_loss_first", "arc_easy_nll", "arc_easy_ece", "arc_easy_accuracy")


def _sweep(results: Path, data_dir: str, name: str, grid: list[str], *extra: str) -> list[dict]:
    """The sweep's rows, all ok, in start order."""
    out = subprocess.run([sys.executable, str(REPO / "sweeps" / "launch.py"), "--config", str(CONFIG),
                          "--results-dir", str(results), "--name", name, *ONE_AT_A_TIME, *grid, *extra],
                         capture_output=True, text=True, timeout=1200,
                         env={**os.environ, "CALSWEEP_DATA_DIR": data_dir, "RAY_USAGE_STATS_ENABLED": "0"})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = sorted(store.read_trials(str(results), name).to_pylist(), key=lambda row: row["started_at"])
    assert all(row["status"] == "ok" for row in rows), rows
    return rows


@pytest.mark.slow
def test_warm_trials_cost_little_outside_their_work_and_match_cold_ones_bit_for_bit(tmp_path, data_dir):
    with ThreadPoolExecutor(1) as pool:  # the cold sweep meanwhile, by a launch and Ray of its own
        cold_run = pool.submit(_sweep, tmp_path / "results", data_dir, "cold", COLD, "resources.warm_trials=false")
        warm = _sweep(tmp_path / "results", data_dir, "warm", SIX)
        cold = cold_run.result()
    assert len(warm) == 6 and len(cold) == 2
    figures = {name: summary(trial_overheads(rows)) for name, rows in (("warm", warm), ("cold", cold))}
    for name, figure in figures.items():
        print(f"{name}: per trial after the first, outside load/train/score: mean {figure['overhead_s_mean']:.2f} s, "
              f"max {figure['overhead_s_max']:.2f} s; with loading: mean {figure['idle_s_mean']:.2f} s; first trial "
              f"framework {figure['first_framework_s']} s, load {figure['first_load_s']} s")
    assert figures["warm"]["slots"] == figures["cold"]["slots"] == 1  # one trial at a time
    assert figures["warm"]["overhead_s_mean"] <= WARM_BOUND_S
    # a return to a worker group per trial costs its start and stop again: the warm path saves most of it
    assert figures["warm"]["overhead_s_mean"] < 0.5 * figures["cold"]["overhead_s_mean"], figures

    warm_order = [row["trial_id"] for row in warm]
    assert [warm_order.index(row["trial_id"]) for row in cold] == [3, 5]  # warm, after three and five other trials
    for row in cold:
        twin = warm[warm_order.index(row["trial_id"])]
        for key in SAME:
            assert twin[key] == row[key], (row["trial_id"], key, twin[key], row[key])
    # the trials differ (the compared ones from those before them too), so a leftover would show
    assert len({row["train_loss"] for row in warm}) == 3 and len({row["arc_easy_nll"] for row in warm}) == 6


SMALL = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=10, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=300, head_dim=8)


def _compiled_trial_forward(config: dict) -> tuple[float, dict]:
    """A new model (as each trial builds its own) run through ``compiled_decoder_layers``: its loss and the
    Dynamo frames compiled for it."""
    import torch
    from torch._dynamo.utils import counters
    from transformers import AutoConfig, AutoModelForCausalLM

    from trainable.compiled import compiled_decoder_layers

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model("llama", **config))
    ids = torch.randint(0, 300, (2, 16), generator=torch.Generator().manual_seed(1))
    counters.clear()
    with compiled_decoder_layers(model, backend="eager") as layers:
        assert layers == config["num_hidden_layers"]
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
    loss.backward()
    return loss.item(), dict(counters["frames"])


def test_a_later_trial_of_the_same_shape_compiles_nothing_and_another_shape_its_own():
    import torch

    torch._dynamo.reset()  # graphs of earlier tests in this process aside
    first_loss, first = _compiled_trial_forward(SMALL)
    assert first["total"] == first["ok"] == 1  # one graph serves every layer (trainable.compiled)
    again_loss, again = _compiled_trial_forward(SMALL)  # a new model instance, as the next warm trial's
    assert again.get("total", 0) == 0 and again_loss == first_loss
    wider = {**SMALL, "hidden_size": 64, "intermediate_size": 128, "head_dim": 16}
    _, other = _compiled_trial_forward(wider)
    assert other["total"] == other["ok"] == 1  # its own graph, not the first shape's
    back_loss, back = _compiled_trial_forward(SMALL)
    assert back.get("total", 0) == 0 and back_loss == first_loss
