"""The grid's trial order (the longest trials first) and how Tune fills a node's GPUs with it: the order from the
layouts of an 8B and a 1B shape, and a real local Ray with 3 (bookkept) GPUs running trivial trials through
calsweep's own resource requests (``sweeps.driver.trial_resources``; a 2-GPU trial's workers through
``sweeps.driver.scaling_config``), since a real multi-GPU trial needs CUDA."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from sweeps import search
from sweeps.config import sweep_from_dict, sweep_to_dict

LLAMA = {"num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 128256,
         "max_position_embeddings": 2048}
SHAPES = {"llama-1b": {**LLAMA, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
                       "head_dim": 64, "tie_word_embeddings": True},
          "llama-8b": {**LLAMA, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32}}


def _sweep(**resources):
    """1B listed first, so the grid's own order (``trial_points``) starts with it."""
    return sweep_from_dict({
        "name": "mixed", "families": ["llama-1b", "llama-8b"], "learning_rates": [1e-4, 3e-4],
        "label_smoothing": [0.0, 0.1],
        "custom_models": {name: {"architecture": "llama", "tokenizer": "smollm2-135m", "config": config}
                          for name, config in SHAPES.items()},
        "sft": {"max_examples": 20000, "max_seq_len": 2048},
        "train": {"max_steps": 200, "micro_batch_size": 4, "gradient_accumulation_steps": 1, "precision": "bf16"},
        "resources": {"gpu_memory_gb": 80.0, **resources}})


def _families(order) -> list[str]:
    return [p.family.removeprefix("llama-") for p in order]


def test_the_longest_trials_come_first_then_the_grid_order():
    sweep = _sweep()
    assert [sweep.layout(f).workers for f in sweep.families] == [1, 2]  # the planner's: 8B sharded over 2 GPUs
    hours = {f: search.trial_hours(sweep, f) for f in sweep.families}
    assert hours["llama-8b"] > 2 * hours["llama-1b"] > 0
    order = search.trial_order(sweep)
    assert _families(order) == ["8b"] * 4 + ["1b"] * 4
    grid = sweep.trial_points()
    assert order[4:] == grid[:4] and order[:4] == grid[4:]  # each family's points keep the grid's order


def _on(gpus: int, **resources) -> list[str]:
    """The order for ``gpus`` GPUs, the sweep's resources planned by the launcher (3 GPUs: 3 trials out at once)."""
    from sweeps.launch import plan_resources

    return _families(search.trial_order(plan_resources(_sweep(**resources), {"GPU": gpus, "CPU": 64}), gpus))


def test_on_the_clusters_gpus_one_gpu_trials_fill_what_two_gpu_trials_leave():
    # Ray Train trials (cold), their GPUs requested late: the hand-out under the cap is simulated
    # 3 GPUs: an 8B trial (3.2 times a 1B one), a 1B trial on the third GPU, the next 8B trial (waiting for the
    # first, first in line), then the 1B trials one after another on the third GPU
    assert _on(3, warm_trials=False) == ["8b", "1b", "8b", "1b", "1b", "1b", "8b", "8b"]
    # 4 GPUs: two 8B trials fill them, two more wait; the 1B trials come last
    assert _on(4, warm_trials=False) == ["8b"] * 4 + ["1b"] * 4
    # 5 GPUs: two 8B trials and a 1B one, two 8B trials waiting, then the 1B trials on the fifth GPU
    assert _on(5, warm_trials=False) == ["8b", "8b", "1b", "8b", "8b", "1b", "1b", "1b"]
    # at most 2 out at once on 3 GPUs: an 8B and a 1B trial, then the 1B trials until the 8B one ends
    assert _on(3, max_concurrent_trials=2, warm_trials=False) == ["8b"] + ["1b"] * 4 + ["8b"] * 3
    # half a GPU per worker: four 8B trials fit 4 GPUs at once
    assert _on(4, gpus_per_worker=0.5, warm_trials=False) == ["8b"] * 4 + ["1b"] * 4


def test_a_warm_grid_is_handed_out_whole_longest_first_unless_a_cap_binds():
    from sweeps.launch import plan_resources

    for gpus in (3, 4, 5):  # Tune and Ray place each trial as GPUs free up: no cap, plain longest first
        sweep = plan_resources(_sweep(), {"GPU": gpus, "CPU": 64})
        assert search.hand_out_cap(sweep, gpus) == 0 and _on(gpus) == ["8b"] * 4 + ["1b"] * 4
    # a cap below what the GPUs hold is the user's: kept, and the hand-out under it simulated
    capped = plan_resources(_sweep(max_concurrent_trials=2), {"GPU": 3, "CPU": 64})
    assert search.hand_out_cap(capped, 3) == 2
    assert _on(3, max_concurrent_trials=2) == ["8b"] + ["1b"] * 4 + ["8b"] * 3


def test_a_family_of_unknown_length_comes_last():
    sweep = sweep_from_dict({**sweep_to_dict(_sweep()), "families": ["no-such-org/no-such-model", "llama-1b"]})
    assert search.trial_hours(sweep, "no-such-org/no-such-model") is None
    assert [p.family for p in search.trial_order(sweep)] == ["llama-1b"] * 4 + ["no-such-org/no-such-model"] * 4


def test_tune_gets_every_point_once_in_that_order_and_the_concurrency_cap():
    from ray.tune.search import BasicVariantGenerator

    sweep = _sweep(max_concurrent_trials=3)
    generator = search.search_algorithm(sweep)
    assert isinstance(generator, BasicVariantGenerator) and generator.max_concurrent == 3
    assert search.num_samples(sweep) == 8


def _fake_trial(params: dict) -> None:
    """A trial that holds what calsweep's would for ``params["seconds"][family]``: a warm one sleeps in its Tune
    actor (a multi-GPU one's placement group holds every worker's GPU), a cold one in the workers of a Ray Train run
    scaled by ``sweeps.driver.scaling_config``; each writes its span (rank 0's) to a file."""
    import ray.train
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

    from sweeps import warm_trial
    from sweeps.driver import scaling_config

    sweep, family = sweep_from_dict(params["sweep"]), params["family"]
    out = Path(params["out"]) / f"{family}_{params['learning_rate']}_{params['label_smoothing']}.json"
    config = {"seconds": params["seconds"][family], "out": str(out),
              "span": {"family": family, "gpus": sweep.layout(family).workers}}

    def work(config: dict) -> None:
        if ray.train.get_context().get_world_rank() == 0:
            start = time.time()
            time.sleep(config["seconds"])
            Path(config["out"]).write_text(json.dumps({**config["span"], "start": start, "end": time.time()}))

    if warm_trial.wanted(sweep):
        start = time.time()
        time.sleep(config["seconds"])
        out.write_text(json.dumps({**config["span"], "start": start, "end": time.time()}))
        return
    DataParallelTrainer(work, train_loop_config=config, scaling_config=scaling_config(sweep, family),
                        run_config=ray.train.RunConfig(name=out.stem, storage_path=params["storage"])).fit()


@pytest.mark.slow
def test_one_gpu_trials_fill_the_gpu_two_gpu_trials_leave(tmp_path):
    """3 GPUs, as the launcher plans them, warm trials (a 2-GPU one's Tune actor holds its placement group): the
    2-GPU trials run one after another on two GPUs while the one-GPU trials run one after another on the third,
    none taking the GPUs of a 2-GPU trial, and the sweep ends when the 2-GPU chain does."""
    import ray
    from ray import tune

    from common.ports import free_port
    from sweeps.driver import trial_resources
    from sweeps.launch import plan_resources

    ray.init(address="local", num_cpus=8, num_gpus=3, include_dashboard=True, dashboard_port=free_port(),
             configure_logging=False)
    try:
        sweep = plan_resources(_sweep(), ray.cluster_resources())
        assert sweep.resources.max_concurrent_trials == 3 and sweep.resources.gpus_per_worker == 1
        assert trial_resources({"sweep": sweep_to_dict(sweep), "family": "llama-1b"})["GPU"] == 1
        param_space = {**search.search_space(sweep), "sweep": sweep_to_dict(sweep), "out": str(tmp_path),
                       "storage": str(tmp_path / "ray"), "seconds": {"llama-8b": 4.0, "llama-1b": 3.0}}
        grid = tune.Tuner(tune.with_resources(_fake_trial, trial_resources), param_space=param_space,
                          tune_config=tune.TuneConfig(num_samples=search.num_samples(sweep), reuse_actors=True,
                                                      search_alg=search.search_algorithm(sweep, 3)),
                          run_config=tune.RunConfig(storage_path=str(tmp_path / "ray"), verbose=0)).fit()
    finally:
        ray.shutdown()
    assert not grid.errors
    assert [r.config["family"] for r in grid] == [p.family for p in search.trial_order(sweep, 3)]  # Tune's hand-out
    spans = sorted((json.loads(p.read_text()) for p in tmp_path.glob("*.json")), key=lambda s: s["start"])
    print("\n".join(f"{s['family']}: {s['start'] - spans[0]['start']:6.1f} s to {s['end'] - spans[0]['start']:6.1f} s"
                    for s in spans))
    assert len(spans) == 8
    assert all(sum(t["gpus"] for t in spans if t["start"] <= s["start"] < t["end"]) <= 3 for s in spans)
    wide, narrow = [s for s in spans if s["gpus"] == 2], [s for s in spans if s["gpus"] == 1]
    # the one-GPU trials ran one after another, each within moments of the one before (on the GPU left free) ...
    assert narrow[0]["start"] - spans[0]["start"] < 3.0
    assert all(later["start"] - earlier["end"] < 3.0 for earlier, later in zip(narrow, narrow[1:]))
    # ... and never two at once, which would have taken the GPUs of the first 2-GPU trial: it ran meanwhile
    assert all(later["start"] >= earlier["end"] - 0.1 for earlier, later in zip(narrow, narrow[1:]))
    assert wide[0]["start"] < narrow[-1]["end"]
    # the 2-GPU trials ran one after another too, and the sweep ended with their chain
    assert all(later["start"] - earlier["end"] < 3.0 for earlier, later in zip(wide, wide[1:]))
    assert max(s["end"] for s in spans) == wide[-1]["end"]
