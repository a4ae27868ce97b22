"""`QbatchSampler` (qbatch/optuna.py) under real Optuna studies: batches shared by one or two threads, every
completed trial told, the study's direction kept, distributions mapped or refused by name."""

from __future__ import annotations

import math

import pytest

optuna = pytest.importorskip("optuna")
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution  # noqa: E402
from optuna.trial import TrialState  # noqa: E402

from orchestrator.errors import ConfigError, SpaceError, UsageError  # noqa: E402
from qbatch.optuna import QbatchSampler, space_from_optuna  # noqa: E402
from tests.integration.conftest import FAST_MODEL, FAST_PROPOSER  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

FAST = {"model_options": FAST_MODEL["options"], "proposer_options": FAST_PROPOSER["options"]}
SPACE = {"x": FloatDistribution(-3.0, 3.0), "lr": FloatDistribution(1e-4, 1e-1, log=True),
         "n": IntDistribution(1, 9, step=2), "act": CategoricalDistribution(["relu", "tanh"])}


def objective(trial):
    x = trial.suggest_float("x", -3.0, 3.0)
    lr = trial.suggest_float("lr", 1e-4, 1e-1, log=True)
    n = trial.suggest_int("n", 1, 9, step=2)
    act = trial.suggest_categorical("act", ["relu", "tanh"])
    if x > 2.7:  # a failing corner: a failed trial is a recorded failure
        raise RuntimeError("diverged")
    return (x - 1.0) ** 2 + abs(math.log10(lr) + 2.0) + 0.1 * n + (0.5 if act == "tanh" else 0.0)


@pytest.mark.parametrize("n_jobs", [1, 2])
def test_a_study_tells_every_completed_trial_and_minimizes(n_jobs):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler = QbatchSampler(SPACE, batch_size=4, initial_design=8, seed=1, **FAST)
    study = optuna.create_study(direction="minimize", sampler=sampler)
    study.optimize(objective, n_trials=20, n_jobs=n_jobs, catch=(RuntimeError,))
    opt = sampler.optimizer
    complete = [t for t in study.trials if t.state == TrialState.COMPLETE]
    failed = [t for t in study.trials if t.state == TrialState.FAIL]
    assert len(complete) + len(failed) == 20
    assert opt.direction == "minimize"
    assert opt.num_completed == len(complete) and opt.num_failed == len(failed)
    assert all(f["error"] == "failed" for f in opt.failures)
    # 20 trials took 5 batches of 4: nothing left queued or pending
    assert opt.num_pending == 0 and not opt.has_trial("5-0")
    assert all(opt.is_told(f"{b}-{i}") for b in range(5) for i in range(4))
    assert math.isfinite(study.best_value)
    # the best observed value is the smallest one: the sign of `minimize` is applied once, at the edge
    best_params, best_value = opt.best_observed()
    assert best_value == study.best_value and best_params == study.best_params
    for t in complete:  # each trial evaluated the point qbatch proposed
        assert t.params["n"] in (1, 3, 5, 7, 9) and t.params["act"] in ("relu", "tanh")


@pytest.mark.filterwarnings("ignore:The value nan is not acceptable")
def test_batches_are_asked_once_and_drained_by_the_trials_after():
    sampler = QbatchSampler({"x": {"type": "float", "low": 0.0, "high": 1.0}}, batch_size=3, initial_design=6)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    trials = [study.ask() for _ in range(4)]
    xs = [t.suggest_float("x", 0.0, 1.0) for t in trials]
    opt = sampler.optimizer
    assert [opt.trial(f"0-{i}").params["x"] for i in range(3)] + [opt.trial("1-0").params["x"]] == xs
    assert opt.num_pending == 6  # two batches of 3: one point still queued
    study.tell(trials[0], 0.5)
    study.tell(trials[1], state=TrialState.PRUNED)
    study.tell(trials[2], float("nan"))  # Optuna fails a NaN value
    assert opt.num_completed == 1 and [f["error"] for f in opt.failures] == ["pruned", "failed"]
    assert opt.direction == "maximize" and opt.best_observed()[1] == 0.5


def test_fixed_and_enqueued_trials_are_told_at_the_point_they_evaluated():
    sampler = QbatchSampler({"x": FloatDistribution(0.0, 1.0), "k": IntDistribution(0, 3)}, batch_size=2)
    study = optuna.create_study(sampler=sampler)
    study.enqueue_trial({"x": 0.25, "k": 2})  # every parameter fixed: nothing sampled here
    study.enqueue_trial({"k": 1})  # one fixed: the proposal's k is not the one evaluated
    study.optimize(lambda t: t.suggest_float("x", 0.0, 1.0) + t.suggest_int("k", 0, 3), n_trials=2)
    opt = sampler.optimizer
    assert opt.trial("user-0").params == {"x": 0.25, "k": 2}
    x1 = study.trials[1].params["x"]
    assert opt.trial("user-1").params == {"x": x1, "k": 1}
    assert [f["error"] for f in opt.failures] == ["not-evaluated"]
    assert sorted(opt.observations()[1].tolist()) == sorted([-2.25, -(x1 + 1)])  # minimize: negated inside


def test_distributions_qbatch_cannot_represent_are_refused_by_name():
    with pytest.raises(SpaceError, match="parameter 'q': qbatch float parameters have no step"):
        QbatchSampler({"q": FloatDistribution(0.0, 1.0, step=0.1)})
    with pytest.raises(SpaceError, match="parameter 'z'"):
        space_from_optuna({"z": "uniform"})
    assert space_from_optuna(SPACE).describe() == {
        "x": {"type": "float", "low": -3.0, "high": 3.0, "log": False},
        "lr": {"type": "float", "low": 1e-4, "high": 1e-1, "log": True},
        "n": {"type": "int", "low": 1, "high": 9, "step": 2, "log": False},
        "act": {"type": "choice", "choices": ["relu", "tanh"]},
    }


def test_a_suggestion_outside_the_space_fails_its_trial_naming_the_parameter():
    sampler = QbatchSampler({"x": FloatDistribution(0.0, 1.0)}, batch_size=2)
    study = optuna.create_study(sampler=sampler)
    with pytest.raises(SpaceError, match="parameter 'y' is not in the QbatchSampler's search space"):
        study.optimize(lambda t: t.suggest_float("x", 0.0, 1.0) + t.suggest_float("y", 0.0, 1.0), n_trials=1)
    with pytest.raises(SpaceError, match="parameter 'x': the objective suggests"):
        study.optimize(lambda t: t.suggest_float("x", 2.0, 3.0), n_trials=1)
    assert [f["error"] for f in sampler.optimizer.failures] == ["failed", "failed"]


def test_bad_options_and_multi_objective_studies_are_refused():
    with pytest.raises(ConfigError, match="`batch_size` must be an integer >= 1"):
        QbatchSampler(SPACE, batch_size=0)
    with pytest.raises(ConfigError, match="`direction` is the study's"):
        QbatchSampler(SPACE, direction="minimize")
    with pytest.raises(ConfigError, match="either `search_space`"):
        QbatchSampler()
    study = optuna.create_study(directions=["minimize", "minimize"], sampler=QbatchSampler(SPACE))
    with pytest.raises(UsageError, match="one objective"):
        study.optimize(lambda t: (t.suggest_float("x", -3.0, 3.0), 0.0), n_trials=1)


def test_an_optimizer_given_keeps_its_space_and_must_share_the_studys_direction():
    from orchestrator.ask_tell import AskTellOptimizer

    opt = AskTellOptimizer(
        {"x": {"type": "float", "low": 0.0, "high": 1.0}}, direction="maximize", initial_design=2
    )
    study = optuna.create_study(direction="maximize", sampler=QbatchSampler(optimizer=opt, batch_size=2))
    study.optimize(lambda t: t.suggest_float("x", 0.0, 1.0), n_trials=2)
    assert opt.num_completed == 2
    other = optuna.create_study(direction="minimize", sampler=QbatchSampler(optimizer=opt))
    with pytest.raises(UsageError, match="the study's direction is 'minimize'"):
        other.optimize(lambda t: t.suggest_float("x", 0.0, 1.0), n_trials=1)


def test_a_refused_refit_proposes_from_the_current_model_with_a_warning():
    sampler = QbatchSampler({"x": FloatDistribution(0.0, 1.0)}, batch_size=2, initial_design=2)
    study = optuna.create_study(sampler=sampler)
    values = iter([1e308, -1e308])  # a variance that overflows: the fit is refused
    study.optimize(lambda t: t.suggest_float("x", 0.0, 1.0) * 0 + next(values), n_trials=2)
    with pytest.warns(UserWarning, match="qbatch refit refused"):
        study.optimize(lambda t: t.suggest_float("x", 0.0, 1.0), n_trials=1)
    assert sampler.optimizer.num_completed == 3
