"""A refit that raises does not end the run: it is logged with its traceback and the run goes on with the
previous model (or the Sobol design before the first one); failures in a row past `max_refit_failures` stop
the run with every result kept (orchestrator/actor/planner.py `Planner.refit`).

The central actor runs in this process here (its evaluations are real Ray tasks on the module's local Ray),
so the optimizer's `fit` can be made to raise: no built-in model fails on demand.
"""

from __future__ import annotations

import sys

import pytest

from orchestrator.actor import CentralActor
from orchestrator.config import load_config
from orchestrator.report import compute_metrics
from orchestrator.store import RunStore
from tests.integration.conftest import finished_counts, run_config

pytestmark = pytest.mark.ray


def _actor(tmp_path, name: str, **over) -> CentralActor:
    # a short run: 0.2 s evaluations, batches and initial design of 8, budget 40
    over = {"objective": {"name": "sleep", "options": {"mean_s": 0.2, "cv": 0.5, "num_cpus": 1}},
            "batch_size": 8, "initial_design": 8, "budget": 40, "seed": 3, **over}
    actor_options = over.pop("actor_options", {})
    cfg = run_config(tmp_path, name, **over)
    RunStore.create(cfg["run_dir"], load_config(cfg).to_dict())
    return CentralActor(cfg["run_dir"], isolate="thread", **actor_options)


@pytest.fixture(autouse=True)
def _switch_interval():
    """`CentralActor.run` shortens the interpreter's switch interval (its own process's, normally): restore
    it."""
    before = sys.getswitchinterval()
    yield
    sys.setswitchinterval(before)


def _failing_fit(actor: CentralActor, fail_calls) -> list[int]:
    """Make the optimizer's fit raise on the given call numbers (1-based; a callable decides)."""
    real_fit, calls = actor.opt.fit, []

    def fit(**kwargs):
        calls.append(len(calls) + 1)
        if fail_calls(calls[-1]):
            raise RuntimeError(f"injected: Cholesky failed on call {calls[-1]}")
        return real_fit(**kwargs)

    actor.opt.fit = fit
    return calls


@pytest.mark.parametrize(
    "synchronous, budget, mean_s",
    # streaming: long enough that the model (once a fit succeeds) proposes before the Sobol fill-in ends
    [(False, 60, 0.5), (True, 40, 0.1)],
    ids=["streaming", "synchronous"],
)
def test_a_failing_refit_is_logged_and_the_run_goes_on(ray_local, tmp_path, synchronous, budget, mean_s):
    actor = _actor(tmp_path, f"flaky-{synchronous}", synchronous=synchronous, budget=budget,
                   objective={"name": "sleep", "options": {"mean_s": mean_s, "cv": 0.5, "num_cpus": 1}})
    calls = _failing_fit(actor, lambda k: k in (1, 3))
    summary = actor.run()
    assert summary["status"] == "finished", summary["message"]
    events = RunStore.open(actor.run_dir).events()
    assert set(finished_counts(events).values()) == {1} and len(finished_counts(events)) == budget
    refits = [e for e in events if e.kind == "refit"]
    failed = [e for e in refits if (e.info or {}).get("failed")]
    assert len(failed) == 2 and summary["refit_failures"] == 2
    assert "injected: Cholesky failed on call 1" in failed[0].info["error"]
    assert "Traceback" in failed[0].info["traceback"] and "RuntimeError" in failed[0].info["traceback"]
    # the first fit failed: no model yet, so further Sobol points; the second failure kept the model
    assert failed[0].info["kept"].startswith("Sobol") and failed[1].info["kept"] == "previous model"
    assert failed[0].info["n"] >= 8
    assert any((e.info or {}).get("source") == "model" for e in events if e.kind == "proposed")
    assert len(calls) >= 4 and summary["refits"] == len(calls) - 2
    m = compute_metrics(events, load_config(RunStore.open(actor.run_dir).config).to_dict())
    assert m.n_refit_failures == 2 and m.n_refits == len(refits) - 2
    assert "call 3" in m.last_refit_error


def test_a_failed_refit_is_retried_only_on_new_results(ray_local, tmp_path):
    actor = _actor(tmp_path, "retry", actor_options={"refit_interval_s": 0.0})
    calls = _failing_fit(actor, lambda k: True)
    actor.opt.ask(8)  # the initial design, told by hand: no evaluation runs, so no new results arrive
    for i, t in enumerate(actor.opt.pending()):
        actor.opt.tell(t.trial_id, float(i))
    assert actor.planner.refit_step() is True and len(calls) == 1
    for _ in range(5):
        assert actor.planner.refit_step() is False  # the same 8 results: no hot retry loop
    assert len(calls) == 1 and actor.status()["refit_failures"] == 1 and actor.abort.message is None
    [t] = actor.opt.ask(1, fit=False)
    actor.opt.tell(t.trial_id, 9.0)
    assert actor.planner.refit_step() is True and len(calls) == 2


def test_a_refit_failure_is_logged_capped_even_when_its_message_is_huge_or_unprintable(ray_local, tmp_path):
    """The refit event's error is capped like an objective's failure (head and tail kept, not `error[:2000]`,
    which cuts the tail, often the useful part), and an exception whose `__str__` raises is still a logged
    failure, not a planner error escaping `Planner.refit` and stopping the refit thread."""
    from workers.records import MAX_MESSAGE_CHARS

    class Unprintable(RuntimeError):
        def __str__(self):
            raise ValueError("no str")

    actor = _actor(tmp_path, "huge", actor_options={"refit_interval_s": 0.0})
    errors = iter([RuntimeError("head " + "x" * 1_000_000 + " tail"), Unprintable()])

    def fit(**kwargs):
        raise next(errors)

    actor.opt.fit = fit
    actor.opt.ask(8)
    for i, t in enumerate(actor.opt.pending()):
        actor.opt.tell(t.trial_id, float(i))
    assert actor.planner.refit_step() is True
    [t] = actor.opt.ask(1, fit=False)
    actor.opt.tell(t.trial_id, 9.0)
    assert actor.planner.refit_step() is True  # the unprintable one did not escape
    failed = [e.info for e in RunStore.open(actor.run_dir).events() if e.kind == "refit"]
    assert len(failed) == 2 and all(info["failed"] for info in failed)
    assert len(failed[0]["error"]) < MAX_MESSAGE_CHARS + 100
    assert failed[0]["error"].startswith("RuntimeError: head") and failed[0]["error"].endswith(" tail")
    assert "characters cut" in failed[0]["error"] and len(failed[0]["traceback"]) < 21_000
    assert failed[1]["error"] == "Unprintable: <unprintable: its __str__ raised>"
    assert actor.status()["refit_failures"] == 2 and actor.abort.message is None


def test_refits_failing_in_a_row_stop_the_run_and_keep_every_result(ray_local, tmp_path):
    actor = _actor(tmp_path, "broken", synchronous=True, actor_options={"max_refit_failures": 2})
    _failing_fit(actor, lambda k: True)
    summary = actor.run()
    assert summary["status"] == "aborted"
    assert "2 refits in a row failed (max_refit_failures=2)" in summary["message"]
    assert "injected: Cholesky failed on call 2" in summary["message"]
    events = RunStore.open(actor.run_dir).events()
    done = finished_counts(events)
    assert set(done.values()) == {1} and len(done) == summary["done"] == 16  # the design and one more batch
    with pytest.raises(Exception, match="max_refit_failures"):
        CentralActor(actor.run_dir, max_refit_failures=0)


@pytest.mark.parametrize("synchronous", [False, True], ids=["streaming", "synchronous"])
def test_a_log_that_cannot_be_written_stops_the_run_with_a_clear_message(ray_local, tmp_path, synchronous):
    """A full disk makes the append raise inside the actor: the run stops with one message naming the run
    directory, the error and `qbatch resume` (not a 40-line RayTaskError traceback with no resume hint); what
    was logged before stays, and a resume finishes the run."""
    import errno

    actor = _actor(tmp_path, f"full-{synchronous}", synchronous=synchronous)
    real_append, calls = actor.store.append, []

    def append(events):
        calls.append(len(events))
        if len(calls) > 6:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_append(events)

    actor.store.append = append
    summary = actor.run()
    assert summary["status"] == "aborted"
    assert f"writing the run log in {actor.run_dir} failed (OSError: [Errno 28] No space left on device)" \
        in summary["message"]
    assert f"qbatch resume {actor.run_dir}" in summary["message"]
    assert len(calls) == 7, "nothing was written after the failure"
    done = finished_counts(RunStore.open(actor.run_dir).events())
    assert set(done.values()) <= {1} and len(done) < 40
    again = CentralActor(actor.run_dir, isolate="thread")  # the aborted run freed its writer lock
    summary = again.run()
    assert summary["status"] == "finished", summary["message"]
    done = finished_counts(RunStore.open(actor.run_dir).events())
    assert set(done.values()) == {1} and len(done) == 40


def test_a_run_that_ends_before_its_first_model_batch_is_still_fitted_at_the_end(ray_local, tmp_path):
    """With a budget just above `initial_design` the run still ends with a final fit on every result for the
    recommendation, as the README promises, not the best single observation."""
    actor = _actor(tmp_path, "short", budget=10, initial_design=8, batch_size=8,
                   objective={"name": "sleep", "options": {"mean_s": 0.05, "cv": 0.5, "num_cpus": 1}})
    summary = actor.run()
    assert summary["status"] == "finished" and summary["done"] == 10
    # the writer lock is free once `run` returns (a resume right after was refused while Ray killed the actor)
    RunStore.check_writer_free(actor.run_dir)
    refits = [e for e in RunStore.open(actor.run_dir).events() if e.kind == "refit"]
    assert refits and refits[-1].info["n"] == 10 and not refits[-1].info.get("failed")
    assert summary["best_predicted"] is not None


def test_the_final_fit_neither_aborts_a_finished_run_nor_escapes_when_it_cannot_be_logged(
    ray_local, tmp_path
):
    """The end-of-run fit does not count toward `max_refit_failures` (a run with every evaluation done would
    report "aborted"), and a failed write of its refit event does not escape `run()` as a traceback with the
    writer lock still held."""
    import errno

    actor = _actor(tmp_path, "final-fails", budget=10, initial_design=8, batch_size=8,
                   objective={"name": "sleep", "options": {"mean_s": 0.05, "cv": 0.5, "num_cpus": 1}},
                   actor_options={"max_refit_failures": 1})
    _failing_fit(actor, lambda k: True)
    summary = actor.run()
    assert summary["status"] == "finished" and summary["done"] == 10, summary["message"]
    RunStore.check_writer_free(actor.run_dir)

    actor = _actor(tmp_path, "final-unlogged", budget=10, initial_design=8, batch_size=8,
                   objective={"name": "sleep", "options": {"mean_s": 0.05, "cv": 0.5, "num_cpus": 1}})
    real_append = actor.store.append

    def append(events):
        if any(e.kind == "refit" and (e.info or {}).get("n") == 10 for e in events):  # the final fit's
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_append(events)

    actor.store.append = append
    summary = actor.run()
    assert summary["status"] == "aborted" and "No space left on device" in summary["message"]
    assert summary["done"] == 10
    RunStore.check_writer_free(actor.run_dir)
