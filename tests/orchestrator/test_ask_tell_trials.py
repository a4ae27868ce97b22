"""The trial registry's public reads (orchestrator/ask_tell/trials.py) that the central actor uses in place of
the optimizer's internals: `design_left`, the initial-design points still owed, and `has_trial`, whether a
trial id is registered (the log's replay restores only the trials it says are not)."""

from __future__ import annotations

import pytest

from orchestrator.ask_tell import AskTellOptimizer, TrialError

SPACE = {"x": {"type": "float", "low": 0.0, "high": 1.0}, "y": {"type": "float", "low": 0.0, "high": 1.0}}


def _opt(**kw) -> AskTellOptimizer:
    return AskTellOptimizer(SPACE, model="exact-gp", initial_design=kw.pop("initial_design", 6), seed=0, **kw)


# ---------------------------------------------------------------------------------------- design_left
def test_design_left_counts_down_the_sobol_points_asked():
    opt = _opt()
    assert opt.design_left == 6
    opt.ask(2)
    assert opt.design_left == 4
    opt.ask(4)
    assert opt.design_left == 0
    assert all(t.source == "sobol" for t in opt.pending())


def test_design_left_counts_completed_results_told_with_tell_point_but_not_failed_ones():
    opt = _opt()
    opt.tell_point({"x": 0.1, "y": 0.2}, 1.0)
    assert opt.design_left == 5
    opt.tell_point({"x": 0.3, "y": 0.4}, float("nan"))  # a failure is no design point
    assert opt.design_left == 5
    opt.ask(1)
    assert opt.design_left == 4


def test_design_left_stops_at_zero_where_more_was_asked_or_told_than_the_design():
    """An ask larger than the design left, prior results beyond `initial_design` and Sobol asks past the
    design (`ask(design=True)`) leave it at 0, never below: the actor sizes its next Sobol batch by it."""
    opt = _opt(initial_design=3)
    opt.ask(5)
    assert opt._design_left() == -2 and opt.design_left == 0
    prior = _opt(initial_design=3)
    for i in range(5):
        prior.tell_point({"x": i / 5, "y": 0.5}, float(i))
    assert prior.design_left == 0
    prior.ask(2, design=True)
    assert prior.design_left == 0


def test_design_left_is_what_decides_whether_ask_continues_the_design():
    opt = _opt(initial_design=4)
    for t in opt.ask(3):
        opt.tell(t.trial_id, t.params["x"])
    assert opt.design_left == 1 and not opt.uses_model()
    (t,) = opt.ask(1)
    assert t.source == "sobol" and opt.design_left == 0
    opt.tell(t.trial_id, 0.5)
    assert opt.uses_model()
    assert [t.source for t in opt.ask(2)] == ["model", "model"]


def test_design_left_survives_a_replay_and_a_state_round_trip():
    opt = _opt()
    asked = opt.ask(4)
    replayed = _opt()
    for t in asked:
        replayed.restore_trial(t.trial_id, t.params, t.x, t.batch_id, seed=t.seed, source=t.source,
                               sobol_index=t.info["sobol_index"])
    restored = _opt()
    restored.set_state(opt.get_state())
    assert opt.design_left == replayed.design_left == restored.design_left == 2


def test_design_left_is_read_only():
    opt = _opt()
    with pytest.raises(AttributeError):
        opt.design_left = 0  # type: ignore[misc]
    assert opt.design_left == 6


# ---------------------------------------------------------------------------------------- has_trial
def test_has_trial_knows_asked_told_added_and_restored_trials():
    opt = _opt()
    assert not opt.has_trial("0-0")
    a, b = opt.ask(2)
    assert opt.has_trial(a.trial_id) and opt.has_trial(b.trial_id)  # pending
    opt.tell(a.trial_id, 1.0)
    opt.tell(b.trial_id, None)  # failed
    assert opt.has_trial(a.trial_id) and opt.has_trial(b.trial_id)
    opt.tell_point({"x": 0.5, "y": 0.5}, 2.0)
    assert opt.has_trial("user-0")
    opt.restore_trial("7-0", {"x": 0.25, "y": 0.75}, [0.25, 0.75], 7)
    assert opt.has_trial("7-0")
    assert not opt.has_trial("1-0") and not opt.has_trial("user-1")


def test_has_trial_answers_false_for_ids_that_are_not_trial_ids():
    opt = _opt()
    opt.ask(1)
    assert not opt.has_trial("")
    assert not opt.has_trial(0)  # type: ignore[arg-type]
    assert not opt.has_trial(("0", "0"))  # type: ignore[arg-type]


def test_has_trial_agrees_with_trial_and_with_a_restored_state():
    opt = _opt()
    ids = [t.trial_id for t in opt.ask(3)]
    restored = _opt()
    restored.set_state(opt.get_state())
    for tid in [*ids, "3-0", "user-0"]:
        try:
            opt.trial(tid)
            known = True
        except TrialError:
            known = False
        assert opt.has_trial(tid) is known is restored.has_trial(tid)


def test_the_replay_restores_only_the_trials_has_trial_does_not_know():
    """As the actor's replay does: a proposal logged twice (or already restored) is restored once."""
    opt = _opt()
    log = [("0-0", [0.1, 0.2]), ("0-1", [0.3, 0.4]), ("0-0", [0.9, 0.9])]
    for tid, x in log:
        if not opt.has_trial(tid):
            opt.restore_trial(tid, {"x": x[0], "y": x[1]}, x, 0)
    assert [t.trial_id for t in opt.pending()] == ["0-0", "0-1"]
    assert opt.trial("0-0").params == {"x": 0.1, "y": 0.2}
