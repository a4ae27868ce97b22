"""The central actor's writes to the run's event log (orchestrator/store): durable before they are acknowledged.

The dispatch loop and the planner threads both write (results, proposals, refits), one append at a time. The
"started" records of dispatched evaluations are buffered and ride along with the next write (or a flush at least
every second, `central.py`). A write that fails (a full disk, storage gone) stops the run: nothing more is
written, and everything logged before it is kept for `qbatch resume`.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any, Callable

from orchestrator.actor.guard import AbortCause
from orchestrator.errors import QbatchError

if TYPE_CHECKING:
    from orchestrator.ask_tell import Trial
    from orchestrator.store import Event, RunStore
    from workers.records import TrialResult

__all__ = ["LogWriteError", "RunLog"]


class LogWriteError(QbatchError):
    """An append to the run's event log failed; the actor stops the run (its message is the abort's)."""


class RunLog:
    """Appends the actor's events to its `RunStore`, after the buffered "started" ones.

    Args:
        store: the run's `RunStore` (its writer lock held).
        run_dir: the run directory (named by the message of a failed write).
        lock: the lock that guards `started` (the scheduler's: the dispatcher buffers under it).
        abort: the run's `AbortCause`; a failed write sets it.
        on_failure: called after a failed write has set the abort (wakes the planner threads).
    """

    def __init__(self, store: RunStore, run_dir: str, lock: Any, abort: AbortCause,
                 on_failure: Callable[[], None]) -> None:
        self.store = store
        self.run_dir = run_dir
        self.lock = lock
        self.abort = abort
        self.on_failure = on_failure
        self.write_lock = threading.Lock()  # RunStore is written from the loop and the planner
        self.started: list[Event] = []  # "started" events not yet written
        self.last_flush = time.time()
        self.failed = False  # an append raised (disk full, storage gone): stop, write nothing

    @staticmethod
    def event(kind: str, trial: Trial, **fields: Any) -> Event:
        """An `Event` of `kind` for `trial` (its id, batch, params and unit-cube point) with `fields`."""
        from orchestrator.store import Event

        return Event(kind, trial.trial_id, batch_id=trial.batch_id, params=dict(trial.params),
                     x=[float(v) for v in trial.x.tolist()], **fields)

    @classmethod
    def result_event(cls, trial: Trial, result: TrialResult, attempt: int, session: float) -> Event:
        """The `completed` or `failed` event of `trial`'s `result` (docs/event-log.md "Schema").

        The result's fields of the event's names are copied (`value` only when completed); its `metrics`,
        `child_pid`, `message` and `metrics_dropped` (the last two when there are any) go into `info`, with
        `session`: when this actor started. The report sums utilization's span over sessions (a resume or a
        restart starts one), so the time a stopped run waited for `qbatch resume` is not idle slot time.
        """
        info: dict[str, Any] = {"metrics": result.metrics or {}, "child_pid": result.child_pid, "session": session}
        if result.message:
            info["message"] = result.message
        if result.metrics_dropped:
            info["metrics_dropped"] = result.metrics_dropped
        return cls.event(
            result.status, trial, time=time.time(), value=result.value if result.status == "completed" else None,
            node_id=result.node_id, pid=result.pid, started_at=result.started_at, ended_at=result.ended_at,
            attempt=attempt, error=result.error, traceback=result.traceback, info=info,
        )

    def append(self, events: list[Event]) -> None:
        """Write `events` (after the buffered "started" ones) to the log, durably.

        Raises:
            LogWriteError: the write failed (e.g. the disk is full); the abort then says so and the run stops.
        """
        with self.write_lock:
            if self.failed:
                raise LogWriteError(self.abort.message or "the run log cannot be written")
            with self.lock:
                buf, self.started = self.started, []
            batch = buf + list(events)
            if batch:
                try:
                    self.store.append(batch)
                except OSError as exc:
                    self.failed = True
                    lost = sum(e.kind in ("completed", "failed") for e in events)
                    self.abort.set(
                        f"writing the run log in {self.run_dir} failed ({type(exc).__name__}: {exc})"
                        + (f"; the {lost} result{'s' if lost > 1 else ''} being written {'were' if lost > 1 else 'was'} not "
                           "recorded" if lost else "")
                        + f". Everything logged before is kept: once the cause is fixed, `qbatch resume "
                        f"{self.run_dir}` finishes the run (evaluations whose results are not in the log run again)",
                        add=True)
                    self.on_failure()
                    raise LogWriteError(self.abort.message) from exc
            self.last_flush = time.time()
