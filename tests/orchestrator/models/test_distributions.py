"""Properties of the noise laws of spec §1.2: normalization, quantile/expectile identities, moments, CDF,
sampling."""

import math

import numpy as np
import pytest
import torch
from scipy import integrate

from orchestrator.models import distributions as D

TAUS = [0.1, 0.3, 0.5, 0.75, 0.95]
FAMILIES = ["asymmetric_laplace", "asymmetric_gaussian", "gaussian"]
F, G = 0.7, math.log(1.3)


def pdf(family, tau):
    def p(y):
        return float(
            D.log_prob(
                family,
                torch.tensor(y, dtype=torch.float64),
                torch.tensor(F, dtype=torch.float64),
                torch.tensor(G, dtype=torch.float64),
                tau,
            ).exp()
        )

    return p


def quad(fun, a=-np.inf, b=np.inf):
    # split at the kink y = F for accuracy
    pieces = [(a, min(b, F)), (max(a, F), b)]
    return sum(
        integrate.quad(fun, lo, hi, limit=400, epsabs=1e-13, epsrel=1e-12)[0] for lo, hi in pieces if lo < hi
    )


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("tau", TAUS)
def test_density_integrates_to_one_and_moments(family, tau):
    p = pdf(family, tau)
    assert quad(p) == pytest.approx(1.0, abs=1e-8)
    cm, cv = D.noise_constants(family, tau)
    sigma = math.exp(G)
    mean = quad(lambda y: y * p(y))
    var = quad(lambda y: (y - mean) ** 2 * p(y))
    assert mean == pytest.approx(F + sigma * cm, abs=1e-7)
    assert var == pytest.approx(sigma**2 * cv, rel=1e-7)


@pytest.mark.parametrize("tau", TAUS)
def test_al_f_is_the_tau_quantile(tau):
    assert quad(pdf("asymmetric_laplace", tau), b=F) == pytest.approx(tau, abs=1e-9)


@pytest.mark.parametrize("tau", TAUS)
def test_ag_f_is_the_tau_expectile(tau):
    p = pdf("asymmetric_gaussian", tau)
    right = tau * quad(lambda y: (y - F) * p(y), a=F)
    left = (1 - tau) * quad(lambda y: (F - y) * p(y), b=F)
    assert right == pytest.approx(left, rel=1e-7)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("tau", [0.1, 0.5, 0.9])
def test_cdf_matches_integral_of_density(family, tau):
    p = pdf(family, tau)
    for y in [-3.0, 0.2, F, 1.1, 4.0]:
        expected = quad(p, b=y) if y > F else integrate.quad(p, -np.inf, y)[0]
        got = D.cdf(
            family,
            torch.tensor(y, dtype=torch.float64),
            torch.tensor(F, dtype=torch.float64),
            torch.tensor(G, dtype=torch.float64),
            tau,
        ).item()
        assert got == pytest.approx(expected, abs=1e-8), (family, tau, y)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("tau", [0.1, 0.75])
def test_samples_follow_the_cdf(family, tau):
    gen = torch.Generator().manual_seed(0)
    n = 200_000
    y = D.sample(
        family, torch.full((n,), F, dtype=torch.float64), torch.full((n,), G, dtype=torch.float64), tau, gen
    )
    for q in [-1.0, 0.5, F, 1.5]:
        emp = (y <= q).double().mean().item()
        exact = D.cdf(
            family,
            torch.tensor(q, dtype=torch.float64),
            torch.tensor(F, dtype=torch.float64),
            torch.tensor(G, dtype=torch.float64),
            tau,
        ).item()
        # 5 standard errors of a Bernoulli mean
        assert abs(emp - exact) < 5 * math.sqrt(exact * (1 - exact) / n) + 1e-4


def test_bad_tau_names_the_value():
    with pytest.raises(ValueError, match="tau must be in \\(0, 1\\); got 1.5"):
        D.al_constants(1.5)
    with pytest.raises(ValueError, match="unknown likelihood family 'student'"):
        D.noise_constants("student", 0.5)
