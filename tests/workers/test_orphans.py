"""Orphans of the evaluation sandboxes (workers/processes.py `adopt_orphans`): a Ray evaluation worker adopts
and reaps its sandboxes' guards and what their group kills end, so none stays a zombie where PID 1 reaps
nothing (a container whose entrypoint is the driver, unreaped, has 31 zombies after 400 evaluations)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from objectives.base import Objective
from workers.evaluate import evaluate_once

REPO = Path(__file__).resolve().parents[2]
SPACE = {"x": {"type": "float", "low": 0.0, "high": 1.0}}


class Daemonizing(Objective):
    """Starts a helper in a session of its own through an intermediate process that exits at once (as `setsid
    -f` or a daemonizing simulator does): the helper is an orphan, adopted by the nearest subreaper."""

    space = SPACE

    def evaluate(self, params, seed):
        subprocess.run([sys.executable, "-c", "import subprocess; subprocess.Popen(['sleep', '0.1'], "
                        "start_new_session=True)"], check=True)
        return 1.0


class Nested(Objective):
    """Evaluates another objective, process-isolated, from inside its own sandbox."""

    space = SPACE

    def evaluate(self, params, seed):
        from tests.workers.test_evaluate import Returning

        rec = evaluate_once(Returning(2.0), "inner", params, seed, timeout_s=20)
        return rec.value if rec.status == "completed" else float("nan")

# 6 timeouts (each kills a sandbox and its guard), then an evaluation that completes; prints the zombies among
# this process's children, and whether the live sandbox's guard is a child here (adopted) or re-parented away
SCRIPT = textwrap.dedent(
    """
    import os, sys
    from workers.evaluate import evaluate_once
    from workers.sandbox import _SANDBOX
    from tests.workers.test_evaluate import Hanging, Returning

    def _proc_stat(pid):  # (state, parent, group)
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            return fields[0].decode(), int(fields[1]), int(fields[2])
        except OSError:
            return None

    def _children():
        return [int(n) for n in os.listdir("/proc")
                if n.isdigit() and (s := _proc_stat(int(n))) and s[1] == os.getpid()]

    import time
    from tests.workers.test_orphans import Daemonizing
    for i in range(6):
        assert evaluate_once(Hanging(), f"0-{i}", {"x": 0.1}, seed=0, timeout_s=0.2).error == "timeout"
    daemonizing = Daemonizing()
    for i in range(4):  # each leaves an orphan in a session of its own, which ends 0.1 s later
        assert evaluate_once(daemonizing, f"1-{i}", {"x": 0.1}, seed=0).value == 1.0
    time.sleep(0.5)
    assert evaluate_once(Returning(1.0), "2-0", {"x": 0.1}, seed=0).value == 1.0
    stats = {pid: _proc_stat(pid) for pid in _children()}
    zombies = sum(1 for s in stats.values() if s and s[0] == "Z")
    sandbox = _SANDBOX.proc.pid
    guards = [p for p, s in stats.items() if s and s[2] == sandbox and p != sandbox]
    everywhere = sum(1 for n in os.listdir("/proc")
                     if n.isdigit() and (s := _proc_stat(int(n))) and s[0] == "Z")
    print(zombies, len(guards), everywhere)
    """
)


def _run(prefix: list[str], worker: bool, mode: str = "process") -> list[int]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("QBATCH_EVALUATION_WORKER", None)
    if worker:
        env["QBATCH_EVALUATION_WORKER"] = mode  # as `evaluation_runtime_env` marks Ray's evaluation workers
    out = subprocess.run([*prefix, sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env,
                         cwd=REPO, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return [int(v) for v in out.stdout.split()]


def test_an_evaluation_worker_adopts_and_reaps_its_sandboxes_orphans():
    zombies, guards, _ = _run([], worker=True)
    # at most the last killed sandbox's guard waits to be reaped (at the next evaluation), and none of the
    # daemonized helpers (a helper in its own session is adopted, and reaped too); the live
    # sandbox's guard is this worker's child, not init's
    assert zombies <= 1 and guards == 1


class NestedInWorker(Objective):
    """Evaluates another objective from its sandbox, then says whether that made the sandbox a subreaper."""

    space = SPACE

    def evaluate(self, params, seed):
        import workers.evaluate as ev
        import workers.processes as processes
        from tests.workers.test_evaluate import Returning

        assert ev.evaluate_once(Returning(2.0), "inner", params, seed, timeout_s=20).value == 2.0
        return float(bool(processes._ADOPTION.subreaper))


def test_a_sandbox_never_becomes_a_subreaper():
    """A sandbox runs objective code: as a subreaper its sweep would reap the objective's own children (a
    `Popen` it waits for would read exit status 0). Only the worker, which runs none, adopts."""
    code = ("from workers.evaluate import evaluate_once; from tests.workers.test_orphans import "
            "NestedInWorker; print(evaluate_once(NestedInWorker(), '0-0', {'x': 0.5}, seed=0, "
            "timeout_s=60).value)")
    env = {**os.environ, "PYTHONPATH": str(REPO), "QBATCH_EVALUATION_WORKER": "process"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["0.0"]


def test_an_objective_may_evaluate_another_in_a_sandbox_of_its_own():
    """The worker does not fork its sandbox holding the adoption lock (the child would inherit it held), so an
    objective that itself calls `evaluate_once` does not hang until its timeout."""
    rec = evaluate_once(Nested(), "0-0", {"x": 0.5}, seed=0, timeout_s=30)
    assert rec.status == "completed" and rec.value == 2.0, rec.traceback


def test_outside_an_evaluation_worker_the_process_is_left_as_it_is():
    _, guards, _ = _run([], worker=False)
    assert guards == 0  # no subreaper: a library caller's process adopts nothing
    # nor a worker for thread-isolated evaluations, which runs objective code (that may call `evaluate_once`)
    _, guards, _ = _run([], worker=True, mode="thread")
    assert guards == 0


def test_no_zombies_pile_up_where_pid_1_reaps_nothing():
    """The evaluating process is PID 1 of its own pid namespace (the driver as a container's entrypoint),
    which reaps nothing but its own children."""
    probe = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"no pid namespace here: {probe.stderr.decode().strip()[:200]}")
    zombies, guards, everywhere = _run(["unshare", "--pid", "--fork", "--mount-proc"], worker=True)
    assert everywhere <= 1 and guards == 1
