"""`QbatchSearch` (qbatch/tune.py) under a real `tune.Tuner` on a local Ray, and its state, space conversion
and failures without Ray (run inside scripts/loopback)."""

from __future__ import annotations

import math

import pytest

ray = pytest.importorskip("ray")
from ray import tune  # noqa: E402

from orchestrator.errors import ConfigError, SpaceError  # noqa: E402
from qbatch.tune import QbatchSearch, space_from_tune  # noqa: E402
from tests.integration.conftest import FAST_MODEL, FAST_PROPOSER  # noqa: E402

FAST = {"model_options": FAST_MODEL["options"], "proposer_options": FAST_PROPOSER["options"]}
SPACE = {"x": {"type": "float", "low": -2.0, "high": 2.0}, "n": {"type": "int", "low": 1, "high": 8}}


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray for the module: two CPUs, no dashboard."""
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.mark.ray
def test_a_tuner_with_concurrent_trials_tells_every_completed_trial(local_ray, tmp_path):
    def train(config):  # (defined here: Ray's workers cannot import a test module, so it travels by value)
        if config["x"] > 1.5:  # a failing corner: an errored Tune trial is a recorded failure
            raise RuntimeError("diverged")
        return {"loss": (config["x"] - 0.5) ** 2 + 0.1 * config["opt"]["n"], "tag": config["tag"]}

    searcher = QbatchSearch(initial_design=4, seed=3, **FAST)
    tuner = tune.Tuner(
        train,
        param_space={"x": tune.uniform(-2.0, 2.0), "opt": {"n": tune.randint(1, 9)}, "tag": "const"},
        tune_config=tune.TuneConfig(search_alg=searcher, metric="loss", mode="min", num_samples=12,
                                    max_concurrent_trials=2),
        run_config=tune.RunConfig(storage_path=str(tmp_path), name="qbatch", verbose=0),
    )
    results = tuner.fit()
    assert len(results) == 12
    ok = [r for r in results if r.error is None]
    assert ok and all(r.metrics["tag"] == "const" and 1 <= r.config["opt"]["n"] <= 8 for r in ok)
    opt = searcher.optimizer
    # the metric and mode came from TuneConfig, the space from param_space, the batch size from
    # max_concurrent_trials
    assert opt is not None and opt.direction == "minimize" and searcher.batch_size == 2
    assert list(opt.space.describe()) == ["x", "opt/n"]
    assert opt.num_completed == len(ok) and opt.num_completed + opt.num_failed == 12
    assert all(f["error"] == "tune-error" for f in opt.failures)
    best_params, best_value = opt.best_observed()
    assert best_value == pytest.approx(min(r.metrics["loss"] for r in ok))
    assert -2.0 <= best_params["x"] <= 2.0


@pytest.mark.ray
def test_a_space_given_to_the_searcher_takes_the_tune_configs_metric(local_ray, tmp_path):
    searcher = QbatchSearch(SPACE, batch_size=3, initial_design=3, **FAST)
    tuner = tune.Tuner(
        lambda c: {"score": -abs(c["x"]) - c["n"]},
        param_space={"unused": 1},  # Tune passes its metric and mode with a non-empty param_space only
        tune_config=tune.TuneConfig(search_alg=searcher, metric="score", mode="max", num_samples=5,
                                    max_concurrent_trials=2),
        run_config=tune.RunConfig(storage_path=str(tmp_path), name="given", verbose=0),
    )
    results = tuner.fit()
    assert not results.errors
    opt = searcher.optimizer
    assert opt.direction == "maximize" and searcher.batch_size == 3
    # 5 trials took 5 of the two batches of 3: the sixth point is still queued, so pending
    assert opt.num_completed == 5 and opt.num_pending == 1


def _drive(searcher, ids):
    return {tid: searcher.suggest(tid) for tid in ids}


def test_save_and_restore_continue_with_the_same_pending_and_told_trials(tmp_path):
    searcher = QbatchSearch(SPACE, metric="loss", mode="min", batch_size=4, initial_design=8)
    configs = _drive(searcher, ["t1", "t2", "t3"])
    searcher.on_trial_complete("t1", {"loss": 1.5})
    searcher.on_trial_complete("t2", {"loss": float("nan")})  # a recorded failure
    path = tmp_path / "searcher.pkl"
    searcher.save(str(path))

    restored = QbatchSearch()
    restored.restore(str(path))
    opt = restored.optimizer
    assert (restored.metric, restored.mode, restored.batch_size) == ("loss", "min", 4)
    assert opt.num_completed == 1 and opt.num_failed == 1 and opt.num_pending == 2  # t3 running, one queued
    assert opt.best_observed()[1] == 1.5
    # both go on alike: the queued point next, then a new batch
    assert _drive(restored, ["t4", "t5"]) == _drive(searcher, ["t4", "t5"])
    restored.on_trial_complete("t3", {"loss": 0.5})
    assert opt.is_told(restored.get_state()["trials"]["t4"]) is False
    assert opt.num_completed == 2 and opt.best_observed() == (
        {k: configs["t3"][k] for k in SPACE}, 0.5)


def test_results_without_the_metric_and_errors_are_failures_and_strangers_are_ignored():
    searcher = QbatchSearch(SPACE, metric="loss", mode="max", batch_size=3)
    _drive(searcher, ["a", "b", "c"])
    searcher.on_trial_complete("a", {"other": 1.0})
    searcher.on_trial_complete("b", None, error=True)
    searcher.on_trial_complete("never-suggested", {"loss": 1.0})
    searcher.on_trial_complete("c", {"loss": 2.0})
    searcher.on_trial_complete("c", {"loss": 3.0})  # a second notification of one trial changes nothing
    opt = searcher.optimizer
    assert [f["error"] for f in opt.failures] == ["no-metric", "tune-error"]
    assert opt.num_completed == 1 and opt.best_observed()[1] == 2.0 and opt.direction == "maximize"


def test_tune_domains_become_qbatch_parameters_and_the_rest_is_refused_by_name():
    converted = space_from_tune({
        "lr": tune.loguniform(1e-4, 1e-1), "layers": tune.randint(1, 5), "width": tune.qrandint(32, 256, 32),
        "act": tune.choice(["relu", "tanh"]), "nested": {"p": tune.uniform(0, 1)}, "batch": 64,
        "own": {"type": "int", "low": 1, "high": 3},
    })
    assert {name: spec for name, (_, spec) in converted.items()} == {
        "lr": {"type": "float", "low": 1e-4, "high": 1e-1, "log": True},
        "layers": {"type": "int", "low": 1, "high": 4, "log": False},  # randint excludes its upper end
        "width": {"type": "int", "low": 32, "high": 256, "step": 32},
        "act": {"type": "choice", "choices": ["relu", "tanh"]},
        "nested/p": {"type": "float", "low": 0.0, "high": 1.0, "log": False},
        "own": {"type": "int", "low": 1, "high": 3},
    }
    assert converted["nested/p"][0] == ("nested", "p")
    for bad, match in [
        ({"q": tune.quniform(0, 1, 0.1)}, "'q'.*Float domain sampled by uniform quantized by 0.1"),
        ({"g": tune.randn()}, "'g'.*normal"),
        ({"grid": tune.grid_search([1, 2])}, "'grid'.*grid"),
        ({"f": tune.sample_from(lambda c: 1)}, "'f'.*Function"),
    ]:
        with pytest.raises(SpaceError, match=match):
            space_from_tune(bad)
    with pytest.raises(SpaceError, match="'batch'.*not a Tune domain"):
        QbatchSearch({"batch": 64})


def test_a_searcher_with_a_space_refuses_a_second_one_and_bad_options_are_named():
    searcher = QbatchSearch(SPACE)
    assert searcher.set_search_properties("loss", "min", {"x": tune.uniform(0, 1)}) is False
    assert searcher.set_search_properties("loss", "min", {"constant": 1}) is True
    assert (searcher.metric, searcher.mode) == ("loss", "min")
    with pytest.raises(ConfigError, match="`mode` must be 'max' or 'min'"):
        QbatchSearch(SPACE, mode="minimize")
    with pytest.raises(ConfigError, match="`direction` comes from `mode`"):
        QbatchSearch(SPACE, direction="minimize")
    with pytest.raises(ConfigError, match="`batch_size` must be an integer >= 1"):
        QbatchSearch(SPACE, batch_size=0)
    with pytest.raises(Exception, match="no search space"):
        QbatchSearch(metric="loss", mode="min").suggest("t")


def test_an_optimizer_given_is_driven_as_it_is():
    from orchestrator.ask_tell import AskTellOptimizer

    opt = AskTellOptimizer(SPACE, direction="minimize", initial_design=2)
    searcher = QbatchSearch(optimizer=opt, metric="loss", batch_size=2)
    assert searcher.mode == "min" and searcher.optimizer is opt
    config = searcher.suggest("t")
    searcher.on_trial_complete("t", {"loss": 0.25})
    assert opt.best_observed() == (config, 0.25)
    with pytest.raises(ConfigError, match="disagrees"):
        QbatchSearch(optimizer=opt, mode="max")
    assert math.isfinite(opt.best()[1])


def test_a_refused_refit_proposes_from_the_current_model_with_a_warning():
    searcher = QbatchSearch(SPACE, metric="loss", mode="min", batch_size=2, initial_design=2)
    _drive(searcher, ["a", "b"])
    searcher.on_trial_complete("a", {"loss": 1e308})
    searcher.on_trial_complete("b", {"loss": -1e308})  # a variance that overflows: the fit is refused
    with pytest.warns(UserWarning, match="qbatch refit refused"):
        assert set(searcher.suggest("c")) == set(SPACE)
