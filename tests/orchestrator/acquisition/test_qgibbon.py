"""Tests of Q-GIBBON (quantile-expectile-bo.md §3): closed forms vs Monte Carlo, log-space numerics,
greedy gains vs log det increments, pending-point repulsion, and large batches.

Most tests use the contract's `PartsSurrogate`, a fixed two-latent sparse GP posterior whose
`posterior_f`/`posterior_g` are computed by a separate route (GPyTorch kernels and dense solves), so the
proposer's cached algebra is checked against it. The proposer contract runs on it and on real fitted
QuantileSVGP/ExpectileSVGP models (end of the file).
"""

from __future__ import annotations

import math
import re

import mpmath
import numpy as np
import pytest
import torch
from scipy import stats

from orchestrator.acquisition import gibbon_terms as T
from orchestrator.acquisition.base import DUPLICATE_TOL, min_distance
from orchestrator.acquisition.qgibbon import QGibbon, QGibbonAcquisition
from orchestrator.errors import ConfigError, InputDataError, UnsupportedError
from orchestrator.models import build_model
from orchestrator.models import distributions as D
from orchestrator.models.base import Surrogate
from tests.orchestrator.acquisition.proposer_contract import PartsSurrogate, ProposerContract, random_parts

TK = {"dtype": torch.float64}


pytestmark = pytest.mark.usefixtures("one_thread")


def make_model(family: str = "asymmetric_laplace", tau: float = 0.75, d: int = 2, log_sigma: float = -1.0,
               noise_f: float = 0.05, seed: int = 0) -> PartsSurrogate:
    """A fixed two-latent posterior (the contract's `PartsSurrogate`): f with unit outputscale, g = log σ
    around `log_sigma`, shared inducing inputs; `noise_f` sets how confident the f-posterior is."""
    Z = torch.rand(20, d, generator=torch.Generator().manual_seed(1234), **TK)
    parts_f = random_parts(d, seed=seed, lengthscale=0.25, noise=noise_f, Z=Z)
    parts_g = random_parts(d, seed=seed + 1, mean=log_sigma, lengthscale=0.4, outputscale=0.1, noise=0.2, Z=Z)
    return PartsSurrogate(parts_f, parts_g, family=family, tau=tau)


# --------------------------------------------------------------------------------------------------------
# C and V against Monte Carlo from the two-latent model
# --------------------------------------------------------------------------------------------------------
MU_F = torch.tensor([0.3, 0.1, 0.0], **TK)
SIG_F = torch.tensor([[0.20, 0.12, 0.05], [0.12, 0.25, 0.10], [0.05, 0.10, 0.30]], **TK)
MU_G = torch.tensor([-1.0, -0.7, -0.9], **TK)
SIG_G = torch.tensor([[0.10, 0.06, 0.03], [0.06, 0.08, 0.05], [0.03, 0.05, 0.12]], **TK)
N_MC = 1_000_000


def _draw(family: str, tau: float, seed: int):
    g = torch.Generator().manual_seed(seed)
    F = MU_F + torch.randn(N_MC, 3, generator=g, **TK) @ torch.linalg.cholesky(SIG_F).mT
    G = MU_G + torch.randn(N_MC, 3, generator=g, **TK) @ torch.linalg.cholesky(SIG_G).mT
    return F, D.sample(family, F, G, tau, generator=g)


@pytest.mark.parametrize("family, tau", [("asymmetric_laplace", 0.8), ("asymmetric_laplace", 0.25),
                                         ("asymmetric_gaussian", 0.8)])
def test_batch_covariance_matches_monte_carlo(family, tau):
    c_m, c_v = D.noise_constants(family, tau)
    _, Y = _draw(family, tau, seed=0)
    Yc = Y - Y.mean(0)
    prod = Yc.unsqueeze(-1) * Yc.unsqueeze(-2)
    C_mc, se = prod.mean(0), prod.std(0) / math.sqrt(N_MC)
    C = T.batch_covariance(SIG_F, MU_G, SIG_G, c_m, c_v)
    z = (C - C_mc).abs() / se
    assert z.max() < 4.5, f"C off by {z.max():.1f} standard errors:\n{C}\n{C_mc}"
    if family == "asymmetric_laplace" and tau == 0.8:
        # the public code's ×2 log-normal factor (spec A4) fails the same criterion (5.5 standard errors off)
        wrong = SIG_F[0, 1] + c_m**2 * torch.exp(
            MU_G[0] + MU_G[1] + 2.0 * (SIG_G[0, 0] + SIG_G[1, 1])
        ) * torch.expm1(SIG_G[0, 1])
        assert (wrong - C_mc[0, 1]).abs() / se[0, 1] > 4.5


@pytest.mark.parametrize(
    "family, tau, g_star",
    [("asymmetric_laplace", 0.8, 0.5), ("asymmetric_laplace", 0.3, 0.0), ("asymmetric_gaussian", 0.7, 0.2)],
)
def test_conditional_variance_matches_monte_carlo(family, tau, g_star):
    c_m, c_v = D.noise_constants(family, tau)
    F, Y = _draw(family, tau, seed=1)
    var_f, var_g = torch.diagonal(SIG_F), torch.diagonal(SIG_G)
    V = T.conditional_variance(MU_F, var_f, MU_G, var_g, torch.tensor([g_star], **TK), c_m, c_v)[0]
    for i in range(3):
        y = Y[F[:, i] <= g_star, i]
        sq = (y - y.mean()) ** 2
        se = sq.std() / math.sqrt(y.numel())
        assert (V[i] - sq.mean()).abs() / se < 4.5, f"V[{i}] = {V[i]:.4f} vs MC {sq.mean():.4f} ± {se:.4f}"
    # and not the unconditional variance: the truncation matters at these g*
    C = T.batch_covariance(SIG_F, MU_G, SIG_G, c_m, c_v)
    assert (torch.diagonal(C) - V).min() > 0


def test_truncated_variance_matches_scipy_and_mpmath():
    gam = torch.linspace(-8.0, 8.0, 33, **TK)
    ref = torch.tensor([stats.truncnorm(-math.inf, g).var() for g in gam.tolist()], **TK)
    assert torch.allclose(T.truncated_variance_factor(gam), ref, rtol=1e-8, atol=0)
    mpmath.mp.dps = 50
    for g in [-8.0, -12.0, -24.9, -25.1, -40.0, -60.0, -200.0, 5.0, 20.0, 38.0, 40.0]:
        G = mpmath.mpf(g)
        r = mpmath.npdf(G) / mpmath.ncdf(G)
        v_ref = 1 - G * r - r * r
        v = T.truncated_variance_factor(torch.tensor(g, **TK)).item()
        assert v == pytest.approx(float(v_ref), rel=1e-7), g
        log_info = T.log_info_factor(torch.tensor(g, **TK)).item()
        assert log_info == pytest.approx(float(mpmath.log(r * (G + r))), rel=1e-7, abs=1e-9), g
    # continuity at the switch to the asymptotic series
    a, b = T.truncated_variance_factor(
        torch.tensor([T.TRUNC_ASYMPTOTIC_GAMMA - 1e-9, T.TRUNC_ASYMPTOTIC_GAMMA + 1e-9], **TK)
    )
    assert abs(a / b - 1) < 1e-7


def test_no_zero_or_nan_for_gamma_from_minus_40_to_40():
    gamma = torch.linspace(-40.0, 40.0, 801, **TK)
    mu_f = (-gamma).clone().requires_grad_(True)  # g* = 0, s_f = 1  =>  γ = −μ_f
    var_f = torch.ones_like(gamma)
    log_noise = torch.full_like(gamma, math.log(0.5))
    g_star = torch.zeros(1, **TK)
    log_q, _ = T.log_quality(mu_f, var_f, log_noise, g_star)
    assert torch.isfinite(log_q).all()
    assert (log_q.diff() < 0).all()  # the higher g* is above the point, the less the point tells about it
    # where Q is representable it equals ½ log(C/V) computed directly
    v = T.truncated_variance_factor(gamma)  # checked against scipy and mpmath above
    direct = 0.5 * torch.log((1.0 + 0.5) / (v + 0.5))  # ½ log(C/V) with s_f = 1, N = 0.5
    ok = gamma < 5  # 1 − v(γ) still far above the float64 epsilon
    assert torch.allclose(log_q.detach()[ok].exp(), direct[ok], rtol=1e-9)
    for log_r in (None, torch.full_like(gamma, math.log(1e-3))):
        val = T.signed_log_gain(log_q, log_r, log_delta=float(log_q.detach().max()) + math.log(1e-3))
        assert torch.isfinite(val).all() and (val != 0).all()
        (grad,) = torch.autograd.grad(val.sum(), mu_f, retain_graph=True)
        assert torch.isfinite(grad).all()
        # with a constant repulsion 1e-3 ≫ Q the slope through Q alone is ~Q/1e-3 and may underflow
        if log_r is None:
            assert (grad != 0).all()
    # the naive float formula (BoTorch-style 1 − ρ²r(γ+r), meta-pytorch/botorch#3368) rounds to exactly zero
    # here
    # Φ(γ) underflows at the far left; only γ > 10 is used
    with np.errstate(divide="ignore", invalid="ignore"):
        r = torch.as_tensor(stats.norm.pdf(gamma.numpy()) / stats.norm.cdf(gamma.numpy()))
    naive = -0.5 * torch.log(1 - (1 / 1.5) * r * (gamma + r))
    assert (naive[gamma > 10] == 0).all()


def test_no_zero_values_with_a_huge_candidate_set():
    """Gumbel grid of 10^5 points on a confident posterior: γ reaches the hundreds, values stay nonzero."""
    model = make_model(noise_f=1e-5, log_sigma=-2.0)
    prop = QGibbon(grid_size=100_000)
    acq = prop.acquisition(model, torch.empty(0, 2, **TK), torch.Generator().manual_seed(0))
    X = torch.rand(2000, 2, generator=torch.Generator().manual_seed(1), **TK).requires_grad_(True)
    mu_f, var_f = model.posterior_f(X.detach(), full_cov=False)
    gamma = (acq.g_star.min() - mu_f) / var_f.sqrt()
    assert (gamma > 9).float().mean() > 0.3  # beyond γ ≈ 8.5 the naive float formula gives exactly 0
    assert (gamma > 40).any()  # and Q itself underflows past γ ≈ 38
    for pending in (False, True):
        if pending:
            acq.add(torch.rand(5, 2, generator=torch.Generator().manual_seed(2), **TK))
        log_q, log_r, _ = acq.log_parts(X)
        val = acq.objective(X, log_delta=float(log_q.detach().max()) + math.log(1e-3))
        (grad,) = torch.autograd.grad(val.sum(), X)
        assert torch.isfinite(val).all() and (val != 0).all()
        assert torch.isfinite(grad).all()
        assert torch.isfinite(log_q).all() and (log_r is None or torch.isfinite(log_r).all())


# --------------------------------------------------------------------------------------------------------
# the cached posterior algebra and the greedy batch
# --------------------------------------------------------------------------------------------------------
def _reference_C(model: Surrogate, S: torch.Tensor, c_m: float, c_v: float) -> torch.Tensor:
    _, Sf = model.posterior_f(S, full_cov=True)
    mu_g, Sg = model.posterior_g(S, full_cov=True)
    return T.batch_covariance(Sf, mu_g, Sg, c_m, c_v)


@pytest.mark.parametrize("family", ["asymmetric_laplace", "asymmetric_gaussian"])
def test_cached_moments_match_model_posterior(family):
    model = make_model(family=family, tau=0.3)
    acq = QGibbonAcquisition(model, torch.zeros(1, **TK))
    P = torch.rand(6, 2, generator=torch.Generator().manual_seed(3), **TK)
    acq.add(P[:4])
    acq.add(P[4:5])
    acq.add(P[5:])
    c_m, c_v = D.noise_constants(family, 0.3)
    C_ref = _reference_C(model, P, c_m, c_v) + acq.jitter * torch.eye(6, **TK)
    assert torch.allclose(acq.L_C @ acq.L_C.mT, C_ref, rtol=1e-9, atol=1e-11)
    X = torch.rand(9, 2, generator=torch.Generator().manual_seed(4), **TK)
    m = acq.moments(X)
    mu_f, var_f = model.posterior_f(X, full_cov=False)
    mu_g, var_g = model.posterior_g(X, full_cov=False)
    for a, b in ((m["mu_f"], mu_f), (m["var_f"], var_f), (m["mu_g"], mu_g), (m["var_g"], var_g)):
        assert torch.allclose(a, b, rtol=1e-9, atol=1e-12)
    C_all = _reference_C(model, torch.cat([P, X]), c_m, c_v)
    assert torch.allclose(acq._cross_to_pending(m), C_all[6:, :6], rtol=1e-9, atol=1e-12)
    assert torch.allclose(m["log_C"].exp(), torch.diagonal(C_all)[6:], rtol=1e-9)


@pytest.mark.parametrize("repulsion", ["paper", "rescaled"])
def test_greedy_gain_equals_half_logdet_increment(repulsion):
    model = make_model()
    c_m, c_v = D.noise_constants(model.family, model.tau)
    pending = torch.rand(3, 2, generator=torch.Generator().manual_seed(5), **TK)
    prop = QGibbon(grid_size=300, raw_samples=64, num_restarts=2, maxiter=15, repulsion=repulsion)
    B = prop.propose(model, 4, X_pending=pending, seed=0)
    diag = prop.last_diagnostics
    S = torch.cat([pending, B])
    C = _reference_C(model, S, c_m, c_v)
    mu_f, var_f = model.posterior_f(B, full_cov=False)
    mu_g, var_g = model.posterior_g(B, full_cov=False)
    V = T.conditional_variance(mu_f, var_f, mu_g, var_g, diag["max_values"], c_m, c_v)  # s x 4
    half_logdet = [0.5 * torch.logdet(C[:k, :k]) for k in range(3, 8)]
    for k in range(4):
        inc = half_logdet[k + 1] - half_logdet[k]  # ½ log det C_{P∪x} − ½ log det C_P = ½ log Schur
        quality = 0.5 * torch.log(C[3 + k, 3 + k]) - 0.5 * V[:, k].log().mean()
        w = 1.0 if repulsion == "paper" else 1.0 / (3 + k) ** 2
        expected = quality + w * (inc - 0.5 * torch.log(C[3 + k, 3 + k]))
        assert diag["gains"][k].item() == pytest.approx(expected.item(), abs=1e-6)
    if repulsion == "paper":  # the gains add up to the change of α_QG (eq 12)
        total = T.qgibbon_value(C, torch.cat([torch.ones(V.shape[0], 3, **TK), V], -1)) - 0.5 * torch.logdet(
            C[:3, :3]
        )
        assert diag["gains"].sum().item() == pytest.approx(total.item(), abs=1e-5)


def test_candidate_at_a_pending_point_is_strongly_repelled():
    model = make_model(log_sigma=-3.0)
    acq = QGibbonAcquisition(model, torch.tensor([2.0], **TK), repulsion="paper")
    P = torch.rand(5, 2, generator=torch.Generator().manual_seed(6), **TK)
    acq.add(P)
    far = (
        torch.tensor([[0.97, 0.03]], **TK)
        if min_distance(torch.tensor([[0.97, 0.03]], **TK), P) > 0.4
        else 1 - P[:1]
    )
    X = torch.cat([P[:1], P[:1] + 1e-7, far])
    _, log_r, log_C = acq.log_parts(X)
    R = -log_r.exp()
    assert R[0] < -0.5 and R[1] < -0.5  # at (and next to) a pending point: Schur ≈ noise ≪ C_xx
    assert R[2] > -0.05
    gain = acq.gain(X)
    assert gain[0] < gain[2] and gain[1] < gain[2]
    # the rescaled weight w = 1/|P|² scales the same repulsion
    acq.repulsion = "rescaled"
    assert acq.weight() == pytest.approx(1 / 25)


def test_batch_moves_away_from_pending_points():
    model = make_model()
    prop = QGibbon(grid_size=300, raw_samples=128, num_restarts=4, maxiter=30, repulsion="paper")
    x_best = prop.propose(model, 1, seed=0)
    x_again = prop.propose(model, 1, seed=1)
    assert (x_best - x_again).abs().max() < 0.02  # the quality optimum is found reliably
    pending = torch.cat([x_best, torch.rand(4, 2, generator=torch.Generator().manual_seed(7), **TK)])
    B = prop.propose(model, 3, X_pending=pending, seed=0)
    assert min_distance(B, pending).min() > 0.02
    assert (B[0] - x_best[0]).abs().max() > 0.02


def test_q100_distinct_in_bounds_with_pending():
    model = make_model()
    pending = torch.rand(20, 2, generator=torch.Generator().manual_seed(8), **TK)
    X_obs = torch.rand(30, 2, generator=torch.Generator().manual_seed(9), **TK)
    prop = QGibbon(grid_size=200, raw_samples=32, num_restarts=2, maxiter=5)
    B = prop.propose(model, 100, X_pending=pending, X_observed=X_obs, seed=0)
    assert B.shape == (100, 2) and B.dtype == torch.float64
    assert ((B >= 0) & (B <= 1)).all()
    d = (B.unsqueeze(1) - B.unsqueeze(0)).abs().amax(-1) + 2 * torch.eye(100, **TK)
    assert d.min() > DUPLICATE_TOL
    assert min_distance(B, pending).min() > DUPLICATE_TOL
    assert min_distance(B, X_obs).min() > DUPLICATE_TOL
    assert torch.isfinite(prop.last_diagnostics["gains"]).all()


def test_same_seed_same_batch_and_spread_hook():
    model = make_model()
    kw = dict(grid_size=200, raw_samples=48, num_restarts=2, maxiter=10)
    a = QGibbon(**kw).propose(model, 3, seed=3)
    b = QGibbon(**kw).propose(model, 3, seed=3)
    assert torch.equal(a, b)
    X = torch.rand(5, 2, **TK)
    plain = QGibbonAcquisition(model, torch.zeros(1, **TK)).moments(X)
    wide = QGibbonAcquisition(model, torch.zeros(1, **TK), spread=lambda Z: 2.0 + Z[..., 0]).moments(X)
    assert torch.allclose(wide["var_f"], (2.0 + X[:, 0]) ** 2 * plain["var_f"])
    assert torch.allclose(wide["mu_f"], plain["mu_f"])
    c = QGibbon(spread=lambda Z: torch.full(Z.shape[:-1], 3.0, **TK), **kw).propose(model, 2, seed=3)
    assert c.shape == (2, 2)


def test_errors_name_the_problem():
    with pytest.raises(ConfigError, match="repulsion"):
        QGibbon(repulsion="strong")
    with pytest.raises(ConfigError, match="num_restarts"):
        QGibbon(num_restarts=0)
    with pytest.raises(ConfigError, match="grid_size"):
        QGibbon(grid_size=-3)
    with pytest.raises(UnsupportedError, match="gaussian"):
        QGibbon().propose(make_model(family="gaussian"), 2, seed=0)
    bad = QGibbonAcquisition(make_model(), torch.zeros(1, **TK), spread=lambda Z: torch.ones(3, **TK))
    with pytest.raises(InputDataError, match="spread"):
        bad.moments(torch.rand(5, 2, **TK))
    X = torch.rand(5, 2, **TK)
    negative = QGibbonAcquisition(
        make_model(),
        torch.zeros(1, **TK),
        spread=lambda Z: torch.where(torch.arange(Z.shape[0]) == 2, -1.0, 1.0).to(**TK),
    )
    with pytest.raises(InputDataError, match=re.escape("1 of 5 are not, the first s(x) = -1.0 at x = "
                                                       f"{X[2].tolist()}")):
        negative.moments(X)
    with pytest.raises(InputDataError, match="last dimension"):
        QGibbonAcquisition(make_model(), torch.zeros(1, **TK)).log_parts(torch.rand(4, 3, **TK))


# --------------------------------------------------------------------------------------------------------
# the proposer contract, on the fixed posterior and on real fitted models
# --------------------------------------------------------------------------------------------------------
def _small_qgibbon() -> QGibbon:
    return QGibbon(grid_size=200, raw_samples=48, num_restarts=2, maxiter=10)


class TestQGibbonContract(ProposerContract):
    def make_proposer(self) -> QGibbon:
        return _small_qgibbon()

    def make_model(self, d: int) -> Surrogate:
        return make_model(d=d, seed=d)


_FITTED: dict[tuple[str, int], Surrogate] = {}


def _fitted(name: str, d: int) -> Surrogate:
    """A real QuantileSVGP / ExpectileSVGP fitted (briefly) to a noisy skewed function; cached per module."""
    if (name, d) not in _FITTED:
        g = torch.Generator().manual_seed(d)
        X = torch.rand(40, d, generator=g, **TK)
        noise = torch.empty(40, **TK).exponential_(generator=g) - 1.0
        Y = torch.sin(5 * X).sum(-1) + 0.3 * (0.5 + X[:, 0]) * noise
        model = build_model(name, tau=0.7, num_inducing=12, max_steps=25, seed=0)
        model.fit(X, Y)
        _FITTED[(name, d)] = model
    return _FITTED[(name, d)]


class TestQGibbonContractQuantileSVGP(ProposerContract):
    dims = (2, 4)
    q_values = (1, 5)

    def make_proposer(self) -> QGibbon:
        return _small_qgibbon()

    def make_model(self, d: int) -> Surrogate:
        return _fitted("quantile", d)


class TestQGibbonContractExpectileSVGP(TestQGibbonContractQuantileSVGP):
    def make_model(self, d: int) -> Surrogate:
        return _fitted("expectile", d)


@pytest.mark.parametrize("name", ["quantile", "expectile"])
def test_cached_moments_match_fitted_model(name):
    model = _fitted(name, 2)
    acq = QGibbonAcquisition(model, torch.zeros(1, **TK))
    X = torch.rand(8, 2, generator=torch.Generator().manual_seed(10), **TK)
    m = acq.moments(X)
    mu_f, Sf = model.posterior_f(X, full_cov=True)
    mu_g, Sg = model.posterior_g(X, full_cov=True)
    assert torch.allclose(m["mu_f"], mu_f, rtol=1e-7, atol=1e-9)
    assert torch.allclose(m["var_f"], torch.diagonal(Sf), rtol=1e-7, atol=1e-9)
    assert torch.allclose(m["mu_g"], mu_g, rtol=1e-7, atol=1e-9)
    acq.add(X[:5])
    c_m, c_v = D.noise_constants(model.family, model.tau)
    C = T.batch_covariance(Sf, mu_g, Sg, c_m, c_v)
    assert torch.allclose(
        acq.L_C @ acq.L_C.mT, C[:5, :5] + acq.jitter * torch.eye(5, **TK), rtol=1e-7, atol=1e-9
    )
    assert torch.allclose(acq._cross_to_pending(acq.moments(X[5:])), C[5:, :5], rtol=1e-7, atol=1e-9)


def test_greedy_gains_never_rise_from_step_to_step():
    """With w = 1 each point added to the batch can only lower the gain everywhere (the quality term is fixed
    and the Schur complement shrinks), so the best gain of greedy step k + 1 is at most step k's. Once the
    gain is positive only on small regions, few of the 1024 random candidates land there; the last step's
    optima start each step too, so no step returns a point with a gain far below the maximum (random
    candidates alone gave 80 times below at steps 9-12 on this problem)."""
    g = torch.Generator().manual_seed(1)
    n, d, tau = 150, 3, 0.75
    X = torch.rand(n, d, generator=g, dtype=torch.float64)
    f = torch.sin(3 * X[:, 0] + 1) * torch.cos(2 * X[:, 1]) + 0.5 * X[:, 2]
    e1, e2 = (-torch.log(torch.rand(n, generator=g, dtype=torch.float64)) for _ in range(2))
    Y = f + (0.1 + 0.3 * X[:, 1]) * (e1 / tau - e2 / (1 - tau))
    # the paper's model (k-means Z, the spec's prior, a GP noise scale, Adam): gains on 16 greedy steps
    model = build_model(
        "quantile",
        tau=tau,
        num_inducing=50,
        max_steps=800,
        seed=0,
        inducing_placement="kmeans",
        lengthscale_prior="spec",
        optimizer="adam",
        noise_scale="gp",
    )
    model.fit(X, Y)
    qg = QGibbon(repulsion="paper")
    qg.propose(model, 16, X_observed=X, seed=0)
    gains = qg.last_diagnostics["gains"]
    assert (gains > 0).sum() >= 8
    rises = [(k, float(a), float(b)) for k, (a, b) in enumerate(zip(gains[:-1], gains[1:]), 1)
             if b > a + 0.1 * abs(a) + 1e-7]
    assert not rises, f"(step, gain, next gain) where the next is larger: {rises}"


def test_min_distance_through_its_tree_matches_the_pairwise_distances():
    """`min_distance` answers large inputs with a k-d tree (a pairwise tensor for Q-GIBBON's duplicate check
    would be n_candidates x n_observed x d: 2.6 GB at 20,000 observed points in 16-D)."""
    g = torch.Generator().manual_seed(0)
    X = torch.rand(700, 5, generator=g, dtype=torch.float64)
    others = torch.rand(900, 5, generator=g, dtype=torch.float64)
    others[:3] = X[:3] + 1e-9  # near-duplicates
    assert X.shape[0] * others.shape[0] > 1 << 14  # the tree's path
    want = torch.stack([(x - others).abs().amax(-1).min() for x in X])
    got = min_distance(X, others)
    assert got.dtype == X.dtype and torch.allclose(got, want, rtol=0, atol=1e-15)
    assert (got[:3] < DUPLICATE_TOL).all() and (got[3:] > DUPLICATE_TOL).all()
    assert torch.isinf(min_distance(X, others[:0])).all()
    bounded = min_distance(X, others, bound=2 * DUPLICATE_TOL)
    assert torch.equal(bounded[:3], got[:3]) and torch.isinf(bounded[3:]).all()
    # a few rows against many: compared directly, in chunks (a tree per call cost 30x for one row)
    many = torch.rand(40000, 5, generator=g, dtype=torch.float64)
    few = torch.cat([many[:2], torch.rand(8, 5, generator=g, dtype=torch.float64)])
    want = torch.stack([(x - many).abs().amax(-1).min() for x in few])
    assert torch.equal(min_distance(few, many), want) and (want[:2] == 0).all()


def test_on_a_grid_the_batch_is_chosen_where_it_will_be_evaluated(monkeypatch):
    """With the space's `snap`, Q-GIBBON scores, de-duplicates and adds each point at its grid cell, so no
    point of a batch on int and choice grids repeats a taken cell and nothing is replaced by a random point
    (a batch built from unrounded points repeats 8-17 of 100 cells once rounded)."""
    import orchestrator.ask_tell as AT

    space = {f"i{k}": {"type": "int", "low": 0, "high": 7} for k in range(4)}
    space["c"] = {"type": "choice", "choices": ["a", "b", "c"]}

    def value(p, seed):
        x = [p[f"i{k}"] / 7 for k in range(4)] + [{"a": 0.0, "b": 0.5, "c": 1.0}[p["c"]]]
        return -sum((v - 0.6) ** 2 for v in x) + 0.1 * float(
            torch.randn(1, generator=torch.Generator().manual_seed(seed))
        )

    from proposer_contract import count_replaced

    replaced = count_replaced(monkeypatch)
    opt = AT.AskTellOptimizer(space, model="quantile", tau=0.5, proposer="qgibbon", initial_design=40, seed=0,
                              model_options={"num_inducing": 40, "max_steps": 100},
                              proposer_options={"raw_samples": 128, "num_restarts": 2, "maxiter": 20})
    assert opt._build_proposer().snap is not None
    # one model-based batch: without the snap, 17 of its 100 points were replaced (6 with these cheaper
    # options)
    for q in (40, 100):
        for t in opt.ask(q):
            opt.tell(t.trial_id, value(t.params, t.seed))
    assert replaced[1:] == [0], replaced


def test_a_used_up_grid_gets_repeats_not_an_error():
    """Once every cell of a small int/choice space is taken, no snapped candidate is new: Q-GIBBON does not
    raise (which would stop an actor's run), and the optimizer keeps repeats there."""
    import orchestrator.ask_tell as AT

    # 12 cells
    space = {"i": {"type": "int", "low": 0, "high": 5}, "c": {"type": "choice", "choices": ["a", "b"]}}
    opt = AT.AskTellOptimizer(space, model="quantile", tau=0.5, proposer="qgibbon", initial_design=8, seed=0,
                              model_options={"num_inducing": 8, "max_steps": 100},
                              proposer_options={"raw_samples": 64, "num_restarts": 2, "maxiter": 20})
    seen = set()
    for q in (8, 4, 4, 4):
        for t in opt.ask(q):
            seen.add((t.params["i"], t.params["c"]))
            opt.tell(t.trial_id, -((t.params["i"] / 5 - 0.6) ** 2) + (0.1 if t.params["c"] == "a" else 0.0))
    assert len(seen) == 12 and opt.num_completed == 20


def test_on_a_grid_each_point_is_the_cell_of_largest_gain():
    """With `snap`, candidates are scored again at their grid cells: the point chosen is the cell whose gain
    is largest over all 16 cells of a 4 x 4 grid (g* drawn as the proposer draws it). Ranking candidates by
    their
    value before rounding fails here: it chooses another cell in 7 of 12 seeds."""
    k = 4

    def snap(X):
        return ((X * k).floor().clamp(max=k - 1) + 0.5) / k

    cells = torch.cartesian_prod(*[(torch.arange(k, **TK) + 0.5) / k] * 2)
    for seed in range(6):
        model = make_model(seed=seed)
        prop = QGibbon(grid_size=300, raw_samples=64, num_restarts=4, maxiter=30)
        prop.snap = snap
        X = prop.propose(model, 1, seed=seed)
        acq = prop.acquisition(model, torch.empty(0, 2, **TK), torch.Generator().manual_seed(seed))
        with torch.no_grad():
            gains = torch.stack([acq.gain(c.unsqueeze(0)).reshape(()) for c in cells])
        assert torch.equal(X[0], cells[gains.argmax()]), (seed, X, gains)
        assert float(prop.last_diagnostics["gains"][0]) == pytest.approx(float(gains.max()), rel=1e-9)
