"""The two-latent SVGPs' option `noise_scale: constant` (svgp.py `SVGPOptions.noise_scale`): the scale latent
g = log sigma held to one learned constant. It stays constant through cold and warm fits and a restore from a
saved state, its level is the data's noise (the Gaussian family's against BoTorch's exact GP on the same
homoscedastic data), g's hyperpriors leave the loss, the default ("gp") is the spec's model, and a bad value
is a ConfigError."""

from __future__ import annotations

import io
import math

import pytest
import torch

from orchestrator.ask_tell import AskTellOptimizer
from orchestrator.errors import ConfigError
from orchestrator.models.expectile_svgp import ExpectileSVGP
from orchestrator.models.het_svgp import HeteroscedasticSVGP
from orchestrator.models.quantile_svgp import QuantileSVGP
from orchestrator.models.svgp import MIN_OUTPUTSCALE

TK = {"dtype": torch.float64}
FAST = {"num_inducing": 32, "max_steps": 600, "seed": 0}


def _data(noise_sd, n: int = 400, seed: int = 0):
    """2-D data y = sin(3 x0) + cos(2 x1) / 2 + noise_sd(x) z."""
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, 2, generator=g, **TK)
    Y = (
        torch.sin(3 * X[:, 0])
        + 0.5 * torch.cos(2 * X[:, 1])
        + noise_sd(X) * torch.randn(n, generator=g, **TK)
    )
    return X, Y


def _spread(model, X):
    g, var = model.posterior_g(X)
    return float(g.max() - g.min()), float(var.max())


@pytest.mark.parametrize("cls", [QuantileSVGP, ExpectileSVGP, HeteroscedasticSVGP])
def test_constant_scale_holds_g_through_warm_refits_and_a_restore(cls):
    """On data whose noise SD grows 13-fold across the box, the spec's model (g a GP) learns a g that varies
    by more than one nat; with `noise_scale: constant` g varies by less than 1e-3 after a cold fit, a warm
    refit on more data, and in a copy restored from the saved state (a run's model checkpoint)."""
    X, Y = _data(lambda X: 0.05 + 0.6 * X[:, 1])
    Xt = torch.rand(500, 2, generator=torch.Generator().manual_seed(1), **TK)
    free = cls(tau=0.2, noise_scale="gp", **FAST)
    free.fit(X, Y)
    assert _spread(free, Xt)[0] > 1.0
    model = cls(tau=0.2, noise_scale="constant", **FAST)
    model.fit(X[:300], Y[:300])
    model.fit(X, Y)  # warm: projected onto new inducing points
    spread, var = _spread(model, Xt)
    assert spread < 1e-3 and var <= 2 * MIN_OUTPUTSCALE
    assert float(model.model.outputscale[1]) == MIN_OUTPUTSCALE and float(model.model.outputscale[0]) > 1e-3
    buffer = io.BytesIO()
    torch.save(model.get_state(), buffer)
    buffer.seek(0)
    clone = cls()
    clone.set_state(torch.load(buffer, weights_only=True))
    assert clone.options.noise_scale == "constant" and clone.model.constant_scale
    torch.testing.assert_close(clone.posterior_g(Xt)[0], model.posterior_g(Xt)[0], atol=0, rtol=0)
    clone.fit(X, Y)  # and the restored model's own refits keep it
    assert _spread(clone, Xt)[0] < 1e-3


def test_constant_scale_learns_the_noise_of_an_exact_gp():
    """The Gaussian family with a constant scale is a homoscedastic sparse GP: on data with Gaussian noise of
    SD 0.3 everywhere its noise SD e^g (in the outcome's units) matches that of BoTorch's exact GP on the same
    data (and the truth) within 10%."""
    from botorch.fit import fit_gpytorch_mll
    from botorch.models import SingleTaskGP
    from gpytorch.mlls import ExactMarginalLogLikelihood

    X, Y = _data(lambda X: torch.full_like(X[:, 0], 0.3), n=500)
    model = HeteroscedasticSVGP(tau=0.5, noise_scale="constant", **FAST)
    model.fit(X, Y)
    _, scale = model.outcome_transform
    sd_svgp = abs(scale) * math.exp(float(model.posterior_g(X[:1])[0]))
    gp = SingleTaskGP(X, Y.unsqueeze(-1))
    fit_gpytorch_mll(ExactMarginalLogLikelihood(gp.likelihood, gp))
    sd_exact = float(gp.likelihood.noise.sqrt()) * float(Y.std())  # BoTorch standardizes Y (`Standardize`)
    assert sd_svgp == pytest.approx(sd_exact, rel=0.10) and sd_svgp == pytest.approx(0.3, rel=0.10)


def test_constant_scale_quantile_noise_level_is_the_check_loss_scale():
    """For the asymmetric Laplace at level tau, the maximum-likelihood scale of residuals r is
    mean(rho_tau(r)); for Gaussian noise of SD s that is s phi(z_tau). The constant-scale quantile SVGP's e^g
    lands within 15% of it."""
    from scipy.stats import norm

    tau, s = 0.2, 0.3
    X, Y = _data(lambda X: torch.full_like(X[:, 0], s), n=600)
    model = QuantileSVGP(tau=tau, noise_scale="constant", **FAST)
    model.fit(X, Y)
    _, scale = model.outcome_transform
    sigma = abs(scale) * math.exp(float(model.posterior_g(X[:1])[0]))
    assert sigma == pytest.approx(s * norm.pdf(norm.ppf(tau)), rel=0.15)


def test_constant_scale_leaves_g_hyperpriors_out_of_the_loss():
    """`log_prior` sums f's lengthscale and outputscale priors only: g has no kernel to put them on."""
    X, Y = _data(lambda X: torch.full_like(X[:, 0], 0.2), n=100)
    model = QuantileSVGP(tau=0.5, noise_scale="constant", **{**FAST, "max_steps": 50})
    model.fit(X, Y)
    m = model.model
    expected = torch.zeros((), **TK)
    for _, module, prior, closure, _ in m.named_priors():
        expected = expected + prior.log_prob(closure(module))[0].sum()
    torch.testing.assert_close(m.log_prior(), expected)
    m.constant_scale = False  # the same parameters under the spec's model: g's priors count too
    assert float(m.log_prior()) != pytest.approx(float(expected), abs=1e-6)


def test_noise_scale_is_checked_and_defaults_per_family():
    assert QuantileSVGP().options.noise_scale == "gp"  # the quantile model's default (benchmarks/quality.py)
    assert ExpectileSVGP().options.noise_scale == "gp"
    assert QuantileSVGP(noise_scale="constant").options.noise_scale == "constant"
    from orchestrator.models.het_svgp import HeteroscedasticSVGP

    assert HeteroscedasticSVGP().options.noise_scale == "gp"  # HetGP's noise model is its point
    for bad in ("Constant", "none", 1, True, None):
        with pytest.raises(ConfigError, match=r"^`noise_scale` must be one of \['gp', 'constant'\]; got "):
            QuantileSVGP(noise_scale=bad)


def test_qgibbon_proposes_from_a_constant_scale_model():
    """Q-GIBBON reads g's moments (spec §3.2): with g constant its batch is still q distinct points in the
    box."""
    space = {"x": {"type": "float", "low": 0.0, "high": 1.0}, "y": {"type": "float", "low": 0.0, "high": 1.0}}
    opt = AskTellOptimizer(space, model="quantile", proposer="qgibbon", tau=0.2, initial_design=30, seed=0,
                           model_options={"noise_scale": "constant", **FAST},
                           proposer_options={"raw_samples": 256, "num_restarts": 2, "num_max_samples": 5,
                                             "grid_size": 500})
    for t in opt.ask(30):
        opt.tell(t.trial_id, math.sin(3 * t.params["x"]) + 0.1 * t.seed % 7 / 7)
    batch = opt.ask(5)
    xs = {(t.params["x"], t.params["y"]) for t in batch}
    assert len(xs) == 5 and all(0 <= v <= 1 for p in xs for v in p)
