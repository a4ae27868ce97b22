"""What a run says about itself as it goes and when it ends: the evaluated points counted by where they came
from (the optimizer, the central actor's status, the progress bar, `qbatch status`), "final fit" while the
last fit runs, the warning of a run whose model proposed nothing, and the recommendation, one name everywhere,
with its parameters one per line. The central actor runs in this process, its Ray submission replaced by a
stub."""

from __future__ import annotations

import io
import itertools
import math

import pytest

from orchestrator.actor import CentralActor
from orchestrator.ask_tell import AskTellOptimizer
from orchestrator.config import load_config
from orchestrator.runner import _report, _show, progress_fields
from orchestrator.runner.drive import _no_model_warning
from orchestrator.store import Event, RunStore

SPACE = {"x": {"type": "float", "low": 0.0, "high": 1.0}}


def _actor(tmp_path, budget: int = 4, **over) -> CentralActor:
    cfg = {
        "name": "end",
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


def _finish_logged(actor: CentralActor) -> None:
    for ref, (trial, _, _) in list(actor.scheduler.inflight.items()):
        del actor.scheduler.inflight[ref]
        x = float(trial.params["x0"])
        value = (6 * x - 2) ** 2 * math.sin(12 * x - 4)
        actor.log.append([actor.log.event("completed", trial, value=value, attempt=0)])
        actor.opt.tell(trial.trial_id, value)
        actor.scheduler.n_completed += 1


# ------------------------------------------------------------------ the counts
def test_the_optimizer_counts_told_trials_by_source():
    opt = AskTellOptimizer(SPACE, initial_design=3, model_options={"max_steps": 30})
    assert opt.told_by_source() == {"sobol": 0, "model": 0}
    for t in opt.ask(3):
        opt.tell(t.trial_id, t.params["x"])
    model = opt.ask(2)
    assert [t.source for t in model] == ["model", "model"]
    assert opt.told_by_source() == {"sobol": 3, "model": 0}  # asked is not told
    opt.tell(model[0].trial_id, 0.5)
    opt.tell(model[1].trial_id, None)  # a failure counts: it was evaluated
    opt.tell_point({"x": 0.3}, 0.2)
    assert opt.told_by_source() == {"sobol": 3, "model": 2, "user": 1}


def test_the_actor_status_counts_sources_and_says_final_fit_while_it_runs(tmp_path):
    actor = _actor(tmp_path)
    actor.planner.propose(4, design=True)
    actor.dispatcher.dispatch()
    _finish_logged(actor)
    st = actor.status()
    assert st["sources"] == {"sobol": 4, "model": 0} and st["uses_model"] is True
    assert st["phase"] == "initial design" and st["last_fit_s"] is None
    seen = []
    final_fit = actor.planner.final_fit

    def spy():
        seen.append(actor.status()["phase"])
        final_fit()

    actor.planner.final_fit = spy
    summary = actor.run()  # the budget is spent: the loop ends at once, with the final fit
    assert seen == ["final fit"]
    assert summary["phase"] == "model" and summary["status"] == "finished"
    assert summary["sources"] == {"sobol": 4, "model": 0} and summary["last_fit_s"] > 0


# ------------------------------------------------------------------ the progress bar
def _st(**over):
    return {"done": 4, "evals_per_s": 2.0, "utilization": 0.5, "inflight": 0, "failed": 0,
            "best_observed": {"params": {"x": 0.1}, "value": 3.0},
            "best_predicted": {"params": {"x": 0.2}, "value": 2.0}, **over}


def test_the_bar_counts_sobol_and_model_points_and_shows_the_final_fit():
    f = progress_fields(_st(sources={"sobol": 20, "model": 155}, phase="model"))
    assert (f["sobol"], f["model"], f["recommendation"]) == (20, 155, "2") and "phase" not in f
    f = progress_fields(_st(sources={"sobol": 20, "model": 155}, phase="final fit"))
    assert list(f)[0] == "phase" and f["phase"] == "final fit"

    class Bar:
        total, n = 175, 0

        def set_postfix(self, fields, refresh):
            self.fields = fields

        def refresh(self):
            pass

    bar = Bar()
    _show(bar, _st(done=175, sources={"sobol": 20, "model": 155}, phase="final fit"))
    assert bar.n == 175 and bar.fields["phase"] == "final fit" and bar.fields["model"] == 155


# ------------------------------------------------------------------ the end of a run
def _summary(**over):
    return {
        "status": "finished",
        "done": 40,
        "completed": 40,
        "failed": 0,
        "utilization": 0.8,
        "run_dir": "/r",
        "sources": {"sobol": 40, "model": 0},
        "uses_model": True,
        "refits": 1,
        "refit_failures": 0,
        "last_fit_s": 4.2,
        "evals_per_s": 12.5,
        "best_observed": {"params": {"lr": 0.01, "width": 64}, "value": 3.0},
        "best_predicted": {"params": {"lr": 0.001, "width": 320}, "value": 2.5},
        **over,
    }


def _cfg(**over):
    return load_config({"objective": "forrester", "budget": 40, "initial_design": 20, **over})


def test_the_end_names_the_recommendation_and_prints_its_parameters_one_per_line():
    out = io.StringIO()
    _report(_summary(sources={"sobol": 20, "model": 20}), out, _cfg())
    lines = out.getvalue().splitlines()
    assert lines[1] == "qbatch: 20 of them from the Sobol design, 20 from the model"
    i = next(i for i, line in enumerate(lines) if "recommendation" in line)
    assert lines[i] == ("qbatch: recommendation (the observed setting with the largest posterior mean of the "
                        "target, at the last fit): predicted tau-level 2.5 at")
    assert lines[i + 1:i + 3] == ["    lr     0.001", "    width  320"]
    assert "warning" not in out.getvalue()
    for old in ("best posterior mean", "best point", "rec ", "best predicted"):
        assert old not in out.getvalue()
    out = io.StringIO()  # before any fit: the best observation, under the same name
    _report(
        _summary(best_predicted=None, sources={"sobol": 4, "model": 0}, done=4),
        out,
        _cfg(budget=4, initial_design=4),
    )
    assert ("qbatch: recommendation (no model was fitted: the best observation): value 3 at\n    lr     "
            "0.01\n") in (
        out.getvalue())


def test_a_streaming_run_whose_model_proposed_nothing_warns_and_says_what_helps():
    out = io.StringIO()
    _report(_summary(), out, _cfg())
    warning = [line for line in out.getvalue().splitlines() if line.startswith("qbatch: warning:")]
    assert len(warning) == 1
    text = warning[0]
    assert "the model proposed none of the 40 evaluations: all came from the Sobol design" in text
    assert (
        "`synchronous: true`" in text
        and "raise `budget`" in text
        and "the final fit alone took 4.2 s" in text
        and "about 52 here" in text
    )
    assert "a larger `initial_design` does not help" in text


@pytest.mark.parametrize("over, cfg, expected", [
    ({}, {"budget": 20, "initial_design": 20}, "`budget` (20) is not above `initial_design` (20)"),
    ({"refits": 0, "refit_failures": 3}, {}, "every refit failed (3)"),
    ({}, {"synchronous": True}, "shows its refits"),
])
def test_the_warning_names_the_cause_it_has(over, cfg, expected):
    assert expected in _no_model_warning(_summary(**over), _cfg(**cfg))


@pytest.mark.parametrize("over", [
    {"sources": {"sobol": 20, "model": 20}},  # the model proposed
    {"uses_model": False},  # a proposer without a model (sobol, random)
    {"status": "stopped"},  # not the end of the run
    {"sources": None},  # an actor that does not count
])
def test_no_warning_where_the_model_had_its_share_or_none_was_meant(over):
    assert _no_model_warning(_summary(**over), _cfg()) is None
    assert _no_model_warning(_summary(), None) is None


# ------------------------------------------------------------------ qbatch status and the report
def _run(root, sources):
    cfg = {"name": "st", "objective": {"name": "forrester"}, "budget": len(sources), "batch_size": 2,
           "initial_design": 2, "tau": 0.2}
    store = RunStore.create(str(root), cfg)
    evs = []
    for i, source in enumerate(sources):
        tid = f"{i // 2}-{i % 2}"
        evs += [Event("proposed", tid, time=1.0 + i, batch_id=i // 2, params={"x": i / 10}, x=[i / 10],
                      info={"source": source}),
                Event("started", tid, time=2.0 + i, started_at=2.0 + i, node_id="n"),
                Event("completed", tid, time=3.0 + i, value=float(i), started_at=2.0 + i, ended_at=3.0 + i)]
    evs.append(
        Event("refit", time=20.0, info={"seconds": 0.5, "best_predicted": 4.2, "best_params": {"x": 0.5}})
    )
    store.append(evs)


def test_status_and_the_summary_count_sources_and_name_the_recommendation(tmp_path, capsys):
    from orchestrator import cli
    from orchestrator.report import compute_metrics

    _run(tmp_path / "mixed", ["sobol", "sobol", "model", "model", "model", "model"])
    assert cli.main(["status", str(tmp_path / "mixed")]) == 0
    out = capsys.readouterr().out
    assert "sources      sobol 2, model 4 (finished trials by where their point came from)\n" in out
    assert "recommendation 4.2 (predicted tau-level at the last fit) at {'x': 0.5}" in out
    assert "recommended" not in out and "model's predicted" not in out
    _run(tmp_path / "random", ["sobol"] * 4)
    assert cli.main(["status", str(tmp_path / "random")]) == 0
    assert ("sobol 4, model 0 (finished trials by where their point came from); the model proposed none of "
            "them") in (
        capsys.readouterr().out)
    store = RunStore.open(str(tmp_path / "mixed"))
    rows = dict(compute_metrics(store.events(), store.config).summary_rows())
    assert rows["evaluations from the Sobol design"] == "2" and rows["evaluations from the model"] == "4"
    assert rows["recommendation: predicted tau-level"] == "4.2" and rows["recommendation: params"] == "x=0.5"
    assert not any("best predicted" in k or "recommended" in k for k in rows)
