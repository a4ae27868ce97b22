"""The central actor's writes to the run's event log (orchestrator/store): durable before acknowledged.

The dispatch loop and the planner threads both write (results, proposals, refits). Appends that come while one
is being written share the next write, one segment and one fsync (group commit), and each returns only once
its events are durable. The "started" records of dispatched evaluations are buffered and ride along with the
next write (or a flush at least every second, `central.py`). A write that fails (a full disk, storage gone)
stops the run: nothing more is written, and everything logged before it is kept for `qbatch resume`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

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
        # group commit (`append`): the appends queued (ticket, events), the last ticket handed out and the
        # last one written, whether a writer is at work, and the errors of appends another writer wrote
        self.commit = threading.Condition(threading.Lock())
        self.pending: list[tuple[int, list[Event]]] = []
        self.queued = 0
        self.committed = 0
        self.writing = False
        self.errors: dict[int, Exception] = {}
        self.lost_tickets: set[int] = set()  # appends in the write that failed
        # the writer thread (`append_async`): its queue of (events, acknowledgement) and whether it is writing
        self.async_queue: list[tuple[list[Event], Callable[[], None]]] = []
        self.async_busy = False
        self.writer: threading.Thread | None = None
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
        info: dict[str, Any] = {"metrics": result.metrics or {}, "child_pid": result.child_pid,
                                "session": session}
        if result.message:
            info["message"] = result.message
        if result.metrics_dropped:
            info["metrics_dropped"] = result.metrics_dropped
        return cls.event(
            result.status, trial, time=time.time(),
            value=result.value if result.status == "completed" else None,
            node_id=result.node_id, pid=result.pid, started_at=result.started_at, ended_at=result.ended_at,
            attempt=attempt, error=result.error, traceback=result.traceback, info=info,
        )

    def append(self, events: list[Event]) -> None:
        """Write `events` (after the buffered "started" ones) to the log, durably: on return they are fsynced.

        Group commit: an append that comes while another one writes waits, and the next writer takes
        everything queued meanwhile (the planners' proposals and refits, the loop's results, the "started"
        records) into one segment, one fsync. No append returns before the write that holds its events.

        Raises:
            LogWriteError: the write failed (e.g. the disk is full); the abort then says so and the run stops.
            StoreError: an event of `events` is malformed (the message names it); nothing of it is written.
        """
        with self.commit:
            if self.failed:
                raise LogWriteError(self.abort.message or "the run log cannot be written")
            self.queued += 1
            ticket = self.queued
            self.pending.append((ticket, list(events)))
            while self.writing and ticket > self.committed and not self.failed:
                self.commit.wait()
            if ticket <= self.committed:  # another writer wrote them
                return self._outcome(ticket)
            if self.failed:
                raise LogWriteError(self.abort.message or "the run log cannot be written")
            self.writing = True
            groups, self.pending = self.pending, []
        errors: dict[int, Exception] = {}
        try:
            errors = self._write(groups)
        finally:  # the other appends' errors are theirs to raise, set before they are woken
            with self.commit:
                self.errors.update((t, exc) for t, exc in errors.items() if t != ticket)
                self.writing = False
                self.committed = max(self.committed, groups[-1][0])
                self.commit.notify_all()
        if ticket in errors:
            raise errors[ticket]

    def append_async(self, events: list[Event], acknowledge: Callable[[], None]) -> None:
        """Queue `events` for the writer thread and return at once; `acknowledge` is called (in that thread)
        once they are durable, never before. The writer takes everything queued since its last write into one
        `append` (one segment, one fsync, shared with the planners' appends that come meanwhile), then calls
        the acknowledgements in the order they were queued. A failed write acknowledges none of its events
        (the abort says why, as `append`'s); `failed` is then set.

        Raises:
            LogWriteError: an earlier write failed; nothing more is written.
        """
        with self.commit:
            if self.failed:
                raise LogWriteError(self.abort.message or "the run log cannot be written")
            self.async_queue.append((list(events), acknowledge))
            if self.writer is None:
                self.writer = threading.Thread(target=self._writer_loop, name="qbatch-log-writer",
                                               daemon=True)
                self.writer.start()
            self.commit.notify_all()

    def wait_written(self, timeout: float | None = None) -> bool:
        """Wait until the writer thread has written and acknowledged everything queued (or a write failed), up
        to `timeout` seconds; returns whether it has."""
        deadline = None if timeout is None else time.time() + timeout
        with self.commit:
            while (self.async_queue or self.async_busy) and not self.failed:
                left = None if deadline is None else deadline - time.time()
                if left is not None and left <= 0:
                    return False
                self.commit.wait(left)
            return True

    def _writer_loop(self) -> None:
        """The writer thread: one `append` of everything queued, then its acknowledgements, until a write
        fails."""
        while True:
            with self.commit:
                while not self.async_queue:
                    self.commit.wait()
                jobs, self.async_queue = self.async_queue, []
                self.async_busy = True
            try:
                self.append([e for events, _ in jobs for e in events])
                for _, acknowledge in jobs:
                    acknowledge()
            except Exception as exc:  # noqa: BLE001 -- the run stops; the abort says why
                with self.commit:
                    self.failed = True
                if not isinstance(exc, LogWriteError):  # (a failed write has set the abort already)
                    self.abort.set(f"recording results failed ({type(exc).__name__}: {exc}); everything "
                                   f"logged before is kept for `qbatch resume {self.run_dir}`", add=True)
                    self.on_failure()
            finally:
                with self.commit:
                    self.async_busy = False
                    self.commit.notify_all()
            if self.failed:
                return

    def _outcome(self, ticket: int) -> None:
        """Under `commit`: the error of an append another writer wrote (raised), if it had one."""
        exc = self.errors.pop(ticket, None)
        if exc is not None:
            raise exc
        if self.failed and ticket in self.lost_tickets:
            raise LogWriteError(self.abort.message or "the run log cannot be written")

    def _write(self, groups: list[tuple[int, list[Event]]]) -> dict[int, Exception]:
        """One segment of the buffered "started" events and every queued group (ticket, events); returns the
        error of each group that was not written. A malformed group (a `StoreError` before anything touches
        the disk) is left out on its own: the others are written without it."""
        from orchestrator.store import _encode

        with self.lock:
            buf, self.started = self.started, []
        errors: dict[int, Exception] = {}
        try:
            self._store(buf + [e for _, g in groups for e in g], groups)
        except LogWriteError:
            raise
        except Exception:  # a malformed event (nothing written): find its group, write the others together
            if len(groups) == 1:
                with self.lock:  # the "started" records go with the next write
                    self.started[:0] = buf
                raise
            good = []
            for t, g in groups:
                try:
                    _encode(g, 0)
                    good.append((t, g))
                except Exception as exc:  # noqa: BLE001 -- that append's own error, raised to its caller
                    errors[t] = exc
            try:
                self._store(buf + [e for _, g in good for e in g], good)
            except LogWriteError:
                raise
            except Exception as exc:  # noqa: BLE001 -- not written: every append of the write raises it
                errors.update((t, exc) for t, _ in good)
                with self.lock:
                    self.started[:0] = buf
        self.last_flush = time.time()
        return errors

    def _store(self, batch: list[Event], groups: list[tuple[int, list[Event]]]) -> None:
        """Append `batch` to the store (nothing when empty); a failed write stops the run (LogWriteError)."""
        if not batch:
            return
        try:
            self.store.append(batch)
        except OSError as exc:
            with self.commit:
                self.failed = True
                self.lost_tickets.update(t for t, _ in groups)
            lost = sum(e.kind in ("completed", "failed") for _, g in groups for e in g)
            self.abort.set(
                f"writing the run log in {self.run_dir} failed ({type(exc).__name__}: {exc})"
                + (f"; the {lost} result{'s' if lost > 1 else ''} being written "
                   f"{'were' if lost > 1 else 'was'} not recorded" if lost else "")
                + f". Everything logged before is kept: once the cause is fixed, `qbatch resume "
                f"{self.run_dir}` finishes the run (evaluations whose results are not in the log run again)",
                add=True)
            self.on_failure()
            raise LogWriteError(self.abort.message) from exc
