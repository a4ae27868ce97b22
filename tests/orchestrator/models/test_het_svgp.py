"""Tests of the HetGP baseline `HeteroscedasticSVGP` (y ~ N(f, e^{2g}), spec §1.3, §1.7) and the expectile
SVGP."""

from __future__ import annotations

import io
import math

import pytest
import torch

from orchestrator.errors import ConfigError
from orchestrator.models.expectile_svgp import ExpectileSVGP
from orchestrator.models.het_svgp import HeteroscedasticSVGP
from orchestrator.models.quantile_svgp import QuantileSVGP

TK = {"dtype": torch.float64}


def _mean(X):
    return 5.0 + 2.0 * torch.sin(3 * X[:, 0])


def _std(X):
    return 0.1 + 0.9 * X[:, 0] ** 2


@pytest.fixture(scope="module")
def gaussian_data():
    """Heteroscedastic Gaussian 1-D data: y = m(x) + s(x) z."""
    g = torch.Generator().manual_seed(0)
    X = torch.rand(600, 1, generator=g, **TK)
    return X, _mean(X) + _std(X) * torch.randn(600, generator=g, **TK)


@pytest.fixture(scope="module")
def het(gaussian_data):
    model = HeteroscedasticSVGP(tau=0.9, num_inducing=20, max_steps=800, seed=0)
    model.fit(*gaussian_data)
    return model


def test_learns_mean_and_noise_scale(het):
    Xt = torch.linspace(0.02, 0.98, 200, **TK).unsqueeze(-1)
    loc, scale = het.outcome_transform
    mu_f, _ = het.posterior_f(Xt, full_cov=False)
    mu_g, _ = het.posterior_g(Xt, full_cov=False)
    assert float((loc + scale * mu_f - _mean(Xt)).abs().max()) < 0.35
    noise_std = scale * mu_g.exp()
    # relative error of the learned noise std, away from the sparse left end
    rel = ((noise_std - _std(Xt)) / _std(Xt)).abs()
    assert float(rel.mean()) < 0.25, float(rel.mean())
    assert float(noise_std[-20:].mean()) > 3 * float(noise_std[:20].mean())  # heteroscedastic


def test_plug_in_quantile_is_the_objective(het):
    """objective_mean = mu_f + Phi^-1(tau) e^{mu_g} (spec §1.7); close to the true 0.9-quantile on Gaussian
    data."""
    Xt = torch.linspace(0.02, 0.98, 100, **TK).unsqueeze(-1)
    mu_f, _ = het.posterior_f(Xt, full_cov=False)
    mu_g, _ = het.posterior_g(Xt, full_cov=False)
    z = float(torch.special.ndtri(torch.tensor(0.9, **TK)))
    torch.testing.assert_close(het.objective_mean(Xt), mu_f + z * mu_g.exp())
    loc, scale = het.outcome_transform
    q_true = _mean(Xt) + z * _std(Xt)
    q = loc + scale * het.objective_mean(Xt).detach()
    assert float((q - q_true).pow(2).mean().sqrt()) < 0.1 * float(q_true.max() - q_true.min())


def test_forecast_quantiles(het):
    """The predictive distribution of y in original units (via `Forecast`) covers fresh data at its levels."""
    g = torch.Generator().manual_seed(9)
    Xt = torch.rand(2000, 1, generator=g, **TK)
    y = _mean(Xt) + _std(Xt) * torch.randn(2000, generator=g, **TK)
    qs = het.predict_quantiles(Xt, [0.1, 0.5, 0.9])
    assert qs.shape == (2000, 3)
    cover = (y.unsqueeze(-1) <= qs).double().mean(0)
    torch.testing.assert_close(cover, torch.tensor([0.1, 0.5, 0.9], **TK), atol=0.04, rtol=0)


def test_state_round_trip(het):
    buffer = io.BytesIO()
    torch.save(het.get_state(), buffer)
    buffer.seek(0)
    clone = HeteroscedasticSVGP()
    clone.set_state(torch.load(buffer, weights_only=True))
    Xt = torch.rand(5, 1, **TK)
    torch.testing.assert_close(clone.objective_mean(Xt), het.objective_mean(Xt), atol=0, rtol=0)
    assert clone.tau == 0.9 and clone.family == "gaussian"


def test_expectile_model_tracks_the_expectile(gaussian_data):
    """For Gaussian noise the tau-expectile is m(x) + s(x) e_tau, with e_tau the standard-normal expectile."""
    tau = 0.8
    X, Y = gaussian_data
    model = ExpectileSVGP(tau=tau, num_inducing=20, max_steps=800, seed=0)
    model.fit(X, Y)
    # standard-normal expectile: solve tau E[(Z-e)+] = (1-tau) E[(e-Z)+] by bisection
    lo, hi = -3.0, 3.0
    phi = lambda e: math.exp(-0.5 * e * e) / math.sqrt(2 * math.pi)  # noqa: E731
    Phi = lambda e: 0.5 * math.erfc(-e / math.sqrt(2))  # noqa: E731
    for _ in range(100):
        e = 0.5 * (lo + hi)
        up = phi(e) - e * (1 - Phi(e))  # E[(Z-e)+]
        down = e * Phi(e) + phi(e)  # E[(e-Z)+]
        lo, hi = (e, hi) if tau * up > (1 - tau) * down else (lo, e)
    Xt = torch.linspace(0.02, 0.98, 100, **TK).unsqueeze(-1)
    loc, scale = model.outcome_transform
    pred = loc + scale * model.objective_mean(Xt).detach()
    truth = _mean(Xt) + _std(Xt) * e
    assert float((pred - truth).pow(2).mean().sqrt()) < 0.1 * float(truth.max() - truth.min())
    # and it is not the quantile at the same level (which is larger for tau = 0.8)
    q = _mean(Xt) + _std(Xt) * float(torch.special.ndtri(torch.tensor(tau, **TK)))
    assert float((pred - truth).pow(2).mean()) < float((pred - q).pow(2).mean())


def test_families_and_bad_tau():
    assert HeteroscedasticSVGP().family == "gaussian"
    assert QuantileSVGP().family == "asymmetric_laplace"
    assert ExpectileSVGP().family == "asymmetric_gaussian"
    for cls in (HeteroscedasticSVGP, ExpectileSVGP):
        with pytest.raises(ConfigError, match="`tau`.*-0.1"):
            cls(tau=-0.1)
