"""The process's own Ray in orchestrator/runner.py without starting one: every run that `_ensure_ray` counts
as sharing it gives its share back on every path, and the process's SIGTERM handler from before Ray is kept
for the main thread to put back (review of the shared-Ray change)."""

from __future__ import annotations

import signal

import pytest

from orchestrator import runner
from orchestrator.errors import QbatchError


@pytest.fixture
def no_real_ray(monkeypatch):
    """`_ensure_ray` "starts" a Ray (a flag), `_shutdown_ray_unlocked` "stops" it: the counting is real."""
    import ray

    state = {"up": False, "shutdowns": 0}

    def start(address, num_cpus):
        state["up"] = True

    def stop(ray_module):
        state["up"] = False
        state["shutdowns"] += 1

    monkeypatch.setattr(runner, "_start_ray", start)
    monkeypatch.setattr(runner, "_shutdown_ray_unlocked", stop)
    monkeypatch.setattr(ray, "is_initialized", lambda: state["up"])
    monkeypatch.setattr(runner, "_OWN_RAY_RUNS", 0)
    monkeypatch.setattr(runner, "_SIGTERM_BEFORE_RAY", None)
    return state


@pytest.mark.parametrize("raised", [KeyboardInterrupt, RuntimeError, QbatchError])
def test_a_feasibility_check_that_raises_gives_the_runs_share_back(no_real_ray, monkeypatch, raised):
    """Found in review: only a QbatchError gave it back; a Ctrl-C or `ray.nodes()` failing left the count at 1,
    and every later run of the process shared a Ray that was never shut down."""
    def boom(resources):
        raise raised("no")

    monkeypatch.setattr(runner, "default_max_concurrent", boom)
    started = runner._ensure_ray(None, None)
    assert started and runner._OWN_RAY_RUNS == 1
    with pytest.raises(raised):
        runner._check_feasible(started, None)
    assert runner._OWN_RAY_RUNS == 0 and no_real_ray == {"up": False, "shutdowns": 1}


def test_the_last_run_to_end_shuts_the_shared_ray_down(no_real_ray):
    assert runner._ensure_ray(None, None) and runner._ensure_ray(None, None)
    assert runner._OWN_RAY_RUNS == 2
    runner._shutdown_local_ray()
    assert no_real_ray["up"] and no_real_ray["shutdowns"] == 0
    runner._shutdown_local_ray()
    assert no_real_ray == {"up": False, "shutdowns": 1}


def test_a_pending_sigterm_handler_from_before_ray_is_not_overwritten(no_real_ray, monkeypatch):
    """Found in review: a shared Ray shut down by another thread cannot put the handler back (signals are set in
    the main thread only); the next main-thread start then saved Ray's handler as the one from before, and the
    process's own was lost."""
    def mine(signum, frame):
        pass

    monkeypatch.setattr(runner, "_SIGTERM_BEFORE_RAY", mine)  # pending: the last shutdown ran in a thread
    monkeypatch.setattr(signal, "getsignal", lambda sig: "ray's handler")
    assert runner._ensure_ray(None, None)
    assert runner._SIGTERM_BEFORE_RAY is mine
