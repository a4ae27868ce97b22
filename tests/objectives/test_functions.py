"""Classic test functions (calibrated-bo.md §2.2) and the noisy Ackley (locbo.md §3.2): known optima, noise
model, exact quantiles against empirical ones, BoTorch agreement."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import norm

from objectives.base import ObjectiveError
from objectives.functions import (
    Ackley,
    Alpine,
    Beale,
    Cosines,
    CrossInTray,
    Dropwave,
    Forrester,
    McCormick,
    NoisyAckley,
    Powers,
    SixHumpCamel,
    maximize_on_box,
    point_rng,
)

# (class, optimum value from the literature / spec table, one known optimizer)
KNOWN = [
    (Forrester, -6.0207, (0.757,)),
    (Ackley, 0.0, (0.0, 0.0)),
    (Alpine, 0.0, (0.0,) * 10),
    (SixHumpCamel, -1.0316, (0.0898, -0.7126)),
    (Cosines, -1.6, (0.3125, 0.3125)),
    (Beale, 0.0, (3.0, 0.5)),
    (McCormick, -1.9133, (-0.54719, -1.54719)),
    (Powers, 0.0, (0.0, 0.0)),
    (CrossInTray, -2.06261, (1.3491, -1.3491)),
    (Dropwave, -1.0, (0.0, 0.0)),
    (NoisyAckley, 0.0, (0.0, 0.0)),
]


@pytest.mark.parametrize("cls,value,x", KNOWN, ids=[k[0].__name__ for k in KNOWN])
def test_known_optimum_value_at_known_location(cls, value, x):
    obj = cls() if cls is not NoisyAckley else cls(noise_scale=0.0)
    params = {f"x{i}": v for i, v in enumerate(x)}
    assert obj.quantile(params, 0.5) == pytest.approx(value, abs=2e-3)
    opt_params, opt_value = obj.optimum(0.5)
    assert opt_value == pytest.approx(value, abs=1e-3)
    # no random point beats the optimum (in the objective's own sense)
    rng = np.random.default_rng(0)
    X = obj.bounds[:, 0] + rng.random((4000, obj.dim)) * (obj.bounds[:, 1] - obj.bounds[:, 0])
    vals = obj.quantile_array(X, 0.5)
    if obj.direction == "minimize":
        assert vals.min() >= opt_value - 1e-9
    else:
        assert vals.max() <= opt_value + 1e-9


def test_forrester_local_minimum_and_directions():
    f = Forrester()
    assert f.quantile({"x0": 0.1426}, 0.5) == pytest.approx(-0.986, abs=2e-3)
    assert f.direction == "minimize" and not f.noisy
    assert NoisyAckley().direction == "maximize" and NoisyAckley().noisy


@pytest.mark.parametrize(
    "cls,botorch_name",
    [(Ackley, "Ackley"), (Beale, "Beale"), (SixHumpCamel, "SixHumpCamel"), (Dropwave, "DropWave")],
)
def test_botorch_backed_functions_agree_with_botorch(cls, botorch_name):
    import botorch.test_functions.synthetic as syn

    obj = cls()
    ref = getattr(syn, botorch_name)(bounds=[tuple(b) for b in obj.bounds])
    X = obj.bounds[:, 0] + np.random.default_rng(1).random((50, obj.dim)) * (
        obj.bounds[:, 1] - obj.bounds[:, 0]
    )
    np.testing.assert_allclose(obj.f(X), ref.evaluate_true(torch.tensor(X)).numpy(), rtol=1e-12, atol=1e-12)


def test_domains_follow_the_spec_table():
    assert SixHumpCamel().bounds.tolist() == [[-2.0, 2.0], [-1.0, 1.0]]
    assert Dropwave().bounds.tolist() == [[-1.0, 1.0], [-1.0, 1.0]]
    assert McCormick().bounds.tolist() == [[-1.5, 4.0], [-3.0, 4.0]]
    assert Alpine().dim == 10 and Alpine().bounds[0].tolist() == [-10.0, 10.0]
    assert NoisyAckley().bounds.tolist() == [[-10.0, 10.0], [-10.0, 10.0]]
    assert list(Forrester().space) == ["x0"]


@pytest.mark.parametrize("tau", [0.1, 0.5, 0.9])
@pytest.mark.parametrize("hetero", [False, True])
def test_noisy_variant_quantile_matches_empirical(tau, hetero):
    obj = Forrester(noise_std=0.5, heteroscedastic=hetero)
    assert obj.noisy
    n = 3000
    for x in (0.1, 0.9):
        draws = np.array([obj({"x0": x}, seed=s) for s in range(n)])
        exact = obj.quantile({"x0": x}, tau)
        sd = float(obj.noise_sd(np.array([[x]]))[0])
        se = np.sqrt(tau * (1 - tau) / n) / norm.pdf(norm.ppf(tau)) * sd
        assert abs(np.quantile(draws, tau) - exact) < 4 * se, (x, tau, np.quantile(draws, tau), exact)


def test_heteroscedastic_noise_varies_over_the_box():
    obj = Powers(noise_std=1.0, heteroscedastic=True)
    sd = obj.noise_sd(np.array([[-1.0, -1.0], [1.0, 1.0]]))
    assert sd[0] == pytest.approx(0.2) and sd[1] == pytest.approx(1.8)
    # the quantile optimum then moves towards the low-noise corner for tau > 1/2 (minimisation)
    x, v = obj.optimum(0.9)
    assert v < obj.quantile({"x0": 0.0, "x1": 0.0}, 0.9)
    assert x["x0"] < 0 and x["x1"] < 0


def test_noisy_ackley_noise_variance_is_norm_plus_10_over_20():
    obj = NoisyAckley()
    x = {"x0": 6.0, "x1": -8.0}  # ||x|| = 10: variance 1
    draws = np.array([obj(x, seed=s) for s in range(4000)])
    f = obj.quantile(x, 0.5)
    assert np.mean(draws) == pytest.approx(f, abs=4 * 1.0 / np.sqrt(4000))
    assert np.var(draws) == pytest.approx(1.0, rel=0.1)
    x0 = {"x0": 0.0, "x1": 0.0}  # variance 0.5
    draws0 = np.array([obj(x0, seed=s) for s in range(4000)])
    assert np.var(draws0) == pytest.approx(0.5, rel=0.1)
    # exact quantile: f + sqrt(var) * Phi^-1(tau)
    assert obj.quantile(x, 0.9) == pytest.approx(f + norm.ppf(0.9))


def test_same_seed_and_point_repeat_but_points_get_independent_noise():
    obj = Forrester(noise_std=1.0)
    a = [obj({"x0": 0.3}, seed=5) for _ in range(2)]
    assert a[0] == a[1]
    # same seed at nearby points: noise differences are not (nearly) identical
    d = [obj({"x0": 0.3 + 1e-9 * i}, seed=5) - obj.quantile({"x0": 0.3 + 1e-9 * i}, 0.5) for i in range(20)]
    assert np.std(d) > 0.3


def test_bad_options_name_the_option():
    with pytest.raises(ObjectiveError, match="noise_std"):
        Forrester(noise_std=-1.0)
    with pytest.raises(ObjectiveError, match="dim"):
        Ackley(dim=0)
    with pytest.raises(ObjectiveError, match="bounds"):
        Beale(bounds=[(0, 1)])
    with pytest.raises(ObjectiveError, match="tau"):
        Forrester().quantile({"x0": 0.5}, 1.5)
    with pytest.raises(ObjectiveError, match="seed"):
        Forrester(noise_std=1.0).evaluate({"x0": 0.5}, seed=1.5)


def test_maximize_on_box_finds_interior_and_boundary_maxima():
    x, v = maximize_on_box(
        lambda X: -((X - 0.3) ** 2).sum(axis=1), [0, 0, 0], [1, 2, 3], n_raw=256, n_starts=4
    )
    np.testing.assert_allclose(x, [0.3, 0.3, 0.3], atol=1e-4)
    x, v = maximize_on_box(lambda X: X.sum(axis=1), [0, -1], [1, 2], n_raw=64, n_starts=2)
    np.testing.assert_allclose(x, [1, 2], atol=1e-9)
    assert v == pytest.approx(3.0)


@pytest.mark.parametrize("name", ["ackley", "six-hump-camel", "beale", "dropwave", "noisy-ackley"])
def test_bounds_without_the_known_optimum_still_evaluate(name):
    """BoTorch refuses custom bounds that leave out a function's optimum; every trial of such a run failed.
    The formula does not depend on the bounds, so the BoTorch problem is built on the default ones."""
    from objectives.registry import load_objective

    obj = load_objective(name, {"bounds": [(0.5, 0.9), (0.5, 0.9)]})
    y = obj({k: 0.7 for k in obj.space}, 0)
    assert np.isfinite(float(y))
    x, v = obj.optimum(0.5)
    assert all(0.5 <= x[k] <= 0.9 for k in x) and np.isfinite(v)


def test_point_rng_draws_depend_on_the_point_and_seed_only():
    """Same seed and point, same draws; another seed or point, others. -0.0 is the point 0.0: its bytes
    differ, yet it draws the same noise for the same evaluation."""
    x = np.array([0.0, 0.25])

    def draw(seed, pt):
        return point_rng(seed, pt).standard_normal(4).tolist()

    assert draw(3, x) == draw(3, x.copy()) == draw(3, [0.0, 0.25])
    assert draw(3, np.array([-0.0, 0.25])) == draw(3, x)
    assert draw(4, x) != draw(3, x) and draw(3, np.array([1e-12, 0.25])) != draw(3, x)
    with pytest.raises(ObjectiveError, match="seed must be an integer; got 1.5"):
        point_rng(1.5, x)
