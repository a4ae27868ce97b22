"""The sites' fixed point at fixed hyperparameters (orchestrator/models/site_fixed_point.py).

The properties proved here: the accelerated iteration reaches the plain natural-gradient fixed point; a step
on the means keeps its evaluation exact and climbs; repeated inputs sum their observations' gradients; the
sites' extrapolation is exact where they move linearly with the hyperparameters.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from threadpoolctl import threadpool_limits

from orchestrator.models import build_model
from orchestrator.models import full_variational as fv
from orchestrator.models import site_fixed_point as sfp
from orchestrator.models.base import TKWARGS
from orchestrator.models.svgp import TwoLatentSVGP


def _data(n: int, d: int = 2, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, d, generator=g, **TKWARGS)
    f = torch.sin(6 * X[:, 0]) + X[:, 1:].sum(-1)
    # skewed, input-dependent
    noise = -torch.log(torch.rand(n, generator=g, **TKWARGS)) * (0.2 + 0.5 * X[:, 0])
    return X, f - noise


def _problem(n: int, kind: str = "quantile", seed: int = 0) -> sfp.SiteProblem:
    """The sites' problem of a model on Z = X with hyperparameters off their defaults."""
    X, Y = _data(n, seed=seed)
    model = TwoLatentSVGP(X)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        model.covar_module.base_kernel.lengthscale = 0.2 + torch.rand(2, 1, 2, generator=g, **TKWARGS)
        model.covar_module.outputscale = 0.3 + torch.rand(2, generator=g, **TKWARGS)
        model.mean_module.constant.copy_(torch.tensor([0.2, math.log(0.4)], **TKWARGS))
        idx = fv.observation_index(X, model.Z)
        return sfp.SiteProblem(
            model.kzz().numpy(), fv._prior(model), idx, Y, build_model(kind, tau=0.2).likelihood
        )


def _plain_fixed_point(problem, nu, lam, steps=3000, beta=0.7):
    """The plain damped natural-gradient iteration (no acceleration, no means' refinement)."""
    for _ in range(steps):
        ev = problem.evaluate(nu, lam)
        lam_target = np.clip(-2.0 * ev.g_var, *sfp.LAMBDA_BOUNDS)
        nu = (1 - beta) * nu + beta * (ev.g_mean + lam_target * ev.post.mean)
        lam = (1 - beta) * lam + beta * lam_target
    return problem.evaluate(nu, lam)


@pytest.mark.parametrize("kind", ["quantile", "expectile"])
def test_the_accelerated_fixed_point_is_the_plain_one(kind):
    problem = _problem(10, kind, seed=4)
    nu, lam = np.zeros((2, 10)), np.full((2, 10), 1e-6)
    with threadpool_limits(limits=1, user_api="blas"):
        reference = _plain_fixed_point(problem, nu, lam)
    _, _, steps, ev = sfp.solve_fixed_point(problem, nu, lam, 200, 1e-10)
    assert steps < 100
    assert np.allclose(ev.post.mean, reference.post.mean, atol=1e-7)
    assert np.allclose(ev.post.var, reference.post.var, rtol=1e-7, atol=1e-10)
    assert ev.elbo >= reference.elbo - 1e-8


def test_a_means_step_keeps_the_evaluation_exact():
    problem = _problem(15, seed=5)
    g = np.random.default_rng(0)
    nu, lam = g.normal(size=(2, 15)), g.uniform(0.1, 5.0, size=(2, 15))
    ev = problem.evaluate(nu, lam)
    for _ in range(3):
        nu, refined = problem.refine(nu, ev)
        fresh = problem.evaluate(nu, lam)
        assert abs(refined.elbo - fresh.elbo) <= 1e-9 * abs(fresh.elbo)
        assert np.allclose(refined.post.mean, fresh.post.mean, atol=1e-12)
        assert refined.elbo > ev.elbo  # the means' step climbs
        ev = refined


def test_repeated_inputs_sum_their_observations_gradients():
    X, Y = _data(10)
    X = torch.cat([X, X[:4]])
    Y = torch.cat([Y, Y[:4] - 0.2])
    model = TwoLatentSVGP(X[:10])
    lik = build_model("quantile", tau=0.3).likelihood
    idx = fv.observation_index(X, model.Z)
    with torch.no_grad():
        problem = sfp.SiteProblem(model.kzz().numpy(), fv._prior(model), idx, Y, lik)
    nu, lam = np.zeros((2, 10)), np.ones((2, 10))
    ev = problem.evaluate(nu, lam)
    assert np.allclose(ev.g_mean[:, :4], ev.obs_g_mean[:, :4] + ev.obs_g_mean[:, 10:])
    assert np.allclose(ev.g_mean[:, 4:], ev.obs_g_mean[:, 4:10])


def test_sites_extrapolate_exactly_where_they_move_linearly_with_the_hyperparameters():
    g = np.random.default_rng(1)
    J = g.normal(size=(8, 3))
    x0 = np.concatenate([g.normal(size=4), g.uniform(1.0, 2.0, size=4)])
    thetas = [g.normal(size=3) * 0.1 for _ in range(4)]
    trail = [(t, x0 + J @ t) for t in thetas]
    theta = 0.3 * thetas[0] - 0.5 * thetas[1] + 1.2 * thetas[2]  # in the span of the trail's differences
    got = sfp.extrapolate_sites(trail, theta, trail[-1][1])
    assert np.allclose(got, x0 + J @ theta, atol=1e-8)
    assert np.array_equal(sfp.extrapolate_sites(trail[:1], theta, x0), x0)
