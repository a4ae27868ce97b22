"""The central actor's slot scheduler (orchestrator/actor/scheduler.py) on its own, without Ray or a model:
queue order, the budget count with reservations and submissions under way, the low-water mark, in-flight
accounting, and what becomes of a trial whose evaluation is lost or timed out."""

from __future__ import annotations

import subprocess
import sys
import threading
from dataclasses import dataclass

import pytest

from orchestrator.actor.scheduler import SlotScheduler
from workers.records import TrialResult


@dataclass(frozen=True)
class _Trial:
    trial_id: str


def _trials(*ids: str) -> list[_Trial]:
    return [_Trial(t) for t in ids]


def _ids(trials) -> list[str]:
    return [t.trial_id for t in trials]


def _scheduler(
    max_concurrent: int = 2, budget: int = 10, queue_low: int = 2, batch_size: int = 4
) -> SlotScheduler:
    return SlotScheduler(
        max_concurrent=max_concurrent, budget=budget, queue_low=queue_low, batch_size=batch_size
    )


def _record(status: str = "completed", error: str | None = None, started_at: float | None = 10.0,
            ended_at: float | None = 13.0) -> TrialResult:
    return TrialResult(status, error=error, started_at=started_at, ended_at=ended_at)


def test_importing_and_running_the_scheduler_needs_no_ray():
    code = (
        "import sys; from orchestrator.actor.scheduler import SlotScheduler; s = SlotScheduler(2, 4, 2, 2); "
        "s.remaining(); s.low_water(); print('ray' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


# ---------------------------------------------------------------------------------------------- queue order
def test_trials_leave_the_queue_first_in_first_out_into_the_free_slots():
    s = _scheduler(max_concurrent=2)
    s.queue.extend(_trials("a", "b", "c"))
    batch = s.take()
    assert [(t.trial_id, attempt) for t, attempt in batch] == [("a", 0), ("b", 0)]
    assert _ids(s.queue) == ["c"] and s.submitting == 2
    s.started(batch, ["ra", "rb"], now=5.0)
    assert s.submitting == 0 and s.first_dispatch == 5.0
    assert s.inflight == {"ra": (batch[0][0], 5.0, 0), "rb": (batch[1][0], 5.0, 0)}
    assert s.take() == [] and s.submitting == 0  # every slot busy
    s.started([], [], now=9.0)
    assert s.first_dispatch == 5.0  # the first dispatch of the session stays


def test_a_failed_submission_puts_its_trials_back_in_front_in_order():
    s = _scheduler(max_concurrent=2)
    s.queue.extend(_trials("a", "b", "c"))
    batch = s.take()
    s.put_back(batch)
    assert _ids(s.queue) == ["a", "b", "c"] and s.submitting == 0 and not s.inflight


def test_freed_slots_are_refilled_before_their_results_are_told_but_the_budget_still_counts_them():
    s = _scheduler(max_concurrent=2, budget=3)
    s.queue.extend(_trials("a", "b", "c", "d"))
    s.started(s.take(), ["ra", "rb"], now=0.0)
    # both results arrived, not yet logged: their slots are free, but only one more trial fits the budget of 3
    assert _ids(t for t, _ in s.take(freed=2)) == ["c"]
    assert _ids(s.queue) == ["d"]


def test_attempts_are_numbered_across_replayed_starts_and_adopted_evaluations():
    s = _scheduler(max_concurrent=3)
    s.saw_attempt("a", 0)
    s.saw_attempt("a", 2)
    s.saw_attempt("a", 1)  # an older record does not lower the count
    s.queue.extend(_trials("a", "b"))
    assert [(t.trial_id, attempt) for t, attempt in s.take()] == [("a", 3), ("b", 0)]
    assert s.attempts == {"a": 4, "b": 1}


def test_after_a_restart_evaluations_the_pool_holds_are_adopted_and_the_rest_stay_queued():
    s = _scheduler(max_concurrent=4)
    s.queue.extend(_trials("a", "b", "c"))
    assert s.adopt({"b": ("ref-b", 1, 42.0), "z": ("ref-z", 0, 1.0)}) == 1  # z: not this run's unfinished
    assert _ids(s.queue) == ["a", "c"]
    assert s.inflight == {"ref-b": (_Trial("b"), 42.0, 1)} and s.attempts == {"b": 2}


# ---------------------------------------------------------------------------------------------- the budget
def test_every_state_of_a_trial_counts_against_the_budget():
    s = _scheduler(max_concurrent=2, budget=10)
    assert s.remaining() == 10
    s.queue.extend(_trials("a", "b", "c"))
    assert s.remaining() == 7
    batch = s.take()  # being submitted
    assert s.remaining() == 7 and s.queued() == 3
    s.started(batch, ["ra", "rb"], now=0.0)  # in flight
    assert s.remaining() == 7 and s.queued() == 1 and s.free_slots() == 0
    s.reserve(2, sobol=False)  # being proposed
    assert s.remaining() == 5
    s.free("ra")
    s.count(_record())  # done
    assert s.remaining() == 5 and s.n_done == 1 and s.free_slots() == 1


def test_a_reservation_ends_with_its_trials_queued_or_with_nothing_when_the_proposal_failed():
    s = _scheduler(budget=8)
    s.reserve(4, sobol=True)
    assert (s.reserved, s.reserved_sobol, s.remaining()) == (4, 4, 4)
    s.reserve(2, sobol=False)
    assert (s.reserved, s.reserved_sobol, s.remaining()) == (6, 4, 2)
    s.release(4, True, _trials("a", "b", "c", "d"))
    assert (s.reserved, s.reserved_sobol, s.remaining()) == (2, 0, 2) and _ids(s.queue) == [
        "a",
        "b",
        "c",
        "d",
    ]
    s.release(2, False, [])  # the proposal raised: its share of the budget is free again
    assert (s.reserved, s.reserved_sobol, s.remaining()) == (0, 0, 4)


def test_a_reservation_under_the_lock_keeps_two_proposers_within_the_budget():
    """The proposer thread and the dispatch loop each cap their ask by `remaining` and reserve it under the
    lock (planner.py `propose`): however they interleave, their asks together never pass the budget."""
    s = _scheduler(budget=7)
    asked: list[int] = []
    start = threading.Barrier(4)

    def propose(q: int) -> None:
        start.wait()
        for _ in range(50):
            with s.lock:
                n = min(q, s.remaining())
                if n <= 0:
                    return
                s.reserve(n, sobol=False)
            asked.append(n)
            s.release(n, False, _trials(*(f"{len(asked)}-{i}" for i in range(n))))

    threads = [threading.Thread(target=propose, args=(q,)) for q in (1, 2, 3, 4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert sum(asked) == len(s.queue) == 7 and s.reserved == 0 and s.remaining() == 0


def test_nothing_is_taken_past_the_budget():
    s = _scheduler(max_concurrent=4, budget=3)
    s.n_completed = 2  # replayed
    s.queue.extend(_trials("a", "b"))
    assert _ids(t for t, _ in s.take()) == ["a"] and _ids(s.queue) == ["b"]


# ---------------------------------------------------------------------------------------------- low water
@pytest.mark.parametrize("max_concurrent, batch_size, queue_low", [(2, 4, 2), (8, 4, 5), (3, 16, 1)])
def test_the_low_water_mark_is_queue_low_until_proposal_and_evaluation_times_are_known(
    max_concurrent, batch_size, queue_low
):
    s = _scheduler(max_concurrent=max_concurrent, batch_size=batch_size, queue_low=queue_low)
    assert s.low_water() == queue_low
    s.record_proposal(30.0)
    assert s.low_water() == queue_low  # no evaluation time yet


def test_the_low_water_mark_keeps_every_slot_busy_through_one_and_a_half_proposal_times():
    s = _scheduler(max_concurrent=4, batch_size=8, queue_low=2)
    s.record_proposal(2.0)
    s.count(_record(started_at=0.0, ended_at=4.0))
    assert s.prop_ema == 2.0 and s.eval_ema == 4.0
    assert s.low_water() == 3  # ceil(1.5 * 4 slots * 2 s / 4 s)
    s.record_proposal(12.0)  # moving average: 0.7 * 2 + 0.3 * 12 = 5
    assert s.prop_ema == pytest.approx(5.0) and s.low_water() == 8  # ceil(1.5 * 4 * 5 / 4)
    s.record_proposal(1000.0)
    assert s.low_water() == 32  # capped at four batches (or four times the slots)
    s.queue_low = 50
    assert s.low_water() == 32


def test_evaluation_times_are_a_slow_moving_average():
    s = _scheduler()
    s.count(_record(started_at=0.0, ended_at=10.0))
    s.count(_record(started_at=0.0, ended_at=30.0))
    assert s.eval_ema == pytest.approx(0.95 * 10.0 + 0.05 * 30.0) and s.busy_s == 40.0


# ---------------------------------------------------------------------------------------------- results
def test_told_results_are_counted_once_each_as_completed_or_failed_with_their_busy_time():
    s = _scheduler(max_concurrent=3)
    s.queue.extend(_trials("a", "b", "c"))
    batch = s.take()
    s.started(batch, ["ra", "rb", "rc"], now=0.0)
    assert s.free("ra") == (batch[0][0], 0.0, 0)
    s.count(_record("completed", started_at=1.0, ended_at=3.0))
    s.free("rb")
    s.count(_record("failed", error="exception", started_at=1.0, ended_at=5.0))
    s.free("rc")
    s.count(_record("failed", error="exception", started_at=None, ended_at=None))  # no times: no busy time
    assert (s.n_completed, s.n_failed, s.n_done, s.n_done_session) == (1, 2, 3, 3)
    assert s.busy_s == 6.0 and not s.inflight and s.free_slots() == 3


def test_a_timed_out_evaluation_is_a_failure_whose_time_counts_as_busy():
    s = _scheduler()
    s.queue.extend(_trials("a"))
    s.started(s.take(), ["ra"], now=0.0)
    s.free("ra")
    # backstop.py `timeout_record`
    s.count(_record("failed", error="timeout", started_at=100.0, ended_at=400.0))
    assert (s.n_failed, s.busy_s, s.eval_ema) == (1, 300.0, 300.0)


def test_a_lost_worker_is_a_failure_without_busy_time():
    """A lost worker's record spans its dispatch to the loss (dispatch.py `lost_record`), not an
    evaluation."""
    s = _scheduler()
    s.queue.extend(_trials("a"))
    s.started(s.take(), ["ra"], now=0.0)
    s.free("ra")
    s.count(_record("failed", error="worker-lost", started_at=0.0, ended_at=50.0))
    assert (s.n_failed, s.n_done_session, s.busy_s, s.eval_ema) == (1, 1, 0.0, None)


def test_an_evaluation_that_will_never_report_runs_again_first():
    """Its owner died with it (the pool's `OwnerDiedError`): nothing was recorded, so it is not a failure; the
    trial goes to the front of the queue, the last one requeued first."""
    s = _scheduler(max_concurrent=2)
    s.queue.extend(_trials("a", "b", "c"))
    s.started(s.take(), ["ra", "rb"], now=0.0)
    s.requeue("ra")
    s.requeue("rb")
    assert _ids(s.queue) == ["b", "a", "c"] and not s.inflight and s.n_done == 0
    assert s.remaining() == s.budget - 3
    assert [(t.trial_id, attempt) for t, attempt in s.take()] == [("b", 1), ("a", 1)]  # their next attempts
