"""The predictive distribution of y (Forecast) against Monte Carlo from the two-latent model."""

import math

import pytest
import torch

from orchestrator.models import distributions as D
from orchestrator.models.predictive import Forecast

FAMILIES = ["asymmetric_laplace", "asymmetric_gaussian", "gaussian"]


def make(family, tau=0.2):
    return Forecast(
        family,
        tau,
        mu_f=torch.tensor([0.0, 1.5, -2.0]),
        var_f=torch.tensor([0.3, 1e-14, 2.0]),
        mu_g=torch.tensor([-0.5, 0.2, math.log(0.3)]),
        var_g=torch.tensor([0.2, 0.05, 0.0]),
    )


def monte_carlo(fc, n=400_000, seed=0):
    gen = torch.Generator().manual_seed(seed)
    f = fc.mu_f + fc.var_f.sqrt() * torch.randn(n, len(fc), generator=gen, dtype=torch.float64)
    g = fc.mu_g + fc.var_g.sqrt() * torch.randn(n, len(fc), generator=gen, dtype=torch.float64)
    return D.sample(fc.family, f, g, fc.tau, gen)  # n x points


@pytest.mark.parametrize("family", FAMILIES)
def test_cdf_matches_monte_carlo(family):
    fc = make(family)
    y = monte_carlo(fc)
    probes = torch.quantile(y, torch.tensor([0.05, 0.3, 0.5, 0.8, 0.97], dtype=torch.float64), dim=0).T  # points x 5
    emp = (y.unsqueeze(-1) <= probes.unsqueeze(0)).double().mean(0)
    got = fc.cdf(probes)
    se = (emp * (1 - emp) / y.shape[0]).sqrt()
    assert torch.all((got - emp).abs() < 5 * se + 1e-3), (got, emp)


@pytest.mark.parametrize("family", FAMILIES)
def test_mean_and_variance_match_monte_carlo(family):
    fc = make(family)
    y = monte_carlo(fc)
    assert torch.allclose(fc.mean(), y.mean(0), atol=5 * (y.var(0) / y.shape[0]).sqrt().max().item())
    assert torch.allclose(fc.variance(), y.var(0), rtol=0.03)


@pytest.mark.parametrize("family", FAMILIES)
def test_quantile_inverts_cdf_and_is_monotone(family):
    fc = make(family)
    levels = [0.01, 0.1, 0.5, 0.9, 0.99]
    q = fc.quantile(levels)
    assert q.shape == (3, 5)
    assert torch.all(q.diff(dim=-1) > 0)
    assert torch.allclose(fc.cdf(q), torch.tensor(levels, dtype=torch.float64).expand(3, 5), atol=1e-8)
    lo, hi = fc.interval(0.8)
    assert torch.allclose(fc.cdf(hi) - fc.cdf(lo), torch.full((3,), 0.8, dtype=torch.float64), atol=1e-8)


def test_known_f_reduces_to_the_noise_law():
    fc = make("asymmetric_laplace", tau=0.3)[1:2]
    fc = Forecast(fc.family, fc.tau, fc.mu_f, fc.var_f, fc.mu_g, torch.zeros(1))
    # f known and sigma known: P(Y <= f) = tau exactly
    assert fc.cdf(fc.mu_f).item() == pytest.approx(0.3, abs=1e-9)
    assert fc.quantile([0.3]).item() == pytest.approx(fc.mu_f.item(), abs=1e-8)


def test_records_round_trip_and_errors():
    fc = make("asymmetric_gaussian", 0.7)
    back = Forecast.from_records(fc.to_records())
    assert torch.equal(back.mu_f, fc.mu_f) and back.family == fc.family and back.tau == fc.tau
    with pytest.raises(ValueError, match="quantile levels must be in \\(0, 1\\)"):
        fc.quantile([0.0, 0.5])
    with pytest.raises(ValueError, match="unknown likelihood family 'cauchy'"):
        Forecast("cauchy", 0.5, torch.zeros(1), torch.ones(1), torch.zeros(1), torch.zeros(1))
