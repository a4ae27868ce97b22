"""The real central actor on a simulated cluster (`orchestrator.sim.simulate`): virtual time, full slots,
every result told once, and U as the report computes it. The quantile SVGP and Thompson batches run in the
loop, small; no Ray."""

from __future__ import annotations

import collections

import pytest

from benchmarks.utilization import (
    QUICK_MODEL,
    QUICK_PROPOSER,
    greedy_utilization,
    span_utilization,
)
from orchestrator.errors import QbatchError
from orchestrator.sim import simulate
from orchestrator.store import RunStore

SLOTS, BUDGET = 4, 28


def _config(run_dir, budget: int = BUDGET, **over):
    return {"name": "sim", "objective": {"name": "sleep", "options": {"dim": 2, "mean_s": 0.0, "noise": 0.1}},
            "tau": 0.1, "model": {"type": "quantile", "options": dict(QUICK_MODEL)},
            "proposer": {"type": "thompson", "options": dict(QUICK_PROPOSER)}, "batch_size": 8,
            "initial_design": 6, "budget": budget, "max_concurrent": SLOTS, "seed": 2,
            "run_dir": str(run_dir), **over}


@pytest.fixture(scope="module")
def slow_evals(tmp_path_factory):
    """Evaluations of a minute on 4 slots: the actor's compute is small beside them."""
    run = simulate(_config(tmp_path_factory.mktemp("sim") / "run"), SLOTS, mean_s=60.0, cv=0.5, seed=1)
    return run, RunStore.open(run.run_dir).events()


def test_every_result_reaches_the_optimizer_exactly_once(slow_evals):
    run, events = slow_evals
    assert run.summary["status"] == "finished" and run.summary["completed"] == BUDGET
    assert run.summary["duplicates_ignored"] == 0
    assert sum(run.summary["sources"].values()) == BUDGET  # told to the optimizer, by source
    results = collections.Counter(e.trial_id for e in events if e.kind in ("completed", "failed"))
    proposed = {e.trial_id for e in events if e.kind == "proposed"}
    assert len(results) == BUDGET and set(results.values()) == {1} and set(results) <= proposed
    assert run.summary["sources"]["model"] > 0 and run.refits > 0  # the model and its refits were in the loop


def test_virtual_time_runs_forward_and_jumps_the_waits(slow_evals):
    run, events = slow_evals
    starts = [e.time for e in events if e.kind == "started"]
    assert starts == sorted(starts)  # dispatch times: the virtual clock never runs back
    for s, e in run.intervals:
        assert e > s
    assert run.span_s > 60.0 * BUDGET / SLOTS * 0.7  # minutes of evaluations ...
    assert run.real_s < run.span_s / 3 and run.skipped_s > run.span_s / 2  # ... in far less real time


def test_every_slot_is_busy_while_work_is_left(slow_evals):
    """The queue stays ahead of the slots (each proposal takes a fraction of a minute-long evaluation): the
    run is the zero-overhead greedy schedule of its own durations, every freed slot refilled at once."""
    run, _ = slow_evals
    ends = sorted(e for _, e in run.intervals)
    starts = sorted(s for s, _ in run.intervals)
    t0 = starts[0]
    assert sum(s - t0 < 1.0 for s in starts) == SLOTS  # all slots start together
    for s in starts[SLOTS:]:  # every later start is (within a second) a slot freed by an ending evaluation
        assert min(abs(s - e) for e in ends) < 1.0
    u_ideal = greedy_utilization([e - s for s, e in run.intervals], SLOTS)
    assert run.utilization == pytest.approx(u_ideal, abs=0.01)


def test_utilization_is_the_reports_and_the_benchmarks(slow_evals):
    run, _ = slow_evals
    u, busy, span = span_utilization(run.intervals, SLOTS)
    assert run.utilization == pytest.approx(u, rel=1e-9)
    assert run.busy_s == pytest.approx(busy) and run.span_s == pytest.approx(span)
    assert run.summary["utilization"] == pytest.approx(u, rel=0.02)  # the actor's own, on the virtual clock


def test_the_actors_compute_shows_up_as_idle_slots(tmp_path):
    """Evaluations of 1 ms (virtual) against proposals and fits of tens of milliseconds (real): the slots
    wait for the actor, and U falls well below what the same durations allow a zero-overhead scheduler. (At
    10 ms a fast machine's fits leave U near 0.5; at 1 ms it sits near 0.06.)"""
    run = simulate(_config(tmp_path / "run", budget=40, batch_size=4), SLOTS, mean_s=0.001, cv=0.0, seed=0)
    u_ideal = greedy_utilization([e - s for s, e in run.intervals], SLOTS)
    assert u_ideal == pytest.approx(1.0, abs=0.05)
    assert run.utilization < 0.5 * u_ideal
    assert run.skipped_s < run.span_s  # most of the span was real compute


def test_bad_arguments_are_refused_by_name(tmp_path):
    with pytest.raises(QbatchError, match="slots must be an integer >= 1; got 0"):
        simulate(_config(tmp_path / "a"), 0, 60.0, 0.5)
    sleepy = _config(tmp_path / "b")
    sleepy["objective"]["options"]["mean_s"] = 2.0
    with pytest.raises(QbatchError, match="sleeps mean_s=2 s in real time.*mean_s: 0"):
        simulate(sleepy, SLOTS, 60.0, 0.5)
    with pytest.raises(QbatchError, match="run_dir"):
        simulate({**_config(tmp_path / "c"), "run_dir": None}, SLOTS, 60.0, 0.5)
    with pytest.raises(QbatchError, match="mean_s must be"):
        simulate(_config(tmp_path / "d"), SLOTS, 0.0, 0.5)
