"""Virtual slots for the real central actor: evaluations end in virtual time, kept in a heap of completions.

`SimCluster` stands in for the Ray cluster: an evaluation submitted at virtual time t ends at t + d, d drawn
from a lognormal of the given mean and coefficient of variation (the load of benchmarks/utilization.py). Its
value is real: the objective runs in this process at submission through the workers' own `call_objective`, so
it must be cheap (an analytic stand-in; its real time counts as the actor's). No process or thread per slot.

`SimDispatcher` is the actor's `Dispatcher` with only its Ray parts replaced: `submit` hands trials to the
`SimCluster`, `wait` returns the evaluations whose virtual end has come, `fetch_many` their records.
Everything else (the refill of freed slots before the durable log write, the write, the tell exactly once, the
failure guard) is the real dispatcher's. While it waits, real time passes if any thread of the actor is at
work (the planner's, `PlannerWatch`, or the dispatch loop with a queued trial for a free slot, which the real
loop picks up only when its wait returns); once none is, the clock jumps to the next evaluation's end, or to
the refit thread's next timed check, whichever comes first."""

from __future__ import annotations

import heapq
import itertools
import math
import threading
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from objectives.timing import lognormal_params
from orchestrator.actor.backstop import Backstop
from orchestrator.actor.dispatch import Dispatcher
from orchestrator.errors import QbatchError
from workers.call import call_objective

if TYPE_CHECKING:
    from objectives.base import Objective
    from orchestrator.actor.planner import Planner
    from orchestrator.ask_tell import Trial
    from orchestrator.sim.clock import VirtualClock
    from orchestrator.sim.watch import PlannerWatch
    from workers.records import TrialResult

__all__ = ["SimCluster", "SimDispatcher"]

class SimCluster:
    """Evaluations in virtual time: submitted ones, each with its end, in a heap ordered by end.

    Args:
        objective: the run's objective, evaluated here at submission (its value and metrics are real).
        mean_s: mean evaluation time in virtual seconds (> 0).
        cv: coefficient of variation of evaluation times (>= 0; 0: every evaluation takes `mean_s`).
        seed: seed of the evaluation times (drawn in submission order).
    """

    def __init__(self, objective: Objective, mean_s: float, cv: float, seed: int = 0) -> None:
        if not (isinstance(mean_s, (int, float)) and math.isfinite(mean_s) and mean_s > 0):
            raise QbatchError(f"mean_s must be a finite number > 0; got {mean_s!r}")
        if not (isinstance(cv, (int, float)) and math.isfinite(cv) and cv >= 0):
            raise QbatchError(f"cv must be a finite number >= 0; got {cv!r}")
        self.objective = objective
        self.mean_s, self.cv = float(mean_s), float(cv)
        self.rng = np.random.default_rng(seed)
        self.heap: list[tuple[float, int, int]] = []  # (end, submission number, ref)
        self.records: dict[int, TrialResult] = {}  # ref -> its record, until fetched
        self.refs = itertools.count()
        self.lock = threading.Lock()
        self.submitted = 0

    def duration(self) -> float:
        """One evaluation time in virtual seconds."""
        if self.cv == 0:
            return self.mean_s
        mu, sigma = lognormal_params(self.mean_s, self.cv)
        return float(self.rng.lognormal(mu, sigma))

    def submit(self, trial: Trial, now: float) -> int:
        """Start `trial`'s evaluation at virtual time `now`; returns its ref."""
        rec = call_objective(self.objective, trial.params, int(trial.seed))
        with self.lock:
            ref = next(self.refs)
            rec.started_at, rec.ended_at = now, now + self.duration()
            rec.trial_id = trial.trial_id
            self.records[ref] = rec
            heapq.heappush(self.heap, (rec.ended_at, self.submitted, ref))
            self.submitted += 1
        return ref

    def next_end(self) -> float:
        """The virtual time the next running evaluation ends (inf when none runs)."""
        with self.lock:
            return self.heap[0][0] if self.heap else math.inf

    def due(self, now: float) -> list[int]:
        """The refs of the evaluations that have ended by virtual time `now`, in order of their ends."""
        out = []
        with self.lock:
            while self.heap and self.heap[0][0] <= now:
                out.append(heapq.heappop(self.heap)[2])
        return out

    def take(self, ref: int) -> TrialResult:
        """The record of the ended evaluation `ref` (once)."""
        with self.lock:
            return self.records.pop(ref)


class SimDispatcher(Dispatcher):
    """The central actor's `Dispatcher` on a `SimCluster`: built from the actor's own, with its parts.

    Args:
        base: the actor's `Dispatcher` (its scheduler, log, optimizer, guard, abort, stop and config).
        cluster: the virtual slots' evaluations.
        clock: the run's virtual clock (the actor's, its planner's and this dispatcher's).
        watch: the planner threads' step counts (the clock jumps only when neither is at work).
    """

    def __init__(self, base: Dispatcher, cluster: SimCluster, clock: VirtualClock,
                 watch: PlannerWatch) -> None:
        super().__init__(base.scheduler, base.log, base.opt, base.guard, base.abort, base.stop, base.wake,
                         cfg=base.cfg, pool=None, objective_spec=base.objective_spec,
                         resources=base.resources, isolate=base.isolate, session=base.session)
        self.backstop = Backstop(None, math.inf, 0)  # a virtual evaluation never hangs
        self.cluster = cluster
        self.clock = clock
        self.watch = watch
        self.planner: Planner = watch.planner
        self.skips = 0  # jumps of the clock

    def submit(self, batch: list[tuple[Trial, int]]) -> list[Any]:
        now = self.clock()
        return [self.cluster.submit(trial, now) for trial, _ in batch]

    def fetch_many(self, refs: list[Any]) -> dict[Any, TrialResult]:
        return {ref: self.cluster.take(ref) for ref in refs}

    def fetch(self, ref: Any, trial: Trial, dispatched: float) -> TrialResult | None:
        return self.cluster.take(ref)

    def wait(self, refs: list[Any], timeout: float) -> tuple[list[Any], list[Any]]:
        """As Ray's: up to `timeout` real seconds for the first result, then every other one that has ended.
        The clock jumps when the actor has nothing to do until the next evaluation ends (`_idle`)."""
        deadline = time.perf_counter() + timeout
        while True:
            now = self.clock()
            ready = self.cluster.due(now)
            if ready:
                done = set(ready)
                return ready, [r for r in refs if r not in done]
            nxt = self.cluster.next_end()
            if math.isfinite(nxt) and self._idle():
                self.clock.advance_to(min(nxt, self._timer(now)))
                self.skips += 1
                continue
            left = deadline - time.perf_counter()
            if left <= 0:
                return [], list(refs)
            # the actor computes: sleep as Ray's wait blocks, until the next end or the timeout (a shorter
            # poll would take the interpreter from the planner threads hundreds of times a second)
            time.sleep(max(0.0, min(left, nxt - now)))

    def _idle(self) -> bool:
        """Whether no thread of the actor has work before the next result: no queued trial waits for a free
        slot (the real loop would dispatch it when its wait ends), the log's writer holds no result still to
        be told, and neither planner thread is at work."""
        sched = self.scheduler
        with sched.lock:
            fillable = (bool(sched.queue) and sched.free_slots() > 0
                        and sched.n_done + len(sched.inflight) < sched.budget)
            writing = bool(self.arrived)
        return not fillable and not writing and self.watch.idle()

    def _timer(self, now: float) -> float:
        """The refit thread's next timed check: when its least interval between refits is over."""
        due = self.planner.last_fit_end + self.planner.refit_interval_s
        return due if due > now else math.inf
