"""Why a run stops early: the failure-rate guard, and the one cause every part of the central actor reports
to.

The guard (config `failure_guard`) stops a run whose evaluations of this session fail too often; the planner
(refit failures in a row, an error of its own), the dispatcher (a submission Ray refuses) and the event log (a
failed write) stop it too. Each states its cause through one `AbortCause`; the run loop ends on it, its
summary's status is "aborted" with that message, and the driver raises `RunAbortedError`.
"""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING, Any

from orchestrator.errors import QbatchError

if TYPE_CHECKING:
    from orchestrator.actor.scheduler import SlotScheduler
    from orchestrator.ask_tell import AskTellOptimizer

__all__ = ["AbortCause", "FailureGuard", "RunAbortedError"]


class RunAbortedError(QbatchError):
    """The run stopped early: the failure-rate guard tripped, or the planner failed."""


class AbortCause:
    """The message of the run's abort (None while it goes on); every part of the actor reads and sets this
    one."""

    def __init__(self) -> None:
        self.message: str | None = None

    def set(self, message: str, add: bool = False) -> None:
        """Stop the run for `message`. The first cause stands: a later one never replaces it (the failure
        guard, tripped by the results drained after a planner error, would overwrite the planner's traceback,
        which only this message records) and is added to it only with `add` (a planner error, a failed log
        write), once."""
        if self.message is None:
            self.message = message
        elif add and message not in self.message:
            self.message += f"; then {message}"


class FailureGuard:
    """Stops the run when too many of this session's evaluations fail (`failure_guard`).

    Args:
        config: the config's `failure_guard` (`max_failure_rate`, `min_trials`).
        scheduler: the session's `SlotScheduler` (its result counts are the run's totals).
        opt: the run's `AskTellOptimizer` (its `failures` say why they failed).
        abort: the run's `AbortCause`.
        run_dir: the run directory (the message points to its 'failed' events).
        base: (results, failures) replayed from the log at a resume: they do not count, so a run the guard
            stopped is resumed once the cause is fixed.
    """

    def __init__(self, config: Any, scheduler: SlotScheduler, opt: AskTellOptimizer, abort: AbortCause,
                 run_dir: str, base: tuple[int, int] = (0, 0)) -> None:
        self.config = config
        self.scheduler = scheduler
        self.opt = opt
        self.abort = abort
        self.run_dir = run_dir
        self.base = base

    def trips(self, n_done: int, n_failed: int) -> bool:
        """Whether `n_failed` failures in `n_done` results (run totals) stop the run: only the results of this
        session count, those replayed from the log at a resume do not."""
        guard = self.config
        n, f = n_done - self.base[0], n_failed - self.base[1]
        return n >= guard.min_trials and n > 0 and f / n > guard.max_failure_rate

    def check(self) -> None:
        """Abort the run if the results counted so far trip the guard, naming the reasons and the most
        frequent message of this session's failures."""
        guard = self.config
        n_done, n_failed = self.scheduler.n_done, self.scheduler.n_failed
        if self.trips(n_done, n_failed):
            n, f = n_done - self.base[0], n_failed - self.base[1]
            failures = self.opt.failures[self.base[1]:]
            reasons = collections.Counter(x["error"] for x in failures)
            # the most frequent message says why (one cluster node without the user's module fails every
            # evaluation it takes, and the reasons alone say only "reasons {'exception': 10}")
            firsts = (str(x.get("message") or "").strip().splitlines()[:1] for x in failures)
            messages = collections.Counter(line[0][:300] for line in firsts if line)
            top = ""
            if messages:
                text, count = messages.most_common(1)[0]
                top = f"; most frequent message ({count} of {f}): {text}"
            since = " since the resume" if self.base[0] else ""
            self.abort.set(
                f"failure guard: {f} of {n} evaluations failed{since} "
                f"({f / n:.0%} > failure_guard.max_failure_rate={guard.max_failure_rate:g}); "
                f"reasons {dict(reasons)}{top}; see the 'failed' events in {self.run_dir} for tracebacks"
            )
