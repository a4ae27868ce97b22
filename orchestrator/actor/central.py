"""The central Ray actor: the facade that owns a run's state and drives its loop, handing work to its parts.

ARCHITECTURE.md "The path of one evaluation", steps 2-6. One `CentralActor` owns the run's `AskTellOptimizer`
(observations, model, calibrator, proposer) and its `RunStore`, and wires the parts of the package to them:
the `SlotScheduler` (queue, slots, budget), the `Dispatcher` (Ray tasks in, results out), the `Planner`
(proposals and refits), the event log, the checkpoints and the failure guard. Its `run()` method is the
dispatch loop, in the actor's main worker thread: it keeps `max_concurrent` evaluations in flight and collects
their results, while the planner's two background threads keep the queue ahead of the slots and the model
fresh (or, with ``synchronous: true``, the loop itself runs the papers' protocol: propose B, evaluate all B,
refit, repeat).

The actor rebuilds itself from the log when created on an existing run directory (resume, or a restart after a
crash, `replay.py`), and restores its model and calibrator from their checkpoints (`checkpoints.py`). What it
has to tell the user, its own lines and the Python warnings of its process, the driver takes with `notices`.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import warnings
from typing import Any

from orchestrator.actor.checkpoints import Checkpoints
from orchestrator.actor.dispatch import Dispatcher
from orchestrator.actor.guard import AbortCause, FailureGuard
from orchestrator.actor.log import LogWriteError, RunLog
from orchestrator.actor.notices import Notices, in_ray_actor
from orchestrator.actor.planner import Planner
from orchestrator.actor.replay import replay_log
from orchestrator.actor.resources import default_max_concurrent
from orchestrator.actor.scheduler import SlotScheduler
from orchestrator.ask_tell import AskTellOptimizer
from orchestrator.errors import QbatchError
from workers.pool import exit_with_node

__all__ = ["CentralActor"]

#: seconds the dispatch loop waits for a result before it looks at the queue again
_WAIT_S = 0.05
#: seconds `CentralActor.stop` waits for a submission under way (a restarting pool may hold one a minute)
_STOP_WAIT_S = 10.0
#: the actor process's GIL switch interval while the planner threads run (Python's default: 5 ms)
_SWITCH_INTERVAL_S = 0.0005
#: buffered "started" events are flushed at least this often (they ride along with result writes otherwise)
_FLUSH_S = 1.0
#: when a run aborts (failure guard, refit failures, planner error), how long the evaluations still in flight
#: may take to finish and be logged; any still running then stay "started" in the log and a resume runs them
_ABORT_DRAIN_S = 60.0


def _node_id() -> str | None:
    """The Ray node this process runs on (None outside a Ray worker)."""
    import ray

    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else None


class CentralActor:
    """The run's brain; create it with `ray.remote(CentralActor).options(max_concurrency>=3, num_cpus=0)`.

    Args:
        run_dir: an existing run directory (`RunStore.create` made it); its log is replayed.
        max_concurrent: evaluations in flight; None = what the cluster allows for the objective's request.
        queue_low: propose the next batch when fewer points than this are queued (default
            `max(max_concurrent, batch_size // 2)`).
        refit_interval_s: least time between two background refits (leaves CPU to the evaluations).
        isolate: how a worker runs the objective ("process" or "thread", workers/evaluate.py).
        pool: the run's `EvaluationPool` actor (workers/pool.py), created by the driver: it owns the
            evaluation tasks so they survive a restart of this actor. Its `(namespace, name)`, looked up at
            each (re)start (the driver passes this: Ray keeps an actor handle passed as a constructor argument
            in the object store, from where it cannot always restore it for a restarted actor,
            ray-project/ray#53727, and warns so at every run), or its handle. None: this actor submits the
            evaluations itself (they then die with it).
        max_refit_failures: a refit that raises is logged (a "refit" event with ``failed: true``, the error
            and its traceback) and the run goes on with the previous model, or with further Sobol points
            before the first one; it is retried once new results are in. This many failures in a row stop
            the run (status "aborted", every result kept): the cause is then more likely a bug than data.

    Its parts, which share the optimizer, the scheduler's lock, the stop event and the abort cause:
    `scheduler` (`SlotScheduler`), `dispatcher` (`Dispatcher`), `planner` (`Planner`), `log` (`RunLog`),
    `checkpoints` (`Checkpoints`), `guard` (`FailureGuard`) and `abort` (`AbortCause`).
    """

    def __init__(
        self,
        run_dir: str,
        max_concurrent: int | None = None,
        queue_low: int | None = None,
        refit_interval_s: float = 0.5,
        isolate: str = "process",
        pool: Any = None,
        max_refit_failures: int = 5,
    ) -> None:
        from objectives.base import Objective
        from objectives.registry import inspect_objective
        from orchestrator.config import load_config
        from orchestrator.store import RunStore

        if (isinstance(max_refit_failures, bool) or not isinstance(max_refit_failures, int)
                or max_refit_failures < 1):
            raise QbatchError(f"max_refit_failures must be an integer >= 1; got {max_refit_failures!r}")
        # first of all: the warnings of building the objective and of replaying the log reach the driver too
        self._notices = Notices(forward=in_ray_actor())
        if self._notices.forward:  # this process is the actor's own: its warnings all go to the driver
            warnings.showwarning = self._notices.show_warning
        # a killed driver's local Ray: free the writer lock at once, not in a minute
        exit_with_node("central actor")
        self.store = RunStore.open(run_dir)
        self.store.lock_writer()  # one writer per log: a second resume of a running run stops here
        self.run_dir = run_dir
        self.cfg = load_config(self.store.config)
        cfg = self.cfg
        objective: Objective = inspect_objective(cfg.objective.name, dict(cfg.objective.options))
        self.objective_spec = (cfg.objective.name, dict(cfg.objective.options))
        self.resources = objective.resources
        self.opt = AskTellOptimizer.from_config(cfg, objective)
        self.direction = self.opt.direction
        self.opt.prepare()
        if max_concurrent is None:
            max_concurrent = cfg.max_concurrent or default_max_concurrent(self.resources)
        max_concurrent = int(max_concurrent)
        queue_low = int(queue_low) if queue_low is not None else max(max_concurrent, cfg.batch_size // 2)
        self.isolate = isolate
        if isinstance(pool, tuple):  # (namespace, name): looked up by every (re)start of this actor
            import ray

            pool = ray.get_actor(pool[1], namespace=pool[0])
        self.pool = pool
        self.budget = cfg.budget

        self._stop = threading.Event()
        self._run_lock = threading.Lock()  # held by the one running `run` loop
        self._finished = threading.Event()  # the loop has ended; `_final` is its summary
        self._final_fit = False  # the final fit runs (`status` says so: the progress bar shows it)
        self._final: dict[str, Any] = {}
        self.abort = AbortCause()
        self.scheduler = SlotScheduler(max_concurrent, cfg.budget, queue_low, cfg.batch_size)
        self.log = RunLog(self.store, run_dir, self.scheduler.lock, self.abort,
                          on_failure=self._wake_planners)
        self.checkpoints = Checkpoints(self.store, self.opt, self._notices, run_dir)
        self.started_at = time.time()
        self.clock = time.time  # `status`'s clock (a simulated cluster's virtual one: orchestrator/sim)
        replayed = replay_log(self.opt, self.store.events(), self.scheduler, self.pool)
        self.replayed = replayed.events
        self.resumed_unfinished = replayed.unfinished
        self.readopted = replayed.readopted
        self.model_restored = self.checkpoints.restore_model()
        self.calibrator_restored = self.checkpoints.restore_calibrator()
        self.checkpoints.calibrator_saved = self.opt.num_calibrated
        # the failure guard judges this session's results: a run it stopped is resumed once the cause is fixed
        self.guard = FailureGuard(cfg.failure_guard, self.scheduler, self.opt, self.abort, run_dir,
                                  base=(self.scheduler.n_done, self.scheduler.n_failed))
        self.planner = Planner(
            self.opt, self.scheduler, self.log, self.checkpoints, self._notices, self.abort, self._stop,
            batch_size=cfg.batch_size, session=self.started_at, refit_interval_s=float(refit_interval_s),
            max_refit_failures=max_refit_failures, model_restored=self.model_restored,
            reevaluation=(cfg.reevaluation.fraction, cfg.reevaluation.repeats))
        self.dispatcher = Dispatcher(
            self.scheduler, self.log, self.opt, self.guard, self.abort, self._stop, self._wake_planners,
            cfg=cfg, pool=self.pool, objective_spec=self.objective_spec, resources=self.resources,
            isolate=isolate, session=self.started_at)

    # ------------------------------------------------------------------ status
    @property
    def max_concurrent(self) -> int:
        return self.scheduler.max_concurrent

    @property
    def n_completed(self) -> int:
        return self.scheduler.n_completed

    @property
    def n_failed(self) -> int:
        return self.scheduler.n_failed

    @property
    def n_done(self) -> int:
        return self.scheduler.n_done

    def low_water(self) -> int:
        """Queue length below which the next batch is proposed (`SlotScheduler.low_water`)."""
        return self.scheduler.low_water()

    def status(self) -> dict[str, Any]:
        """A snapshot for the progress bar and `qbatch status` (safe to call while `run` is going)."""
        sched = self.scheduler
        with sched.lock:
            now = self.clock()
            span = (now - sched.first_dispatch) if sched.first_dispatch else 0.0
            best = self.opt.best_observed()
            model_best = None
            try:
                model_best = self.opt.best() if self.opt.model is not None else None
            except QbatchError:
                pass
            return {
                "run_dir": self.run_dir,
                "budget": self.budget,
                "done": self.n_done,
                "completed": self.n_completed,
                "failed": self.n_failed,
                "inflight": len(sched.inflight),
                "queued": len(sched.queue),
                "max_concurrent": self.max_concurrent,
                "best_observed": None if best is None else {"params": best[0], "value": best[1]},
                "best_predicted": (None if model_best is None
                                   else {"params": model_best[0], "value": model_best[1]}),
                "evals_per_s": sched.n_done_session / span if span > 0 else 0.0,
                "utilization": sched.busy_s / (self.max_concurrent * span) if span > 0 else 0.0,
                "refits": self.planner.refits,
                "refit_failures": self.planner.refit_failures,
                "low_water": self.low_water(),
                "elapsed_s": now - self.started_at,
                "phase": ("final fit" if self._final_fit else
                          "model" if self.opt.model is not None else "initial design"),
                # the results by where their point came from; a proposer without a model proposes "model"
                # points too, so the driver's end-of-run check also reads `uses_model`
                "sources": self.opt.told_by_source(),
                "uses_model": self.opt.needs_model(),
                "last_fit_s": self.planner.last_fit_s,
                "pid": os.getpid(),
                "node_id": _node_id(),
                "aborted": self.abort.message,
                "duplicates_ignored": self.dispatcher.duplicates,
                "model_restored": self.model_restored,
                "calibrator_restored": self.calibrator_restored,
            }

    def pid(self) -> int:
        return os.getpid()

    def notices(self) -> list[str]:
        """The lines for the user (this actor's messages and its process's Python warnings, one line each)
        since the last call, oldest first; the driver prints them above its progress bar (`Notices`). Empty
        outside a Ray actor, whose lines are printed as they come."""
        return self._notices.take()

    def inflight(self) -> dict[str, float]:
        """Trials being evaluated now: trial_id -> dispatch time."""
        with self.scheduler.lock:
            return {trial.trial_id: t for trial, t, _ in self.scheduler.inflight.values()}

    def stop(self) -> None:
        """Ask `run` to return after the current step (in-flight evaluations are left to finish). Nothing new
        is proposed or dispatched once it returns: it waits for a submission under way (up to `_STOP_WAIT_S`),
        and every later dispatch and proposal sees the stop first. The driver calls it as soon as the user
        says stop (Ctrl-C, SIGTERM), so an objective that moves hardware does not start after that."""
        self._stop.set()
        self._wake_planners()
        if self.dispatcher.lock.acquire(timeout=_STOP_WAIT_S):
            self.dispatcher.lock.release()

    # ------------------------------------------------------------------ the loop
    def run(self, wait_s: float = 60.0) -> dict[str, Any]:
        """Drive the run to its budget. Returns a summary; `status`/"aborted" says if the guard stopped it.

        One loop per actor: a second call (a driver that lost its reference for a moment calls again) waits up
        to `wait_s` for the running loop and returns its summary, or {"status": "running"} (call again); a
        call after the loop ended returns its summary. Two loops would ingest the same results twice.
        """
        if not self._run_lock.acquire(blocking=False):
            return self._final if self._finished.wait(wait_s) else {"status": "running"}
        try:
            if self._finished.is_set():
                return self._final
            self._final = self._run_loop()
            self._finished.set()
            # nothing is written after the loop: free the writer lock now, so a resume started the moment the
            # driver has the summary is not refused while this process is still being killed (unless a planner
            # thread outlived its join: it may still write, and the lock goes with the process)
            if not self.planner.alive():
                self.store.unlock_writer()
            return self._final
        finally:
            self._run_lock.release()

    def _run_loop(self) -> dict[str, Any]:
        if not self.cfg.synchronous:
            # the planner threads run long Python stretches of model code: hand the interpreter back to the
            # dispatch loop sooner than the default 5 ms, so a result's freed slot is refilled promptly
            sys.setswitchinterval(_SWITCH_INTERVAL_S)
            self.planner.start()
        sched, log = self.scheduler, self.log
        try:
            while not self._stop.is_set():
                try:
                    self.dispatcher.dispatch()
                    if self.n_done >= self.budget and not sched.inflight:
                        break
                    if self.abort.message or self.planner.error:
                        break
                    if not self.cfg.synchronous:
                        self._fill_before_first_model()
                    if sched.inflight:
                        self.dispatcher.collect(_WAIT_S)
                    elif self.cfg.synchronous:
                        self.planner.sync_step()
                    else:
                        self._wake_planners()
                        time.sleep(0.005)
                    if log.started and time.time() - log.last_flush > _FLUSH_S:
                        log.append([])
                except LogWriteError:  # the abort says what failed; nothing more can be recorded
                    break
        finally:
            self._stop.set()
            self._wake_planners()
            self.dispatcher.settle(_ABORT_DRAIN_S)  # the results handed to the log's writer are told
            self.planner.join(timeout=600)
            if log.started and not log.failed:
                try:
                    log.append([])
                except LogWriteError:
                    pass
        if self.planner.error and not log.failed:
            self.abort.set(f"the planner failed: {self.planner.error}", add=True)
        if self.abort.message and sched.inflight and not log.failed:
            try:
                self.dispatcher.drain(_ABORT_DRAIN_S)
            except LogWriteError:
                pass
        elif (not self.abort.message and self.opt.can_fit()
              and (self.opt.model is None or self.opt.num_stale > 0)):
            self._final_fit = True
            try:
                self.planner.final_fit()
            except LogWriteError:  # the abort says what failed
                pass
            finally:
                self._final_fit = False
        return self._summary()

    def _fill_before_first_model(self) -> None:
        """Until the first model-based batch is queued, free slots get Sobol points from this loop directly
        (`Planner.fill_before_first_model`), dispatched at once; so do slots whose results are still being
        written."""
        with self.scheduler.lock:
            freed = len(self.dispatcher.arrived)
        if self.planner.fill_before_first_model(freed):
            self.dispatcher.dispatch()

    def _wake_planners(self) -> None:
        self.planner.wake()

    def _summary(self) -> dict[str, Any]:
        st = self.status()
        finished = self.n_done >= self.budget
        st["status"] = "aborted" if self.abort.message else ("finished" if finished else "stopped")
        st["message"] = self.abort.message
        st["proposal_seconds"] = list(self.planner.proposal_s)
        return st
