"""Per-trial time outside load, training and scoring, from hand-made store rows."""

import datetime as dt

import pytest

from sweeps.overhead import summary, trial_overheads

T0 = dt.datetime(2026, 11, 26, 10, 0, 0, tzinfo=dt.timezone.utc)


def _row(trial_id: str, start: float, end: float, load: float = 8.0, train: float = 30.0, score: float = 5.0) -> dict:
    return {"trial_id": trial_id, "started_at": T0 + dt.timedelta(seconds=start),
            "finished_at": T0 + dt.timedelta(seconds=end), "wall_load_s": load, "wall_train_s": train,
            "wall_eval_s": score}


def test_slots_gaps_and_framework_time():
    # two slots: a [0, 50] then c [53, 103]; b [1, 51] then d [55, 105]; e failed at once in a's slot after c
    rows = [_row("d", 55, 105), _row("a", 0, 50), _row("b", 1, 51), _row("c", 53, 103),
            _row("e", 104, 106, None, None, None)]
    by_id = {o.trial_id: o for o in trial_overheads(rows)}
    assert [by_id[t].slot for t in "abcde"] == [0, 1, 0, 1, 0]
    assert by_id["a"].gap_s is None and by_id["b"].gap_s is None
    assert by_id["c"].gap_s == pytest.approx(3.0) and by_id["d"].gap_s == pytest.approx(4.0)
    assert by_id["e"].gap_s == pytest.approx(1.0)
    assert by_id["c"].framework_s == pytest.approx(50 - 43) and by_id["c"].overhead_s == pytest.approx(10.0)
    assert by_id["c"].idle_s == pytest.approx(18.0)
    assert by_id["e"].framework_s == pytest.approx(2.0) and by_id["e"].load_s == 0.0
    figures = summary(list(by_id.values()))
    assert figures["slots"] == 2 and figures["trials"] == 5
    assert figures["overhead_s_mean"] == pytest.approx((10 + 11 + 3) / 3)
    assert figures["overhead_s_max"] == pytest.approx(11.0)
    assert figures["first_framework_s"] == [7.0, 7.0]


def test_a_new_actors_start_is_told_from_the_tune_scheduling_before_it():
    # slot 0: a [0, 50] in an actor started at -5, c [53, 103] in the same actor (reused); slot 1: b [1, 51] in an
    # actor started at -3, d [55, 105] in a new one started at 52 (after b's end: b's actor was stopped); e [110, 120]
    # in slot 0 from a row written before actor_started_at existed
    rows = [{**_row("a", 0, 50), "actor_started_at": T0 - dt.timedelta(seconds=5)},
            {**_row("b", 1, 51), "actor_started_at": T0 - dt.timedelta(seconds=3)},
            {**_row("c", 53, 103), "actor_started_at": T0 - dt.timedelta(seconds=5)},
            {**_row("d", 55, 105), "actor_started_at": T0 + dt.timedelta(seconds=52)},
            _row("e", 110, 120)]
    by_id = {o.trial_id: o for o in trial_overheads(rows)}
    assert by_id["a"].actor_start_s == pytest.approx(5.0) and by_id["b"].actor_start_s == pytest.approx(4.0)
    assert by_id["a"].schedule_s is None  # the first trial of its slot: no previous row
    assert by_id["c"].actor_start_s is None and by_id["c"].schedule_s == pytest.approx(3.0)  # reused
    assert by_id["d"].actor_start_s == pytest.approx(3.0) and by_id["d"].schedule_s == pytest.approx(1.0)
    assert by_id["d"].gap_s == pytest.approx(4.0)
    assert by_id["e"].actor_start_s is None and by_id["e"].schedule_s == pytest.approx(7.0)
    figures = summary(list(by_id.values()))
    assert figures["new_actor_start_s"] == [5.0, 4.0, 3.0]
    per_trial = {t["trial_id"]: t for t in figures["per_trial"]}
    assert per_trial["d"]["actor_start_s"] == pytest.approx(3.0) and per_trial["d"]["schedule_s"] == pytest.approx(1.0)
