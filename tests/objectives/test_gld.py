"""GLD problems (quantile-expectile-bo.md §4.1): FMKL quantile function, GP draws by RFF, exact quantiles
against 20,000 draws, numerical optimum."""

from __future__ import annotations

import numpy as np
import pytest

from objectives.base import ObjectiveError
from objectives.gld import GLDProblem, MaternRFF, fmkl_quantile


def test_fmkl_zero_shapes_give_the_logistic_and_the_limit_is_continuous():
    u = np.linspace(0.01, 0.99, 99)
    np.testing.assert_allclose(
        fmkl_quantile(u, 1.0, 2.0, 0.0, 0.0), 1.0 + 2.0 * np.log(u / (1 - u)), rtol=1e-13
    )
    for lam in (1e-12, -1e-12, 1e-7):
        np.testing.assert_allclose(fmkl_quantile(u, 0.0, 1.0, lam, lam), fmkl_quantile(u, 0.0, 1.0, 0.0, 0.0),
                                   atol=1e-6)
    # away from zero it is the textbook formula
    l3, l4 = 0.3, -0.2
    ref = ((u**l3 - 1) / l3 - ((1 - u) ** l4 - 1) / l4) / 1.5
    np.testing.assert_allclose(fmkl_quantile(u, 0.0, 1 / 1.5, l3, l4), ref, rtol=1e-12)
    assert np.all(np.diff(fmkl_quantile(u, 0.0, 1.0, l3, l4)) > 0)


def test_rff_draws_have_the_matern52_covariance():
    rff = MaternRFF(2, 0.5, 4000, 100, seed=7)  # each draw has its own features
    X = np.array([[0.2, 0.2], [0.4, 0.2], [0.2, 0.9]])
    H = rff(X)  # `3 x 4000`: 4000 independent draws
    emp = np.cov(H)
    r = np.linalg.norm(X[:, None] - X[None], axis=-1) / 0.5
    k = (1 + np.sqrt(5) * r + 5 * r**2 / 3) * np.exp(-np.sqrt(5) * r)
    np.testing.assert_allclose(emp, k, atol=0.08)


def test_problem_structure_and_lengthscales():
    g3, g6, g2 = GLDProblem(dim=3), GLDProblem(dim=6), GLDProblem(dim=2)
    assert (g3.lengthscale, g6.lengthscale, g2.lengthscale) == (0.5, 1.0, pytest.approx(1 / 3))
    assert list(g3.space) == ["x0", "x1", "x2"] and g3.direction == "maximize" and g3.noisy
    lam = g3.lambdas(np.random.default_rng(0).random((500, 3)))
    assert np.all(lam[:, 1] > 0)  # 1/lambda_2 > 0
    X = np.random.default_rng(1).random((50, 3))
    assert not np.allclose(
        GLDProblem(problem=0).quantile_unit(X, 0.75), GLDProblem(problem=1).quantile_unit(X, 0.75)
    )
    np.testing.assert_array_equal(
        GLDProblem(problem=4).quantile_unit(X, 0.75), GLDProblem(problem=4).quantile_unit(X, 0.75)
    )


@pytest.mark.parametrize("tau", [0.25, 0.75, 0.95])
def test_empirical_quantile_of_20000_draws_matches_exact(tau):
    n = 20_000
    g = GLDProblem(dim=3, problem=2)
    rng = np.random.default_rng(11)
    X = rng.random((5, 3))
    Y = g.sample_unit(X, rng, size=n)  # `n x 5`
    exact = g.quantile_unit(X, tau)
    se = np.sqrt(tau * (1 - tau) / n) / g.quantile_density(X, tau)
    z = (np.quantile(Y, tau, axis=0) - exact) / se
    assert np.all(np.abs(z) < 4.5), z


def test_evaluate_draws_follow_the_same_distribution():
    g = GLDProblem(dim=3, problem=3)
    p = {"x0": 0.2, "x1": 0.5, "x2": 0.8}
    draws = np.array([g(p, seed=s) for s in range(3000)])
    x = np.array([[0.2, 0.5, 0.8]])
    for tau in (0.25, 0.75):
        se = np.sqrt(tau * (1 - tau) / 3000) / g.quantile_density(x, tau)[0]
        assert abs(np.quantile(draws, tau) - g.quantile(p, tau)) < 4.5 * se


def test_optimum_beats_random_points_and_is_cached():
    g = GLDProblem(dim=3, problem=5)
    x_opt, v_opt = g.optimum(0.75)
    X = np.random.default_rng(3).random((20_000, 3))
    assert g.quantile_unit(X, 0.75).max() <= v_opt + 1e-9
    assert g.quantile(x_opt, 0.75) == pytest.approx(v_opt)
    assert g.optimum(0.75) is g.optimum(0.75)
    assert g.optimum(0.95)[1] > v_opt  # higher level, higher quantile


def test_bad_arguments_are_named():
    with pytest.raises(ObjectiveError, match="dim"):
        GLDProblem(dim=0)
    with pytest.raises(ObjectiveError, match="problem"):
        GLDProblem(problem=-1)
    with pytest.raises(ObjectiveError, match="tau"):
        GLDProblem().quantile_unit(np.zeros((1, 3)), 1.0)
    with pytest.raises(ObjectiveError, match="n x 3"):
        GLDProblem().quantile_unit(np.zeros((1, 2)), 0.5)


@pytest.mark.slow
@pytest.mark.parametrize("dim", [3, 6])
def test_optimum_is_not_beaten_by_dense_random_search_over_many_problems(dim):
    rng = np.random.default_rng(dim)
    for problem in range(5):
        g = GLDProblem(dim=dim, problem=problem)
        _, v_opt = g.optimum(0.75)
        X = rng.random((30_000, dim))
        assert g.quantile_unit(X, 0.75).max() <= v_opt + 1e-9, problem
