"""The recommendation's own fit (`SVGPOptions.recommendation_scale`, `TwoLatentSVGPSurrogate.recommender`):
after a final fit the quantile model recommends from a cold fit with one constant noise scale on the same
data, while n <= `full_batch_max`; proposals keep the fitted model; a failing recommender leaves the
recommendation to the model; a bad value is a ConfigError naming the option."""

from __future__ import annotations

import pytest
import torch

from orchestrator.ask_tell import AskTellOptimizer
from orchestrator.errors import ConfigError, ModelFitError
from orchestrator.models.expectile_svgp import ExpectileSVGP
from orchestrator.models.het_svgp import HeteroscedasticSVGP
from orchestrator.models.quantile_svgp import QuantileSVGP

TK = {"dtype": torch.float64}
SPACE = {f"x{i}": {"type": "float", "low": 0.0, "high": 1.0} for i in range(2)}


def _data(n: int = 40, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """y = m(x) - s(x) E, E ~ Exp(1): a bump whose noise widens towards x1 = 1."""
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, 2, generator=g, **TK)
    m = torch.exp(-((X - 0.6) ** 2).sum(-1) / 0.08)
    s = 0.05 + 0.5 * X[:, 1]
    E = -torch.log(torch.rand(n, generator=g, **TK))
    return X, m - s * E


def _g_spread(model, X) -> float:
    g, _ = model.posterior_g(X)
    return float(g.max() - g.min())


def test_a_bad_value_is_a_config_error_naming_the_option():
    with pytest.raises(ConfigError, match="recommendation_scale"):
        QuantileSVGP(tau=0.1, recommendation_scale="median")


def test_the_quantile_model_recommends_from_a_constant_scale_by_default_and_the_others_from_themselves():
    assert QuantileSVGP(tau=0.1).options.recommendation_scale == "constant"
    assert QuantileSVGP(tau=0.1).options.noise_scale == "gp"
    assert ExpectileSVGP(tau=0.1).options.recommendation_scale == "model"
    assert HeteroscedasticSVGP(tau=0.1).options.recommendation_scale == "model"


def test_the_recommender_is_a_cold_constant_scale_fit_on_the_same_data_and_leaves_the_model_alone():
    X, Y = _data()
    model = QuantileSVGP(tau=0.1, seed=0)
    model.fit(X, Y)
    before = {k: v.clone() for k, v in model.get_state()["model"].items()}
    mean_before = model.objective_mean(X).detach().clone()
    rec = model.recommender(X, Y)
    assert rec is not model and isinstance(rec, QuantileSVGP)
    assert rec.options.noise_scale == "constant" and model.options.noise_scale == "gp"
    assert _g_spread(rec, X) < 1e-3 < _g_spread(model, X)
    assert torch.equal(model.objective_mean(X), mean_before)
    assert all(torch.equal(before[k], v) for k, v in model.get_state()["model"].items())
    # the same fit as a constant-scale model built directly: same options but the scale, cold, same data
    direct = QuantileSVGP(tau=0.1, seed=0, noise_scale="constant")
    direct.fit(X, Y)
    assert torch.allclose(rec.objective_mean(X), direct.objective_mean(X), atol=1e-8)
    assert rec.recommender(X, Y) is rec


@pytest.mark.parametrize("options", [{"recommendation_scale": "model"}, {"noise_scale": "constant"},
                                     {"recommendation_full_batch_max": 30}])
def test_the_recommender_is_the_model_itself_when_told_already_constant_or_past_the_full_batch_fit(options):
    X, Y = _data(n=40)
    model = QuantileSVGP(tau=0.1, seed=0, max_steps=200, **options)
    model.fit(X, Y)
    assert model.recommender(X, Y) is model


def test_the_recommender_fits_full_batch_where_the_model_has_moved_to_minibatches():
    """Past the model's own `full_batch_max` (its fits minibatch Adam) and up to
    `recommendation_full_batch_max`, the recommender is the full-batch constant-scale fit: the one a model
    with a higher `full_batch_max` makes."""
    X, Y = _data(n=40)
    model = QuantileSVGP(tau=0.1, seed=0, max_steps=200, full_batch_max=30)
    model.fit(X, Y)
    rec = model.recommender(X, Y)
    assert rec is not model and rec.options.full_batch_max == 1000
    direct = QuantileSVGP(tau=0.1, seed=0, max_steps=200, noise_scale="constant")
    direct.fit(X, Y)
    assert torch.allclose(rec.objective_mean(X), direct.objective_mean(X), atol=1e-8)
    # a minibatch fit of the same model lands elsewhere: the option is what makes it full-batch
    mini = QuantileSVGP(tau=0.1, seed=0, max_steps=200, noise_scale="constant", full_batch_max=30)
    mini.fit(X, Y)
    assert not torch.allclose(rec.objective_mean(X), mini.objective_mean(X), atol=1e-4)
    with pytest.raises(ConfigError, match="recommendation_full_batch_max"):
        QuantileSVGP(tau=0.1, recommendation_full_batch_max=0)


def _told_optimizer(n_batches: int = 4) -> AskTellOptimizer:
    X, Y = _data(n=10 * n_batches, seed=1)
    opt = AskTellOptimizer(SPACE, model="quantile", tau=0.1, seed=0, initial_design=10)
    for x, y in zip(X.tolist(), Y.tolist()):
        opt.tell_point({"x0": x[0], "x1": x[1]}, y)
    return opt


def _same_point(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(abs(a[k] - b[k]) < 1e-12 for k in a)


def test_a_final_fit_recommends_the_argmax_of_its_recommender_and_proposals_keep_the_model():
    opt = _told_optimizer()
    diag = opt.fit()
    assert diag["recommender"] == "fitted for it"
    rec, model = opt.recommender, opt.model
    assert rec is not model and rec.options.noise_scale == "constant" and model.options.noise_scale == "gp"
    X, _ = opt.observations()
    with torch.no_grad():
        i = int(torch.argmax(rec.objective_mean(X)))
    params, predicted = opt.best()
    assert _same_point(params, opt.space.from_unit(X[i:i + 1])[0])
    loc, scale = rec.outcome_transform
    assert predicted == pytest.approx(loc + scale * float(rec.objective_mean(X[i:i + 1])[0]))
    # a refit without the restart (those inside `ask`) recommends from the model in use
    diag = opt.fit(restart=False)
    assert "recommender" not in diag and opt.recommender is opt.model
    with torch.no_grad():
        j = int(torch.argmax(opt.model.objective_mean(X)))
    assert opt.best()[0] == diag["best_params"]
    assert _same_point(diag["best_params"], opt.space.from_unit(X[j:j + 1])[0])


def test_a_recommender_whose_fit_fails_leaves_the_recommendation_to_the_model(monkeypatch):
    opt = _told_optimizer()

    def fail(self, X, Y):
        raise ModelFitError("no fit")

    monkeypatch.setattr(QuantileSVGP, "recommender", fail)
    diag = opt.fit()
    assert diag["recommender"].startswith("model (its recommender's fit failed")
    assert opt.recommender is opt.model
    X, _ = opt.observations()
    with torch.no_grad():
        i = int(torch.argmax(opt.model.objective_mean(X)))
    assert _same_point(diag["best_params"], opt.space.from_unit(X[i:i + 1])[0])


def test_a_restored_model_keeps_the_recommendation_and_recommends_from_itself_after():
    opt = _told_optimizer()
    opt.fit()
    best = opt.best()
    checkpoint = opt.model_checkpoint()
    fresh = _told_optimizer()
    fresh.restore_model(checkpoint)
    assert fresh.best() == best
    assert fresh.recommender is fresh.model
