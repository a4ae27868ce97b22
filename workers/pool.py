"""The owner of a run's evaluation tasks: evaluations outlive a crash of the central actor.

In Ray a task fate-shares with the process that submitted it: if the central
actor submitted the evaluations itself, its death would kill every running evaluation, and results that
finished while it restarts would be lost. So the driver creates one `EvaluationPool` actor per run (no
CPUs, no model, nothing that can run out of memory) and the central actor submits through it. The pool
submits the Ray tasks (workers/evaluate.py), keeps their `ObjectRef`s until the central actor says the
result is durably logged (`release`, or with its next `submit`), and hands the refs back: the central actor
waits on them directly (as a borrower), so streaming costs no extra hop per result.

When the central actor dies and Ray restarts it, the new instance replays the log and asks the pool what
is still held (`held`): evaluations that are still running, and those that finished while it was down,
whose results wait in the pool until they are collected. They are ingested exactly once (by trial id)
and never re-run. Each task reports to the pool when its attempt starts running (`started`), so the central
actor's backstop deadline for a frozen worker counts from then, not from submission. If the pool itself dies,
its tasks die with it; the central actor sees the owner's death on those refs and puts the trials back in the
queue (they were never recorded).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from objectives.base import Resources
from workers.evaluate import evaluation_submitter

__all__ = ["EvaluationPool", "exit_with_node"]

logger = logging.getLogger(__name__)

#: how often an actor checks that the Ray node process that started it is still there (`exit_with_node`)
NODE_CHECK_S = 1.0


def exit_with_node(what: str, check_s: float = NODE_CHECK_S) -> bool:
    """In a Ray actor's process: exit as soon as the raylet that started it (its parent) is gone.

    When a driver that started a local Ray is SIGKILLed, its raylet goes with it, but the actors live on until
    Ray's own checks end them (seconds here, about a minute in another PID namespace); the central actor would
    keep the run's writer lock that long, and `qbatch resume` would be refused as if another run were writing.
    Whatever the actor was doing is safe to cut: every log write is atomic. Outside an actor (a driver, a
    test) nothing is started. Returns whether the watch was started.
    """
    import ray

    if not ray.is_initialized() or ray.get_runtime_context().get_actor_id() is None:
        return False
    watch_parent(what, check_s)
    return True


def watch_parent(what: str, check_s: float = NODE_CHECK_S) -> None:
    """Start a daemon thread that ends this process (exit status 1, a logged warning, on stderr unless the
    process configured logging otherwise) once its parent process is gone (it is then re-parented), checking
    every `check_s` seconds."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(check_s)
        logger.warning("qbatch: the Ray node that ran the %s is gone; the %s exits (pid %d)", what, what,
                       os.getpid())
        os._exit(1)

    threading.Thread(target=watch, name="qbatch-node-watch", daemon=True).start()


class EvaluationPool:
    """Submits and holds the evaluation tasks of one run; create it with
    `ray.remote(EvaluationPool).options(num_cpus=0, max_restarts=-1)` from the driver, never from the
    central actor (an actor's creator owns it, and the point is not to share the central actor's fate).

    Args:
        objective: the objective as `submit_evaluation` takes it (an `Objective`, a `(name, options)` spec or
            a `ByValue` objective).
        resources: the objective's `Resources`.
        timeout_s, max_retries, isolate: as in `submit_evaluation`.
    """

    def __init__(
        self,
        objective: Any,
        resources: Resources,
        timeout_s: float = 600.0,
        max_retries: int = 1,
        isolate: str = "process",
    ) -> None:
        import ray

        # one copy in the object store, shared by every task (an ObjectRef argument is resolved by Ray)
        self._objective = ray.put(objective)
        self._resources = resources
        self._timeout_s = float(timeout_s)
        self._max_retries = int(max_retries)
        self._isolate = isolate
        self._held: dict[str, tuple[Any, int, float]] = {}  # trial_id -> (ref, attempt, submitted at)
        self._started: dict[str, float] = {}  # trial_id -> when its latest attempt started running
        self._me = ray.get_runtime_context().current_actor if ray.is_initialized() else None
        self._task = evaluation_submitter(resources, self._max_retries, isolate)  # `submit_evaluation`'s task
        exit_with_node("evaluation pool")

    def submit(self, items: Sequence[tuple[str, int, Mapping[str, Any], int]],
               release: Sequence[str] = ()) -> list[Any]:
        """Start one evaluation per `(trial_id, attempt, params, seed)`; returns their refs, in order.

        A trial already held (submitted and not released) is not started twice: its existing ref is returned.
        `release`: trial ids whose results are durably logged, forgotten first (as `release` does): the
        central actor's next submission carries them, one call for both.
        """
        self.release(release)
        refs = []
        for trial_id, attempt, params, seed in items:
            if trial_id not in self._held:
                ref = self._task.remote(self._objective, trial_id, dict(params), int(seed), self._timeout_s,
                                        self._isolate, self._me)
                self._held[trial_id] = (ref, int(attempt), time.time())
            refs.append(self._held[trial_id][0])
        return refs

    def release(self, trial_ids: Sequence[str]) -> int:
        """Forget results the central actor has logged durably (frees them in the object store)."""
        n = 0
        for tid in trial_ids:
            n += self._held.pop(tid, None) is not None
            self._started.pop(tid, None)
        return n

    def started(self, trial_id: str, at: float) -> None:
        """Called by an evaluation task when an attempt starts running (after any wait in Ray's queue)."""
        if trial_id in self._held:
            self._started[trial_id] = max(at, self._started.get(trial_id, at))

    def started_at(self, trial_ids: Sequence[str]) -> dict[str, float]:
        """When the latest attempt of each of `trial_ids` started; those still queued are left out."""
        return {tid: self._started[tid] for tid in trial_ids if tid in self._started}

    def counts(self) -> tuple[int, int]:
        """`(in flight, started)`: evaluations held and not yet finished, and how many of them have started
        running; the others wait in Ray's queue for a worker with the resources they ask for."""
        import ray

        refs = {entry[0]: tid for tid, entry in self._held.items()}
        done: list[Any] = []
        if refs:
            done, _ = ray.wait(list(refs), num_returns=len(refs), timeout=0, fetch_local=False)
        finished = set(done)
        live = [tid for ref, tid in refs.items() if ref not in finished]
        return len(live), sum(1 for tid in live if tid in self._started)

    def cancel(self, trial_ids: Sequence[str]) -> int:
        """Force-cancel evaluations past their deadline (kills a frozen worker) and forget them."""
        import ray

        n = 0
        for tid in trial_ids:
            entry = self._held.pop(tid, None)
            self._started.pop(tid, None)
            if entry is not None:
                n += 1
                try:
                    ray.cancel(entry[0], force=True)
                except Exception:  # finished meanwhile, or its worker is already gone
                    pass
        return n

    def held(self) -> dict[str, tuple[Any, int, float]]:
        """Every evaluation not yet released: trial_id -> (ref, attempt, submitted at); running or
        finished."""
        return dict(self._held)

    def size(self) -> int:
        return len(self._held)
