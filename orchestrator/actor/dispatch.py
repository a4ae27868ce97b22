"""The central actor's evaluation pipeline on Ray: submit queued trials, collect their results, log, then tell.

ARCHITECTURE.md "The path of one evaluation", steps 3-4. The `Dispatcher` keeps the free slots busy, each
evaluation a Ray task (workers/evaluate.py), and waits for results one at a time (``ray.wait(num_returns=1)``,
plus any others already done, fetched in one ``ray.get``): it hands each freed slot the next point of the
queue at once, writes the results durably to the event log (one append, while the pool answers the
submission) and only then tells the optimizer (exactly once per trial id). Which trials run
and the budget count are the `SlotScheduler`'s (`scheduler.py`); this module adds Ray.

The evaluation tasks are submitted through the run's `EvaluationPool` (workers/pool.py), which the driver
creates: a Ray task fate-shares with the process that submitted it, so tasks owned by this actor would die
with it. An evaluation whose worker is frozen and cannot enforce its own timeout is cancelled at a deadline and
recorded as a failed 'timeout' trial (`backstop.py`).
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any, Callable

from orchestrator.actor.backstop import Backstop, timeout_record
from orchestrator.actor.guard import AbortCause, FailureGuard
from orchestrator.actor.log import RunLog
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
        self.unreleased: list[str] = []  # trial ids logged, not yet released in the pool (`release`)

    # ------------------------------------------------------------------ dispatch
    def dispatch(self, freed: int = 0, meanwhile: Callable[[], None] | None = None) -> None:
        """Start queued trials in the free slots. `freed`: in-flight evaluations whose results have arrived
        but are not yet logged (`collect` refills their slots before the durable write; they still count
        against the budget until they are told). `meanwhile`: called once while the pool answers (`collect`
        writes the results then, so the write and the pool's round trip overlap); its error is raised after
        the submission is recorded."""
        with self.lock:
            self._dispatch_locked(freed, meanwhile)
        if len(self.scheduler.queue) < self.scheduler.low_water() and not self.stop.is_set():
            self.wake()

    def _dispatch_locked(self, freed: int, meanwhile: Callable[[], None] | None = None) -> None:
        """`dispatch`'s work, under `lock`: a stop (`CentralActor.stop`) is seen here or waits until it returns."""
        # an aborting run starts nothing new (its evaluations in flight are drained); nor does a stopped one
        batch = [] if self.abort.message or self.stop.is_set() else self.scheduler.take(freed)
        # (still spoken for, `SlotScheduler.remaining`, while submitted)
        sent: Any = None
        if batch:
            # outside the lock: a restarting pool may take up to a minute to answer, and status(), the planners'
            # budget checks and their log appends would wait that long on the lock
            try:
                sent = self.send(batch)
            except Exception as exc:  # put the trials back: they stay logged as proposed, never lost
                self._refused(batch, exc)
                batch = []
        error = None
        if meanwhile is not None:
            try:
                meanwhile()
            except Exception as exc:  # noqa: BLE001 -- raised once the submission is recorded
                error = exc
        if batch:
            try:
                refs = sent if isinstance(sent, list) else self._answer(sent)
            except Exception as exc:
                self._refused(batch, exc)
            else:
                now = time.time()
                with self.scheduler.lock:
                    self.scheduler.started(batch, refs, now)
                    self.log.started.extend(self.log.event("started", trial, time=now, attempt=attempt)
                                            for (trial, attempt), _ in zip(batch, refs))
        if error is not None:
            raise error

    def _refused(self, batch: list[tuple[Trial, int]], exc: Exception) -> None:
        """The submission of `batch` failed: its trials go back to the queue; a refusal that is not transient
        stops the run, a transient one (the pool is restarting) is tried again on the next pass."""
        self.scheduler.put_back(batch)
        if not is_transient(exc):  # a submission Ray refuses would be refused forever
            self.abort.set(f"evaluations cannot be submitted: {type(exc).__name__}: {exc}")
            return
        time.sleep(0.2)

    def submit(self, batch: list[tuple[Trial, int]]) -> list[Any]:
        """Start the evaluations of `batch` ((trial, attempt) pairs); returns their refs in order."""
        if self.pool is None:
            return [
                submit_evaluation(
                    self.objective_spec, t.trial_id, t.params, t.seed, resources=self.resources,
                    timeout_s=self.cfg.timeout_s, max_retries=self.cfg.max_retries, isolate=self.isolate,
                )
                for t, _ in batch
            ]
        return self._answer(self.send(batch))

    def send(self, batch: list[tuple[Trial, int]]) -> Any:
        """Start submitting `batch`: its refs (a list) without a pool (`submit`), else the pool's pending
        answer (`_answer` waits for it). The logged results not yet released in the pool go with it."""
        if self.pool is None:
            return self.submit(batch)
        items = [(t.trial_id, attempt, dict(t.params), int(t.seed)) for t, attempt in batch]
        release, self.unreleased = self.unreleased, []  # logged results: the pool forgets them in this call
        return release, self.pool.submit.remote(items, release)

    def _answer(self, sent: tuple[list[str], Any]) -> list[Any]:
        """The refs of a submission `send` started, once the pool has answered (at most a minute)."""
        import ray

        release, answer = sent
        try:
            return ray.get(answer, timeout=60)
        except Exception:
            self.unreleased = release + self.unreleased  # released again with the next one
            raise

    def release(self, trial_ids: list[str]) -> None:
        """The pool may forget the results of `trial_ids` (durably logged): they go with the next submission,
        one call for both, or at once when none is coming (the queue is empty) or a slots' worth waits."""
        self.unreleased.extend(trial_ids)
        sched = self.scheduler
        if self.unreleased and (not sched.queue or len(self.unreleased) >= sched.max_concurrent):
            release, self.unreleased = self.unreleased, []
            self.pool.release.remote(release)

    # ------------------------------------------------------------------ results
    def collect(self, timeout: float) -> None:
        """Wait up to `timeout` seconds for results; refill the freed slots, log the results, then tell them."""
        import ray

        sched = self.scheduler
        refs = list(sched.inflight)
        ready, rest = ray.wait(refs, num_returns=1, timeout=timeout)
        if ready and rest:
            more, rest = ray.wait(rest, num_returns=len(rest), timeout=0)
            ready = ready + more
        expired = self.backstop.expired(rest, sched.inflight)
        if not ready and not expired:
            return
        results = []
        orphaned = []
        for ref, started in expired.items():
            trial, _, attempt = sched.inflight[ref]
            results.append((ref, trial, attempt, timeout_record(trial, started, self.cfg.timeout_s)))
        got = _get_all(ready)
        for ref in ready:
            trial, dispatched, attempt = sched.inflight[ref]
            try:
                rec = got[ref] if ref in got else ray.get(ref)
            except ray.exceptions.OwnerDiedError:  # the pool died and its tasks with it: never recorded, run again
                orphaned.append((ref, trial))
                continue
            except Exception as exc:  # the worker or node died and Ray's retries ran out, or a bug
                rec = lost_record(trial, exc, dispatched)
            results.append((ref, trial, attempt, rec))
        if orphaned:
            with sched.lock:
                for ref, trial in orphaned:
                    if self.opt.is_told(trial.trial_id):
                        sched.free(ref)
                    else:
                        sched.requeue(ref)
        # refill the freed slots first: the next evaluations need neither the write nor the tell below; unless
        # these results trip the failure guard (the run stops: nothing new may start)
        new = {trial.trial_id: rec for _, trial, _, rec in results if not self.opt.is_told(trial.trial_id)}
        # exactly once by trial id
        events = [self.log.result_event(trial, rec, attempt, self.session)
                  for _, trial, attempt, rec in results if not self.opt.is_told(trial.trial_id)]
        if not self.guard.trips(sched.n_done + len(new),
                                sched.n_failed + sum(rec.status != "completed" for rec in new.values())):
            # durable before anything is acknowledged; written while the pool answers the submission
            self.dispatch(freed=len(results), meanwhile=lambda: self.log.append(events))
        else:
            self.log.append(events)  # durable before anything is acknowledged
        if self.pool is not None and results:
            self.release([trial.trial_id for _, trial, _, _ in results])
        with sched.lock:
            for ref, trial, _, rec in results:
                sched.free(ref)
                if self.opt.is_told(trial.trial_id):
                    self.duplicates += 1
                    continue
                if rec.status == "completed":
                    self.opt.tell(trial.trial_id, rec.value)
                else:
                    self.opt.tell(trial.trial_id, None, error=rec.error or "exception", message=rec.message)
                sched.count(rec)
            self.guard.check()
        self.wake()

    def drain(self, limit_s: float) -> None:
        """After an abort: log the results of the evaluations in flight as they finish, for up to `limit_s`
        seconds, starting nothing new (`dispatch` refuses once the abort is set). A result that is finished is
        never dropped; an evaluation still running after the limit stays "started" and a resume runs it again."""
        deadline = time.time() + limit_s
        while self.scheduler.inflight and (left := deadline - time.time()) > 0:
            self.collect(min(left, 1.0))
        if self.scheduler.inflight:
            self.abort.message += (f"; {len(self.scheduler.inflight)} evaluations still running after {limit_s:g} s "
                                   "were left unrecorded (`qbatch resume` runs them again)")


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
