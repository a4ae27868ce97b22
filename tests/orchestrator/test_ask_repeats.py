"""Re-evaluations of the best observed points (`AskTellOptimizer.ask_repeats`, `reevaluation` in a run's
config): which points, how many times, with which seeds, and where a run spends them."""

from __future__ import annotations

import collections

import pytest
import torch

from orchestrator.ask_tell import AskTellOptimizer, TrialError
from orchestrator.ask_tell.repeats import SOURCE, repeat_share
from orchestrator.config import load_config
from orchestrator.errors import ConfigError
from orchestrator.recommend import recommendation_scores
from orchestrator.sim import simulate
from orchestrator.store import RunStore

SPACE = {"x": {"type": "float", "low": 0.0, "high": 1.0}, "y": {"type": "float", "low": 0.0, "high": 1.0}}


def _f(p: dict) -> float:
    return -((p["x"] - 0.3) ** 2) - (p["y"] - 0.6) ** 2


def _fitted(n_batches: int = 3) -> AskTellOptimizer:
    opt = AskTellOptimizer(SPACE, model="exact-gp", tau=0.5, initial_design=6, seed=3)
    for _ in range(n_batches):
        for t in opt.ask(4):
            opt.tell(t.trial_id, _f(t.params))
    opt.fit()
    return opt


def _ranked(opt: AskTellOptimizer) -> list[tuple[float, ...]]:
    X, _ = opt.observations()
    order = torch.argsort(recommendation_scores(opt.model, X), descending=True)
    return [tuple(X[i].tolist()) for i in order]


def test_the_best_points_are_asked_again_each_up_to_its_repeats():
    opt = _fitted()
    opt.repeat_order = "model"
    ranked = _ranked(opt)
    trials = opt.ask_repeats(5, repeats=2, fit=False)
    points = [tuple(t.x.tolist()) for t in trials]
    assert points == [ranked[0], ranked[0], ranked[1], ranked[1], ranked[2]]
    assert all(t.source == SOURCE and t.forecast is None for t in trials)
    assert len({t.seed for t in trials}) == 5 and len({t.trial_id for t in trials}) == 5
    # pending ones count: the next ask finishes the third point, then goes on to the fourth
    more = opt.ask_repeats(2, repeats=2, fit=False)
    assert [tuple(t.x.tolist()) for t in more] == [ranked[2], ranked[3]]
    for t in trials + more:
        assert opt.tell(t.trial_id, _f(t.params)) == "completed"
    counts = collections.Counter(tuple(x.tolist()) for x in opt.observations()[0])
    assert counts[ranked[0]] == counts[ranked[1]] == counts[ranked[2]] == 3 and counts[ranked[3]] == 2


def test_a_repeat_keeps_the_points_params_and_the_fit_sees_the_replicates():
    opt = _fitted()
    (t,) = opt.ask_repeats(1, repeats=1, fit=False)
    X, _ = opt.observations()
    source = [i for i in range(X.shape[0]) if torch.equal(X[i], t.x)]
    assert len(source) == 1
    opt.tell(t.trial_id, _f(t.params) + 0.01)
    n_before = opt.num_completed
    assert opt.num_stale == 1
    opt.ask_repeats(1, repeats=1)  # fits first: the replicate is in the model's data
    assert opt.num_stale == 0 and opt.num_completed == n_before


def test_past_the_last_candidate_the_best_are_asked_again():
    opt = AskTellOptimizer(SPACE, model="exact-gp", tau=0.5, initial_design=3, seed=0)
    for t in opt.ask(3):
        opt.tell(t.trial_id, _f(t.params))
    opt.fit()
    opt.repeat_order = "model"
    ranked = _ranked(opt)
    trials = opt.ask_repeats(5, repeats=1, fit=False)
    assert [tuple(t.x.tolist()) for t in trials] == ranked + ranked[:2]


def _by_outcome(opt: AskTellOptimizer) -> list[tuple[float, ...]]:
    X, y = opt.observations()
    order = torch.argsort(y.reshape(-1), descending=True, stable=True)
    return [tuple(X[i].tolist()) for i in order]


def test_the_default_order_alternates_the_models_and_the_best_outcomes():
    """"mixed": the rule's first, the best outcome's first, the rule's second, ..., each point once (the
    quantile model on noisy outcomes, so its order and the outcomes' differ)."""
    opt = AskTellOptimizer(SPACE, model="quantile", tau=0.1, initial_design=6, seed=3)
    rng = torch.Generator().manual_seed(0)
    for _ in range(3):
        for t in opt.ask(4):
            opt.tell(t.trial_id, _f(t.params) + 0.3 * float(torch.randn((), generator=rng)))
    opt.fit()
    assert opt.repeat_order == "mixed"
    by_model, by_y = _ranked(opt), _by_outcome(opt)
    expected: list[tuple[float, ...]] = []
    for pair in zip(by_model, by_y):
        expected.extend(p for p in pair if p not in expected)
    assert expected[:6] != by_model[:6]  # the two orders differ here, so the test tells them apart
    trials = opt.ask_repeats(6, repeats=1, fit=False)
    assert [tuple(t.x.tolist()) for t in trials] == expected[:6]


def test_a_high_outcome_the_model_ranks_low_is_measured_again():
    """A point told after the fit with the best outcome of all: the stale model ranks it low, the rule's order
    alone leaves it out of the first re-evaluations, the default's second one measures it."""
    opt = _fitted()
    (t,) = opt.ask(1, fit=False)
    opt.tell(t.trial_id, 10.0)  # far above every other outcome (they are <= 0)
    high = tuple(t.x.tolist())
    opt.repeat_order = "model"
    assert high not in _ranked(opt)[:2]
    assert high not in [tuple(r.x.tolist()) for r in opt.ask_repeats(2, repeats=1, fit=False)]
    opt.repeat_order = "mixed"
    second = opt.ask_repeats(2, repeats=2, fit=False)  # the model's first again (it has 2 of 3), then `high`
    assert tuple(second[1].x.tolist()) == high


def test_an_unknown_repeat_order_is_refused_by_name():
    opt = _fitted()
    opt.repeat_order = "outcome"
    with pytest.raises(TrialError, match=r"repeat_order must be one of \['mixed', 'model'\]; got 'outcome'"):
        opt.ask_repeats(2)


def test_bad_calls_are_refused_by_name():
    opt = AskTellOptimizer(SPACE, model="exact-gp", tau=0.5, initial_design=6, seed=3)
    with pytest.raises(TrialError, match="needs a fitted model"):
        opt.ask_repeats(2)
    opt = _fitted()
    with pytest.raises(TrialError, match="q must be an integer >= 1; got 0"):
        opt.ask_repeats(0)
    with pytest.raises(TrialError, match="repeats must be an integer >= 1; got True"):
        opt.ask_repeats(2, repeats=True)


@pytest.mark.parametrize("budget, fraction, expected", [
    (100, 0.0, 0), (100, 0.1, 10), (80, 0.1, 8), (10, 0.1, 2), (3, 0.5, 2), (2, 0.9, 1), (1, 0.5, 0),
])
def test_the_budget_share_of_repeats(budget, fraction, expected):
    assert repeat_share(budget, fraction) == expected


def test_the_config_key_is_checked_and_round_trips():
    default = load_config({"objective": "forrester"})
    assert (default.reevaluation.fraction, default.reevaluation.repeats) == (0.1, 1)
    assert "reevaluation" not in default.to_dict()  # the default keeps a saved config's key set
    cfg = load_config({"objective": "forrester", "reevaluation": {"fraction": 0.0}})
    assert (cfg.reevaluation.fraction, cfg.reevaluation.repeats) == (0.0, 1)
    assert load_config(cfg.to_dict()) == cfg
    with pytest.raises(ConfigError, match=r"`reevaluation.fraction` must be .*got 1"):
        load_config({"objective": "forrester", "reevaluation": {"fraction": 1.0}})
    with pytest.raises(ConfigError, match=r"`reevaluation.repeats`"):
        load_config({"objective": "forrester", "reevaluation": {"repeats": 0}})


@pytest.mark.parametrize("synchronous", [False, True])
def test_a_run_spends_its_last_evaluations_on_repeats(tmp_path, synchronous):
    """The central actor (on a simulated cluster) proposes the search's points first and the budget's last
    `repeat_share` evaluations as re-evaluations of observed points; the budget holds exactly."""
    budget, fraction = 28, 0.25
    cfg = {"name": "rep", "objective": {"name": "sleep", "options": {"dim": 2, "mean_s": 0.0, "noise": 0.1}},
           "tau": 0.1, "model": {"type": "exact-gp"}, "batch_size": 4, "initial_design": 6, "budget": budget,
           "max_concurrent": 4, "seed": 2, "synchronous": synchronous, "run_dir": str(tmp_path / "run"),
           "reevaluation": {"fraction": fraction, "repeats": 2}}
    run = simulate(cfg, 4, mean_s=10.0, cv=0.3, seed=1)
    assert run.summary["status"] == "finished" and run.summary["completed"] == budget
    proposed = [e for e in RunStore.open(run.run_dir).events() if e.kind == "proposed"]
    sources = [(e.info or {}).get("source") for e in proposed]
    k = repeat_share(budget, fraction)
    assert len(proposed) == budget and sources.count(SOURCE) == k
    first = sources.index(SOURCE)
    assert set(sources[first:]) == {SOURCE} and "model" in sources[:first]  # the search first, then repeats
    searched = {tuple(e.x) for e in proposed[:first]}
    assert all(tuple(e.x) in searched for e in proposed[first:])  # only points measured before
    assert max(collections.Counter(tuple(e.x) for e in proposed).values()) <= 3
