"""A `(name, options)` objective spec is built inside the sandbox child, never in the Ray worker that forks
it.

GNU OpenMP (torch's CPU thread pool) is not fork-safe: a child forked from a process that already ran a
multi-threaded torch op deadlocks at its own first one. Were the worker to build the objective, a user
objective that warms up a model in its constructor would time out at every evaluation.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from objectives.base import Objective
from workers.evaluate import evaluate_once

REPO = Path(__file__).resolve().parents[2]

USER_MODULE = textwrap.dedent(
    '''
    import os
    import time

    from objectives.base import Objective


    class Recording(Objective):
        """Writes the pid of the process that built it, one line per construction."""

        space = {"x": {"type": "float", "low": 0.0, "high": 1.0}}

        def __init__(self, log: str, fail: str = "", eval_s: float = 0.0):
            self.eval_s = eval_s
            with open(log, "a") as f:
                f.write(f"{os.getpid()}\\n")
            if fail == "raise":
                raise RuntimeError("no model file at /models/missing.pt")
            if fail == "exit":
                os._exit(3)
            if fail == "hang":
                time.sleep(120)
            if fail == "slow":
                time.sleep(2.0)

        def evaluate(self, params, seed):
            time.sleep(self.eval_s)
            return float(params["x"])


    class WarmTorch(Objective):
        """Warms a model up with a two-thread matmul in its constructor, as a user objective may."""

        space = {"x": {"type": "float", "low": 0.0, "high": 1.0}}

        def __init__(self):
            import torch

            torch.set_num_threads(2)
            self.w = torch.randn(600, 600)
            (self.w @ self.w).sum()

        def evaluate(self, params, seed):
            import torch

            torch.set_num_threads(2)
            return float((self.w @ self.w).sum() * 0 + params["x"])
    '''
)


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "qbatch_user_objective.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    sys.modules.pop("qbatch_user_objective", None)


def _builders(log: Path) -> list[int]:
    return [int(line) for line in log.read_text().split()] if log.exists() else []


def test_spec_is_built_once_in_the_sandbox_child(user_module):
    log = user_module / "built.txt"
    spec = ("qbatch_user_objective:Recording", {"log": str(log)})
    first = evaluate_once(spec, "0-0", {"x": 0.25}, seed=0)
    second = evaluate_once(spec, "0-1", {"x": 0.5}, seed=1)
    assert (first.status, first.value, second.value) == ("completed", 0.25, 0.5)
    assert first.child_pid == second.child_pid != os.getpid()
    assert _builders(log) == [first.child_pid]  # built once, by the child, never by this process
    # the same spec under thread isolation is built here (no fork involved)
    threaded = evaluate_once(spec, "0-2", {"x": 0.75}, seed=2, isolate="thread")
    assert threaded.value == 0.75 and _builders(log)[-1] == os.getpid()


@pytest.mark.parametrize("fail,message", [
    ("raise", r"loading the objective failed: RuntimeError: no model file at /models/missing.pt"),
    ("exit", r"loading the objective failed: RuntimeError: the sandbox process died while building the "
             r"objective \(exit code 3\)"),
])
def test_an_objective_that_cannot_be_built_is_a_failed_record_each_time(user_module, fail, message):
    log = user_module / "built.txt"
    spec = ("qbatch_user_objective:Recording", {"log": str(log), "fail": fail})
    records = [evaluate_once(spec, f"0-{i}", {"x": 0.5}, seed=i, timeout_s=30) for i in range(2)]
    for rec in records:
        assert (rec.status, rec.error, rec.value) == ("failed", "exception", None)
        assert pytest.approx(rec.ended_at, abs=30) == rec.started_at
        assert re.fullmatch(message, rec.message), rec.message
    if fail == "raise":
        assert "no model file" in records[0].traceback and "Traceback" in records[0].traceback
    # each evaluation tried again in a fresh child (a file may have appeared meanwhile)
    assert _builders(log) == [r.child_pid for r in records] and len(set(_builders(log))) == 2


def test_objective_warmed_with_threaded_torch_does_not_deadlock_its_evaluations(user_module):
    """In a fresh interpreter (this one may have used OpenMP already): no evaluation deadlocks in the forked
    child and ends as a timeout. The same for a warm-up at the module's top level (which a worker importing
    the module before forking would run)."""
    (user_module / "qbatch_warm_module.py").write_text(textwrap.dedent(
        """
        import torch

        from objectives.base import Objective

        torch.set_num_threads(2)
        W = torch.randn(600, 600)
        (W @ W).sum()


        class Warm(Objective):
            space = {"x": {"type": "float", "low": 0.0, "high": 1.0}}

            def evaluate(self, params, seed):
                torch.set_num_threads(2)
                return float((W @ W).sum() * 0 + params["x"])
        """
    ))
    code = textwrap.dedent(
        """
        # imported, no op run: only the first import's time, which a loaded machine stretches a lot
        import torch
        from workers.evaluate import evaluate_once
        for spec in (("qbatch_user_objective:WarmTorch", {}), ("qbatch_warm_module:Warm", {})):
            for i in range(2):
                rec = evaluate_once(spec, f"0-{i}", {"x": 0.5}, seed=i, timeout_s=120)
                print(rec.status, rec.value, rec.error)
        """
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(user_module), str(REPO)]), "OMP_NUM_THREADS": "2"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[:4] == ["completed 0.5 None"] * 4, out.stdout


def test_a_hung_constructor_is_a_timeout_of_its_own_build(user_module):
    """The build gets `timeout_s` of its own: a hung constructor is killed there and recorded as such (before,
    it waited for the central actor's backstop and was recorded as a frozen worker, at every trial)."""
    log = user_module / "built.txt"
    calls = []
    rec = evaluate_once(
        ("qbatch_user_objective:Recording", {"log": str(log), "fail": "hang"}),
        "0-0",
        {"x": 0.5},
        seed=0,
        timeout_s=1.5,
        on_progress=lambda: calls.append(1),
    )
    assert (rec.status, rec.error) == ("failed", "timeout")
    assert rec.message == "timeout after 1.5 s while building the objective"
    assert "building the objective took longer than timeout_s=1.5 s" in rec.traceback
    # where it hung: the child's Python stack, written on STACK_SIGNAL just before it was killed
    assert "its Python stacks when it was killed" in rec.traceback and "in __init__" in rec.traceback
    assert 1.5 <= rec.ended_at - rec.started_at < 4.0 and calls == [1]  # imported, never built
    with pytest.raises(ProcessLookupError):  # the hung child was killed
        os.kill(rec.child_pid, 0)


def test_a_slow_constructor_is_built_once_and_reported_once(user_module):
    """A build of 2 s and evaluations of 2 s, each within timeout_s = 3.5 s but not together: both evaluations
    complete in one child (the evaluation's timeout counts after the build); `on_progress` (the task's start
    re-reports) is called twice for the one child, after its import and after its build."""
    log = user_module / "built.txt"
    spec = ("qbatch_user_objective:Recording", {"log": str(log), "fail": "slow", "eval_s": 2.0})
    calls = []
    recs = [
        evaluate_once(
            spec, f"0-{i}", {"x": 0.5}, seed=i, timeout_s=3.5, on_progress=lambda: calls.append(time.time())
        )
        for i in range(2)
    ]
    assert [r.status for r in recs] == ["completed"] * 2 and len(calls) == 2
    assert len(_builders(log)) == 1 and calls[0] + 1.9 < calls[1] <= recs[0].started_at


class _SeesDevices(Objective):
    space = {"x": {"type": "float", "low": 0.0, "high": 1.0}}

    def evaluate(self, params, seed):
        return float(os.environ.get("CUDA_VISIBLE_DEVICES", "-1"))


def test_a_task_given_other_gpus_gets_a_new_sandbox(monkeypatch):
    """Ray sets CUDA_VISIBLE_DEVICES per task; a kept sandbox child keeps the value it was forked with, so a
    later task on the same worker given another GPU would run on the first one."""
    obj = _SeesDevices()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    a = evaluate_once(obj, "0-0", {"x": 0.5}, seed=0)
    b = evaluate_once(obj, "0-1", {"x": 0.5}, seed=1)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    c = evaluate_once(obj, "0-2", {"x": 0.5}, seed=2)
    assert (a.value, b.value, c.value) == (0.0, 0.0, 1.0)
    assert a.child_pid == b.child_pid != c.child_pid


def test_importing_the_objectives_module_is_not_part_of_the_builds_timeout(tmp_path, monkeypatch):
    """The worker imports a spec's module before it forks (once per worker, untimed); only the constructor
    counts against the build's timeout_s, so a module that takes 1.5 s to import does not fail every trial at
    timeout_s = 1."""
    (tmp_path / "qbatch_slow_import.py").write_text(textwrap.dedent(
        """
        import time

        from objectives.base import Objective

        time.sleep(1.5)


        class Quick(Objective):
            space = {"x": {"type": "float", "low": 0.0, "high": 1.0}}

            def evaluate(self, params, seed):
                return float(params["x"])
        """
    ))
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        rec = evaluate_once(("qbatch_slow_import:Quick", {}), "0-0", {"x": 0.25}, seed=0, timeout_s=1.0)
    finally:
        sys.modules.pop("qbatch_slow_import", None)
    assert (rec.status, rec.value) == ("completed", 0.25), rec


def _interrupt_the_next_wait(monkeypatch) -> None:
    """The worker's next wait on its sandbox raises KeyboardInterrupt (Ctrl-C in a library call); later ones
    wait."""
    import multiprocessing.connection as mc

    poll, interrupted = mc.Connection.poll, []

    def interrupting_poll(self, timeout=0.0):
        if not interrupted:
            interrupted.append(True)
            raise KeyboardInterrupt
        return poll(self, timeout)

    monkeypatch.setattr(mc.Connection, "poll", interrupting_poll)


def test_an_interrupted_build_leaves_no_half_built_sandbox(user_module, monkeypatch):
    """Ctrl-C while the sandbox builds (a library call): the child is killed and the next evaluation builds
    afresh. The sandbox does not claim the spec before it is built, so the next evaluation does not read the
    late "ready" message as its result (a spurious crash record)."""
    spec = ("qbatch_user_objective:Recording", {"log": str(user_module / "built.txt"), "fail": "slow"})
    _interrupt_the_next_wait(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        evaluate_once(spec, "0-0", {"x": 0.5}, seed=0, timeout_s=30)
    rec = evaluate_once(spec, "0-1", {"x": 0.75}, seed=1, timeout_s=30)
    assert (rec.status, rec.value) == ("completed", 0.75), rec


def test_an_interrupted_evaluation_leaves_no_busy_sandbox(user_module, monkeypatch):
    """Ctrl-C while an evaluation runs (a library call): the child still computing x = 0.1 must not answer the
    next evaluation (returning 0.1 for x = 0.9)."""
    spec = ("qbatch_user_objective:Recording", {"log": str(user_module / "built.txt"), "eval_s": 0.5})
    assert evaluate_once(spec, "0-0", {"x": 0.2}, seed=0).value == 0.2  # a ready child
    _interrupt_the_next_wait(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        evaluate_once(spec, "0-1", {"x": 0.1}, seed=1, timeout_s=30)
    rec = evaluate_once(spec, "0-2", {"x": 0.9}, seed=2, timeout_s=30)
    assert (rec.status, rec.value) == ("completed", 0.9), rec


def test_a_module_that_fails_to_import_is_reported_as_such(tmp_path, monkeypatch):
    """A slow module that then fails to import: the failure says so, with no build timeout (it was imported in
    the worker, untimed, then again in the child within the build's timeout: "timeout ... while building")."""
    (tmp_path / "qbatch_bad_import.py").write_text("import time\ntime.sleep(1.5)\nraise ImportError('no "
                                                   "libfoo.so')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    rec = evaluate_once(("qbatch_bad_import:Thing", {}), "0-0", {"x": 0.5}, seed=0, timeout_s=1.0)
    assert (rec.status, rec.error) == ("failed", "exception"), rec
    assert "loading the objective failed" in rec.message and "no libfoo.so" in rec.message, rec.message
