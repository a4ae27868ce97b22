"""The predictive distribution of y (Forecast) against Monte Carlo from the two-latent model."""

import math

import numpy as np
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
    # points x 5
    probes = torch.quantile(y, torch.tensor([0.05, 0.3, 0.5, 0.8, 0.97], dtype=torch.float64), dim=0).T
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


@pytest.mark.parametrize("ratio", [2.0, 0.3, 0.05, 0.01])
def test_ag_at_tau_half_is_the_gaussian_sum_for_any_noise_to_f_ratio(ratio):
    """AG at tau = 1/2 is N(f, sigma^2) (rho = u^2/2), so y ~ N(mu, s^2 + sigma^2) exactly, also once
    sigma << s_f, where a 48-node quadrature over f makes the CDF a staircase (0.05 off at sigma/s_f = 0.05,
    the 0.9-quantile 1.18 for 1.28) that calibrators would then "fix" in a calibrated model."""
    fc = Forecast("asymmetric_gaussian", 0.5, torch.zeros(1), torch.ones(1), torch.tensor([math.log(ratio)]),
                  torch.zeros(1))
    ys = torch.linspace(-3, 3, 301, dtype=torch.float64)
    exact = torch.special.ndtr(ys / math.sqrt(1 + ratio**2))
    assert (fc.cdf(ys.reshape(1, -1))[0] - exact).abs().max().item() < 1e-9
    assert fc.quantile([0.9]).item() == pytest.approx(1.2815516 * math.sqrt(1 + ratio**2), abs=1e-6)


@pytest.mark.parametrize("tau", [0.1, 0.9])
@pytest.mark.parametrize("ratio", [0.5, 0.02])
def test_ag_cdf_matches_quadrature_over_f(tau, ratio):
    """The skew-normal closed form against quadrature of E_f[F_AG(y | f, sigma)], with g known and with g
    uncertain (Gauss-Hermite in g). In f: composite Gauss-Legendre (64 nodes a piece), cut at the kink f = y
    and at y -+ 1, 3, 10, 30, 100 sigma, where F_AG(y | f) turns over. It agrees with 160 nodes a piece to
    1e-14, and with scipy's adaptive `quad` (breakpoint y, which this test used: 22 s a case, 200 times
    longer) to 6e-7, where `quad` itself warned of roundoff."""
    from scipy import stats

    sigma = ratio
    t_gl, w_gl = np.polynomial.legendre.leggauss(64)

    def reference(y, s_g=0.0):
        zs, ws = np.polynomial.hermite.hermgauss(40) if s_g else (np.zeros(1), np.full(1, math.sqrt(math.pi)))
        total = 0.0
        for z, w in zip(zs, ws):
            sg = sigma * math.exp(math.sqrt(2) * s_g * z)
            cuts = {-12.0, 12.0, y, *(y + side * k * sg for side in (-1, 1) for k in (1, 3, 10, 30, 100))}
            cuts = np.array(sorted(c for c in cuts if -12.0 <= c <= 12.0))
            a, b = cuts[:-1, None], cuts[1:, None]
            f = ((b - a) / 2 * t_gl + (a + b) / 2).ravel()
            wf = ((b - a) / 2 * w_gl).ravel()
            F = D.cdf("asymmetric_gaussian", torch.tensor(y, dtype=torch.float64), torch.from_numpy(f),
                      torch.tensor(math.log(sg), dtype=torch.float64), tau).numpy()
            total += w / math.sqrt(math.pi) * float(np.sum(wf * stats.norm.pdf(f) * F))
        return total

    for s_g in (0.0, 0.4):
        fc = Forecast(
            "asymmetric_gaussian",
            tau,
            torch.zeros(1),
            torch.ones(1),
            torch.tensor([math.log(sigma)]),
            torch.tensor([s_g**2]),
        )
        for y in (-1.7, -0.2, 0.0, 0.6, 2.1):
            # 32 Gauss-Hermite nodes in g in the code, 40 here: agree to 1e-6
            assert fc.cdf(torch.tensor([[y]], dtype=torch.float64)).item() == pytest.approx(
                reference(y, s_g), abs=2e-6
            )


@pytest.mark.parametrize("tau,mu_g,var_g", [(0.5, -25.0, 0.0), (0.9, -25.0, 0.0), (0.9, -5.0, 2.5),
                                             (0.99, -3.0, 4.0), (0.9, -1.0, 0.5)])
def test_al_cdf_stays_finite_and_right_when_the_noise_is_tiny_next_to_f(tau, mu_g, var_g):
    """The asymmetric-Laplace CDF stays monotone and finite where the log-space sum of
    exp(a d + (a s)^2 / 2) Phi(-d/s - a s) cancels at 1e15-1e17, once sigma / s_f < ~1e-9 at a Gauss-Hermite
    node of g (at tau 0.9 already for mu_g = -5, var_g = 2.5; there the sum gives 0 or NaN and a median of
    90.7 for -0.2). Against adaptive quadrature of E_g[E_f[F_AL(y | f, e^g)]] (f ~ N(0, 1))."""
    from scipy import integrate

    fc = Forecast("asymmetric_laplace", tau, torch.zeros(1), torch.ones(1), torch.tensor([mu_g]),
                  torch.tensor([var_g]))
    ys = torch.tensor([-1.0, 0.0, 0.5, 2.0], dtype=torch.float64)
    got = fc.cdf(ys.reshape(1, -1))[0]
    zs, ws = np.polynomial.hermite.hermgauss(30) if var_g else (np.zeros(1), np.full(1, math.sqrt(math.pi)))

    def al_cdf(y, f, sigma):  # spec §1's asymmetric Laplace in closed form; both branches' exponents are <= 0
        if y <= f:
            return tau * math.exp((1 - tau) * (y - f) / sigma)
        return 1 - (1 - tau) * math.exp(-tau * (y - f) / sigma)

    for y, f, g in [(-0.3, 0.2, -1.0), (0.7, 0.2, 0.5), (0.2, 0.2, -30.0), (0.2 + 1e-14, 0.2, -35.0)]:
        y_, f_, g_ = (torch.tensor(v, dtype=torch.float64) for v in (y, f, g))
        lib = float(D.cdf("asymmetric_laplace", y_, f_, g_, tau))
        # the reference is the library's F_AL
        assert lib == pytest.approx(al_cdf(y, f, math.exp(g)), abs=1e-12)

    def reference(y):
        total = 0.0
        for z, w in zip(zs, ws):
            sigma = math.exp(mu_g + math.sqrt(2 * var_g) * z)
            inner = lambda f: math.exp(-0.5 * f * f) / math.sqrt(2 * math.pi) * al_cdf(y, f, sigma)  # noqa: E731, B023
            total += w / math.sqrt(math.pi) * integrate.quad(inner, -12, 12, points=[y], limit=200)[0]
        return total

    assert torch.isfinite(got).all() and torch.all(got.diff() >= 0), got
    want = torch.tensor([reference(float(y)) for y in ys], dtype=torch.float64)
    assert (got - want).abs().max().item() < 2e-3, (got, want)
    q = fc.quantile([0.1, 0.5, 0.9])[0]
    assert (
        torch.all(q.diff() > 0)
        and (fc.cdf(q.reshape(1, -1))[0] - torch.tensor([0.1, 0.5, 0.9])).abs().max() < 1e-6
    )
