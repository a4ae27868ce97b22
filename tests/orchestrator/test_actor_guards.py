"""Guards of the central actor against its own concurrency (orchestrator/actor/): it never proposes past the
budget when its two proposers overlap (`Planner.propose`), and it never runs two dispatch loops (`run`).

Before the first model-based batch is queued, the dispatch loop fills free slots with Sobol points itself
(`Planner.fill_before_first_model`) while the proposer thread may be proposing. A batch asked for but not yet
queued used to be invisible to the other's budget count, so a run could log a batch more than its budget,
and those trials were never evaluated. The actor runs in this process here, with its Ray submission
replaced by a stub, so the two proposers can be interleaved at the exact point of the race.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import threading
from pathlib import Path

import numpy as np
import pytest

from orchestrator.actor import CALIBRATOR_CHECKPOINT, CentralActor
from orchestrator.config import load_config
from orchestrator.store import RunStore


def _actor(tmp_path, budget: int = 8, **over) -> CentralActor:
    cfg = {
        "name": "budget",
        "objective": {"name": "forrester", "options": {}},
        "batch_size": 4,
        "initial_design": 4,
        "budget": budget,
        "max_concurrent": 4,
        "seed": 1,
        "run_dir": str(tmp_path / "run"),
        **over,
    }
    RunStore.create(cfg["run_dir"], load_config(cfg).to_dict())
    actor = CentralActor(cfg["run_dir"], max_concurrent=4, pool=None)
    refs = itertools.count()
    # no Ray: results are told by hand
    actor.dispatcher.submit = lambda batch: [f"ref{next(refs)}" for _ in batch]
    return actor


def _finish_inflight(actor: CentralActor) -> None:
    for ref, (trial, _, _) in list(actor.scheduler.inflight.items()):
        del actor.scheduler.inflight[ref]
        actor.opt.tell(trial.trial_id, 1.0)
        actor.scheduler.n_completed += 1


def test_overlapping_proposals_stay_within_the_budget(tmp_path):
    actor = _actor(tmp_path, budget=8)
    actor.planner.propose(4)  # the initial design, evaluated
    actor.dispatcher.dispatch()
    _finish_inflight(actor)
    assert actor.n_done == 4 and actor.scheduler.remaining() == 4

    logged = actor.log.append
    raced = []

    def append_then_race(events):
        """The dispatch loop runs while the proposer thread is between its ask and its enqueue."""
        logged(events)
        if events and events[0].kind == "proposed" and not raced:
            raced.append(True)
            actor._fill_before_first_model()

    actor.log.append = append_then_race
    actor.planner.propose(4)  # as the proposer thread proposes the first model batch
    assert raced
    proposed = [e for e in RunStore.open(actor.run_dir).events() if e.kind == "proposed"]
    assert len(proposed) == actor.budget  # 12 before the fix: 4 design + 4 proposer + 4 filler
    assert len(actor.scheduler.queue) + len(actor.scheduler.inflight) == 4 and actor.scheduler.reserved == 0
    assert actor.scheduler.remaining() == 0


def test_sobol_fillers_only_for_free_slots_and_only_while_a_model_is_awaited(tmp_path):
    """Sobol fillers go only to free slots and only while the first model is awaited: the dispatch loop adds
    none while the initial design is between its ask and its enqueue, and the proposer thread does not top the
    queue up with them while the first model is fitted."""
    actor = _actor(tmp_path, budget=12)
    actor.scheduler.max_concurrent = 2
    logged = actor.log.append
    raced = []

    def append_then_fill(events):
        logged(events)
        if not raced:  # the dispatch loop runs while the initial design is between its ask and its enqueue
            raced.append(actor._fill_before_first_model())

    actor.log.append = append_then_fill
    assert actor.planner.propose_step() is True and raced
    actor.log.append = logged
    assert len(actor.scheduler.queue) == 4 and actor.opt._n_sobol == 4, "no filler beside the initial design"
    actor.dispatcher.dispatch()
    _finish_inflight(actor)
    actor.dispatcher.dispatch()
    assert actor.planner.propose_step() is False, "no model yet: the proposer waits for it"
    _finish_inflight(actor)
    assert not actor.scheduler.queue
    actor._fill_before_first_model()  # the queue ran dry with both slots free
    assert len(actor.scheduler.queue) + len(actor.scheduler.inflight) == 2 and actor.opt._n_sobol == 6


def test_random_search_takes_no_sobol_fillers(tmp_path):
    actor = _actor(tmp_path, budget=12, proposer={"type": "random", "options": {}})
    assert actor.planner.propose_step() is True  # the design
    actor.dispatcher.dispatch()
    _finish_inflight(actor)
    actor.dispatcher.dispatch()
    _finish_inflight(actor)
    actor._fill_before_first_model()
    assert actor.opt._n_sobol == 4 and not actor.scheduler.queue
    assert actor.planner.propose_step() is True
    assert {t.source for t in actor.scheduler.queue} == {"model"}  # the proposer's points, not the design's


def test_a_failed_proposal_releases_its_reservation(tmp_path):
    actor = _actor(tmp_path, budget=8)

    def fail(*args, **kwargs):
        raise RuntimeError("injected proposal failure")

    actor.opt.ask = fail
    try:
        actor.planner.propose(4)
    except RuntimeError:
        pass
    else:
        raise AssertionError("the proposal's error must reach the caller (the planner thread reports it)")
    assert actor.scheduler.reserved == 0 and not actor.scheduler.queue and actor.scheduler.remaining() == 8


def test_a_second_run_call_waits_for_the_running_loop_instead_of_starting_another(tmp_path):
    """The driver calls `run` again after an actor error; when the actor was only unreachable for a moment its
    loop is still running, and a second loop would ingest the same results twice."""
    actor = _actor(tmp_path)
    gate, loops, first = threading.Event(), [], []

    def loop():
        loops.append(1)
        gate.wait(30)
        return {"status": "finished", "done": 8}

    actor._run_loop = loop
    t = threading.Thread(target=lambda: first.append(actor.run()))
    t.start()
    while not loops:
        threading.Event().wait(0.01)
    assert actor.run(wait_s=0.05) == {"status": "running"}  # not finished within wait_s: call again
    waiting = []
    w = threading.Thread(target=lambda: waiting.append(actor.run(wait_s=30)))
    w.start()
    gate.set()
    t.join(30)
    w.join(30)
    assert first == waiting == [{"status": "finished", "done": 8}]
    assert actor.run(wait_s=0.05) == {"status": "finished", "done": 8}  # after the end: its summary
    assert loops == [1]


def test_a_submission_ray_refuses_stops_the_run_instead_of_retrying_forever(tmp_path):
    """A refused submission (e.g. resource options Ray rejects) was taken for a restarting pool and retried
    every 0.2 s forever, with nothing in flight. Now it stops the run; the trials stay queued and logged as
    proposed."""
    import ray.exceptions

    actor = _actor(tmp_path)
    actor.planner.propose(4)

    def refuse(batch):
        raise ValueError("The quantity of resource sensor cannot be negative")

    actor.dispatcher.submit = refuse
    actor.dispatcher.dispatch()
    abort = actor.abort.message
    assert abort and "cannot be submitted: ValueError: The quantity of resource sensor" in abort
    assert len(actor.scheduler.queue) == 4 and not actor.scheduler.inflight

    restarting = _actor(tmp_path / "second")
    restarting.planner.propose(4)

    def pool_restarting(batch):
        raise ray.exceptions.RayActorError()

    restarting.dispatcher.submit = pool_restarting
    restarting.dispatcher.dispatch()  # transient: put back, tried again on the next pass
    assert restarting.abort.message is None and len(restarting.scheduler.queue) == 4


def test_the_first_abort_cause_stands_and_a_planner_error_is_never_overwritten(tmp_path):
    """A planner error aborts the run and the evaluations in flight are drained; when their results trip the
    failure guard, the abort message keeps the planner's traceback (recorded nowhere else) first, and a cause
    that is added is appended once."""
    actor = _actor(tmp_path)
    actor.abort.set("the planner failed: Traceback ... RuntimeError: bug in the proposer", add=True)
    actor.abort.set("failure guard: 7 of 15 evaluations failed")
    actor.abort.set("failure guard: 8 of 16 evaluations failed")
    assert actor.abort.message == "the planner failed: Traceback ... RuntimeError: bug in the proposer"
    actor.abort.set("writing the run log failed", add=True)
    actor.abort.set("writing the run log failed", add=True)  # added once
    abort = actor.abort.message
    assert abort.endswith("; then writing the run log failed") and abort.count("run log") == 1

    # the real path: guard tripped by drained results after the planner error was recorded
    other = _actor(tmp_path / "b", failure_guard={"max_failure_rate": 0.3, "min_trials": 2})
    other.planner.error = "propose: Traceback ... RuntimeError: bug in the proposer"
    other.abort.set(f"the planner failed: {other.planner.error}", add=True)
    other.scheduler.n_completed, other.scheduler.n_failed = 1, 3
    other.opt.failures.extend({"trial_id": f"x{i}", "error": "worker-lost"} for i in range(3))
    other.guard.check()
    assert other.abort.message.startswith("the planner failed: propose: Traceback")


def test_the_failure_guard_names_the_most_frequent_message(tmp_path):
    """The failure guard's abort message names, beside the count of each reason, the most frequent failure
    message (its first line), so a cause such as a cluster node without the user's module is in the message
    and not in each event alone."""
    actor = _actor(tmp_path, failure_guard={"max_failure_rate": 0.3, "min_trials": 2})
    trials = actor.opt.ask(4, design=True)
    missing = "loading the objective failed: ModuleNotFoundError: No module named 'revobj'"
    for t, message in zip(trials, [missing + "\n(traceback)", missing, "ValueError: bad input", None]):
        actor.opt.tell(t.trial_id, None, error="exception", message=message)
    assert actor.opt.failures[0]["message"] == missing + "\n(traceback)"
    actor.scheduler.n_failed = 4
    actor.guard.check()
    abort = actor.abort.message
    assert f"reasons {{'exception': 4}}; most frequent message (2 of 4): {missing}; see" in abort, abort


def test_a_refit_that_ends_after_a_newer_one_is_not_swapped_in(tmp_path):
    """A refit still running when the run ends (its join timed out) that finishes after a newer fit does not
    swap its older model in, so the model and its checkpoint stay those of the most results. Here the older
    fit (on the first 4 results) ends after the fit on all 8."""
    actor = _actor(tmp_path, budget=12)
    for _ in range(2):
        actor.planner.propose(4)
        actor.dispatcher.dispatch()
        _finish_inflight(actor)
    opt = actor.opt
    assert opt.fit()["n"] == 8 and opt._model_n == 8
    newest, best = opt.model, opt.best()
    X, Y, ids = opt._snapshot()
    opt._snapshot = lambda: (X[:4], Y[:4], ids[:4])  # what the slow fit had read when it started
    diag = opt.fit()
    del opt._snapshot
    assert diag["n"] == 4 and diag["swapped"] is False and "best_predicted" not in diag  # the report's figure
    assert opt.model is newest and opt._model_n == 8 and opt.best() == best


@contextlib.contextmanager
def _submission_held_up(actor: CentralActor):
    """While inside: `actor.dispatcher.dispatch` runs in a thread and its pool submission waits (as on a
    restarting pool)."""
    entered, release = threading.Event(), threading.Event()
    refs = itertools.count()

    def slow_submit(batch):
        entered.set()
        release.wait(10)
        return [f"slow{next(refs)}" for _ in batch]

    actor.dispatcher.submit = slow_submit
    worker = threading.Thread(target=actor.dispatcher.dispatch)
    worker.start()
    try:
        assert entered.wait(10)
        yield
    finally:
        release.set()
        worker.join(10)


def test_a_slow_submission_blocks_neither_status_nor_the_budget_count(tmp_path):
    """`Dispatcher.dispatch` does not hold the actor's lock while the pool answers (up to 60 s while it
    restarts), so status(), the planners' budget checks and their log appends do not wait for it. The trials
    being submitted still count against the budget."""
    import time

    actor = _actor(tmp_path, budget=8)
    actor.planner.propose(4)
    with _submission_held_up(actor):
        t0 = time.perf_counter()
        st = actor.status()
        assert time.perf_counter() - t0 < 1.0, "status() waited for the submission"
        assert actor.scheduler.remaining() == 4  # the 4 being submitted are spoken for
        assert st["inflight"] == 0 and st["queued"] == 0
    assert (
        len(actor.scheduler.inflight) == 4
        and actor.scheduler.remaining() == 4
        and actor.scheduler.submitting == 0
    )


def test_trials_being_submitted_count_as_queued_for_the_next_proposal(tmp_path):
    """While a submission waits on the pool, the trials being submitted count as queued, so the proposer does
    not see an empty queue and propose a batch more than the queue needs."""
    actor = _actor(tmp_path, budget=12, proposer={"type": "random", "options": {}})
    actor.planner.propose(4)
    with _submission_held_up(actor):
        assert actor.planner.propose_step() is False  # 4 being submitted: the queue is not low
    assert actor.planner.propose_step() is True  # in flight now, the queue empty: the next batch is due


def _online_actor(tmp_path, budget: int) -> CentralActor:
    """An actor with the online calibrator under calibrated UCB on an exact GP (cheap fits)."""
    return _actor(tmp_path, budget=budget, calibrator={"type": "online", "options": {"eta": 0.2}},
                  model={"type": "exact-gp"}, proposer={"type": "calibrated", "options": {
                      "acquisition": "ucb", "raw_samples": 32, "num_restarts": 1, "maxiter": 10}})


def _finish_logged(actor: CentralActor, n: int | None = None) -> None:
    """The first `n` (all) evaluations in flight end: each result logged, then told (`Dispatcher.collect`'s
    order)."""
    for ref, (trial, _, _) in list(actor.scheduler.inflight.items())[:n]:
        del actor.scheduler.inflight[ref]
        x = float(trial.params["x0"])
        value = (6 * x - 2) ** 2 * math.sin(12 * x - 4) + 0.3 * math.cos(37 * x)
        actor.log.append([actor.log.event("completed", trial, value=value, attempt=0)])
        actor.opt.tell(trial.trial_id, value)
        actor.scheduler.n_completed += 1


def _ask_with_a_result_told_during_it(actor: CentralActor) -> str:
    """Refit, then ask for a model batch of 4 while the collect thread tells one result in flight (after the
    ask's flush, so it is logged before the batch's proposals); returns that result's trial id."""
    propose = actor.opt._propose
    told = []

    def propose_while_a_result_arrives(*args, **kwargs):
        told.append(next(iter(actor.scheduler.inflight.values()))[0].trial_id)
        _finish_logged(actor, 1)
        return propose(*args, **kwargs)

    actor.opt._propose = propose_while_a_result_arrives
    try:
        assert actor.planner.refit()
        actor.planner.propose(4)
    finally:
        actor.opt._propose = propose
    return told[0]


def _after_model_batches(tmp_path, budget: int = 40, told: tuple[int, ...] = (4, 2)) -> CentralActor:
    """An online-calibrated actor after its design and a model batch of 4 per entry of `told`, each followed
    by that many of its results (by default: the first batch all told, two of the second)."""
    actor = _online_actor(tmp_path, budget=budget)
    actor.planner.propose(4, design=True)
    actor.dispatcher.dispatch()
    _finish_logged(actor)
    for n_finished in told:
        assert actor.planner.refit()
        actor.planner.propose(4)
        actor.dispatcher.dispatch()
        _finish_logged(actor, n_finished)
    return actor


def test_a_replay_without_calibrator_checkpoint_teaches_the_online_calibrator_ask_by_ask(tmp_path):
    """A resume whose calibrator checkpoint is missing tells every logged result again and flushes once; the
    replay ends a calibration round where the log shows a model batch proposed, so the online recalibrator
    takes one step per ask as it did (without the rounds: one step for all the results)."""
    # three model batches, each proposed after a refit on the results before it, all told
    actor = _after_model_batches(tmp_path, budget=20, told=(4, 4, 4))
    actor.opt.flush_calibration()
    levels = actor.opt.calibrator.raw_levels()
    assert actor.opt.calibrator.T == 12 and abs(levels - actor.opt.calibrator.levels).max() > 0.05
    for f in Path(actor.run_dir).rglob(f"*{CALIBRATOR_CHECKPOINT}*"):
        f.unlink()  # as if it was lost
    actor.store.unlock_writer()  # the first actor's session is over
    again = CentralActor(actor.run_dir, max_concurrent=4, pool=None)
    assert again.calibrator_restored == 0 and again.opt.flush_calibration() == 12
    np.testing.assert_allclose(again.opt.calibrator.raw_levels(), levels, atol=1e-12)


def test_a_streaming_replay_puts_a_result_told_during_an_ask_in_the_next_update(tmp_path):
    """Streaming: a result told while a model ask runs (after its flush) is logged before that batch's
    proposals. The ask logs how many results the calibrator had learned (`info["calibrated"]`), so a replay,
    with or without the calibrator checkpoint, learns that result with the next ask's update, as the run did,
    not in the update before it nor alone."""
    actor = _after_model_batches(tmp_path, told=(2,))  # two of the first model batch's four results
    told_during = [_ask_with_a_result_told_during_it(actor)]
    actor.dispatcher.dispatch()
    _finish_logged(actor)
    log = [(e.kind, e.trial_id) for e in actor.store.events() if e.kind in ("proposed", "completed")]
    assert log.index(("completed", told_during[0])) < log.index(("proposed", "2-0"))  # logged before batch 2
    before_ckpt = actor.opt.calibrator.raw_levels()  # what the checkpoint holds (batch 2's ask saved it)
    actor.opt.flush_calibration()  # the told-during result and batch 2's, one update
    levels = actor.opt.calibrator.raw_levels()
    assert not np.allclose(levels, before_ckpt)
    actor.store.unlock_writer()
    for drop_checkpoint in (False, True):
        if drop_checkpoint:
            for f in Path(actor.run_dir).rglob(f"*{CALIBRATOR_CHECKPOINT}*"):
                f.unlink()
        again = CentralActor(actor.run_dir, max_concurrent=4, pool=None)
        assert (again.calibrator_restored == 0) == drop_checkpoint
        again.opt.flush_calibration()
        np.testing.assert_allclose(again.opt.calibrator.raw_levels(), levels, atol=1e-12)
        again.store.unlock_writer()


@pytest.mark.parametrize("killed_in_final_fit", [False, True])
def test_a_replay_ends_the_calibrator_update_where_the_last_session_ended(tmp_path, killed_in_final_fit):
    """A session that ends (stopped, here with two results of its last batch in) flushes the calibrator with
    its final fit (`Planner.final_fit`), whose record says how many results it learned. A resume without the
    calibrator checkpoint ends that update there, so the two results the next session re-runs are an update of
    their own, as with the checkpoint, not one update of all four. A session killed during its final fit
    flushed nothing, with or without the checkpoint: the flush and its checkpoint come with the fit's record,
    so no update is left that no record marks."""
    import shutil

    actor = _after_model_batches(tmp_path, budget=24)
    actor.scheduler.inflight.clear()  # the session stops: the other two are never finished
    if killed_in_final_fit:
        def killed(*args, **kwargs):
            raise KeyboardInterrupt("the process is killed during the final fit")

        actor.opt.fit = killed
        with pytest.raises(KeyboardInterrupt):
            actor.planner.final_fit()
    else:
        actor.planner.final_fit()
    assert actor.opt.num_calibrated == (4 if killed_in_final_fit else 6)
    actor.store.unlock_writer()
    levels = {}
    for drop_checkpoint in (False, True):
        run_dir = shutil.copytree(actor.run_dir, tmp_path / f"resumed-{drop_checkpoint}")
        if drop_checkpoint:
            for f in Path(run_dir).rglob(f"*{CALIBRATOR_CHECKPOINT}*"):
                f.unlink()
        again = CentralActor(str(run_dir), max_concurrent=4, pool=None)
        assert (again.calibrator_restored == 0) == drop_checkpoint
        refs = itertools.count()
        again.dispatcher.submit = lambda batch, refs=refs: [f"ref{next(refs)}" for _ in batch]
        again.dispatcher.dispatch()  # the two unfinished trials, run again
        _finish_logged(again)
        again.planner.propose(4)  # its ask's flush learns them
        assert again.opt.num_calibrated == 8
        levels[drop_checkpoint] = again.opt.calibrator.raw_levels()
        again.store.unlock_writer()
    np.testing.assert_allclose(levels[True], levels[False], atol=1e-12)


def test_the_end_of_the_run_loop_stops_a_refit_and_logs_no_failure(tmp_path):
    """Once the run loop ends (`_stop`: the budget is spent or `stop` was called), a refit in progress stops:
    it would be replaced by the final fit on every result, which the run's end used to wait for it to begin.
    It logs nothing and counts as no failure; the final fit still runs. A synchronous run stopped during its
    refit proposes no batch after it (a resume proposes it)."""
    for synchronous in (False, True):
        actor = _actor(tmp_path / str(synchronous), budget=12, synchronous=synchronous)
        actor.planner.propose(4, design=True)
        actor.dispatcher.dispatch()
        _finish_logged(actor)
        actor._stop.set()
        logged = len(actor.store.events())
        if synchronous:
            actor.planner.sync_step()
        else:
            assert actor.planner.refit() is False
        assert len(actor.store.events()) == logged  # no refit record, no proposals
        assert (
            actor.opt.model is None
            and actor.planner.refit_failures == 0
            and actor.planner.failed_in_a_row == 0
        )
        actor.planner.final_fit()
        refits = [e for e in actor.store.events() if e.kind == "refit"]
        assert actor.opt.model is not None and len(refits) == 1 and not refits[0].info.get("failed")
        actor.store.unlock_writer()


def test_after_a_damaged_part_of_the_log_later_calibrator_updates_are_cut_where_the_run_cut_them(tmp_path):
    """A streaming run whose first model batch's proposals are lost from the log (a damaged segment): their
    results come back without forecasts, so the calibrator cannot learn them again. Each ask logs how many
    results its own flush learned (`info["learned"]`), so the replay still puts a result told during a later
    ask into the update after it (a cut by the count learned in all, which counts the lost results, would come
    4 results late, and that result would join the update before)."""
    import pyarrow.parquet as pq

    actor = _after_model_batches(tmp_path)  # model batch 1, all told; batch 2, two of four
    _ask_with_a_result_told_during_it(actor)  # batch 2's third result, told during the third ask
    told_during = [u.trial_id for u in actor.opt._calib_queue]
    assert len(told_during) == 1 and told_during[0].startswith("2-")
    actor.store.unlock_writer()
    lost = 0
    for segment in sorted(Path(actor.run_dir, "events").glob("*.parquet")):
        t = pq.read_table(segment).to_pydict()
        if any(k == "proposed" and str(tid).startswith("1-") for k, tid in zip(t["kind"], t["trial_id"])):
            segment.unlink()
            lost += 1
    assert lost
    again = CentralActor(actor.run_dir, max_concurrent=4, pool=None)
    rounds = {u.trial_id: u.round for u in again.opt._calib_queue}
    assert not any(t.startswith("1-") for t in rounds)  # no forecast: nothing to learn from them
    batch2 = sorted(t for t in rounds if t.startswith("2-"))
    assert len(batch2) == 3
    learned_by_ask_3 = [t for t in batch2 if t != told_during[0]]
    assert all(rounds[told_during[0]] > rounds[t] for t in learned_by_ask_3), rounds
    again.store.unlock_writer()


def _resumed(run_dir, drop_checkpoint: bool = False) -> CentralActor:
    """A new session on `run_dir` (its calibrator checkpoint deleted first if asked), submission stubbed."""
    if drop_checkpoint:
        for f in Path(run_dir).rglob(f"*{CALIBRATOR_CHECKPOINT}*"):
            f.unlink()
    actor = CentralActor(str(run_dir), max_concurrent=4, pool=None)
    refs = itertools.count()
    actor.dispatcher.submit = lambda batch: [f"ref{next(refs)}" for _ in batch]
    return actor


def _assert_resumes_reach(run_dir, copies, live) -> None:
    """Resumes of two copies of `run_dir` (under `copies`), one with its calibrator checkpoint and one
    without, each end with the calibrator levels `live`."""
    import shutil

    for drop_checkpoint in (False, True):
        again = _resumed(shutil.copytree(run_dir, copies / str(drop_checkpoint)), drop_checkpoint)
        assert (again.calibrator_restored == 0) == drop_checkpoint
        again.opt.flush_calibration()
        np.testing.assert_allclose(again.opt.calibrator.raw_levels(), live, atol=1e-12)
        again.store.unlock_writer()


def test_a_replay_cuts_a_resumed_sessions_first_update_by_the_results_it_taught(tmp_path):
    """Session 1 is killed and its calibrator checkpoint lost; session 2's first ask then teaches the
    calibrator the results of several rounds, and one result is told during that ask. A third session's
    replay, with or without session 2's checkpoint, ends in the state session 2 reached: each flush's record
    names the results it taught (`learned_ids`); a cut by how many it taught would count only the last round's
    results and keep the result told during the ask in the update before it."""
    actor = _after_model_batches(tmp_path)
    actor.store.unlock_writer()  # killed: no final fit
    second = _resumed(actor.run_dir, drop_checkpoint=True)
    assert second.calibrator_restored == 0
    second.dispatcher.dispatch()
    _finish_logged(second, 1)
    _ask_with_a_result_told_during_it(second)
    assert len(second.opt._calib_queue) == 1  # the result told during the ask
    second.opt.flush_calibration()
    live = second.opt.calibrator.raw_levels()
    second.store.unlock_writer()
    _assert_resumes_reach(actor.run_dir, tmp_path / "third", live)


def test_a_calibrator_that_fails_at_the_end_of_a_session_loses_no_fit(tmp_path, caplog):
    """The flush at the end of a session runs after the final fit; a calibrator update that raises there loses
    neither the fitted model's record nor its checkpoint and does not escape the run loop. It is reported, the
    fit is recorded with the error, and nothing is checkpointed for the calibrator (a resume teaches it
    again)."""
    actor = _after_model_batches(tmp_path, budget=12, told=(4,))

    def broken(*args, **kwargs):
        raise RuntimeError("calibrator update failed")

    actor.opt.calibrator.update = broken
    actor.planner.final_fit()
    final = [e for e in actor.store.events() if e.kind == "refit"][-1]
    assert final.info["final"] and "calibrator update failed" in final.info["calibrator_error"]
    assert actor.opt._model_n == actor.opt.num_completed == 8 and not final.info.get("failed")
    assert "calibrator could not learn" in caplog.text
    actor.store.unlock_writer()


def test_a_calibrator_checkpoint_one_lesson_behind_the_log_resumes_exactly(tmp_path):
    """The calibrator is checkpointed after the record of what its flush learned: a crash between the two
    leaves the checkpoint one lesson behind, and the records after it cut the replayed rounds as the run did,
    so the resumed calibrator, with or without the checkpoint, ends where the run's did (a result told during
    the last ask included)."""
    import shutil

    actor = _after_model_batches(tmp_path)
    # the process dies before this ask's checkpoint is written
    actor.checkpoints.save_calibrator = lambda force=False: None
    _ask_with_a_result_told_during_it(actor)
    behind = actor.opt.num_calibrated
    actor.opt.flush_calibration()
    live = actor.opt.calibrator.raw_levels()
    actor.store.unlock_writer()
    for drop_checkpoint in (False, True):
        again = _resumed(
            shutil.copytree(actor.run_dir, tmp_path / f"again-{drop_checkpoint}"), drop_checkpoint
        )
        assert again.calibrator_restored == (0 if drop_checkpoint else behind - 2)  # the last ask taught 2
        again.opt.flush_calibration()
        np.testing.assert_allclose(again.opt.calibrator.raw_levels(), live, atol=1e-12)
        again.store.unlock_writer()


def test_a_flush_whose_record_was_lost_is_replayed_before_the_next_one(tmp_path):
    """A session ends (two results of its last batch in) and its final fit's record, which marks the flush
    that taught the calibrator those two, is lost from a damaged log. The next session restores the
    checkpoint, so its first ask teaches only the two results it re-ran. A third session's replay without a
    checkpoint finds all four in one round, and the ask's record names two: the other two, told before them,
    were an earlier update of their own and are learned first, as the run did."""
    import shutil

    import pyarrow.parquet as pq

    actor = _after_model_batches(tmp_path)
    actor.scheduler.inflight.clear()
    actor.planner.final_fit()
    actor.store.unlock_writer()
    lost = []
    for segment in sorted(Path(actor.run_dir, "events").glob("*.parquet")):
        t = pq.read_table(segment).to_pydict()
        if any(k == "refit" and '"final"' in str(i) for k, i in zip(t["kind"], t["info"])):
            assert len(t["kind"]) == 1
            segment.unlink()
            lost.append(segment)
    assert len(lost) == 1
    second = _resumed(actor.run_dir)
    assert second.calibrator_restored == 6
    second.dispatcher.dispatch()
    _finish_logged(second)
    assert second.planner.refit()
    second.planner.propose(4)
    live = second.opt.calibrator.raw_levels()
    second.store.unlock_writer()
    third = _resumed(shutil.copytree(actor.run_dir, tmp_path / "third"), drop_checkpoint=True)
    third.opt.flush_calibration()
    np.testing.assert_allclose(third.opt.calibrator.raw_levels(), live, atol=1e-12)
    third.store.unlock_writer()


def test_the_calibrator_checkpoint_is_rewritten_as_it_grows_and_a_resume_behind_it_is_exact(
    tmp_path, monkeypatch
):
    """Every checkpoint holds every learned trial id, so one per ask would write O(n^2) over a run of
    one-point batches. An ask rewrites it once the calibrator learned `CALIBRATOR_SAVE_GROWTH` more; a session
    killed with the checkpoint several lessons behind resumes, with or without it, where it was."""
    import orchestrator.actor.checkpoints as checkpoints_module

    monkeypatch.setattr(checkpoints_module, "CALIBRATOR_SAVE_GROWTH", 0.2)
    actor = _online_actor(tmp_path, budget=40)
    saves = []
    save = actor.store.save_checkpoint
    actor.store.save_checkpoint = lambda name, state: (saves.append(name), save(name, state))[1]
    actor.planner.propose(4, design=True)
    actor.dispatcher.dispatch()
    _finish_logged(actor)
    assert actor.planner.refit()
    for _ in range(30):  # one-point model batches, each told before the next is asked
        actor.planner.propose(1)
        actor.dispatcher.dispatch()
        _finish_logged(actor)
    asks_that_learned = actor.opt.num_calibrated  # each ask but the first learned one result
    assert asks_that_learned == 29
    ckpt_saves = saves.count(CALIBRATOR_CHECKPOINT)
    # killed behind the log
    assert 5 <= ckpt_saves <= 15 and actor.checkpoints.calibrator_saved < actor.opt.num_calibrated
    actor.opt.flush_calibration()
    live = actor.opt.calibrator.raw_levels()
    actor.store.unlock_writer()
    _assert_resumes_reach(actor.run_dir, tmp_path / "again", live)
