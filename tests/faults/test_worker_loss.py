"""SIGKILL the process of a running evaluation during a real run.

Evaluations run in a forked child of the Ray worker by default (``isolate="process"``, workers/evaluate.py).
Killing the child is a crash of the evaluation: one failed record ("crash"), never re-run. Killing the Ray
worker itself (the child dies with it) is a lost worker: Ray re-runs the task up to `max_retries` times, and
the trial is recorded once, completed by the retry, or failed ("worker-lost") when the retries run out.
In every case each trial id has exactly one completed/failed record and their number is the budget.
The user objective `tests.faults.objectives:PidRecorder` writes who runs each evaluation (pid, parent pid,
params) so the test knows whom to kill.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.faults.conftest import RunThread, alive, audit, fault_config, fresh_running, trial_of, wait_for
from tests.faults.objectives import read_pid_files

pytestmark = pytest.mark.ray

RUN_TIMEOUT_S = 120
# How long each evaluation of the kill tests sleeps. The test thread picks a running evaluation and kills it;
# beside the run's driver thread in this process, on a loaded 2-core CI machine, it can come late by over a
# second, so an evaluation must outlast that delay: at 1.5 s a retry once finished before its kill landed
# (the fresh-clone CI of 15887d7 recorded it "completed" instead of "worker-lost").
KILL_SLEEP_S = 4.0
FRESH_S = KILL_SLEEP_S / 2  # a victim is picked only if it started less than this ago: 2 s left to kill it


def _check_exactly_once(cfg, summary):
    """Every trial id once, as many as the budget; the summary agrees with the log."""
    a = audit(cfg["run_dir"], cfg["budget"])
    assert a["lost"] == 0 and a["duplicated"] == 0, (a["lost"], a["duplicated"])
    assert set(a["counts"].values()) == {1} and len(a["counts"]) == cfg["budget"]
    assert not a["damage"]
    assert summary["status"] == "finished" and summary["done"] == cfg["budget"]
    assert summary["completed"] + summary["failed"] == cfg["budget"]
    assert summary["completed"] == sum(e.kind == "completed" for e in a["results"].values())
    return a


def _executions(pid_dir, params):
    """How many times the objective started at `params` (one PidRecorder file per start)."""
    return [r for r in read_pid_files(pid_dir) if r["params"] == params]


def _kill_config(tmp_path, name, max_retries):
    """`fault_config` for the kill tests: evaluations of KILL_SLEEP_S, long enough for a late kill to land."""
    return fault_config(tmp_path, name, max_retries=max_retries, objective_options={"sleep_s": KILL_SLEEP_S})


def _victim(pid_dir, key):
    """A running evaluation that started less than FRESH_S ago (`key`: whose pid the test will kill)."""
    return wait_for(lambda: fresh_running(pid_dir, key=key, max_age_s=FRESH_S), 60, "a running evaluation")


def _kill(pid):
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not alive(pid), 10, f"pid {pid} to die")


def test_killed_evaluation_child_is_one_crash_record_and_not_rerun(ray_local, tmp_path):
    cfg = _kill_config(tmp_path, "kill-child", max_retries=1)
    pid_dir = cfg["objective"]["options"]["pid_dir"]
    run = RunThread(cfg)
    run.start()
    victim = _victim(pid_dir, "pid")
    assert victim["pid"] != victim["ppid"]  # the objective runs in a forked child of the Ray worker
    _kill(victim["pid"])
    summary = run.result(RUN_TIMEOUT_S)

    a = _check_exactly_once(cfg, summary)
    tid = trial_of(a["events"], victim["params"])
    rec = a["results"][tid]
    assert rec.kind == "failed" and rec.error == "crash", (rec.kind, rec.error)
    assert rec.info["child_pid"] == victim["pid"] and rec.pid == victim["ppid"]
    assert "SIGKILL" in rec.traceback
    assert len(_executions(pid_dir, victim["params"])) == 1, "a crashed evaluation is a result, not re-run"
    assert summary["failed"] == 1 and summary["completed"] == cfg["budget"] - 1


@pytest.mark.parametrize("isolate", ["process", "thread"])
def test_killed_ray_worker_is_retried_and_recorded_once(ray_local, tmp_path, isolate):
    cfg = _kill_config(tmp_path, f"kill-worker-{isolate}", max_retries=1)
    pid_dir = cfg["objective"]["options"]["pid_dir"]
    run = RunThread(cfg, actor_options={"isolate": isolate})
    run.start()
    # the Ray worker: the child's parent with isolate="process", the process itself with "thread"
    key = "ppid" if isolate == "process" else "pid"
    victim = _victim(pid_dir, key)
    worker = victim[key]
    _kill(worker)
    if isolate == "process":  # the child dies with its worker (PR_SET_PDEATHSIG)
        wait_for(lambda: not alive(victim["pid"]), 10, "the orphaned evaluation child to die")
    summary = run.result(RUN_TIMEOUT_S)

    a = _check_exactly_once(cfg, summary)
    tid = trial_of(a["events"], victim["params"])
    rec = a["results"][tid]
    assert rec.kind == "completed", f"{tid} recorded as {rec.kind} ({rec.error}): Ray should have retried it"
    runs = _executions(pid_dir, victim["params"])
    assert len(runs) == 2, "the killed attempt and Ray's retry"
    assert rec.pid != worker and rec.pid == runs[1][key], "the record is the retry's, from another worker"
    assert rec.started_at >= runs[1]["time"] - 1.0
    assert summary["failed"] == 0


def test_killed_ray_worker_without_retries_is_one_worker_lost_record(ray_local, tmp_path):
    cfg = _kill_config(tmp_path, "kill-worker-noretry", max_retries=0)
    pid_dir = cfg["objective"]["options"]["pid_dir"]
    run = RunThread(cfg)
    run.start()
    victim = _victim(pid_dir, "ppid")
    _kill(victim["ppid"])
    summary = run.result(RUN_TIMEOUT_S)

    a = _check_exactly_once(cfg, summary)
    rec = a["results"][trial_of(a["events"], victim["params"])]
    assert rec.kind == "failed" and rec.error == "worker-lost", (rec.kind, rec.error)
    assert "WorkerCrashedError" in rec.traceback
    assert len(_executions(pid_dir, victim["params"])) == 1, "max_retries=0: never re-run"
    assert summary["failed"] == 1


def test_worker_killed_on_every_attempt_exhausts_the_retries(ray_local, tmp_path):
    cfg = _kill_config(tmp_path, "kill-worker-twice", max_retries=1)
    pid_dir = cfg["objective"]["options"]["pid_dir"]
    run = RunThread(cfg)
    run.start()
    first = _victim(pid_dir, "ppid")
    _kill(first["ppid"])

    def retry():
        # the retry while it still evaluates: started less than half an evaluation ago (its worker, and the
        # worker's sandbox child, outlive the evaluation, so their being alive says nothing)
        runs = _executions(pid_dir, first["params"])
        if len(runs) < 2:
            return None
        r = runs[1]
        return r if alive(r["ppid"]) and time.time() - r["time"] < FRESH_S else None

    second = wait_for(retry, 60, "Ray's retry of the killed evaluation")
    _kill(second["ppid"])
    summary = run.result(RUN_TIMEOUT_S)

    a = _check_exactly_once(cfg, summary)
    rec = a["results"][trial_of(a["events"], first["params"])]
    assert rec.kind == "failed" and rec.error == "worker-lost", (rec.kind, rec.error)
    assert len(_executions(pid_dir, first["params"])) == 2, "one attempt plus max_retries=1 retry, no more"
    assert summary["failed"] == 1


def test_frozen_ray_worker_is_timed_out(ray_local, tmp_path):
    cfg = fault_config(tmp_path, "freeze-worker", budget=6, timeout_s=2.0, objective_options={"sleep_s": 0.5})
    pid_dir = cfg["objective"]["options"]["pid_dir"]
    run = RunThread(cfg)
    run.start()
    victim = wait_for(lambda: fresh_running(pid_dir, key="ppid", max_age_s=0.3), 60, "a running evaluation")
    os.kill(victim["ppid"], signal.SIGSTOP)
    t_stop = time.time()
    try:
        # timeout_s = 2 s: allow 15 s more for the fault to be noticed and the other trials to finish
        run.join(cfg["timeout_s"] + 15.0)
        finished_in_time = not run.is_alive()
    finally:
        os.kill(victim["ppid"], signal.SIGCONT)  # let a hung run finish so nothing is left behind
    summary = run.result(RUN_TIMEOUT_S)
    a = _check_exactly_once(cfg, summary)
    rec = a["results"][trial_of(a["events"], victim["params"])]
    assert finished_in_time, (f"the run was still waiting for the frozen worker {time.time() - t_stop:.0f} s "
                              "later")
    assert rec.kind == "failed" and rec.error == "timeout", (rec.kind, rec.error)
