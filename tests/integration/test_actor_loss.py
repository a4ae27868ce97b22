"""SIGKILL the central actor mid-run. Ray restarts it, it rebuilds from the log and carries
on; the evaluations that were running keep running (their tasks belong to the run's `EvaluationPool`, not
to the actor), and the ones that finished while it was down are collected by the new actor - recorded once,
never re-run, never lost."""

from __future__ import annotations

import io
import os
import signal
import threading
import time

import pytest

from orchestrator.runner import NAMESPACE, actor_name, run_experiment
from orchestrator.store import RunStore
from tests.faults.conftest import wait_for
from tests.integration.conftest import finished_counts, run_config

pytestmark = pytest.mark.ray

BUDGET = 30


def test_killed_actor_restarts_and_keeps_the_evaluations_that_finished_while_it_was_down(ray_local, tmp_path):
    import ray

    # 2.5 s evaluations: they finish during the restart
    cfg = run_config(
        tmp_path,
        "actor-loss",
        objective={"name": "sleep", "options": {"mean_s": 2.5, "cv": 0.0, "num_cpus": 0.5}},
        tau=0.5,
        batch_size=6,
        initial_design=8,
        budget=BUDGET,
        max_concurrent=6,
    )
    run_dir = cfg["run_dir"]
    box: dict = {}

    def drive() -> None:
        try:
            box["summary"] = run_experiment(cfg, address=ray_local, progress=False, out=io.StringIO())
        except BaseException as exc:  # surfaced by the assertions below
            box["error"] = exc

    driver = threading.Thread(target=drive, daemon=True)
    driver.start()

    def events():
        return RunStore.open(run_dir).events() if RunStore.exists(run_dir) else []

    wait_for(lambda: len(finished_counts(events())) >= 8, 120, "8 finished evaluations", period=0.1)
    actor = ray.get_actor(actor_name(run_dir), namespace=NAMESPACE)
    actor_pid = ray.get(actor.pid.remote(), timeout=30)
    # kill when an evaluation has been in flight for 2.2 of its 2.5 s (the actor's dispatch times; the slots
    # are free, so it started then): it ends within 0.3 s, before the restarted actor (a new process that
    # replays the log) is back. Killing at any moment flaked: with every evaluation just dispatched, the actor
    # could be back before any of them ended.
    seen: dict = {}

    def one_nearly_done() -> bool:
        seen.update(inflight=ray.get(actor.inflight.remote()), now=time.time())
        return any(seen["now"] - t >= 2.2 for t in seen["inflight"].values())

    wait_for(one_nearly_done, 30, "an evaluation 2.2 s in flight", period=0.05)
    t_kill = time.time()
    os.kill(actor_pid, signal.SIGKILL)  # at once: the snapshot that found it is the one checked below
    running = seen["inflight"]

    driver.join(timeout=240)
    assert not driver.is_alive(), "the run did not finish after the actor was killed"
    assert "error" not in box, repr(box.get("error"))
    summary = box["summary"]
    assert summary["status"] == "finished" and summary["actor_restarts"] == 1

    after = RunStore.open(run_dir).events()
    counts = finished_counts(after)
    assert len(counts) == BUDGET and set(counts.values()) == {1}, "no loss, no duplicate, count == budget"
    results = {e.trial_id: e for e in after if e.kind in ("completed", "failed")}
    assert running, "some evaluations were running when the actor was killed"
    # the dead actor writes nothing after the kill: the first later event is the restarted actor's
    back = min(e.time for e in after if e.time is not None and e.time > t_kill)
    for tid in running:
        rec = results[tid]
        assert rec.kind == "completed", f"{tid} was recorded as {rec.kind} ({rec.error})"
        # the evaluation recorded is the one dispatched before the kill, never re-run: no 'started' event
        # after the kill (its own may have been lost in the dead actor's unflushed buffer), and it began
        # before the restarted actor could dispatch anything (a task may begin a few ms after its dispatch, so
        # after the kill)
        starts = [e for e in after if e.kind == "started" and e.trial_id == tid]
        assert len(starts) <= 1 and all(e.time < t_kill for e in starts), [
            (e.time, e.attempt) for e in starts
        ]
        assert rec.attempt == 0 and rec.started_at < back
    finished_while_down = [tid for tid in running if t_kill < results[tid].ended_at < back]
    assert finished_while_down, "at least one evaluation finished while the actor was down and was kept"
