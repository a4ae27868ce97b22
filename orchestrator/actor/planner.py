"""The central actor's planner: when to propose the next batch and when to refit the surrogate.

ARCHITECTURE.md "The path of one evaluation", steps 2 and 5. Model work never holds up the dispatch loop. In
the default asynchronous mode two background threads of the actor run the planner's steps. The *proposer
thread* proposes the next batch as soon as the queue falls below its low-water mark
(`SlotScheduler.low_water`: enough points to keep every slot busy through 1.5 recent proposal times, at least
`queue_low`), so before it runs dry, counting every running and queued point as pending, with the current
model. The *refit thread* refits the surrogate whenever new results are in: it fits a copy (warm-started from
the current posterior) and swaps it in when ready, so proposals never wait for a fit. Until the first model is
ready, free slots get further Sobol points rather than idling (`fill_before_first_model`, from the dispatch
loop). Only the proposer thread touches the calibrator: the dispatch loop queues each (forecast, y) pair and
the proposer thread applies those queued since its last proposal, in ask order. With ``synchronous: true`` the
dispatch loop runs `sync_step` instead, the papers' protocol: propose B, evaluate all B, refit, repeat (all in
the loop's thread); such a run is reproducible from its config and seed, since neither the model nor the
calibrator sees the order results came in.

Every proposal is logged with the model's forecast at that point (model units: after the sign flip of
``direction: minimize``) and the run's slot count, every refit with {"seconds", "n", "best_params",
"best_predicted", "slots", "session", "direction"} (the report's utilization counts the slots the run had).
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

from orchestrator.actor.checkpoints import Checkpoints
from orchestrator.actor.guard import AbortCause
from orchestrator.actor.log import LogWriteError, RunLog
from orchestrator.actor.notices import Notices
from orchestrator.actor.scheduler import SlotScheduler
from orchestrator.ask_tell.repeats import repeat_share
from workers.records import describe_exception, format_exception_traceback

if TYPE_CHECKING:
    from orchestrator.ask_tell import AskTellOptimizer, Trial

__all__ = ["Planner"]

#: the planner threads' roles, one thread each
ROLES = ("propose", "refit")


class Planner:
    """Proposals and refits of one session of the central actor.

    Args:
        opt: the run's `AskTellOptimizer`.
        scheduler: the session's `SlotScheduler` (the queue, the budget count, the low-water mark).
        log: the run's event log (`RunLog`): every proposal and refit is recorded.
        checkpoints: the model and calibrator checkpoints, saved after a refit and a proposal.
        notices: where a failed refit is reported to the user.
        abort: the run's `AbortCause`: `max_refit_failures` refits failed in a row set it.
        stop: set when the run loop ends (or `CentralActor.stop`): nothing more is proposed, a refit stops.
        batch_size: the config's `batch_size`.
        session: when this session started (its records say so).
        refit_interval_s: least time between two background refits.
        max_refit_failures: refits failed in a row that abort the run.
        model_restored: the session started from a model checkpoint (no Sobol fillers while it refits).
    """

    def __init__(
        self,
        opt: AskTellOptimizer,
        scheduler: SlotScheduler,
        log: RunLog,
        checkpoints: Checkpoints,
        notices: Notices,
        abort: AbortCause,
        stop: threading.Event,
        *,
        batch_size: int,
        session: float,
        refit_interval_s: float,
        max_refit_failures: int,
        model_restored: bool,
        reevaluation: tuple[float, int] = (0.0, 1),
    ) -> None:
        self.opt = opt
        self.scheduler = scheduler
        self.log = log
        self.checkpoints = checkpoints
        self.notices = notices
        self.abort = abort
        self.stop = stop
        self.batch_size = batch_size
        self.session = session
        self.direction = opt.direction
        self.refit_interval_s = refit_interval_s
        self.max_refit_failures = max_refit_failures
        self.model_restored = model_restored
        self.wakes = {role: threading.Event() for role in ROLES}  # wake the planner threads
        self.threads: list[threading.Thread] = []
        self.error: str | None = None  # a planner thread's traceback: the run aborts
        self.last_fit_end = 0.0
        self.last_fit_s: float | None = None  # how long the last successful fit took
        self.refits = 0
        self.refit_failures = 0  # in this session
        self.failed_in_a_row = 0
        self.failed_fit_n = -1  # results the last failed refit saw (-1: the last refit did not fail)
        self.proposal_s: list[float] = []
        self.model_batches = 0  # model-based batches proposed in this session
        self.clock = time.time  # the refit interval's clock (orchestrator/sim: a virtual one)
        # the budget's last `final` evaluations re-evaluate the best observed points, `repeats` times more
        self.final = repeat_share(scheduler.budget, reevaluation[0])
        self.repeats = int(reevaluation[1])

    # ------------------------------------------------------------------ the threads
    def start(self) -> None:
        """Start the proposer and the refit threads (asynchronous mode)."""
        self.threads = [threading.Thread(target=self.loop, args=(role,), name=f"qbatch-{role}", daemon=True)
                        for role in ROLES]
        for t in self.threads:
            t.start()

    def join(self, timeout: float) -> None:
        for t in self.threads:
            t.join(timeout=timeout)

    def alive(self) -> bool:
        """Whether a planner thread still runs (it may still write to the log)."""
        return any(t.is_alive() for t in self.threads)

    def wake(self) -> None:
        for ev in self.wakes.values():
            ev.set()

    def loop(self, role: str) -> None:
        """Background loop of one planner thread: role "propose" or "refit"."""
        step = self.propose_step if role == "propose" else self.refit_step
        try:
            while not self.stop.is_set():
                if not step():
                    self.wakes[role].wait(0.1)
                    self.wakes[role].clear()
        except LogWriteError:  # the abort says what failed
            self.wake()
        except Exception as exc:
            self.error = f"{role}: {format_exception_traceback(exc)}"
            self.wake()

    # ------------------------------------------------------------------ steps
    def propose_step(self) -> bool:
        """Propose when the queue is low (before it runs dry). Returns whether it did something. The
        calibrator learns the results queued since the last proposal when the next one is asked
        (`AskTellOptimizer.ask`, in this thread only), and is checkpointed then (`ask_and_log`)."""
        remaining = self.scheduler.remaining()
        if remaining <= 0:
            return False
        queued = self.scheduler.queued()  # trials being submitted count as queued
        low = self.scheduler.low_water()
        if queued >= low:
            return False
        design_left = self.opt.design_left
        if design_left > 0:  # the initial design
            q = min(design_left, self.batch_size, remaining)
        elif self.opt.model is not None or not self.opt.needs_model():  # a model, or a proposer without one
            q = min(self.batch_size, remaining)
        else:
            # waiting for the first model: the dispatch loop gives free slots further Sobol points meanwhile
            # (`fill_before_first_model`); queued ones would hold the first model batch up behind them
            return False
        self.propose(q)
        return True

    def fill_before_first_model(self, freed: int = 0) -> bool:
        """Until the first model-based batch is queued, free slots get Sobol points from the dispatch loop
        directly. Returns whether there were free slots to fill (the dispatch loop then dispatches). `freed`:
        slots whose results have arrived but are still being written (`Dispatcher.dispatch` refills them).

        The first fit and the first proposal (which also pays one-off start-up costs) may take longer than
        the queued initial design lasts; the space-filling design simply continues meanwhile. Later
        proposals are kept ahead of the queue by `low_water` instead, so the budget goes to the model.
        """
        sched = self.scheduler
        with sched.lock:  # Sobol points being proposed (the initial design's last ones) will fill slots too
            # at a resume with a restored model the first model batch comes at once; without one (no usable
            # checkpoint) the slots would idle through the cold refit: they get Sobol points as at a start
            if (self.model_batches or self.model_restored or sched.queue or sched.reserved_sobol
                    or not self.opt.needs_model() or self.opt.design_left > 0):
                return False
            free = sched.free_slots() + freed
        q = min(free, sched.remaining())
        if q > 0:
            self.propose(q, design=True)
            return True
        return False

    def refit_step(self) -> bool:
        """Refit on new results (on a copy; swapped in when ready). Returns whether it did something."""
        if (
            self.scheduler.remaining() > 0  # a refit only matters for proposals still to come
            and self.opt.design_left == 0
            and self.opt.can_fit()
            and (self.opt.model is None or self.opt.num_stale > 0)
            and self.clock() - self.last_fit_end >= self.refit_interval_s
            and self.opt.num_completed != self.failed_fit_n  # after a failed fit: retry on new results only
        ):
            self.refit()
            return True
        return False

    def sync_step(self) -> None:
        """Papers' protocol: all of the last batch is in; refit, then propose the next batch of B."""
        remaining = self.scheduler.remaining()
        if remaining <= 0 or self.scheduler.queue:
            return
        design_left = self.opt.design_left
        if design_left > 0:
            self.propose(min(design_left, remaining))
            return
        if self.opt.can_fit() and (self.opt.model is None or self.opt.num_stale > 0):
            if not self.refit() and (self.abort.message or self.stop.is_set()):
                return  # (stopped during the fit: the run ends, and a resume proposes this batch)
        self.propose(min(self.batch_size, remaining))

    # ------------------------------------------------------------------ proposals
    def propose(self, q: int, design: bool = False) -> None:
        """Ask for up to `q` trials, log them and queue them. The dispatch loop (Sobol points before the first
        model) and the proposer thread may both propose: each reserves its share of the budget under the lock
        first, so that their batches together never pass the budget."""
        sched = self.scheduler
        with sched.lock:
            remaining = sched.remaining()
            q = min(q, remaining)
            if q <= 0 or self.stop.is_set():  # a stopped run asks for nothing more
                return
            sobol = design or self.opt.design_left > 0
            repeat = False
            if self.final and not sobol and self.opt.model is not None:
                # with a model to rank the points, the search stops where the budget's re-evaluations begin;
                # a proposer without a model (or a run still without one) searches to the end
                repeat = remaining <= self.final
                if not repeat:
                    q = min(q, remaining - self.final)
            sched.reserve(q, sobol)
        trials: list[Trial] = []
        try:
            trials = self.ask_and_log(q, design, repeat)
        finally:  # queued only once logged; the reservation ends either way
            sched.release(q, sobol, trials)

    def ask_and_log(self, q: int, design: bool, repeat: bool = False) -> list[Trial]:
        """`propose`'s work: ask for `q` trials (`repeat`: re-evaluations of the best observed points) and
        log them (a trial is logged before it can be dispatched)."""
        t0 = time.perf_counter()
        pending = self.opt.num_pending
        calibrated_before = self.opt.num_calibrated
        if repeat:
            trials = self.opt.ask_repeats(q, self.repeats, fit=False)
        else:
            trials = self.opt.ask(q, fit=False, design=design)
        seconds = time.perf_counter() - t0
        self.proposal_s.append(seconds)
        calibrated = None
        if trials and trials[0].source == "model":
            self.model_batches += 1
            self.scheduler.record_proposal(seconds)
            # how many results the calibrator had learned when this ask flushed it (only this thread flushes),
            # and (on the batch's first record) which ones this flush taught it: a replay without a calibrator
            # checkpoint rebuilds the ask's update from them (replay.py)
            calibrated = self.opt.num_calibrated if self.opt.calibrator is not None else None
        events = []
        for i, t in enumerate(trials):
            info = {
                "source": t.source,
                "seed": t.seed,
                "proposal_seconds": seconds,
                "q": q,
                "pending": pending,
                "slots": self.scheduler.max_concurrent,
                "session": self.session,
            }
            if calibrated is not None:
                info["calibrated"] = calibrated
                if i == 0:
                    info["learned_ids"] = self.opt.calibrated_ids(calibrated_before)
            if "sobol_index" in t.info:
                info["sobol_index"] = t.info["sobol_index"]
            if self.direction == "minimize":
                info["forecast_units"] = "negated (direction: minimize)"
            events.append(self.log.event("proposed", t, info=info, forecast=t.forecast))
        self.log.append(events)
        # this thread flushed the calibrator in `ask` (design points come from the dispatch loop).
        if not design:
            # Saved after the record of what it learned: a checkpoint behind the log is replayed exactly (the
            # records after it cut the rounds), one ahead of it would not be (saved first, a crash or a failed
            # write in between would leave a learned update no record marks)
            self.checkpoints.save_calibrator()
        return trials

    # ------------------------------------------------------------------ refits
    def refit(self, restart: bool = False, final: bool = False) -> bool:
        """Refit the surrogate and log it. A fit that raises leaves the current model in place (the optimizer
        swaps a new one in only when its fit succeeds), is logged with its traceback, and returns False;
        `max_refit_failures` in a row abort the run, except for the `final` fit after the last result (the run
        is done: its recommendation is then the previous model's). `restart`: see `AskTellOptimizer.fit`.
        Every fit but the final one stops when the run loop ends (`stop`), logging nothing and returning
        False: the final fit on every result replaces it, and the run's end does not wait for it (a streaming
        run's background refit on the results before the last ones)."""
        from orchestrator.errors import FitInterrupted

        t0 = time.perf_counter()
        n = self.opt.num_completed
        try:
            diag = self.opt.fit(restart=restart, stop=None if final else self.stop)
        except FitInterrupted:
            return False
        except Exception as exc:
            self.last_fit_end = self.clock()
            self.refit_failures += 1
            self.failed_in_a_row += 1
            self.failed_fit_n = n
            # capped like an objective's failure (head and tail kept), and safe from an exception whose
            # __str__ raises
            error = describe_exception(exc)
            info = {
                "failed": True,
                "error": error,
                "traceback": format_exception_traceback(exc),
                "n": n,
                "slots": self.scheduler.max_concurrent,
                "session": self.session,
                "direction": self.direction,
                "failed_in_a_row": self.failed_in_a_row,
                "elapsed_s": time.perf_counter() - t0,
                "kept": "previous model" if self.opt.model is not None else "Sobol design (no model yet)",
            }
            self.append_refit(info, final)
            self.notices.say(
                f"qbatch: refit on {n} results failed ({self.failed_in_a_row} in a row): {error}; the "
                f"run goes on with the {info['kept']}"
            )
            if self.failed_in_a_row >= self.max_refit_failures and not final:
                self.abort.set(f"{self.failed_in_a_row} refits in a row failed (max_refit_failures="
                               f"{self.max_refit_failures}); the last on {n} results: {error}")
                self.wake()
            return False
        self.last_fit_end = self.clock()
        self.last_fit_s = diag.get("seconds")
        self.refits += 1
        self.failed_in_a_row, self.failed_fit_n = 0, -1
        # the slots and the direction this session ran with: the report's utilization and best value read them
        self.append_refit({**diag, "slots": self.scheduler.max_concurrent, "session": self.session,
                           "direction": self.direction}, final)
        self.checkpoints.save_model()
        return True

    def final_fit(self) -> None:
        """The end of a session that was not aborted (its budget spent, or stopped): the model is refitted
        from scratch on every result, then the calibrator learns the results since the last ask
        (`session_end`). The final recommendation uses every result (after the evaluation span) and a fresh
        fit: a warm start can stay in the basin of a fit on the first few results (`AskTellOptimizer.fit`); a
        run that ended before its first model batch (a budget near `initial_design`) is fitted here too."""
        self.refit(restart=True, final=True)

    def append_refit(self, info: dict[str, Any], final: bool) -> None:
        """Log a refit's record, failed or not. The final fit's also carries the session's last calibrator
        flush (`session_end`), which is checkpointed once the record is written."""
        from orchestrator.store import Event

        if final:
            info.update(self.session_end())
        self.log.append([Event("refit", info=info)])
        if final and "calibrator_error" not in info:
            self.checkpoints.save_calibrator(force=True)

    def session_end(self) -> dict[str, Any]:
        """The calibrator learns the results told since the last ask (`refit` checkpoints it once the record
        is written, as `ask_and_log` does); returns what the final fit's record, appended right after, says of
        it (`final`, and with a calibrator `calibrated`, how many it has learned in all, and `learned_ids`,
        the results this flush taught it), so that a replay without the checkpoint ends that update there too
        (replay.py) and does not merge it with the next session's first. A flush that raises is reported and
        leaves the fit and its record as they are. It runs after the final fit, not before: a session killed
        during that fit (it may take minutes) flushed nothing, so its replay agrees with its checkpoint
        (flushed and checkpointed first, it would have learned results whose update no record marks)."""
        before = self.opt.num_calibrated
        try:
            self.opt.flush_calibration()
        except Exception as exc:  # noqa: BLE001 - the fitted model and its record are kept
            # not checkpointed: a resume restores the last checkpoint and teaches it these results from
            # the log
            error = describe_exception(exc)
            self.notices.say(
                f"qbatch: the calibrator could not learn the session's last results ({error}); a "
                "resume teaches them again from the log"
            )
            return {"final": True, "calibrator_error": error}
        if self.opt.calibrator is None:
            return {"final": True}
        return {
            "final": True,
            "calibrated": self.opt.num_calibrated,
            "learned_ids": self.opt.calibrated_ids(before),
        }
