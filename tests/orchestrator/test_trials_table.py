"""`trials_table` field rules (orchestrator/store.py): replaying a trial's events gives one record whose
outcome is fixed by its first completed/failed event (a later "started" of a retry does not reopen it),
whose params/x/batch/forecast come from the first event carrying them, whose proposed_at is the first
proposal's time, and whose started_at/ended_at/node_id/pid fall back to earlier values or the event time
where the terminal event leaves them out.
"""

from __future__ import annotations

import pytest

from orchestrator.store import Event, trials_table

#: every field of a replayed record, as a trial with nothing but a proposal would have it
_BLANK = {
    "trial_id": "t",
    "status": "proposed",
    "batch_id": None,
    "params": None,
    "x": None,
    "value": None,
    "forecast": None,
    "error": None,
    "traceback": None,
    "node_id": None,
    "pid": None,
    "attempt": 0,
    "proposed_at": None,
    "started_at": None,
    "ended_at": None,
    "info": None,
    "duplicates": 0,
}


def _expect(**fields) -> dict:
    out = dict(_BLANK)
    out.update(fields)
    return out


def _proposed(time: float = 1.0, **kw) -> Event:
    base = dict(batch_id=0, params={"a": 1}, x=[0.25])
    base.update(kw)
    return Event("proposed", "t", time=time, **base)


CASES = {
    # ST2: a retry's late "started" (attempt 1) after the first result keeps the trial completed
    "late_start_after_completion_keeps_the_outcome": (
        [
            _proposed(1.0),
            Event("started", "t", time=2.0, started_at=2.0, node_id="A", pid=7, attempt=0),
            Event("completed", "t", time=3.0, value=1.0, started_at=2.0, ended_at=3.0, node_id="A", pid=7,
                  attempt=0),
            Event("started", "t", time=4.0, started_at=4.0, node_id="B", pid=8, attempt=1),
        ],
        _expect(status="completed", batch_id=0, params={"a": 1}, x=[0.25], value=1.0, node_id="A", pid=7,
                attempt=0, proposed_at=1.0, started_at=2.0, ended_at=3.0),
    ),
    # ST3: a failed event never carries a value into the record
    "failed_event_value_is_dropped": (
        [
            _proposed(1.0),
            Event("failed", "t", time=5.0, value=2.0, error="boom", traceback="tb", ended_at=4.5),
        ],
        _expect(status="failed", batch_id=0, params={"a": 1}, x=[0.25], value=None, error="boom",
                traceback="tb", proposed_at=1.0, ended_at=4.5),
    ),
    # ST4: no ended_at on the result: the result event's time
    "ended_at_falls_back_to_event_time": (
        [_proposed(1.0), Event("completed", "t", time=50.0, value=3.0)],
        _expect(status="completed", batch_id=0, params={"a": 1}, x=[0.25], value=3.0, proposed_at=1.0,
                ended_at=50.0),
    ),
    # ST5: no started_at on the start report: the start event's time
    "started_at_falls_back_to_event_time": (
        [_proposed(1.0), Event("started", "t", time=20.0, node_id="A", pid=3)],
        _expect(status="running", batch_id=0, params={"a": 1}, x=[0.25], node_id="A", pid=3, proposed_at=1.0,
                started_at=20.0),
    ),
    # ST6: params, x, batch and forecast come from the first event that carries them
    "first_params_x_batch_forecast_win": (
        [
            _proposed(1.0, forecast={"mu_f": 0.0}),
            Event("completed", "t", time=3.0, value=1.0, ended_at=3.0, batch_id=5, params={"a": 2}, x=[0.75],
                  forecast={"mu_f": 9.0}),
        ],
        _expect(status="completed", batch_id=0, params={"a": 1}, x=[0.25], forecast={"mu_f": 0.0}, value=1.0,
                proposed_at=1.0, ended_at=3.0),
    ),
    "a_field_missing_from_the_proposal_is_taken_from_a_later_event": (
        [
            Event("proposed", "t", time=1.0),
            Event("started", "t", time=2.0, started_at=2.0, batch_id=4, params={"a": 3}, x=[0.5],
                  forecast={"mu_f": 1.0}),
        ],
        _expect(status="running", batch_id=4, params={"a": 3}, x=[0.5], forecast={"mu_f": 1.0},
                proposed_at=1.0, started_at=2.0),
    ),
    # ST37, ST38, ST39: a result without node_id, pid, started_at keeps those of the start report
    "result_without_node_pid_started_at_keeps_the_start_reports": (
        [
            _proposed(1.0),
            Event("started", "t", time=2.0, started_at=2.5, node_id="A", pid=11, attempt=0),
            Event("completed", "t", time=6.0, value=4.0, ended_at=5.5, attempt=0),
        ],
        _expect(status="completed", batch_id=0, params={"a": 1}, x=[0.25], value=4.0, node_id="A", pid=11,
                proposed_at=1.0, started_at=2.5, ended_at=5.5),
    ),
    # the same fields given by the result replace the start report's
    "result_with_node_pid_started_at_replaces_the_start_reports": (
        [
            _proposed(1.0),
            Event("started", "t", time=2.0, started_at=2.5, node_id="A", pid=11, attempt=0),
            Event("failed", "t", time=7.0, error="lost", started_at=3.0, ended_at=6.5, node_id="B", pid=22,
                  attempt=1, info={"retries": 1}),
        ],
        _expect(status="failed", batch_id=0, params={"a": 1}, x=[0.25], error="lost", node_id="B", pid=22,
                attempt=1, proposed_at=1.0, started_at=3.0, ended_at=6.5, info={"retries": 1}),
    ),
    # ST30: the attempt is the terminal event's, also where it is lower than the start report's
    "attempt_is_the_results": (
        [
            _proposed(1.0),
            Event("started", "t", time=2.0, started_at=2.0, attempt=0),
            Event("completed", "t", time=3.0, value=1.0, ended_at=3.0, attempt=2),
        ],
        _expect(status="completed", batch_id=0, params={"a": 1}, x=[0.25], value=1.0, attempt=2,
                proposed_at=1.0, started_at=2.0, ended_at=3.0),
    ),
    "attempt_of_a_result_lower_than_the_start_reports": (
        [
            _proposed(1.0),
            Event("started", "t", time=2.0, started_at=2.0, attempt=3),
            Event("completed", "t", time=3.0, value=1.0, ended_at=3.0, attempt=1),
        ],
        _expect(status="completed", batch_id=0, params={"a": 1}, x=[0.25], value=1.0, attempt=1,
                proposed_at=1.0, started_at=2.0, ended_at=3.0),
    ),
    # ST40: a second proposal does not move proposed_at
    "proposed_at_is_the_first_proposals_time": (
        [_proposed(1.0), _proposed(5.0, params={"a": 9})],
        _expect(batch_id=0, params={"a": 1}, x=[0.25], proposed_at=1.0),
    ),
    # the first result fixes the outcome; later ones only count as duplicates
    "later_results_are_duplicates": (
        [
            _proposed(1.0),
            Event("completed", "t", time=3.0, value=1.0, ended_at=3.0, node_id="A", pid=1),
            Event("failed", "t", time=4.0, error="late", ended_at=4.0, node_id="B", pid=2, attempt=1),
            Event("completed", "t", time=5.0, value=7.0, ended_at=5.0),
        ],
        _expect(status="completed", batch_id=0, params={"a": 1}, x=[0.25], value=1.0, node_id="A", pid=1,
                proposed_at=1.0, ended_at=3.0, duplicates=2),
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_trials_table_field_rules(name):
    events, expected = CASES[name]
    got = trials_table(events)
    assert len(got) == 1
    assert got[0].to_dict() == expected


def test_refit_and_id_less_events_are_skipped_and_order_is_first_appearance():
    events = [
        Event("proposed", "b", time=1.0),
        Event("refit", time=1.5, info={"fit_s": 0.1}),
        Event("proposed", "a", time=2.0),
        Event("started", "b", time=3.0),
        Event("completed", "c", time=4.0, value=0.5),
    ]
    got = trials_table(events)
    assert [(t.trial_id, t.status) for t in got] == [("b", "running"), ("a", "proposed"), ("c", "completed")]
    assert got[2].proposed_at is None and got[2].ended_at == 4.0
