"""The central actor's evaluation pipeline on Ray: submit queued trials, collect results, log, then tell.

ARCHITECTURE.md "The path of one evaluation", steps 3-4. The `Dispatcher` keeps the free slots busy, each
evaluation a Ray task (workers/evaluate.py), and waits for results one at a time (``ray.wait(num_returns=1)``,
plus any others already done, fetched in one ``ray.get``): it hands each freed slot the next point of the
queue at once, then hands the results to the log's writer thread (`log.py`), which writes everything that
arrived since its last write with one fsync and only then tells the optimizer (exactly once per trial id);
meanwhile the loop goes on collecting. Which trials run and the budget count are the `SlotScheduler`'s
(`scheduler.py`); this module adds Ray.

The evaluation tasks are submitted through the run's `EvaluationPool` (workers/pool.py), which the driver
creates: a Ray task fate-shares with the process that submitted it, so tasks owned by this actor would die
with it. An evaluation whose worker is frozen and cannot enforce its own timeout is cancelled at a deadline
and recorded as a failed 'timeout' trial (`backstop.py`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from orchestrator.actor.backstop import Backstop, timeout_record
from orchestrator.actor.guard import AbortCause, FailureGuard
from orchestrator.actor.log import LogWriteError, RunLog
from orchestrator.actor.scheduler import SlotScheduler
from workers.evaluate import submit_evaluation
from workers.records import TrialResult

if TYPE_CHECKING:
    from orchestrator.ask_tell import AskTellOptimizer, Trial

__all__ = ["Dispatcher", "is_transient", "lost_record"]


class Dispatcher:
    """Starts the evaluations of queued trials and ingests their results.

    Args:
        scheduler: the session's `SlotScheduler`.
        log: the run's event log: "started" records are buffered, results written before they are told.
        opt: the run's `AskTellOptimizer` (results are told to it).
        guard: the failure guard, checked as results come in.
        abort: the run's `AbortCause`: an aborting run starts nothing new.
        stop: set when the run stops: nothing new is dispatched.
        wake: wakes the planner threads (the queue runs low, results came in).
        cfg: the run's `ExperimentConfig` (`timeout_s`, `max_retries`).
        pool: the run's `EvaluationPool` actor, or None: the evaluations are this actor's own Ray tasks.
        objective_spec: (name, options) of the objective, for tasks submitted without a pool.
        resources: the objective's `Resources`, for tasks submitted without a pool.
        isolate: how a worker runs the objective ("process" or "thread", workers/evaluate.py).
        session: when this session started (its result records say so).
    """

    def __init__(self, scheduler: SlotScheduler, log: RunLog, opt: AskTellOptimizer, guard: FailureGuard,
                 abort: AbortCause, stop: threading.Event, wake: Callable[[], None], *, cfg: Any, pool: Any,
                 objective_spec: Any, resources: Any, isolate: str, session: float) -> None:
        self.scheduler = scheduler
        self.log = log
        self.opt = opt
        self.guard = guard
        self.abort = abort
        self.stop = stop
        self.wake = wake
        self.cfg = cfg
        self.pool = pool
        self.objective_spec = objective_spec
        self.resources = resources
        self.isolate = isolate
        self.session = session
        self.backstop = Backstop(pool, cfg.timeout_s, cfg.max_retries)
        self.lock = threading.Lock()  # held from the stop check in `dispatch` until its submission returns
        self.duplicates = 0  # results of trials told already, ignored
        self.clock = time.time  # dispatch times (a simulated cluster's virtual clock, orchestrator/sim)
        self.unreleased: list[str] = []  # trial ids logged, not yet released in the pool (`release`)
        self.release_lock = threading.Lock()  # `unreleased` is extended by the log's writer thread
        # results handed to the log's writer, not yet acknowledged (under the scheduler's lock): their refs
        # (still in flight for the budget, never waited on again) and their trial ids (told, for exactly once)
        self.arrived: set[Any] = set()
        self.arriving: set[str] = set()
        self.arriving_failed = 0

    # ------------------------------------------------------------------ dispatch
    def dispatch(self, freed: int | None = None) -> None:
        """Start queued trials in the free slots. `freed`: in-flight evaluations whose results have arrived
        but are not yet logged (`collect` refills their slots before the durable write; they still count
        against the budget until they are told); None: those `collect` handed to the log's writer."""
        with self.lock:
            self._dispatch_locked(len(self.arrived) if freed is None else freed)
        if len(self.scheduler.queue) < self.scheduler.low_water() and not self.stop.is_set():
            self.wake()

    def _dispatch_locked(self, freed: int) -> None:
        """`dispatch`'s work, under `lock`: a stop (`CentralActor.stop`) is seen here or waits for it."""
        # an aborting run starts nothing new (its evaluations in flight are drained); nor does a stopped one
        if self.abort.message or self.stop.is_set():
            return
        batch = self.scheduler.take(freed)  # still spoken for (`SlotScheduler.remaining`) while submitted
        if batch:
            # outside the lock: a restarting pool may take up to a minute to answer, and status(), the
            # planners' budget checks and their log appends would wait that long on the lock
            try:
                refs = self.submit(batch)
            except Exception as exc:  # put the trials back: they stay logged as proposed, never lost
                self.scheduler.put_back(batch)
                if not is_transient(exc):  # a submission Ray refuses would be refused forever
                    self.abort.set(f"evaluations cannot be submitted: {type(exc).__name__}: {exc}")
                    return
                time.sleep(0.2)  # the pool is restarting: try again on the next pass
                return
            now = self.clock()
            with self.scheduler.lock:
                self.scheduler.started(batch, refs, now)
                self.log.started.extend(self.log.event("started", trial, time=now, attempt=attempt)
                                        for (trial, attempt), _ in zip(batch, refs))

    def submit(self, batch: list[tuple[Trial, int]]) -> list[Any]:
        """Start the evaluations of `batch` ((trial, attempt) pairs); returns their refs in order. The logged
        results not yet released in the pool go with it (`release`)."""
        if self.pool is None:
            return [
                submit_evaluation(
                    self.objective_spec, t.trial_id, t.params, t.seed, resources=self.resources,
                    timeout_s=self.cfg.timeout_s, max_retries=self.cfg.max_retries, isolate=self.isolate,
                )
                for t, _ in batch
            ]
        import ray

        items = [(t.trial_id, attempt, dict(t.params), int(t.seed)) for t, attempt in batch]
        with self.release_lock:  # logged results: the pool forgets them in this call
            release, self.unreleased = self.unreleased, []
        try:
            return ray.get(self.pool.submit.remote(items, release), timeout=60)
        except Exception:
            with self.release_lock:  # released again with the next one
                self.unreleased[:0] = release
            raise

    def release(self, trial_ids: list[str]) -> None:
        """The pool may forget the results of `trial_ids` (durably logged): they go with the next submission,
        one call for both, or at once when none is coming (the queue is empty) or a slots' worth waits."""
        sched = self.scheduler
        with self.release_lock:
            self.unreleased.extend(trial_ids)
            if not self.unreleased or (sched.queue and len(self.unreleased) < sched.max_concurrent):
                return
            release, self.unreleased = self.unreleased, []
        self.pool.release.remote(release)

    # ------------------------------------------------------------------ results
    def collect(self, timeout: float) -> None:
        """Wait up to `timeout` seconds for results; refill the freed slots and hand the results to the log's
        writer thread, which tells them once they are durable (`_acknowledge`).

        Raises:
            LogWriteError: a write of the log failed (the abort says why); nothing more is recorded.
        """
        sched = self.scheduler
        if self.log.failed:
            raise LogWriteError(self.abort.message or "the run log cannot be written")
        with sched.lock:
            refs = [r for r in sched.inflight if r not in self.arrived]
        if not refs:  # every result in flight is being written: wait for the writer
            self.log.wait_written(timeout)
            return
        ready, rest = self.wait(refs, timeout)
        expired = self.backstop.expired(rest, sched.inflight)
        if not ready and not expired:
            return
        results = []
        orphaned = []
        for ref, started in expired.items():
            trial, _, attempt = sched.inflight[ref]
            results.append((ref, trial, attempt, timeout_record(trial, started, self.cfg.timeout_s)))
        got = self.fetch_many(ready)
        for ref in ready:
            trial, dispatched, attempt = sched.inflight[ref]
            rec = got[ref] if ref in got else self.fetch(ref, trial, dispatched)
            if rec is None:  # never recorded: run again
                orphaned.append((ref, trial))
                continue
            results.append((ref, trial, attempt, rec))
        with sched.lock:
            for ref, trial in orphaned:
                if self._told(trial.trial_id):
                    sched.free(ref)
                else:
                    sched.requeue(ref)
            # exactly once by trial id
            new = {}
            for _, trial, _, rec in results:
                if not self._told(trial.trial_id) and trial.trial_id not in new:
                    new[trial.trial_id] = rec
            events = [self.log.result_event(trial, rec, attempt, self.session)
                      for _, trial, attempt, rec in results if new.get(trial.trial_id) is rec]
            failed = sum(rec.status != "completed" for rec in new.values())
            trips = self.guard.trips(sched.n_done + len(self.arriving) + len(new),
                                     sched.n_failed + self.arriving_failed + failed)
            self.arrived.update(ref for ref, _, _, _ in results)
            self.arriving.update(new)
            self.arriving_failed += failed
        # refill the freed slots first: the next evaluations need neither the write nor the tell; unless these
        # results trip the failure guard (the run stops: nothing new may start)
        if not trips:
            self.dispatch()
        # durable before anything is acknowledged: the writer tells them after the fsync that holds them
        self.log.append_async(events, lambda: self._acknowledge(results, new))

    def _told(self, trial_id: str) -> bool:
        """Whether `trial_id`'s result is told or on its way to be (under the scheduler's lock)."""
        return trial_id in self.arriving or self.opt.is_told(trial_id)

    def _acknowledge(self, results: list[tuple[Any, Trial, int, TrialResult]],
                     new: dict[str, TrialResult]) -> None:
        """In the log's writer thread, once `results` are durable: release them in the pool, free their slots,
        tell the optimizer the `new` ones (exactly once) and count them."""
        sched = self.scheduler
        if self.pool is not None and results:
            self.release([trial.trial_id for _, trial, _, _ in results])
        with sched.lock:
            for ref, trial, _, rec in results:
                sched.free(ref)
                self.arrived.discard(ref)
                if new.get(trial.trial_id) is not rec:
                    self.duplicates += 1
                    continue
                self.arriving.discard(trial.trial_id)
                self.arriving_failed -= rec.status != "completed"
                if rec.status == "completed":
                    self.opt.tell(trial.trial_id, rec.value)
                else:
                    self.opt.tell(trial.trial_id, None, error=rec.error or "exception", message=rec.message)
                sched.count(rec)
            self.guard.check()
        self.wake()

    def wait(self, refs: list[Any], timeout: float) -> tuple[list[Any], list[Any]]:
        """(ready, rest) of the in-flight `refs`: waits up to `timeout` seconds for one result, then takes
        every other one that is done too."""
        import ray

        ready, rest = ray.wait(refs, num_returns=1, timeout=timeout)
        if ready and rest:
            more, rest = ray.wait(rest, num_returns=len(rest), timeout=0)
            ready = ready + more
        return ready, rest

    def fetch_many(self, refs: list[Any]) -> dict[Any, TrialResult]:
        """The records of the finished evaluations `refs` in one fetch for all; those it leaves out are got
        one by one (`fetch`)."""
        return _get_all(refs)

    def fetch(self, ref: Any, trial: Trial, dispatched: float) -> TrialResult | None:
        """The result of the finished evaluation `ref` of `trial` (dispatched at `dispatched`): its record, a
        failed one when its Ray task failed, or None when the pool died and its tasks with it."""
        import ray

        try:
            return ray.get(ref)
        except ray.exceptions.OwnerDiedError:
            return None
        except Exception as exc:  # the worker or node died and Ray's retries ran out, or a bug
            return lost_record(trial, exc, dispatched)

    def settle(self, timeout: float | None = None) -> bool:
        """Wait until every result handed to the log's writer is written and told (or a write failed), up to
        `timeout` seconds; returns whether it is."""
        return self.log.wait_written(timeout)

    def drain(self, limit_s: float) -> None:
        """After an abort: log the results of the evaluations in flight as they finish, for up to `limit_s`
        seconds, starting nothing new (`dispatch` refuses once the abort is set). A result that is finished is
        never dropped; an evaluation still running after the limit stays "started" and a resume runs it again.
        """
        deadline = time.time() + limit_s
        while self.scheduler.inflight and (left := deadline - time.time()) > 0:
            self.collect(min(left, 1.0))
        if self.scheduler.inflight:
            running = len(self.scheduler.inflight)
            self.abort.message += (f"; {running} evaluations still running after {limit_s:g} s were left "
                                   "unrecorded (`qbatch resume` runs them again)")


def _get_all(refs: list[Any]) -> dict[Any, Any]:
    """The values of finished `refs` in one `ray.get` (one fetch for all); {} when one of them raises, and
    then each is got on its own (the caller tells a failed task's error from the others')."""
    import ray

    if len(refs) < 2:
        return {}
    try:
        return dict(zip(refs, ray.get(refs, timeout=60)))
    except Exception:  # noqa: BLE001 -- a task's error, or the owner's death: each ref is got alone
        return {}


def is_transient(exc: BaseException) -> bool:
    """Whether a failed submission may succeed later: the evaluation pool is restarting or slow to answer."""
    import ray

    # ActorUnavailableError (a moment of unreachability) is a RayActorError
    return isinstance(exc, (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError))


def lost_record(trial: Trial, exc: BaseException, dispatched: float) -> TrialResult:
    """A failed result for an evaluation whose Ray task itself failed (worker/node lost after retries)."""
    import ray

    reason = "exception" if isinstance(exc, ray.exceptions.RayTaskError) else "worker-lost"
    return TrialResult.failure(reason, f"{type(exc).__name__}", f"{type(exc).__name__}: {exc}", dispatched,
                               time.time(), trial_id=trial.trial_id)
