"""The central Ray actor: ask/tell state, model refits and the streaming evaluation pipeline.

ARCHITECTURE.md "The path of one evaluation", steps 2-6. One `CentralActor` owns the
run's `AskTellOptimizer` (observations, model, calibrator, proposer) and its `RunStore`. Its `run()`
method is the dispatch loop, in the actor's main worker thread:

- keep `max_concurrent` evaluations in flight, each a Ray task (workers/evaluate.py);
- wait for results one at a time (``ray.wait(num_returns=1)``, plus any others already done), hand each
  freed slot the next point of the queue at once, then write the results durably to the event log and only
  then tell the optimizer (exactly once per trial id).

Model work never holds up that loop. In the default asynchronous mode two background threads of the
actor do it. The *proposer thread* proposes the next batch as soon as the queue falls below its low-water
mark (`low_water`: enough points to keep every slot busy through 1.5 recent proposal times, at least
`queue_low`), so before it runs dry, counting every running and queued point as pending, with the current model. The
*refit thread* refits the surrogate whenever new results are in: it fits a copy (warm-started from the
current posterior) and swaps it in when ready, so proposals never wait for a fit. Until the first model
is ready, free slots get further Sobol points rather than idling. Only the proposer thread touches the
calibrator: the dispatch loop queues each (forecast, y) pair and the proposer thread applies those queued
since its last proposal, in ask order. With ``synchronous: true`` the loop follows the papers' protocol
instead: propose B, evaluate all B, refit, repeat (all in the loop's thread); such a run is reproducible
from its config and seed, since neither the model nor the calibrator sees the order results came in.

Every proposal is logged with the model's forecast at that point (model units: after the sign flip of
``direction: minimize``) and the run's slot count, every refit with {"seconds", "n", "best_params",
"best_predicted", "slots", "session", "direction"} (the report's utilization counts the slots the run had). The actor
rebuilds itself from the log when created on an existing run directory (resume, or a restart after a
crash): it replays proposals and results and re-queues trials that never finished. After every refit the
model is saved to ``checkpoints/model``; a resumed actor proposes from that model while it refits on the
replayed results, rather than filling slots with Sobol points through a cold first fit (the log stays the
record: a missing or unreadable checkpoint only means a cold refit). The calibrator is saved to
``checkpoints/calibrator`` with the trial ids it has learned when a proposal taught it enough more; a resumed
actor restores it and teaches it only the replayed results it had not learned, so it goes on in the state
the interrupted run left it in (learning every result again in one flush would end elsewhere: online OGD,
LOCBO and time-series splits depend on the chunks).

The evaluation tasks are submitted through the run's `EvaluationPool` (workers/pool.py), which the driver
creates: a Ray task fate-shares with the process that submitted it, so tasks owned by this actor would die
with it. After a restart the actor adopts the evaluations the pool still holds (running, or finished while
it was down) instead of re-running them. An evaluation whose worker is frozen and cannot
enforce its own timeout is cancelled at a deadline and recorded as a failed 'timeout' trial (`_expired`).

What the actor has to tell the user, its own lines and the Python warnings of its process, the driver takes
with `notices` and prints one to a line above its progress bar (`_Notices`).
"""

from __future__ import annotations

import collections
import math
import os
import sys
import threading
import time
import warnings
from typing import Any, Mapping

from orchestrator.ask_tell import AskTellOptimizer, Trial
from orchestrator.errors import QbatchError
from workers.evaluate import submit_evaluation
from workers.pool import exit_with_node
from workers.records import cap, describe_exception, format_exception_traceback

__all__ = ["CentralActor", "RunAbortedError", "default_max_concurrent", "slots_for"]

#: seconds the dispatch loop waits for a result before it looks at the queue again
_WAIT_S = 0.05
#: seconds `CentralActor.stop` waits for a submission under way (a restarting pool may hold one up to a minute)
_STOP_WAIT_S = 10.0
#: the actor process's GIL switch interval while the planner threads run (Python's default: 5 ms)
_SWITCH_INTERVAL_S = 0.0005
#: buffered "started" events are flushed at least this often (they ride along with result writes otherwise)
_FLUSH_S = 1.0
#: when a run aborts (failure guard, refit failures, planner error), how long the evaluations still in flight
#: may take to finish and be logged; any still running then stay "started" in the log and a resume runs them
_ABORT_DRAIN_S = 60.0
#: the checkpoint (run directory, `checkpoints/`) of the last fitted model, rewritten after every refit
MODEL_CHECKPOINT = "model"
#: the checkpoint of the calibrator and the results it has learned, rewritten when a proposal taught it more
CALIBRATOR_CHECKPOINT = "calibrator"
#: an ask rewrites the calibrator checkpoint once the calibrator has learned this share more results than the
#: checkpoint holds (a session's final fit always does; a session that ends without one, aborted or with its
#: model fitted on every result already, may leave it that far behind). Each rewrite holds every learned trial
#: id, so one per ask would write O(n^2 / batch) in all, ~3 GB over 20,000 one-point batches; a
#: checkpoint behind the log is replayed exactly (the log records what each flush learned, `_replay`)
CALIBRATOR_SAVE_GROWTH = 0.05
#: the most lines the actor holds for the driver (`CentralActor.notices`); past it the oldest are dropped
MAX_NOTICES = 200
#: the most characters of one such line (a longer one keeps its head and tail)
MAX_NOTICE_CHARS = 2000


class RunAbortedError(QbatchError):
    """The run stopped early: the failure-rate guard tripped, or the planner failed."""


def slots_for(node_resources: Mapping[str, float], request: Mapping[str, float]) -> int:
    """How many evaluations asking for `request` fit on a node with `node_resources` (Ray resource names)."""
    fits = []
    for name, need in request.items():
        if need and need > 0:
            fits.append(int(math.floor(float(node_resources.get(name, 0.0)) / float(need) + 1e-9)))
    return min(fits) if fits else 0


def resource_request(resources: Any) -> dict[str, float]:
    """One evaluation's request for an objective's `Resources`, by Ray's resource names ("CPU", "GPU", "memory",
    custom names), as `ray.available_resources()` names them."""
    opts = resources.to_ray_options()
    request: dict[str, float] = {"CPU": opts.get("num_cpus", 0.0), "GPU": opts.get("num_gpus", 0.0)}
    if opts.get("memory"):
        request["memory"] = float(opts["memory"])
    request.update({k: float(v) for k, v in opts.get("resources", {}).items()})
    return request


def default_max_concurrent(resources: Any) -> int:
    """Evaluations the live cluster can run at once for an objective's `Resources` (sum over alive nodes).

    A request of zero for every resource is bounded by the cluster's CPU count.

    Raises:
        QbatchError: no alive node can run a single evaluation (the message names the request).
    """
    import ray

    request = resource_request(resources)
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    if not any(v > 0 for v in request.values()):
        return max(1, int(sum(n["Resources"].get("CPU", 0) for n in nodes)))
    total = sum(slots_for(n["Resources"], request) for n in nodes)
    if total < 1:
        raise QbatchError(
            f"no node of the cluster can run one evaluation asking for {request}; "
            f"nodes offer {[dict(n['Resources']) for n in nodes]}"
        )
    return total


def _node_id() -> str | None:
    """The Ray node this process runs on (None outside a Ray worker)."""
    import ray

    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else None


def _in_ray_actor() -> bool:
    """Whether this process runs a Ray actor (its stderr reaches the driver through Ray's log forwarding)."""
    try:
        import ray

        return ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None
    except Exception:  # noqa: BLE001 - no Ray, or no runtime context: a plain process
        return False


def warning_line(message: Warning | str, category: type[Warning], filename: str, lineno: int) -> str:
    """One line for a Python warning: ``qbatch: warning: Category: message``, without the source line Python
    prints under it, with the newlines of the message folded, and with its origin (``file:line``) when it
    comes from outside qbatch (a library's warning; qbatch's own name what to change)."""
    text = " ".join(str(message).split())
    if not str(getattr(category, "__module__", "")).startswith("orchestrator"):
        text = f"{text} ({os.path.basename(filename)}:{lineno})"
    return cap(f"qbatch: warning: {category.__name__}: {text}", MAX_NOTICE_CHARS, sep=" ")


class _Notices:
    """What the central actor has to tell the user: its lines and the Python warnings raised in its process.

    In a Ray actor (`forward`) they are held for the driver, which takes them with `CentralActor.notices` and
    prints each on a line of its own above the progress bar: Ray forwards an actor's stderr to the driver's
    terminal as it comes, after the actor's pid and on the bar's line, and Python prints a warning with the
    source line of its `warnings.warn`. Outside Ray (an actor object in the caller's process) a line is
    printed to stderr at once and warnings are left to Python.

    The hook is the process's `warnings.showwarning`: a `warnings.catch_warnings` in a library (BoTorch's
    fits record their warnings so) replaces it while it lasts, as it does Python's own.
    """

    def __init__(self, forward: bool) -> None:
        self.forward = forward
        self._lines: collections.deque[str] = collections.deque(maxlen=MAX_NOTICES)

    def say(self, line: str) -> None:
        if self.forward:
            self._lines.append(cap(line, MAX_NOTICE_CHARS, sep=" "))
        else:
            print(line, file=sys.stderr, flush=True)

    def show_warning(self, message: Warning | str, category: type[Warning], filename: str, lineno: int,
                     file: Any = None, line: str | None = None) -> None:
        """`warnings.showwarning` of the actor's process (the filters still decide what is shown)."""
        self._lines.append(warning_line(message, category, filename, lineno))

    def take(self) -> list[str]:
        """The lines held, oldest first, and forget them."""
        out = []
        while True:
            try:
                out.append(self._lines.popleft())
            except IndexError:
                return out


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

        if isinstance(max_refit_failures, bool) or not isinstance(max_refit_failures, int) or max_refit_failures < 1:
            raise QbatchError(f"max_refit_failures must be an integer >= 1; got {max_refit_failures!r}")
        # first of all: the warnings of building the objective and of replaying the log reach the driver too
        self._notices = _Notices(forward=_in_ray_actor())
        if self._notices.forward:  # this process is the actor's own: its warnings all go to the driver
            warnings.showwarning = self._notices.show_warning
        exit_with_node("central actor")  # a killed driver's local Ray: free the writer lock at once, not in a minute
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
        self.max_concurrent = int(max_concurrent)
        self.queue_low = int(queue_low) if queue_low is not None else max(self.max_concurrent, cfg.batch_size // 2)
        self.refit_interval_s = float(refit_interval_s)
        self.max_refit_failures = max_refit_failures
        self.isolate = isolate
        if isinstance(pool, tuple):  # (namespace, name): looked up by every (re)start of this actor
            import ray

            pool = ray.get_actor(pool[1], namespace=pool[0])
        self.pool = pool
        self.budget = cfg.budget

        self._lock = threading.RLock()  # queue, in-flight table, counters
        self._store_lock = threading.Lock()  # RunStore is written from the loop and the planner
        self._wakes = {"propose": threading.Event(), "refit": threading.Event()}  # wake the planner threads
        self._stop = threading.Event()
        self._dispatch_lock = threading.Lock()  # held from the stop check in `_dispatch` until its submission returns
        self._run_lock = threading.Lock()  # held by the one running `run` loop
        self._finished = threading.Event()  # the loop has ended; `_final` is its summary
        self._final: dict[str, Any] = {}
        self._queue: collections.deque[Trial] = collections.deque()
        self._submitting = 0  # trials taken from the queue whose submission has not returned (`_dispatch`)
        self._reserved = 0  # trials being proposed now (asked for, not yet queued): part of the budget
        self._reserved_sobol = 0  # the part of `_reserved` being proposed as Sobol points
        self._inflight: dict[Any, tuple[Trial, float, int]] = {}
        self._attempts: dict[str, int] = {}
        self._started_buf: list[Any] = []
        self._last_flush = time.time()
        self._busy_s = 0.0  # evaluation time of results ingested in this session
        # backstop deadlines (`_expired`): start times the pool reported, and when they were last asked for
        self._starts: dict[str, float] | None = None
        self._starts_asked = -math.inf
        self._first_dispatch: float | None = None
        self._n_done_session = 0
        self._duplicates = 0
        self._planners: list[threading.Thread] = []
        self._planner_error: str | None = None
        self._abort: str | None = None
        self._log_failed = False  # an append to the event log raised (disk full, storage gone): stop, write nothing
        self._last_fit_end = 0.0
        self._refits = 0
        self._refit_failures = 0  # in this session
        self._failed_in_a_row = 0
        self._failed_fit_n = -1  # results the last failed refit saw (-1: the last refit did not fail)
        self._proposal_s: list[float] = []
        self._model_batches = 0  # model-based batches proposed in this session
        self._prop_ema: float | None = None  # moving average of model-based proposal seconds
        self._eval_ema: float | None = None  # moving average of evaluation seconds
        self.started_at = time.time()
        self._replay()
        self.model_restored = self._restore_model()
        self.calibrator_restored = self._restore_calibrator()
        self._calib_saved = self.opt.num_calibrated

    # ------------------------------------------------------------------ replay (resume / restart)
    def _replay(self) -> None:
        """Rebuild the optimizer from the log: proposals, then results exactly once, in log order."""
        events = self.store.events()
        self.replayed = len(events)
        finished: set[str] = set()
        n_completed = n_failed = 0
        model_batches: set[int] = set()
        for ev in events:
            if ev.kind == "proposed" and ev.trial_id not in self.opt._trials:
                info = ev.info or {}
                if info.get("source") == "model" and ev.batch_id is not None and ev.batch_id not in model_batches:
                    # that batch's ask flushed the calibrator's queue: the results logged before it are one update,
                    # but for those told while the ask ran (logged before its batch, the next ask's), which the
                    # count the ask logged sets apart (`_ask_and_log`)
                    model_batches.add(ev.batch_id)
                    self._end_calibration_round(info)
                self.opt.restore_trial(
                    ev.trial_id, ev.params or {}, ev.x or [], ev.batch_id if ev.batch_id is not None else -1,
                    forecast=ev.forecast, seed=info.get("seed"), source=info.get("source", "sobol"),
                    sobol_index=info.get("sobol_index"),
                )
            elif ev.kind == "refit" and (ev.info or {}).get("final"):
                self._end_calibration_round(ev.info)  # the end of a session flushed the calibrator (`_session_end`)
            elif ev.kind == "started":
                self._attempts[ev.trial_id] = max(self._attempts.get(ev.trial_id, 0), ev.attempt + 1)
            elif ev.kind in ("completed", "failed") and ev.trial_id not in finished:
                finished.add(ev.trial_id)
                if ev.trial_id not in self.opt._trials:  # its "proposed" record was lost (damaged segment)
                    self._restore_from(ev)
                if ev.kind == "completed":
                    self.opt.tell(ev.trial_id, ev.value)
                    n_completed += 1
                else:
                    self.opt.tell(ev.trial_id, None, error=ev.error or "exception", message=(ev.info or {}).get("message"))
                    n_failed += 1
        self.n_completed, self.n_failed = n_completed, n_failed
        # the failure guard judges this session's results: a run it stopped is resumed once the cause is fixed
        self._guard_base = (n_completed + n_failed, n_failed)
        # trials proposed (maybe started) that never finished go first, in proposal order
        self._queue.extend(self.opt.pending())
        self.resumed_unfinished = len(self._queue)
        self.readopted = self._readopt(finished) if self.pool is not None else 0

    def _end_calibration_round(self, info: Mapping[str, Any]) -> None:
        """`_replay` at a record of a calibrator flush (a model batch's first proposal, a session's final fit): its
        `learned_ids` (absent from logs of older versions) name the results that flush taught the calibrator,
        `calibrated` how many it had learned in all (on every proposal of the batch: the first one's record may be
        lost). The ids are exact across sessions and after a damaged part of the log; the count is shifted by
        results a damaged log lost (a count of the flush's results alone would be shifted by a resumed session's
        first flush too, which teaches the results of several rounds)."""
        ids = info.get("learned_ids")
        if isinstance(ids, list):
            self.opt.end_calibration_round(learned_ids=[str(t) for t in ids])
            return
        after = info.get("calibrated")
        self.opt.end_calibration_round(
            after=after if isinstance(after, int) and not isinstance(after, bool) else None)

    def _restore_model(self) -> bool:
        """After a resume or restart: the last fitted model from `checkpoints/model`, so proposals continue from
        it while the refit on the replayed results runs beside (no cold start). The log stays the record: an
        unreadable or mismatched checkpoint is skipped with a warning and the model is refitted from the log."""
        if self.opt.num_completed == 0:
            return False
        try:
            ckpt = self.store.load_checkpoint(MODEL_CHECKPOINT)
            if ckpt is None:
                return False
            self.opt.restore_model(ckpt)
        except Exception as exc:  # noqa: BLE001 - the model is refitted from the log instead
            self._notices.say(f"qbatch: model checkpoint of {self.run_dir} not used ({type(exc).__name__}: {exc}); "
                              "the model is refitted from the log")
            return False
        return True

    def _save_model(self) -> None:
        """Checkpoint the model just fitted (`checkpoints/model`); a failed write is reported, never fatal."""
        try:
            ckpt = self.opt.model_checkpoint()
            if ckpt is not None:
                self.store.save_checkpoint(MODEL_CHECKPOINT, ckpt)
        except Exception as exc:  # noqa: BLE001 - a full disk must not stop the run; the log holds every result
            self._notices.say(f"qbatch: could not save the model checkpoint ({type(exc).__name__}: {exc}); a resume "
                              "will refit from the log")

    def _restore_calibrator(self) -> int:
        """After a resume or restart: the calibrator as the last session left it (`checkpoints/calibrator`), with
        only the results it had not learned yet left to teach it. Without a usable checkpoint it learns every
        replayed result at the first flush, one update per ask as the log shows them (`_replay`; exact for
        synchronous runs, approximate for streaming ones: `AskTellOptimizer.flush_calibration`), and a warning says
        why when a checkpoint was there. Returns how many results the restored calibrator had learned."""
        if self.opt.calibrator is None or self.opt.num_completed == 0:
            return 0
        try:
            ckpt = self.store.load_checkpoint(CALIBRATOR_CHECKPOINT)
            return 0 if ckpt is None else self.opt.restore_calibrator(ckpt)
        except Exception as exc:  # noqa: BLE001 - the calibrator learns the replayed results instead
            self._notices.say(f"qbatch: calibrator checkpoint of {self.run_dir} not used ({type(exc).__name__}: "
                              f"{exc}); the calibrator learns the replayed results again")
            return 0

    def _save_calibrator(self, force: bool = False) -> None:
        """Checkpoint the calibrator if it learned results since the last save, at least `CALIBRATOR_SAVE_GROWTH`
        of them unless `force`; a failed write is reported, never fatal (a resume then re-teaches it from the
        log). Called by the thread that flushes it."""
        n = self.opt.num_calibrated
        if n == self._calib_saved or (not force and n - self._calib_saved < CALIBRATOR_SAVE_GROWTH * n):
            return
        try:
            ckpt = self.opt.calibrator_checkpoint()
            if ckpt is not None:
                self.store.save_checkpoint(CALIBRATOR_CHECKPOINT, ckpt)
                self._calib_saved = len(ckpt["taught"])
        except Exception as exc:  # noqa: BLE001 - the log holds every result
            self._notices.say(f"qbatch: could not save the calibrator checkpoint ({type(exc).__name__}: {exc}); a "
                              "resume will re-teach it from the log")

    def _readopt(self, finished: set[str]) -> int:
        """After a restart: evaluations the pool still holds (running, or finished while this actor was down)
        are waited on again instead of re-dispatched; held results already in the log are released."""
        import ray

        held = ray.get(self.pool.held.remote(), timeout=120)
        stale = [tid for tid in held if tid in finished]
        if stale:
            self.pool.release.remote(stale)
        adopted = 0
        keep: collections.deque[Trial] = collections.deque()
        for trial in self._queue:
            if trial.trial_id in held:
                ref, attempt, submitted = held[trial.trial_id]
                self._inflight[ref] = (trial, submitted, attempt)
                self._attempts[trial.trial_id] = max(self._attempts.get(trial.trial_id, 0), attempt + 1)
                adopted += 1
            else:
                keep.append(trial)
        self._queue = keep
        return adopted

    def _restore_from(self, ev: Any) -> None:
        """Re-register a trial from one of its own events (they all carry params and x)."""
        x = ev.x if ev.x else self.opt.space.to_unit([ev.params or {}])[0].tolist()
        self.opt.restore_trial(ev.trial_id, ev.params or {}, x, ev.batch_id if ev.batch_id is not None else -1,
                               source="unknown")

    # ------------------------------------------------------------------ status
    @property
    def n_done(self) -> int:
        return self.n_completed + self.n_failed

    def status(self) -> dict[str, Any]:
        """A snapshot for the progress bar and `qbatch status` (safe to call while `run` is going)."""
        with self._lock:
            now = time.time()
            span = (now - self._first_dispatch) if self._first_dispatch else 0.0
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
                "inflight": len(self._inflight),
                "queued": len(self._queue),
                "max_concurrent": self.max_concurrent,
                "best_observed": None if best is None else {"params": best[0], "value": best[1]},
                "best_predicted": None if model_best is None else {"params": model_best[0], "value": model_best[1]},
                "evals_per_s": self._n_done_session / span if span > 0 else 0.0,
                "utilization": self._busy_s / (self.max_concurrent * span) if span > 0 else 0.0,
                "refits": self._refits,
                "refit_failures": self._refit_failures,
                "low_water": self.low_water(),
                "elapsed_s": now - self.started_at,
                "phase": "model" if self.opt.model is not None else "initial design",
                "pid": os.getpid(),
                "node_id": _node_id(),
                "aborted": self._abort,
                "duplicates_ignored": self._duplicates,
                "model_restored": self.model_restored,
                "calibrator_restored": self.calibrator_restored,
            }

    def pid(self) -> int:
        return os.getpid()

    def notices(self) -> list[str]:
        """The lines for the user (this actor's messages and its process's Python warnings, one line each) since
        the last call, oldest first; the driver prints them above its progress bar (`_Notices`). Empty outside
        a Ray actor, whose lines are printed as they come."""
        return self._notices.take()

    def inflight(self) -> dict[str, float]:
        """Trials being evaluated now: trial_id -> dispatch time."""
        with self._lock:
            return {trial.trial_id: t for trial, t, _ in self._inflight.values()}

    def stop(self) -> None:
        """Ask `run` to return after the current step (in-flight evaluations are left to finish). Nothing new is
        proposed or dispatched once it returns: it waits for a submission under way (up to `_STOP_WAIT_S`), and
        every later `_dispatch` and `_propose` sees the stop first. The driver calls it as soon as the user
        says stop (Ctrl-C, SIGTERM), so an objective that moves hardware does not start after that."""
        self._stop.set()
        self._wake_planners()
        if self._dispatch_lock.acquire(timeout=_STOP_WAIT_S):
            self._dispatch_lock.release()

    # ------------------------------------------------------------------ the loop
    def run(self, wait_s: float = 60.0) -> dict[str, Any]:
        """Drive the run to its budget. Returns a summary; `status`/"aborted" says if the guard stopped it.

        One loop per actor: a second call (a driver that lost its reference for a moment calls again) waits up
        to `wait_s` for the running loop and returns its summary, or {"status": "running"} (call again); a call
        after the loop ended returns its summary. Two loops would ingest the same results twice.
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
            if not any(t.is_alive() for t in self._planners):
                self.store.unlock_writer()
            return self._final
        finally:
            self._run_lock.release()

    def _run_loop(self) -> dict[str, Any]:
        if not self.cfg.synchronous:
            # the planner threads run long Python stretches of model code: hand the interpreter back to the
            # dispatch loop sooner than the default 5 ms, so a result's freed slot is refilled promptly
            sys.setswitchinterval(_SWITCH_INTERVAL_S)
            self._planners = [
                threading.Thread(target=self._planner_loop, args=(role,), name=f"qbatch-{role}", daemon=True)
                for role in ("propose", "refit")
            ]
            for t in self._planners:
                t.start()
        try:
            while not self._stop.is_set():
                try:
                    self._dispatch()
                    if self.n_done >= self.budget and not self._inflight:
                        break
                    if self._abort or self._planner_error:
                        break
                    if not self.cfg.synchronous:
                        self._fill_before_first_model()
                    if self._inflight:
                        self._collect(_WAIT_S)
                    elif self.cfg.synchronous:
                        self._sync_step()
                    else:
                        self._wake_planners()
                        time.sleep(0.005)
                    if self._started_buf and time.time() - self._last_flush > _FLUSH_S:
                        self._append([])
                except _LogWriteError:  # `_abort` says what failed; nothing more can be recorded
                    break
        finally:
            self._stop.set()
            self._wake_planners()
            for t in self._planners:
                t.join(timeout=600)
            if self._started_buf and not self._log_failed:
                try:
                    self._append([])
                except _LogWriteError:
                    pass
        if self._planner_error and not self._log_failed:
            self._set_abort(f"the planner failed: {self._planner_error}", add=True)
        if self._abort and self._inflight and not self._log_failed:
            try:
                self._drain(_ABORT_DRAIN_S)
            except _LogWriteError:
                pass
        elif not self._abort and self.opt.can_fit() and (self.opt.model is None or self.opt.num_stale > 0):
            try:
                self._final_fit()
            except _LogWriteError:  # `_abort` says what failed
                pass
        return self._summary()

    def _final_fit(self) -> None:
        """The end of a session that was not aborted (its budget spent, or stopped): the model is refitted from
        scratch on every result, then the calibrator learns the results since the last ask (`_session_end`). The
        final recommendation uses every result (after the evaluation span) and a fresh fit: a warm start can stay
        in the basin of a fit on the first few results (`AskTellOptimizer.fit`); a run that ended before its first
        model batch (a budget near `initial_design`) is fitted here too."""
        self._refit(restart=True, final=True)

    def _session_end(self) -> dict[str, Any]:
        """The calibrator learns the results told since the last ask (`_refit` checkpoints it once the record is
        written, as `_ask_and_log` does); returns what the final fit's record, appended right after, says of it
        (`final`, and with a calibrator `calibrated`, how many it has learned in all, and `learned_ids`, the
        results this flush taught it), so that a replay without the checkpoint ends that update there too
        (`_replay`) and does not merge it with the next session's first. A flush that raises is reported and
        leaves the fit and its record as they are. It runs after the final fit, not before: a session killed
        during that fit (it may take minutes) flushed nothing, so its replay agrees with its checkpoint (flushed
        and checkpointed first, it would have learned results whose update no record marks)."""
        before = self.opt.num_calibrated
        try:
            self.opt.flush_calibration()
        except Exception as exc:  # noqa: BLE001 - the fitted model and its record are kept
            # not checkpointed: a resume restores the last checkpoint and teaches it these results from the log
            error = describe_exception(exc)
            self._notices.say(f"qbatch: the calibrator could not learn the session's last results ({error}); a "
                              "resume teaches them again from the log")
            return {"final": True, "calibrator_error": error}
        if self.opt.calibrator is None:
            return {"final": True}
        return {"final": True, "calibrated": self.opt.num_calibrated, "learned_ids": self.opt.calibrated_ids(before)}

    def _drain(self, limit_s: float) -> None:
        """After an abort: log the results of the evaluations in flight as they finish, for up to `limit_s`
        seconds, starting nothing new (`_dispatch` refuses once `_abort` is set). A result that is finished is
        never dropped; an evaluation still running after the limit stays "started" and a resume runs it again."""
        deadline = time.time() + limit_s
        while self._inflight and (left := deadline - time.time()) > 0:
            self._collect(min(left, 1.0))
        if self._inflight:
            self._abort += (f"; {len(self._inflight)} evaluations still running after {limit_s:g} s were left "
                            "unrecorded (`qbatch resume` runs them again)")

    def _summary(self) -> dict[str, Any]:
        st = self.status()
        st["status"] = "aborted" if self._abort else ("finished" if self.n_done >= self.budget else "stopped")
        st["message"] = self._abort
        st["proposal_seconds"] = list(self._proposal_s)
        return st

    def _remaining_to_propose(self) -> int:
        """Budget not yet spoken for: done, in flight, being submitted, queued, or being proposed right now
        (`_reserved`)."""
        with self._lock:
            return (self.budget - self.n_done - len(self._inflight) - len(self._queue) - self._submitting
                    - self._reserved)

    def _dispatch(self, freed: int = 0) -> None:
        """Start queued trials in the free slots. `freed`: in-flight evaluations whose results have arrived
        but are not yet logged (`_collect` refills their slots before the durable write; they still count
        against the budget until they are told)."""
        with self._dispatch_lock:
            self._dispatch_locked(freed)
        if len(self._queue) < self.low_water() and not self._stop.is_set():
            self._wake_planners()

    def _dispatch_locked(self, freed: int) -> None:
        """`_dispatch`'s work, under `_dispatch_lock`: a stop (`stop`) is seen here or waits until it returns."""
        # an aborting run starts nothing new (its evaluations in flight are drained); nor does a stopped one
        if self._abort or self._stop.is_set():
            return
        with self._lock:
            batch: list[tuple[Trial, int]] = []
            while (self._queue and len(self._inflight) - freed + len(batch) < self.max_concurrent
                   and self.n_done + len(self._inflight) + len(batch) < self.budget):
                trial = self._queue.popleft()
                attempt = self._attempts.get(trial.trial_id, 0)
                self._attempts[trial.trial_id] = attempt + 1
                batch.append((trial, attempt))
            self._submitting = len(batch)  # still spoken for (`_remaining_to_propose`) while submitted
        if batch:
            # outside the lock: a restarting pool may take up to a minute to answer, and status(), the planners'
            # budget checks and their log appends would wait that long on the lock
            try:
                refs = self._submit(batch)
            except Exception as exc:  # put the trials back: they stay logged as proposed, never lost
                with self._lock:
                    self._queue.extendleft(t for t, _ in reversed(batch))
                    self._submitting = 0
                if not _is_transient(exc):  # a submission Ray refuses would be refused forever
                    self._set_abort(f"evaluations cannot be submitted: {type(exc).__name__}: {exc}")
                    return
                time.sleep(0.2)  # the pool is restarting: try again on the next pass
                return
            now = time.time()
            with self._lock:
                self._submitting = 0
                if self._first_dispatch is None:
                    self._first_dispatch = now
                for (trial, attempt), ref in zip(batch, refs):
                    self._inflight[ref] = (trial, now, attempt)
                    self._started_buf.append(self._event("started", trial, time=now, attempt=attempt))

    def _submit(self, batch: list[tuple[Trial, int]]) -> list[Any]:
        """Start the evaluations of `batch` ((trial, attempt) pairs); returns their refs in order."""
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
        return ray.get(self.pool.submit.remote(items), timeout=60)

    def _collect(self, timeout: float) -> None:
        import ray

        refs = list(self._inflight)
        ready, rest = ray.wait(refs, num_returns=1, timeout=timeout)
        if ready and rest:
            more, rest = ray.wait(rest, num_returns=len(rest), timeout=0)
            ready = ready + more
        expired = self._expired(rest)
        if not ready and not expired:
            return
        results = []
        orphaned = []
        for ref, started in expired.items():
            trial, _, attempt = self._inflight[ref]
            results.append((ref, trial, attempt, _timeout_record(trial, started, self.cfg.timeout_s)))
        for ref in ready:
            trial, dispatched, attempt = self._inflight[ref]
            try:
                rec = ray.get(ref)
            except ray.exceptions.OwnerDiedError:  # the pool died and its tasks with it: never recorded, run again
                orphaned.append((ref, trial))
                continue
            except Exception as exc:  # the worker or node died and Ray's retries ran out, or a bug
                rec = _lost_record(trial, exc, dispatched)
            results.append((ref, trial, attempt, rec))
        if orphaned:
            with self._lock:
                for ref, trial in orphaned:
                    del self._inflight[ref]
                    if not self.opt.is_told(trial.trial_id):
                        self._queue.appendleft(trial)
        # refill the freed slots first: the next evaluations need neither the write nor the tell below; unless
        # these results trip the failure guard (the run stops: nothing new may start)
        new = {trial.trial_id: rec for _, trial, _, rec in results if not self.opt.is_told(trial.trial_id)}
        if not self._guard_trips(self.n_done + len(new),
                                 self.n_failed + sum(rec["status"] != "completed" for rec in new.values())):
            self._dispatch(freed=len(results))
        events = []
        for _, trial, attempt, rec in results:
            if self.opt.is_told(trial.trial_id):  # exactly once by trial id
                continue
            kind = rec["status"]
            # `session`: when this actor started; the report sums utilization's span over sessions (a resume or
            # a restart starts one), so the time a stopped run waited for `qbatch resume` is not idle slot time
            info = {"metrics": rec.get("metrics") or {}, "child_pid": rec.get("child_pid"), "session": self.started_at}
            if rec.get("message"):
                info["message"] = rec["message"]
            if rec.get("metrics_dropped"):
                info["metrics_dropped"] = rec["metrics_dropped"]
            events.append(self._event(
                kind, trial, time=time.time(), value=rec["value"] if kind == "completed" else None,
                node_id=rec.get("node_id"), pid=rec.get("pid"), started_at=rec.get("started_at"),
                ended_at=rec.get("ended_at"), attempt=attempt, error=rec.get("error"),
                traceback=rec.get("traceback"), info=info,
            ))
        self._append(events)  # durable before anything is acknowledged
        if self.pool is not None and results:
            self.pool.release.remote([trial.trial_id for _, trial, _, _ in results])
        with self._lock:
            for ref, trial, _, rec in results:
                del self._inflight[ref]
                if self.opt.is_told(trial.trial_id):
                    self._duplicates += 1
                    continue
                if rec["status"] == "completed":
                    self.opt.tell(trial.trial_id, rec["value"])
                    self.n_completed += 1
                else:
                    self.opt.tell(trial.trial_id, None, error=rec.get("error") or "exception", message=rec.get("message"))
                    self.n_failed += 1
                self._n_done_session += 1
                if rec.get("error") != "worker-lost" and rec.get("started_at") is not None and rec.get("ended_at") is not None:
                    dt = max(0.0, rec["ended_at"] - rec["started_at"])
                    self._busy_s += dt
                    self._eval_ema = dt if self._eval_ema is None else 0.95 * self._eval_ema + 0.05 * dt
            self._check_guard()
        self._wake_planners()

    def _expired(self, refs: list[Any]) -> dict[Any, float]:
        """Evaluations past their deadline, cancelled (force: the worker process is killed): ref -> when its
        latest attempt started (its dispatch when that is unknown).

        `timeout_s` is enforced inside the worker (workers/evaluate.py); this is the backstop for a worker
        that cannot enforce it because it is frozen itself (SIGSTOP, hung NFS, a swap storm). Through the pool,
        each attempt reports when it starts running, and the deadline counts from the latest start: an evaluation
        that waits in Ray's queue (more in flight than the cluster runs at once) is never cut short. It allows
        every Ray retry its full timeout plus a grace period, since a retry after a lost worker may itself wait
        in the queue before it reports its start. A new sandbox reports again once it has imported and once it
        has built the objective (the build has a timeout_s of its own). Without start reports (no pool, or the
        pool does not answer) the deadline counts from dispatch and allows each attempt a build too.
        """
        limit = self.cfg.timeout_s
        if not refs or not math.isfinite(limit):
            return {}
        grace = max(5.0, 0.25 * limit)
        # from an attempt's latest start report: a new sandbox re-reports after its import and its build
        deadline = (1 + self.cfg.max_retries) * limit + grace
        # from dispatch: each attempt may also build the objective first, with a timeout_s of its own
        from_dispatch = 2 * (1 + self.cfg.max_retries) * limit + grace
        now = time.time()
        late = [ref for ref in refs if now - self._inflight[ref][1] > deadline]  # none can expire sooner
        if not late:
            return {}
        starts = self._start_times([self._inflight[ref][0].trial_id for ref in late], now)
        expired: dict[Any, float] = {}
        for ref in late:
            trial, dispatched, _ = self._inflight[ref]
            if starts is None:
                over = now - dispatched > from_dispatch
            else:
                start = starts.get(trial.trial_id)
                over = start is not None and now - start > deadline  # not started: still queued
            if over:
                expired[ref] = dispatched if starts is None else starts[trial.trial_id]
        if expired:
            import ray

            if self.pool is not None:
                self.pool.cancel.remote([self._inflight[ref][0].trial_id for ref in expired])
            else:
                for ref in expired:
                    try:
                        ray.cancel(ref, force=True)
                    except Exception:  # already finished or its worker is gone: nothing left to stop
                        pass
        return expired

    def _start_times(self, trial_ids: list[str], now: float) -> dict[str, float] | None:
        """When each evaluation's latest attempt started (from the pool; at most one query a second), or None
        when there are no start reports (no pool, or it did not answer within 10 s)."""
        if self.pool is None:
            return None
        if now - self._starts_asked >= 1.0:
            import ray

            self._starts_asked = now
            try:
                self._starts = ray.get(self.pool.started_at.remote(trial_ids), timeout=10.0)
            except Exception:  # the pool is restarting or gone (its refs then fail on their own)
                self._starts = None
        return self._starts

    def _guard_trips(self, n_done: int, n_failed: int) -> bool:
        """Whether `n_failed` failures in `n_done` results (run totals) stop the run (`failure_guard`): only the
        results of this session count, those replayed from the log at a resume do not."""
        guard = self.cfg.failure_guard
        n, f = n_done - self._guard_base[0], n_failed - self._guard_base[1]
        return n >= guard.min_trials and n > 0 and f / n > guard.max_failure_rate

    def _set_abort(self, message: str, add: bool = False) -> None:
        """Stop the run for `message`. The first cause stands: a later one never replaces it (the failure guard,
        tripped by the results drained after a planner error, would overwrite the planner's traceback, which only
        this message records) and is added to it only with `add` (a planner error, a failed log
        write), once."""
        if self._abort is None:
            self._abort = message
        elif add and message not in self._abort:
            self._abort += f"; then {message}"

    def _check_guard(self) -> None:
        guard = self.cfg.failure_guard
        if self._guard_trips(self.n_done, self.n_failed):
            n, f = self.n_done - self._guard_base[0], self.n_failed - self._guard_base[1]
            failures = self.opt.failures[self._guard_base[1]:]
            reasons = collections.Counter(x["error"] for x in failures)
            # the most frequent message says why (one cluster node without the user's module fails every
            # evaluation it takes, and the reasons alone say only "reasons {'exception': 10}")
            firsts = (str(x.get("message") or "").strip().splitlines()[:1] for x in failures)
            messages = collections.Counter(line[0][:300] for line in firsts if line)
            top = ""
            if messages:
                text, count = messages.most_common(1)[0]
                top = f"; most frequent message ({count} of {f}): {text}"
            since = " since the resume" if self._guard_base[0] else ""
            self._set_abort(
                f"failure guard: {f} of {n} evaluations failed{since} "
                f"({f / n:.0%} > failure_guard.max_failure_rate={guard.max_failure_rate:g}); "
                f"reasons {dict(reasons)}{top}; see the 'failed' events in {self.run_dir} for tracebacks"
            )

    # ------------------------------------------------------------------ proposals and refits
    def _wake_planners(self) -> None:
        for ev in self._wakes.values():
            ev.set()

    def _planner_loop(self, role: str) -> None:
        """Background loop of one planner thread: role "propose" or "refit"."""
        step = self._propose_step if role == "propose" else self._refit_step
        try:
            while not self._stop.is_set():
                if not step():
                    self._wakes[role].wait(0.1)
                    self._wakes[role].clear()
        except _LogWriteError:  # `_abort` says what failed
            self._wake_planners()
        except Exception as exc:
            self._planner_error = f"{role}: {format_exception_traceback(exc)}"
            self._wake_planners()

    def _propose_step(self) -> bool:
        """Propose when the queue is low (before it runs dry). Returns whether it did something. The calibrator
        learns the results queued since the last proposal when the next one is asked (`AskTellOptimizer.ask`,
        in this thread only), and is checkpointed then (`_ask_and_log`)."""
        remaining = self._remaining_to_propose()
        if remaining <= 0:
            return False
        with self._lock:  # trials being submitted count as queued (else an extra batch is proposed while a
            queued = len(self._queue) + self._submitting  # restarting pool holds a submission up)
        low = self.low_water()
        if queued >= low:
            return False
        design_left = self.opt._design_left()
        if design_left > 0:  # the initial design
            q = min(design_left, self.cfg.batch_size, remaining)
        elif self.opt.model is not None or not self.opt.needs_model():  # a model, or a proposer without one
            q = min(self.cfg.batch_size, remaining)
        else:
            # waiting for the first model: the dispatch loop gives free slots further Sobol points meanwhile
            # (`_fill_before_first_model`); queued ones would hold the first model batch up behind them
            return False
        self._propose(q)
        return True

    def _fill_before_first_model(self) -> None:
        """Until the first model-based batch is queued, free slots get Sobol points from this loop directly.

        The first fit and the first proposal (which also pays one-off start-up costs) may take longer than
        the queued initial design lasts; the space-filling design simply continues meanwhile. Later
        proposals are kept ahead of the queue by `low_water` instead, so the budget goes to the model.
        """
        with self._lock:  # Sobol points being proposed (the initial design's last ones) will fill slots too
            # at a resume with a restored model the first model batch comes at once; without one (no usable
            # checkpoint) the slots would idle through the cold refit: they get Sobol points as at a start
            if (self._model_batches or self.model_restored or self._queue or self._reserved_sobol
                    or not self.opt.needs_model() or self.opt._design_left() > 0):
                return
            free = self.max_concurrent - len(self._inflight)
        q = min(free, self._remaining_to_propose())
        if q > 0:
            self._propose(q, design=True)
            self._dispatch()

    def low_water(self) -> int:
        """Queue length below which the next batch is proposed: at least `queue_low`, and enough points to
        keep every slot busy for 1.5 times the recent proposal time (measured: moving averages of proposal
        and evaluation times), so the queue does not run dry while a proposal is computed."""
        low = self.queue_low
        if self._prop_ema is not None and self._eval_ema:
            low = max(low, math.ceil(1.5 * self.max_concurrent * self._prop_ema / self._eval_ema))
        return min(low, 4 * max(self.cfg.batch_size, self.max_concurrent))

    def _refit_step(self) -> bool:
        """Refit on new results (on a copy; swapped in when ready). Returns whether it did something."""
        if (
            self._remaining_to_propose() > 0  # a refit only matters for proposals still to come
            and self.opt._design_left() <= 0
            and self.opt.can_fit()
            and (self.opt.model is None or self.opt.num_stale > 0)
            and time.time() - self._last_fit_end >= self.refit_interval_s
            and self.opt.num_completed != self._failed_fit_n  # after a failed fit: retry on new results only
        ):
            self._refit()
            return True
        return False

    def _propose(self, q: int, design: bool = False) -> None:
        """Ask for up to `q` trials, log them and queue them. The dispatch loop (Sobol points before the first
        model) and the proposer thread may both propose: each reserves its share of the budget under the lock
        first, so that their batches together never pass the budget."""
        with self._lock:
            q = min(q, self._remaining_to_propose())
            if q <= 0 or self._stop.is_set():  # a stopped run asks for nothing more
                return
            self._reserved += q
            sobol = design or self.opt._design_left() > 0
            self._reserved_sobol += q if sobol else 0
        trials: list[Trial] = []
        try:
            trials = self._ask_and_log(q, design)
        finally:  # queued only once logged; the reservation ends either way
            with self._lock:
                self._queue.extend(trials)
                self._reserved -= q
                self._reserved_sobol -= q if sobol else 0

    def _ask_and_log(self, q: int, design: bool) -> list[Trial]:
        """`_propose`'s work: ask for `q` trials and log them (a trial is logged before it can be dispatched)."""
        t0 = time.perf_counter()
        pending = self.opt.num_pending
        calibrated_before = self.opt.num_calibrated
        trials = self.opt.ask(q, fit=False, design=design)
        seconds = time.perf_counter() - t0
        self._proposal_s.append(seconds)
        calibrated = None
        if trials and trials[0].source == "model":
            self._model_batches += 1
            self._prop_ema = seconds if self._prop_ema is None else 0.7 * self._prop_ema + 0.3 * seconds
            # how many results the calibrator had learned when this ask flushed it (only this thread flushes), and
            # (on the batch's first record) which ones this flush taught it: a replay without a calibrator
            # checkpoint rebuilds the ask's update from them (`_replay`)
            calibrated = self.opt.num_calibrated if self.opt.calibrator is not None else None
        events = []
        for i, t in enumerate(trials):
            info = {"source": t.source, "seed": t.seed, "proposal_seconds": seconds, "q": q, "pending": pending,
                    "slots": self.max_concurrent, "session": self.started_at}
            if calibrated is not None:
                info["calibrated"] = calibrated
                if i == 0:
                    info["learned_ids"] = self.opt.calibrated_ids(calibrated_before)
            if "sobol_index" in t.info:
                info["sobol_index"] = t.info["sobol_index"]
            if self.direction == "minimize":
                info["forecast_units"] = "negated (direction: minimize)"
            events.append(self._event("proposed", t, info=info, forecast=t.forecast))
        self._append(events)
        if not design:  # this thread flushed the calibrator in `ask` (design points come from the dispatch loop).
            # Saved after the record of what it learned: a checkpoint behind the log is replayed exactly (the
            # records after it cut the rounds), one ahead of it would not be (saved first, a crash or a failed
            # write in between would leave a learned update no record marks)
            self._save_calibrator()
        return trials

    def _refit(self, restart: bool = False, final: bool = False) -> bool:
        """Refit the surrogate and log it. A fit that raises leaves the current model in place (the optimizer
        swaps a new one in only when its fit succeeds), is logged with its traceback, and returns False;
        `max_refit_failures` in a row abort the run, except for the `final` fit after the last result (the run
        is done: its recommendation is then the previous model's). `restart`: see `AskTellOptimizer.fit`.
        Every fit but the final one stops when the run loop ends (`stop`), logging nothing and returning False:
        the final fit on every result replaces it, and the run's end does not wait for it (a streaming run's
        background refit on the results before the last ones)."""
        from orchestrator.errors import FitInterrupted

        t0 = time.perf_counter()
        n = self.opt.num_completed
        try:
            diag = self.opt.fit(restart=restart, stop=None if final else self._stop)
        except FitInterrupted:
            return False
        except Exception as exc:
            self._last_fit_end = time.time()
            self._refit_failures += 1
            self._failed_in_a_row += 1
            self._failed_fit_n = n
            # capped like an objective's failure (head and tail kept), and safe from an exception whose
            # __str__ raises
            error = describe_exception(exc)
            info = {"failed": True, "error": error, "traceback": format_exception_traceback(exc), "n": n,
                    "slots": self.max_concurrent, "session": self.started_at, "direction": self.direction,
                    "failed_in_a_row": self._failed_in_a_row, "elapsed_s": time.perf_counter() - t0,
                    "kept": "previous model" if self.opt.model is not None else "Sobol design (no model yet)"}
            self._append_refit(info, final)
            self._notices.say(f"qbatch: refit on {n} results failed ({self._failed_in_a_row} in a row): {error}; the "
                              f"run goes on with the {info['kept']}")
            if self._failed_in_a_row >= self.max_refit_failures and not final:
                self._set_abort(f"{self._failed_in_a_row} refits in a row failed (max_refit_failures="
                                f"{self.max_refit_failures}); the last on {n} results: {error}")
                self._wake_planners()
            return False
        self._last_fit_end = time.time()
        self._refits += 1
        self._failed_in_a_row, self._failed_fit_n = 0, -1
        # the slots and the direction this session ran with: the report's utilization and best value read them
        self._append_refit({**diag, "slots": self.max_concurrent, "session": self.started_at,
                            "direction": self.direction}, final)
        self._save_model()
        return True

    def _append_refit(self, info: dict[str, Any], final: bool) -> None:
        """Log a refit's record, failed or not. The final fit's also carries the session's last calibrator flush
        (`_session_end`), which is checkpointed once the record is written."""
        from orchestrator.store import Event

        if final:
            info.update(self._session_end())
        self._append([Event("refit", info=info)])
        if final and "calibrator_error" not in info:
            self._save_calibrator(force=True)

    def _sync_step(self) -> None:
        """Papers' protocol: all of the last batch is in; refit, then propose the next batch of B."""
        remaining = self._remaining_to_propose()
        if remaining <= 0 or self._queue:
            return
        design_left = self.opt._design_left()
        if design_left > 0:
            self._propose(min(design_left, remaining))
            return
        if self.opt.can_fit() and (self.opt.model is None or self.opt.num_stale > 0):
            if not self._refit() and (self._abort or self._stop.is_set()):
                return  # (stopped during the fit: the run ends, and a resume proposes this batch)
        self._propose(min(self.cfg.batch_size, remaining))

    # ------------------------------------------------------------------ log
    def _event(self, kind: str, trial: Trial, **fields: Any) -> Any:
        from orchestrator.store import Event

        return Event(kind, trial.trial_id, batch_id=trial.batch_id, params=dict(trial.params),
                     x=[float(v) for v in trial.x.tolist()], **fields)

    def _append(self, events: list[Any]) -> None:
        """Write `events` (after the buffered "started" ones) to the log, durably.

        Raises:
            _LogWriteError: the write failed (e.g. the disk is full); `_abort` then says so and the run stops.
        """
        with self._store_lock:
            if self._log_failed:
                raise _LogWriteError(self._abort or "the run log cannot be written")
            with self._lock:
                buf, self._started_buf = self._started_buf, []
            batch = buf + list(events)
            if batch:
                try:
                    self.store.append(batch)
                except OSError as exc:
                    self._log_failed = True
                    lost = sum(e.kind in ("completed", "failed") for e in events)
                    self._set_abort(
                        f"writing the run log in {self.run_dir} failed ({type(exc).__name__}: {exc})"
                        + (f"; the {lost} result{'s' if lost > 1 else ''} being written {'were' if lost > 1 else 'was'} not "
                           "recorded" if lost else "")
                        + f". Everything logged before is kept: once the cause is fixed, `qbatch resume "
                        f"{self.run_dir}` finishes the run (evaluations whose results are not in the log run again)",
                        add=True)
                    self._wake_planners()
                    raise _LogWriteError(self._abort) from exc
            self._last_flush = time.time()


class _LogWriteError(QbatchError):
    """An append to the run's event log failed; the actor stops the run (its message is `_abort`)."""


def _is_transient(exc: BaseException) -> bool:
    """Whether a failed submission may succeed later: the evaluation pool is restarting or slow to answer."""
    import ray

    # ActorUnavailableError (a moment of unreachability) is a RayActorError
    return isinstance(exc, (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError))


def _timeout_record(trial: Trial, started: float, timeout_s: float) -> dict[str, Any]:
    """A failed 'timeout' record for an evaluation that gave no result long past its deadline (`started`: when
    its latest attempt started, or its dispatch when that is unknown)."""
    now = time.time()
    return {
        "trial_id": trial.trial_id,
        "status": "failed",
        "value": None,
        "error": "timeout",
        "traceback": None,
        "message": f"no result {now - started:.0f} s after it started (timeout_s={timeout_s:g}); the worker "
        "did not enforce its timeout (frozen?) and was cancelled",
        "started_at": started,
        "ended_at": now,
        "metrics": {},
        "node_id": None,
        "pid": None,
        "child_pid": None,
    }


def _lost_record(trial: Trial, exc: BaseException, dispatched: float) -> dict[str, Any]:
    """A failed record for an evaluation whose Ray task itself failed (worker/node lost after retries)."""
    import ray

    reason = "exception" if isinstance(exc, ray.exceptions.RayTaskError) else "worker-lost"
    return {
        "trial_id": trial.trial_id,
        "status": "failed",
        "value": None,
        "error": reason,
        "traceback": f"{type(exc).__name__}: {exc}",
        "message": f"{type(exc).__name__}",
        "started_at": dispatched,
        "ended_at": time.time(),
        "metrics": {},
        "node_id": None,
        "pid": None,
        "child_pid": None,
    }
