"""The timeout backstop: an evaluation whose worker is frozen is cancelled at a deadline and recorded as
failed.

`timeout_s` is enforced inside the worker (workers/evaluate.py); this is the backstop for a worker that cannot
enforce it because it is frozen itself (SIGSTOP, hung NFS, a swap storm). The dispatcher (`dispatch.py`) asks
it, at each wait for results, which evaluations in flight are past their deadline, and records each as a
failed 'timeout' trial (`timeout_record`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from workers.records import TrialResult

if TYPE_CHECKING:
    from orchestrator.ask_tell import Trial

__all__ = ["Backstop", "timeout_record"]


class Backstop:
    """Finds and cancels the evaluations in flight past their deadline.

    Args:
        pool: the run's `EvaluationPool` actor (it reports when each attempt starts, and cancels), or None
            (the actor's own tasks, cancelled with `ray.cancel`; deadlines count from dispatch).
        timeout_s: the config's `timeout_s` of one evaluation (inf: no backstop).
        max_retries: the config's `max_retries` (Ray retries of an evaluation whose worker was lost).
    """

    def __init__(self, pool: Any, timeout_s: float, max_retries: int) -> None:
        self.pool = pool
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        # start times the pool reported, and when they were last asked for
        self._starts: dict[str, float] | None = None
        self._starts_asked = -math.inf

    def expired(self, refs: list[Any], inflight: Mapping[Any, tuple[Any, float, int]]) -> dict[Any, float]:
        """The evaluations of `refs` past their deadline, cancelled (force: the worker process is killed): ref
        -> when its latest attempt started (its dispatch when that is unknown). `inflight`: ref -> (trial,
        dispatch time, attempt), the scheduler's table.

        Through the pool, each attempt reports when it starts running, and the deadline counts from the latest
        start: an evaluation that waits in Ray's queue (more in flight than the cluster runs at once) is never
        cut short. It allows every Ray retry its full timeout plus a grace period, since a retry after a lost
        worker may itself wait in the queue before it reports its start. A new sandbox reports again once it
        has imported and once it has built the objective (the build has a timeout_s of its own). Without start
        reports (no pool, or the pool does not answer) the deadline counts from dispatch and allows each
        attempt a build too.
        """
        limit = self.timeout_s
        if not refs or not math.isfinite(limit):
            return {}
        grace = max(5.0, 0.25 * limit)
        # from an attempt's latest start report: a new sandbox re-reports after its import and its build
        deadline = (1 + self.max_retries) * limit + grace
        # from dispatch: each attempt may also build the objective first, with a timeout_s of its own
        from_dispatch = 2 * (1 + self.max_retries) * limit + grace
        now = time.time()
        late = [ref for ref in refs if now - inflight[ref][1] > deadline]  # none can expire sooner
        if not late:
            return {}
        starts = self.start_times([inflight[ref][0].trial_id for ref in late], now)
        expired: dict[Any, float] = {}
        for ref in late:
            trial, dispatched, _ = inflight[ref]
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
                self.pool.cancel.remote([inflight[ref][0].trial_id for ref in expired])
            else:
                for ref in expired:
                    try:
                        ray.cancel(ref, force=True)
                    except Exception:  # already finished or its worker is gone: nothing left to stop
                        pass
        return expired

    def start_times(self, trial_ids: list[str], now: float) -> dict[str, float] | None:
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


def timeout_record(trial: Trial, started: float, timeout_s: float) -> TrialResult:
    """A failed 'timeout' result for an evaluation that gave no result long past its deadline (`started`: when
    its latest attempt started, or its dispatch when that is unknown)."""
    now = time.time()
    message = (
        f"no result {now - started:.0f} s after it started (timeout_s={timeout_s:g}); the worker did not "
        "enforce its timeout (frozen?) and was cancelled"
    )
    return TrialResult.failure("timeout", message, None, started, now, trial_id=trial.trial_id)
