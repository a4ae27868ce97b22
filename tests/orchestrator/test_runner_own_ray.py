"""The process's own Ray in orchestrator/runner/session.py without starting one: every run that
`OwnRay.acquire` counts as sharing it gives its share back on every path, and the process's SIGTERM handler
from before Ray is kept for the main thread to put back."""

from __future__ import annotations

import signal

import pytest

from orchestrator.errors import QbatchError
from orchestrator.runner import preflight, session


@pytest.fixture
def no_real_ray(monkeypatch):
    """`OwnRay.acquire` "starts" a Ray (a flag), `OwnRay._shutdown` "stops" it: the counting is real, on a
    fresh `OWN_RAY`."""
    import ray

    state = {"up": False, "shutdowns": 0}

    def start(address, num_cpus):
        state["up"] = True

    def stop(own, ray_module):
        state["up"] = False
        state["shutdowns"] += 1

    monkeypatch.setattr(session, "_start_ray", start)
    monkeypatch.setattr(session.OwnRay, "_shutdown", stop)
    monkeypatch.setattr(ray, "is_initialized", lambda: state["up"])
    monkeypatch.setattr(session, "OWN_RAY", session.OwnRay())  # no run counted, no SIGTERM handler pending
    return state


@pytest.mark.parametrize("raised", [KeyboardInterrupt, RuntimeError, QbatchError])
def test_a_feasibility_check_that_raises_gives_the_runs_share_back(no_real_ray, monkeypatch, raised):
    """Not only a QbatchError gives the share back: a Ctrl-C or `ray.nodes()` failing does too, so the count
    does not stay at 1 with every later run of the process sharing a Ray that is never shut down."""
    def boom(resources):
        raise raised("no")

    monkeypatch.setattr(preflight, "default_max_concurrent", boom)
    with pytest.raises(raised):
        # as `run_experiment` and `resume_experiment` hold it
        with session.ray_session(None, None) as started:
            assert started and session.OWN_RAY.runs == 1
            preflight._check_feasible(None)
    assert session.OWN_RAY.runs == 0 and no_real_ray == {"up": False, "shutdowns": 1}


def test_the_last_run_to_end_shuts_the_shared_ray_down(no_real_ray):
    own = session.OWN_RAY
    assert own.acquire(None, None) and own.acquire(None, None)
    assert own.runs == 2
    own.release()
    assert no_real_ray["up"] and no_real_ray["shutdowns"] == 0
    own.release()
    assert no_real_ray == {"up": False, "shutdowns": 1}


def test_a_pending_sigterm_handler_from_before_ray_is_not_overwritten(no_real_ray, monkeypatch):
    """A shared Ray shut down by another thread cannot put the handler back (signals are set in the main
    thread only); the next main-thread start keeps the process's own handler as the one from before, not
    Ray's."""
    def mine(signum, frame):
        pass

    own = session.OWN_RAY
    monkeypatch.setattr(own, "sigterm_before", mine)  # pending: the last shutdown ran in a thread
    monkeypatch.setattr(signal, "getsignal", lambda sig: "ray's handler")
    assert own.acquire(None, None)
    assert own.sigterm_before is mine
