"""Exact values of single report metrics (orchestrator/report/) on tiny hand-built event logs.

Each test builds a few `Event`s whose metric can be worked out by hand: the time-weighted queue depth and
when a trial leaves the queue, the refit p95 and counts of failed refits, the cumulative best-so-far and
the predicted series' evaluation count, the progress cap, dropping trials whose clock ran backwards, the
utilization series as a fraction of the slots, the latest recorded slot count, and that running trials
are not failures.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from orchestrator.report import (
    best_so_far,
    compute_metrics,
    intervals,
    predicted_series,
    queue_depth_series,
    utilization_series,
)
from orchestrator.store import Event, trials_table

CONFIG = {
    "name": "tiny",
    "objective": {"name": "forrester"},
    "tau": 0.5,
    "budget": 10,
    "direction": "maximize",
}


def _done(tid, start, end, value=1.0, **kw):
    """A started + completed pair of events of trial `tid` over [start, end]."""
    return [
        Event("started", tid, time=start, started_at=start),
        Event("completed", tid, time=end, value=value, started_at=start, ended_at=end, **kw),
    ]


# ---------------------------------------------------------------------------------------- queue depth
def test_queue_depth_mean_is_weighted_by_time():
    # two proposals at t=0; one starts at t=1, the other at t=3: depth 2 over [0, 1], 1 over [1, 3]
    # -> (2 * 1 + 1 * 2) / 3 = 4/3 (a plain mean of the depths after each change, [1, 2, 1, 0], is 1.0)
    events = [
        Event("proposed", "a", time=0.0),
        Event("proposed", "b", time=0.0),
        Event("started", "a", time=1.0, started_at=1.0),
        Event("started", "b", time=3.0, started_at=3.0),
    ]
    m = compute_metrics(events, CONFIG, with_calibration=False)
    assert m.queue_depth_mean == pytest.approx(4.0 / 3.0)
    assert m.queue_depth_max == 2


def test_a_trial_leaves_the_queue_when_it_started_not_when_that_was_logged():
    # b's "started" event is logged at t=4 but says it started at t=2
    events = [
        Event("proposed", "a", time=0.0),
        Event("proposed", "b", time=0.0),
        Event("started", "a", time=1.0, started_at=1.0),
        Event("started", "b", time=4.0, started_at=2.0),
    ]
    times, depth = queue_depth_series(events)
    assert times.tolist() == [0.0, 0.0, 1.0, 2.0]
    assert depth.tolist() == [1.0, 2.0, 1.0, 0.0]
    # depth 2 over [0, 1], 1 over [1, 2]: (2 + 1) / 2 = 1.5 (leaving at t=4 would give (2 + 3) / 4 = 1.25)
    m = compute_metrics(events, CONFIG, with_calibration=False)
    assert m.queue_depth_mean == pytest.approx(1.5)


# ---------------------------------------------------------------------------------------- refits
def test_refit_p95_is_numpys_default_percentile():
    events = [Event("refit", time=float(i), info={"seconds": float(i)}) for i in range(1, 11)]
    m = compute_metrics(events, CONFIG, with_calibration=False)
    # linear interpolation: rank 0.95 * 9 = 8.55 between 9 and 10 -> 9.55
    assert m.refit_p95_s == pytest.approx(9.55)
    assert m.refit_mean_s == pytest.approx(5.5)
    assert m.n_refits == 10 and m.n_refit_failures == 0


def test_failed_refits_are_counted_apart_from_refits():
    events = [
        Event("refit", time=1.0, info={"seconds": 0.5}),
        Event("refit", time=2.0, info={"failed": True, "error": "NotPSDError: first"}),
        Event("refit", time=3.0, info={"seconds": 0.7}),
        Event("refit", time=4.0, info={"failed": True, "error": "NotPSDError: second"}),
        Event("refit", time=5.0, info={"seconds": 0.9}),
    ]
    m = compute_metrics(events, CONFIG, with_calibration=False)
    assert m.n_refits == 3
    assert m.n_refit_failures == 2
    assert m.last_refit_error == "NotPSDError: second"


# ---------------------------------------------------------------------------------------- best so far
@pytest.mark.parametrize("direction,expected", [("maximize", [1.0, 3.0, 3.0]), ("minimize", [1.0, 1.0, 1.0])])
def test_best_so_far_is_cumulative(direction, expected):
    events = _done("a", 0.0, 1.0, 1.0) + _done("b", 0.0, 2.0, 3.0) + _done("c", 0.0, 3.0, 2.0)
    n, times, best = best_so_far(trials_table(events), direction)
    assert n.tolist() == [1, 2, 3]
    assert times.tolist() == [1.0, 2.0, 3.0]
    assert best.tolist() == expected


def test_best_so_far_carries_the_best_over_a_failure():
    events = _done("a", 0.0, 1.0, 2.0) + [
        Event("started", "b", time=0.0, started_at=0.0),
        Event("failed", "b", time=2.0, started_at=0.0, ended_at=2.0, error="nan"),
    ] + _done("c", 0.0, 3.0, 1.0)
    _, _, best = best_so_far(trials_table(events), "maximize")
    assert best.tolist() == [2.0, 2.0, 2.0]


def test_predicted_series_counts_evaluations_ended_by_the_refit_inclusive():
    events = (_done("a", 0.0, 1.0) + _done("b", 0.0, 2.0) + _done("c", 0.0, 3.0)
              + [Event("refit", time=2.0, info={"best_predicted": 0.4}),
                 Event("refit", time=2.5, info={"best_predicted": 0.6}),
                 Event("refit", time=0.5, info={"seconds": 0.1})])  # no best_predicted: not a point
    ns, ts, vs = predicted_series(events, trials_table(events))
    # at t=2 the trials ending at 1 and at 2 have finished (an end at the refit's instant counts)
    assert ns.tolist() == [2.0, 2.0]
    assert ts.tolist() == [2.0, 2.5]
    assert vs.tolist() == [0.4, 0.6]


# ---------------------------------------------------------------------------------------- progress
def test_progress_is_capped_at_one():
    events = _done("a", 0.0, 1.0) + _done("b", 0.0, 1.0) + _done("c", 0.0, 1.0)
    m = compute_metrics(events, {**CONFIG, "budget": 2}, with_calibration=False)
    assert m.counts["completed"] == 3
    assert m.progress == 1.0
    m = compute_metrics(events, {**CONFIG, "budget": 4}, with_calibration=False)
    assert m.progress == pytest.approx(0.75)


# ---------------------------------------------------------------------------------------- timing
def test_trials_ending_before_they_started_are_left_out_of_the_timing():
    # "b" ended (t=4) before it started (t=5): clock skew between nodes; its times are not used
    events = _done("a", 0.0, 2.0) + [
        Event("started", "b", time=5.0, started_at=5.0),
        Event("completed", "b", time=4.0, value=1.0, started_at=5.0, ended_at=4.0),
    ]
    trials = trials_table(events)
    assert intervals(trials).tolist() == [[0.0, 2.0]]
    m = compute_metrics(events, {**CONFIG, "max_concurrent": 1}, with_calibration=False)
    assert m.busy_s == pytest.approx(2.0)
    assert m.span_s == pytest.approx(2.0)
    assert m.utilization == pytest.approx(1.0)
    assert m.counts["completed"] == 2  # still counted as finished


def test_utilization_series_is_a_fraction_of_the_slots():
    # one evaluation busy over [0, 2] of 2 slots: each of 2 bins is half busy
    centres, busy = utilization_series(np.array([[0.0, 2.0]]), slots=2, bins=2)
    assert centres.tolist() == [0.5, 1.5]
    assert busy.tolist() == pytest.approx([0.5, 0.5])
    # two evaluations over [0, 1] and [0, 2] of 4 slots, 2 bins: bin 1 has 2 busy of 4, bin 2 has 1 of 4
    centres, busy = utilization_series(np.array([[0.0, 1.0], [0.0, 2.0]]), slots=4, bins=2)
    assert busy.tolist() == pytest.approx([0.5, 0.25])


def test_slots_are_the_latest_recorded_not_the_largest():
    events = _done("a", 0.0, 1.0) + [Event("refit", time=1.5, info={"slots": 4})] + _done("b", 2.0, 3.0) + [
        Event("refit", time=3.5, info={"slots": 2})]
    m = compute_metrics(events, CONFIG, with_calibration=False)
    assert (m.slots, m.slots_source) == (2, "recorded")
    # busy 2 s over a 3 s span of 2 slots
    assert m.utilization == pytest.approx(2.0 / (2 * 3.0))


# ---------------------------------------------------------------------------------------- failures
def test_running_and_queued_trials_are_not_failures():
    events = [
        Event("proposed", "a", time=0.0),
        Event("proposed", "b", time=0.0),
        Event("proposed", "c", time=0.0),
        Event("started", "a", time=1.0, started_at=1.0),
        Event("failed", "a", time=2.0, started_at=1.0, ended_at=2.0, error="timeout"),
        Event("started", "b", time=1.0, started_at=1.0),  # still running; "c" still queued
    ]
    m = compute_metrics(events, CONFIG, with_calibration=False)
    assert m.counts == {"proposed": 1, "running": 1, "completed": 0, "failed": 1, "unfinished": 0}
    # no process writes the run
    stopped = compute_metrics(events, CONFIG, with_calibration=False, writing=False)
    assert stopped.counts == {"proposed": 0, "running": 0, "completed": 0, "failed": 1, "unfinished": 2}
    assert m.failures == {"timeout": 1}
    assert math.isnan(m.best_value)
