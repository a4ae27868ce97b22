"""The slot scheduler: which proposed trial runs next, and how much of the budget is spoken for.

ARCHITECTURE.md "The path of one evaluation", steps 4-5. A plain class, without Ray: the central actor's
dispatcher (`dispatch.py`) takes the trials that fill the free slots from its queue and hands their
evaluations' refs back, and the planner (`planner.py`) asks it whether the queue is low (`low_water`) and
reserves its share of the budget before it proposes. A trial is queued, then being submitted, then in flight,
then done (or back at the front of the queue when its evaluation will never report); in every one of these
states, and while it is being proposed, it counts against the budget (`remaining`), so two proposers together
never pass it.
"""

from __future__ import annotations

import collections
import math
import threading
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from workers.records import TrialResult

__all__ = ["SlotScheduler"]


class _Trial(Protocol):
    """What the scheduler reads of a trial (orchestrator/ask_tell.py `Trial`)."""

    trial_id: str


class SlotScheduler:
    """The queue of proposed trials, the evaluations in flight and the budget count of one session.

    Args:
        max_concurrent: evaluations in flight at most (the run's slots).
        budget: results the run ends with, those replayed from the log included.
        queue_low: the least low-water mark (`low_water`).
        batch_size: the config's batch size; the low-water mark stays below four batches (or four times the
            slots).

    Its state is public for the actor and its parts, to be read and changed under `lock`: `queue` (trials in
    proposal order, first out first), `inflight` (ref -> (trial, dispatch time, attempt)), `attempts` (trial
    id -> attempts started), `submitting` (trials taken from the queue whose submission has not returned),
    `reserved` (trials being proposed now: asked for, not yet queued) with `reserved_sobol` of them Sobol
    points, and the results counted (`n_completed`, `n_failed`).
    """

    def __init__(self, max_concurrent: int, budget: int, queue_low: int, batch_size: int) -> None:
        self.max_concurrent = max_concurrent
        self.budget = budget
        self.queue_low = queue_low
        self.batch_size = batch_size
        # queue, in-flight table, counters; re-entrant: the actor holds it also while it tells results, so a
        # budget count sees each result either in flight or done, never both or neither
        self.lock = threading.RLock()
        self.queue: collections.deque[_Trial] = collections.deque()
        self.inflight: dict[Any, tuple[_Trial, float, int]] = {}
        self.attempts: dict[str, int] = {}
        self.submitting = 0
        self.reserved = 0
        self.reserved_sobol = 0
        self.n_completed = 0
        self.n_failed = 0
        self.n_done_session = 0  # results counted in this session (not replayed)
        self.busy_s = 0.0  # evaluation time of results counted in this session
        self.first_dispatch: float | None = None
        self.prop_ema: float | None = None  # moving average of model-based proposal seconds
        self.eval_ema: float | None = None  # moving average of evaluation seconds

    @property
    def n_done(self) -> int:
        return self.n_completed + self.n_failed

    # ------------------------------------------------------------------ the budget and the queue's level
    def remaining(self) -> int:
        """Budget not yet spoken for: done, in flight, being submitted, queued, or being proposed right now
        (`reserved`)."""
        with self.lock:
            return (self.budget - self.n_done - len(self.inflight) - len(self.queue) - self.submitting
                    - self.reserved)

    def queued(self) -> int:
        """Trials queued or being submitted: the latter count as queued, else a proposer would see an empty
        queue while a restarting pool holds a submission up, and propose a batch more than the queue needs."""
        with self.lock:
            return len(self.queue) + self.submitting

    def free_slots(self) -> int:
        """Slots without an evaluation in flight."""
        with self.lock:
            return self.max_concurrent - len(self.inflight)

    def low_water(self) -> int:
        """Queue length below which the next batch is proposed: at least `queue_low`, and enough points to
        keep every slot busy for 1.5 times the recent proposal time (measured: moving averages of proposal
        and evaluation times), so the queue does not run dry while a proposal is computed."""
        low = self.queue_low
        if self.prop_ema is not None and self.eval_ema:
            low = max(low, math.ceil(1.5 * self.max_concurrent * self.prop_ema / self.eval_ema))
        return min(low, 4 * max(self.batch_size, self.max_concurrent))

    def record_proposal(self, seconds: float) -> None:
        """A model-based proposal took `seconds` (the low-water mark follows its moving average)."""
        self.prop_ema = seconds if self.prop_ema is None else 0.7 * self.prop_ema + 0.3 * seconds

    # ------------------------------------------------------------------ reservations (proposals under way)
    def reserve(self, q: int, sobol: bool) -> None:
        """`q` trials are being proposed (`sobol`: as Sobol points): spoken for until `release`. The caller
        holds `lock` from its `remaining` check to here, so that two proposers together never pass the
        budget."""
        with self.lock:
            self.reserved += q
            self.reserved_sobol += q if sobol else 0

    def release(self, q: int, sobol: bool, trials: Iterable[_Trial]) -> None:
        """The proposal of `reserve(q, sobol)` is over: its `trials` (none when it failed) join the queue."""
        with self.lock:
            self.queue.extend(trials)
            self.reserved -= q
            self.reserved_sobol -= q if sobol else 0

    # ------------------------------------------------------------------ dispatch
    def take(self, freed: int = 0) -> list[tuple[_Trial, int]]:
        """The queued trials that fill the free slots, first in first out, each with its attempt number (its
        attempts so far); they count as being submitted until `started` or `put_back`. `freed`: evaluations in
        flight whose results have arrived but are not yet logged (their slots are refilled before the durable
        write; they still count against the budget until they are told)."""
        with self.lock:
            batch: list[tuple[_Trial, int]] = []
            while (self.queue and len(self.inflight) - freed + len(batch) < self.max_concurrent
                   and self.n_done + len(self.inflight) + len(batch) < self.budget):
                trial = self.queue.popleft()
                attempt = self.attempts.get(trial.trial_id, 0)
                self.attempts[trial.trial_id] = attempt + 1
                batch.append((trial, attempt))
            self.submitting = len(batch)
            return batch

    def put_back(self, batch: list[tuple[_Trial, int]]) -> None:
        """A submission of `take`'s `batch` failed: its trials go back to the front of the queue, in order."""
        with self.lock:
            self.queue.extendleft(t for t, _ in reversed(batch))
            self.submitting = 0

    def started(self, batch: list[tuple[_Trial, int]], refs: list[Any], now: float) -> None:
        """`take`'s `batch` was submitted at `now`: its evaluations are in flight under `refs` (in order)."""
        with self.lock:
            self.submitting = 0
            if self.first_dispatch is None:
                self.first_dispatch = now
            for (trial, attempt), ref in zip(batch, refs):
                self.inflight[ref] = (trial, now, attempt)

    def saw_attempt(self, trial_id: str, attempt: int) -> None:
        """Attempt `attempt` of `trial_id` started (a replayed "started" record, an adopted evaluation): the
        next one is numbered after it."""
        with self.lock:
            self.attempts[trial_id] = max(self.attempts.get(trial_id, 0), attempt + 1)

    def adopt(self, held: Mapping[str, tuple[Any, int, float]]) -> int:
        """After a restart: the queued trials whose evaluations the pool still holds (`held`: trial id ->
        (ref, attempt, submission time)) are in flight again instead of queued. Returns how many."""
        with self.lock:
            adopted = 0
            keep: collections.deque[_Trial] = collections.deque()
            for trial in self.queue:
                if trial.trial_id in held:
                    ref, attempt, submitted = held[trial.trial_id]
                    self.inflight[ref] = (trial, submitted, attempt)
                    self.saw_attempt(trial.trial_id, attempt)
                    adopted += 1
                else:
                    keep.append(trial)
            self.queue = keep
            return adopted

    # ------------------------------------------------------------------ results
    def free(self, ref: Any) -> tuple[_Trial, float, int]:
        """The evaluation `ref` ended (its result is told, or it was told before): its slot is free. Returns
        its (trial, dispatch time, attempt)."""
        with self.lock:
            return self.inflight.pop(ref)

    def requeue(self, ref: Any) -> None:
        """The evaluation `ref` will never report (the process that owned its task died): its slot is free and
        its trial goes to the front of the queue, to run again."""
        with self.lock:
            trial, _, _ = self.inflight.pop(ref)
            self.queue.appendleft(trial)

    def count(self, result: TrialResult) -> None:
        """A result told (its `status`, `error`, `started_at` and `ended_at`): done, completed or failed, and
        its evaluation time is busy slot time, but for a lost worker's (its times are the dispatch's and the
        loss's)."""
        with self.lock:
            if result.status == "completed":
                self.n_completed += 1
            else:
                self.n_failed += 1
            self.n_done_session += 1
            started_at, ended_at = result.started_at, result.ended_at
            if result.error != "worker-lost" and started_at is not None and ended_at is not None:
                dt = max(0.0, ended_at - started_at)
                self.busy_s += dt
                self.eval_ema = dt if self.eval_ema is None else 0.95 * self.eval_ema + 0.05 * dt
