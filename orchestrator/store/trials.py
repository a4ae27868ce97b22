"""The trials table: the event log replayed into one `TrialRecord` per trial.

docs/event-log.md "Reading a log", and ARCHITECTURE.md "The path of one evaluation", step 6 (a resume replays
the log): each result counts exactly once, the first completed/failed event of a trial fixing its outcome.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from orchestrator.store.schema import Event, TrialFields


@dataclass
class TrialRecord(TrialFields):
    """One trial as replayed from the log (exactly-once: the first completed/failed event wins).

    The reader's view: where an `Event` (store/schema.py) is one step of a trial, this is the trial folded
    over its events into the same `TrialFields` (`proposed_at` is its `proposed` event's `time`).
    `status` is "proposed" (not started), "running" (started, no result), "completed" or "failed".
    `duplicates` counts completed/failed events after the first one (ignored by the replay).
    """

    trial_id: str
    status: str
    proposed_at: float | None = None
    duplicates: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def trials_table(events: Iterable[Event]) -> list[TrialRecord]:
    """One `TrialRecord` per trial_id, in order of first appearance (refit events are skipped).

    The first completed/failed event of a trial fixes its outcome; later ones only increase `duplicates`.
    Params, x, batch and forecast are taken from the first event that carries them (normally "proposed").
    """
    trials: dict[str, TrialRecord] = {}
    for ev in events:
        if ev.kind == "refit" or not ev.trial_id:
            continue
        rec = trials.get(ev.trial_id)
        if rec is None:
            rec = trials[ev.trial_id] = TrialRecord(trial_id=ev.trial_id, status="proposed")
        for name in ("batch_id", "params", "x", "forecast"):
            if getattr(rec, name) is None and getattr(ev, name) is not None:
                setattr(rec, name, getattr(ev, name))
        terminal = rec.status in ("completed", "failed")
        if ev.kind == "proposed":
            if rec.proposed_at is None:
                rec.proposed_at = ev.time
        elif ev.kind == "started":
            if not terminal:
                rec.status = "running"
                rec.started_at = ev.started_at if ev.started_at is not None else ev.time
                rec.node_id, rec.pid, rec.attempt = ev.node_id, ev.pid, ev.attempt
        else:  # completed | failed
            if terminal:
                rec.duplicates += 1
                continue
            rec.status = ev.kind
            rec.value = ev.value if ev.kind == "completed" else None
            rec.error, rec.traceback = ev.error, ev.traceback
            rec.started_at = ev.started_at if ev.started_at is not None else rec.started_at
            rec.ended_at = ev.ended_at if ev.ended_at is not None else ev.time
            rec.node_id = ev.node_id if ev.node_id is not None else rec.node_id
            rec.pid = ev.pid if ev.pid is not None else rec.pid
            rec.attempt = ev.attempt
            rec.info = ev.info
    return list(trials.values())


def status_counts(trials: Sequence[TrialRecord]) -> dict[str, int]:
    """How many trials are in each status (all four keys present)."""
    c = Counter(t.status for t in trials)
    return {k: c.get(k, 0) for k in ("proposed", "running", "completed", "failed")}

