"""The console: one line per trial event (start, progress with tokens/s and the sweep's ETA, done with metrics,
skipped, failed with the stored one-line error), driven through Ray Tune's callback hooks on real Trial objects."""

from pathlib import Path

import pytest
from ray.tune.experiment import Trial

from sweeps import store
from sweeps.config import load_sweep
from sweeps.failures import FAILED_PHASE
from sweeps.progress import StoreRecorder, TrialProgress, ended_failed, settle_stopped, sweep_eta

TINY = Path(__file__).with_name("tiny_sweep.yaml")


def test_eta_from_finished_trials_else_from_training_progress():
    assert sweep_eta({}, {}, [], pending=4, concurrency=1) is None
    # one trial 25% through after 30 s: it takes ~120 s; 90 s left plus 3 pending at 120 s each
    assert sweep_eta({"a": 30.0}, {"a": 0.25}, [], pending=3, concurrency=1) == pytest.approx(450.0)
    # finished trials took 100 s on average: a running one at 40 s has 60 s left; 2 pending, 2 at a time
    assert sweep_eta({"a": 40.0}, {"a": 0.9}, [90.0, 110.0], pending=2, concurrency=2) == pytest.approx(130.0)


def test_one_line_per_event(tmp_path, capsys):
    sweep = load_sweep(TINY, {"results_dir": str(tmp_path)})
    progress = TrialProgress(sweep, total=3, every_s=0.0)
    points = sweep.trial_points()
    trials = [Trial("trainable", config=point._asdict(), stub=True) for point in points]
    for trial in trials:
        progress.on_trial_start(0, trials, trial)
    progress.on_trial_result(0, trials, trials[0], {"phase": "train", "step": 1, "total_steps": 2,
                                                     "train_loss": 2.5, "tokens_per_s": 90.0,
                                                     "tokens_per_s_steady": 120.0})
    trials[0].update_last_result({"phase": "done", "train_steps": 2, "train_loss": 2.25, "train_loss_plain": 1.5,
                                  "mmlu_accuracy": 0.5, "mmlu_ece": 0.125})
    progress.on_trial_complete(0, trials, trials[0])
    failed = sweep.trial(points[1])
    store.write_trial(str(tmp_path), {"run_name": sweep.name, "trial_id": failed.trial_id, "status": "failed",
                                      "error": "ValueError: expected at least one SFT example"})
    progress.on_trial_error(0, trials, trials[1])
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("] ")[1].split(" ")[0] for line in lines] == ["start", "start", f"{trials[0]}:", "done",
                                                                     "FAILED"]
    assert "step 1/2  loss 2.5000  120 tok/s  sweep ETA" in lines[2]
    assert lines[3].startswith("[calsweep 1/3] done") and "mmlu acc 0.500 ece 0.125" in lines[3]
    assert "loss 2.2500 (plain 1.5000)" in lines[3]
    assert lines[4] == f"[calsweep 2/3] FAILED {trials[1]}: ValueError: expected at least one SFT example"


def test_a_resumed_trial_gets_one_line(tmp_path, capsys):
    sweep = load_sweep(TINY, {"results_dir": str(tmp_path)})
    progress = TrialProgress(sweep, total=1, every_s=3600.0)
    trial = Trial("trainable", config=sweep.trial_points()[0]._asdict(), stub=True)
    progress.on_trial_start(0, [trial], trial)
    for step, resumed in ((1, 0), (2, 0), (3, 2), (4, 2), (5, 4)):  # died after step 2, then after step 4
        progress.on_trial_result(0, [trial], trial, {"phase": "train", "step": step, "total_steps": 6,
                                                     "train_loss": 2.0, "resumed_from_step": resumed})
    lines = capsys.readouterr().out.splitlines()
    assert lines[2:] == [f"[calsweep 0/1] {trial}: resumed from its checkpoint at step 2/6",
                         f"[calsweep 0/1] {trial}: resumed from its checkpoint at step 4/6"]


def test_store_recorder_keeps_ok_and_errors_but_a_stopped_trial_is_stopped(tmp_path):
    sweep = load_sweep(TINY, {"results_dir": str(tmp_path), "label_smoothing": [0.0, 0.1, 0.2]})
    points = sweep.trial_points()
    trials = [Trial("trainable", config={**p._asdict(), "provenance": {"git_rev": "abc"}}, stub=True) for p in points]
    ids = [sweep.trial(p).trial_id for p in points]
    recorder = StoreRecorder(sweep)
    for trial in trials:
        recorder.on_trial_start(0, trials, trial)
    for trial_id, status in zip(ids, ("ok", "failed", "failed")):  # the drivers' own rows
        store.write_trial(str(tmp_path), {"run_name": sweep.name, "trial_id": trial_id, "status": status,
                                          "error": None if status == "ok" else "ActorDiedError: the actor died"})
    recorder.on_trial_complete(0, trials, trials[0])  # finished: its ok row stays
    recorder.on_trial_complete(0, trials, trials[1])  # ASHA stopped it; its driver saw the workers torn down
    recorder.on_trial_error(0, trials, trials[2])  # a real failure: the driver's error stays
    rows = {r["trial_id"]: r for r in store.read_trials(str(tmp_path), sweep.name).to_pylist()}
    assert [rows[i]["status"] for i in ids] == ["ok", "stopped", "failed"]
    assert rows[ids[1]]["error"] == "stopped early by the scheduler" and rows[ids[1]]["git_rev"] == "abc"
    assert rows[ids[2]]["error"] == "ActorDiedError: the actor died"


def test_a_resumed_sweep_counts_the_trials_it_finished_before(tmp_path, capsys):
    sweep = load_sweep(TINY, {"results_dir": str(tmp_path), "label_smoothing": [0.0, 0.1, 0.2]})
    trials = [Trial("trainable", config=point._asdict(), stub=True) for point in sweep.trial_points()]
    trials[0].set_status(Trial.TERMINATED)  # finished before the launcher was killed; restored as such
    progress = TrialProgress(sweep, total=3, every_s=3600.0)
    for trial in trials[1:]:
        progress.on_trial_start(0, trials, trial)
    for trial in trials[1:]:
        trial.update_last_result({"phase": "done", "train_steps": 2, "train_loss": 2.0})
        progress.on_trial_complete(0, trials, trial)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("[calsweep 1/3] start") and lines[-1].startswith("[calsweep 3/3] done")


def test_a_row_the_store_refuses_is_one_line_and_the_sweep_goes_on(tmp_path, capsys):
    sweep = load_sweep(TINY, {"results_dir": str(tmp_path)})
    trial = Trial("trainable", config={**sweep.trial_points()[0]._asdict(), "provenance": {"git_rev": "abc"}},
                  stub=True)
    trial_id = sweep.trial(sweep.point(trial.config)).trial_id
    blocker = tmp_path / "trials" / f"{store.file_stem(sweep.name, trial_id)}.parquet"
    blocker.mkdir(parents=True)  # the row's place taken by a folder: its write fails (a chmod would not stop root)
    (blocker / ".keep").write_text("")
    recorder = StoreRecorder(sweep)
    recorder.on_trial_start(0, [trial], trial)
    recorder.on_trial_error(0, [trial], trial)  # no exception: Tune's loop, and the sweep, go on
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"[calsweep] {trial_id}: its failed row could not be written")
    assert lines[0].endswith("`--resume tiny` runs it again")
    assert f"results store {tmp_path}/trials: could not write" in lines[0] and ".tmp" not in lines[0]  # the folder
    assert sorted(path.name for path in (tmp_path / "trials").iterdir()) == [blocker.name]  # no temporary left
    trial.set_status(Trial.ERROR)
    recorder.on_experiment_end([trial])  # it ran: no "ended by Tune before it ran", no second line
    assert capsys.readouterr().out == ""


def test_a_trial_tune_stopped_whose_driver_stored_failed_ends_stopped(tmp_path):
    rows = {"a": "failed", "b": "failed", "c": "ok"}
    for trial_id, status in rows.items():
        store.write_trial(str(tmp_path), {"run_name": "r", "trial_id": trial_id, "status": status,
                                          "error": "ActorDiedError: its placement group was removed"})
    assert settle_stopped(str(tmp_path), "r", {"a": False, "b": True, "c": False}) == ["a"]
    assert store.trial_statuses(str(tmp_path), "r") == {"a": "stopped", "b": "failed", "c": "ok"}


def test_a_trial_tune_failed_before_it_ran_is_stored_failed(tmp_path, capsys):
    sweep = load_sweep(TINY, {"results_dir": str(tmp_path)})
    trials = [Trial("trainable", config={**p._asdict(), "provenance": {"git_rev": "abc"}}, stub=True)
              for p in sweep.trial_points()]
    store.write_trial(str(tmp_path), {"run_name": sweep.name, "trial_id": sweep.trial(sweep.trial_points()[0]).trial_id,
                                      "status": "ok"})
    for trial in trials:  # Tune's word for both; the second never ran (its reused actor could not be reset)
        trial.set_status(Trial.ERROR)
    StoreRecorder(sweep).on_experiment_end(trials)
    first, second = (sweep.trial(p).trial_id for p in sweep.trial_points())
    assert store.trial_statuses(str(tmp_path), sweep.name) == {first: "ok", second: "failed"}  # a stored row stays
    assert "ended by Tune before it ran" in capsys.readouterr().out


def test_a_retried_out_of_memory_says_so_with_its_layout_and_peaks(tmp_path, capsys):
    sweep = load_sweep(TINY, {"results_dir": str(tmp_path)})
    trial = Trial("trainable", config=sweep.trial_points()[0]._asdict(), stub=True)
    progress = TrialProgress(sweep, total=1)
    progress.on_trial_start(0, [trial], trial)
    progress.on_trial_recover(0, [trial], trial)  # no row: its driver died with its node
    store.write_trial(str(tmp_path), {"run_name": sweep.name, "trial_id": sweep.trial(sweep.trial_points()[0]).trial_id,
                                      "status": "failed", "error": "torch.OutOfMemoryError: CUDA out of memory.",
                                      "world_size": 2, "engine": "deepspeed", "zero_stage": 2, "micro_batch_size": 2,
                                      "gradient_accumulation_steps": 2, "activation_checkpointing": 0,
                                      "gpu_peak_predicted_gib": 1.69, "gpu_peak_gib": None})
    progress.on_trial_recover(0, [trial], trial)
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == (f"[calsweep 0/1] retrying {trial} (its driver or node failed: the trial's process ended "
                        f"without recording a result)")
    assert lines[2] == (f"[calsweep 0/1] retrying {trial} (out of GPU memory on 2 workers, ZeRO-2 (deepspeed), "
                        f"micro-batch 2 x 2, 0 layers recomputed; peak planned 1.7 GiB, measured n/a: "
                        f"torch.OutOfMemoryError: CUDA out of memory.)")


def test_a_trial_its_driver_ended_failed_stays_failed_and_counts(tmp_path, capsys):
    sweep = load_sweep(TINY, {"results_dir": str(tmp_path)})
    trial = Trial("trainable", config={**sweep.trial_points()[0]._asdict(), "provenance": {"git_rev": "abc"}},
                  stub=True)
    trial_id = sweep.trial(sweep.trial_points()[0]).trial_id
    error = "ValueError: expected at least micro_batch_size=2 packed rows per rank, got 1"
    progress, recorder = TrialProgress(sweep, total=1), StoreRecorder(sweep)
    for callback in (progress, recorder):
        callback.on_trial_start(0, [trial], trial)
    store.write_trial(str(tmp_path), {"run_name": sweep.name, "trial_id": trial_id, "status": "failed",
                                      "error": error})  # the driver's row
    trial.update_last_result({"phase": FAILED_PHASE, "error": error})  # its last report; Tune completes the trial
    for callback in (progress, recorder):
        callback.on_trial_complete(0, [trial], trial)
    assert capsys.readouterr().out.splitlines()[-1] == (f"[calsweep 1/1] FAILED {trial}: {error} (not retried: the "
                                                        f"same input fails the same way)")
    assert ended_failed(None, trial.last_result) and not ended_failed(None, {"phase": "done"})
    assert settle_stopped(str(tmp_path), sweep.name, {trial_id: ended_failed(None, trial.last_result)}) == []
    assert store.stored_trial(str(tmp_path), sweep.name, trial_id)["status"] == "failed"  # not "stopped"
