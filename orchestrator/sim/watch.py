"""Whether the central actor's planner threads are at work: the simulated cluster's clock may jump only
when not.

The planner (orchestrator/actor/planner.py) runs its proposer and refit steps in two background threads, each
a loop that runs its step and, when the step finds nothing to do, waits to be woken. `PlannerWatch` wraps both
steps of one `Planner` (its `loop` looks them up on the instance when it starts) and counts them, so the
simulated dispatcher (`cluster.py`) can ask: woken now, does either thread find work? Only when neither does
(every thread of the actor waits for a result) may the virtual clock skip ahead to the next one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from orchestrator.actor.planner import ROLES

if TYPE_CHECKING:
    from orchestrator.actor.planner import Planner

__all__ = ["PlannerWatch"]


class PlannerWatch:
    """Counts the steps of `planner`'s two threads; install it before the actor's `run` starts them.

    Args:
        planner: the central actor's `Planner`; its `propose_step` and `refit_step` are wrapped in place.
    """

    def __init__(self, planner: Planner) -> None:
        if planner.threads:
            raise RuntimeError("PlannerWatch must wrap the planner's steps before its threads start")
        self.planner = planner
        self.cond = threading.Condition()
        self.started = dict.fromkeys(ROLES, 0)  # steps begun, per role
        self.finished = dict.fromkeys(ROLES, 0)  # the number of the last step that returned
        self.running = dict.fromkeys(ROLES, False)
        self.worked = dict.fromkeys(ROLES, True)  # whether the last step that returned did something
        self.steps_worked = dict.fromkeys(ROLES, 0)
        for role in ROLES:
            name = f"{role}_step"
            setattr(planner, name, self._wrap(role, getattr(planner, name)))

    def _wrap(self, role: str, step: Callable[[], bool]) -> Callable[[], bool]:
        def watched() -> bool:
            with self.cond:
                self.started[role] += 1
                number = self.started[role]
                self.running[role] = True
            did = False
            try:
                did = bool(step())
                return did
            finally:
                with self.cond:
                    self.running[role] = False
                    self.finished[role] = number
                    self.worked[role] = did
                    self.steps_worked[role] += did
                    self.cond.notify_all()

        watched.__wrapped__ = step  # type: ignore[attr-defined]
        return watched

    def idle(self, timeout: float = 1.0) -> bool:
        """Wake both planner threads and wait for each to run a step: True when neither found work (both wait
        again), False as soon as one is at work (or after `timeout` seconds without an answer). Without
        running threads (``synchronous: true`` runs its steps in the dispatch loop, the caller) it is True."""
        if not self.planner.alive():
            return True
        with self.cond:
            if any(self.running.values()):  # at work now: no need to wake it (and slow it down) to ask
                return False
            target = {r: self.started[r] + 1 for r in ROLES}
        self.planner.wake()

        def answered() -> bool:
            return all(self.running[r] or self.finished[r] >= target[r] for r in ROLES)

        with self.cond:
            if not self.cond.wait_for(answered, timeout):
                return False
            return not any(self.running[r] or self.worked[r] for r in ROLES)
