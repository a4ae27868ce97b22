"""Rebuilding the central actor from its run's event log: a resume, or a restart after a crash.

The actor replays proposals and results (each result exactly once, in log order) into its optimizer and
re-queues the trials that never finished, first and in proposal order. The calibrator's updates are cut where
the log says the run flushed it (a model batch's first proposal, a session's final fit), so a replay without
the calibrator checkpoint learns the results in the chunks the run did. After a restart the actor adopts the
evaluations its `EvaluationPool` (workers/pool.py) still holds, running or finished while it was down, instead
of re-running them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from orchestrator.actor.scheduler import SlotScheduler

if TYPE_CHECKING:
    from orchestrator.ask_tell import AskTellOptimizer
    from orchestrator.store import Event

__all__ = ["Replayed", "end_calibration_round", "readopt", "replay_log"]


@dataclass
class Replayed:
    """What a replay found: `events` records, the trial ids with a result (`finished`), the unfinished trials
    re-queued (`unfinished`), and how many of those the pool still held (`readopted`: in flight again)."""

    events: int
    finished: set[str]
    unfinished: int
    readopted: int


def replay_log(
    opt: AskTellOptimizer, events: list[Event], scheduler: SlotScheduler, pool: Any = None
) -> Replayed:
    """Rebuild `opt` from the log's `events`: proposals, then results exactly once, in log order. The results
    are counted in `scheduler`, the attempts started too, and the trials that never finished are queued (or,
    with `pool`, in flight again where it still holds their evaluations)."""
    finished: set[str] = set()
    n_completed = n_failed = 0
    model_batches: set[int] = set()
    for ev in events:
        if ev.kind == "proposed" and not opt.has_trial(ev.trial_id):
            info = ev.info or {}
            if info.get("source") == "model" and ev.batch_id is not None and ev.batch_id not in model_batches:
                # that batch's ask flushed the calibrator's queue: the results logged before it are one
                # update, but for those told while the ask ran (logged before its batch, the next ask's),
                # which the count the ask logged sets apart (planner.py `ask_and_log`)
                model_batches.add(ev.batch_id)
                end_calibration_round(opt, info)
            opt.restore_trial(
                ev.trial_id, ev.params or {}, ev.x or [], ev.batch_id if ev.batch_id is not None else -1,
                forecast=ev.forecast, seed=info.get("seed"), source=info.get("source", "sobol"),
                sobol_index=info.get("sobol_index"),
            )
        elif ev.kind == "refit" and (ev.info or {}).get("final"):
            end_calibration_round(opt, ev.info)  # the end of a session flushed the calibrator (`session_end`)
        elif ev.kind == "started":
            scheduler.saw_attempt(ev.trial_id, ev.attempt)
        elif ev.kind in ("completed", "failed") and ev.trial_id not in finished:
            finished.add(ev.trial_id)
            if not opt.has_trial(ev.trial_id):  # its "proposed" record was lost (damaged segment)
                _restore_from(opt, ev)
            if ev.kind == "completed":
                opt.tell(ev.trial_id, ev.value)
                n_completed += 1
            else:
                opt.tell(
                    ev.trial_id, None, error=ev.error or "exception", message=(ev.info or {}).get("message")
                )
                n_failed += 1
    scheduler.n_completed, scheduler.n_failed = n_completed, n_failed
    # trials proposed (maybe started) that never finished go first, in proposal order
    scheduler.queue.extend(opt.pending())
    unfinished = len(scheduler.queue)
    readopted = readopt(pool, scheduler, finished) if pool is not None else 0
    return Replayed(events=len(events), finished=finished, unfinished=unfinished, readopted=readopted)


def end_calibration_round(opt: AskTellOptimizer, info: Mapping[str, Any]) -> None:
    """The replay at a record of a calibrator flush (a model batch's first proposal, a session's final fit):
    its `learned_ids` (absent from logs of older versions) name the results that flush taught the calibrator,
    `calibrated` how many it had learned in all (on every proposal of the batch: the first one's record may be
    lost). The ids are exact across sessions and after a damaged part of the log; the count is shifted by
    results a damaged log lost (a count of the flush's results alone would be shifted by a resumed session's
    first flush too, which teaches the results of several rounds)."""
    ids = info.get("learned_ids")
    if isinstance(ids, list):
        opt.end_calibration_round(learned_ids=[str(t) for t in ids])
        return
    after = info.get("calibrated")
    opt.end_calibration_round(after=after if isinstance(after, int) and not isinstance(after, bool) else None)


def readopt(pool: Any, scheduler: SlotScheduler, finished: set[str]) -> int:
    """After a restart: evaluations the pool still holds (running, or finished while this actor was down)
    are waited on again instead of re-dispatched; held results already in the log are released."""
    import ray

    held = ray.get(pool.held.remote(), timeout=120)
    stale = [tid for tid in held if tid in finished]
    if stale:
        pool.release.remote(stale)
    return scheduler.adopt(held)


def _restore_from(opt: AskTellOptimizer, ev: Event) -> None:
    """Re-register a trial from one of its own events (they all carry params and x)."""
    x = ev.x if ev.x else opt.space.to_unit([ev.params or {}])[0].tolist()
    opt.restore_trial(ev.trial_id, ev.params or {}, x, ev.batch_id if ev.batch_id is not None else -1,
                      source="unknown")
