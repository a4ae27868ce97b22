"""The simulated cluster's parts (orchestrator/sim/): the virtual clock, the heap of completions, the planner
watch, and their checks of bad input. No Ray, no model."""

from __future__ import annotations

import itertools
import math
import threading
import time

import numpy as np
import pytest

from objectives.timing import SleepObjective
from orchestrator.errors import QbatchError
from orchestrator.sim import PlannerWatch, SimCluster, VirtualClock


class _Trial:
    def __init__(self, i: int) -> None:
        self.trial_id, self.seed, self.params = f"0-{i}", i, {"x0": 0.3, "x1": 0.5}


def test_virtual_clock_passes_real_time_and_only_jumps_forward():
    clock = VirtualClock(start=1000.0)
    a = clock()
    time.sleep(0.02)
    b = clock()
    assert 1000.0 <= a < b and b - a == pytest.approx(0.02, abs=0.015)
    assert clock.advance_to(5000.0) == pytest.approx(5000.0, abs=1e-3)
    assert clock.skipped == pytest.approx(5000.0 - b, abs=0.01)
    before = clock()
    assert clock.advance_to(10.0) >= before  # a time in the past is no jump back
    reads = [clock() for _ in range(1000)]
    assert all(x <= y for x, y in itertools.pairwise(reads))


def test_cluster_ends_evaluations_in_virtual_time_in_order():
    obj = SleepObjective(dim=2, mean_s=0.0, noise=0.0)
    cluster = SimCluster(obj, mean_s=60.0, cv=0.5, seed=3)
    refs = [cluster.submit(_Trial(i), now=100.0 + i) for i in range(50)]
    assert cluster.submitted == 50 and len(set(refs)) == 50
    ends = {}
    now = 100.0
    while math.isfinite(cluster.next_end()):
        now = cluster.next_end()
        for ref in cluster.due(now):
            rec = cluster.take(ref)
            assert rec.ended_at == now and rec.started_at == 100.0 + refs.index(ref)
            assert rec.status == "completed" and rec.value == pytest.approx(obj.true_value(_Trial(0).params))
            ends[ref] = rec.ended_at
    assert sorted(ends) == sorted(refs)
    durations = np.array([ends[r] - (100.0 + i) for i, r in enumerate(refs)])
    assert 40 < durations.mean() < 80 and durations.min() > 0
    with pytest.raises(KeyError):
        cluster.take(refs[0])  # a record is fetched once


def test_cluster_durations_follow_mean_and_cv():
    cluster = SimCluster(SleepObjective(mean_s=0.0), mean_s=60.0, cv=0.5, seed=0)
    d = np.array([cluster.duration() for _ in range(20000)])
    assert d.mean() == pytest.approx(60.0, rel=0.02) and d.std() / d.mean() == pytest.approx(0.5, rel=0.05)
    assert SimCluster(SleepObjective(mean_s=0.0), mean_s=7.0, cv=0.0).duration() == 7.0


@pytest.mark.parametrize(("mean_s", "cv", "match"), [
    (0.0, 0.5, "mean_s must be"), (math.inf, 0.5, "mean_s must be"),
    (60.0, -1.0, "cv must be"), (60.0, math.nan, "cv must be")])
def test_cluster_refuses_bad_times(mean_s, cv, match):
    with pytest.raises(QbatchError, match=match):
        SimCluster(SleepObjective(mean_s=0.0), mean_s=mean_s, cv=cv)


class _Planner:
    """The two planner threads' loop of orchestrator/actor/planner.py, with steps the test controls."""

    def __init__(self) -> None:
        self.threads: list[threading.Thread] = []
        self.wakes = {r: threading.Event() for r in ("propose", "refit")}
        self.work = {"propose": threading.Event(), "refit": threading.Event()}
        self.stop = threading.Event()
        self.propose_step = lambda: self._step("propose")
        self.refit_step = lambda: self._step("refit")

    def _step(self, role: str) -> bool:
        if self.work[role].is_set():
            time.sleep(0.2)
            self.work[role].clear()
            return True
        return False

    def loop(self, role: str) -> None:
        step = self.propose_step if role == "propose" else self.refit_step
        while not self.stop.is_set():
            if not step():
                self.wakes[role].wait(0.1)
                self.wakes[role].clear()

    def start(self) -> None:
        self.threads = [threading.Thread(target=self.loop, args=(r,), daemon=True)
                        for r in ("propose", "refit")]
        for t in self.threads:
            t.start()

    def alive(self) -> bool:
        return any(t.is_alive() for t in self.threads)

    def wake(self) -> None:
        for ev in self.wakes.values():
            ev.set()


def test_planner_watch_sees_work_and_idleness():
    planner = _Planner()
    assert PlannerWatch(planner).idle()  # no threads (synchronous mode): the caller is the only one
    planner = _Planner()
    watch = PlannerWatch(planner)
    planner.start()
    try:
        assert watch.idle()
        planner.work["refit"].set()  # the refit thread finds work once woken
        assert not watch.idle()
        time.sleep(0.3)
        assert watch.idle() and watch.steps_worked == {"propose": 0, "refit": 1}
    finally:
        planner.stop.set()
        planner.wake()
    with pytest.raises(RuntimeError, match="before its threads start"):
        PlannerWatch(planner)
