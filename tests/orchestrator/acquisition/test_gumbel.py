"""Tests of the Gumbel max-value sampler (quantile-expectile-bo.md §3.3), against SciPy root finding."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import optimize, stats

from orchestrator.acquisition import gumbel
from orchestrator.acquisition.gumbel import (
    GUMBEL_MIN_SCALE,
    build_grid,
    fit_gumbel,
    max_value_quantiles,
    sample_gumbel,
    sample_max_values,
)
from orchestrator.errors import InputDataError

TK = {"dtype": torch.float64}


def _moments(n: int, seed: int, batch: tuple[int, ...] = ()) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    mean = torch.randn(batch + (n,), generator=g, **TK)
    std = 0.1 + 0.4 * torch.rand(batch + (n,), generator=g, **TK)
    return mean, std


def _brentq_quantile(mean: np.ndarray, std: np.ndarray, p: float) -> float:
    def f(y: float) -> float:
        return np.sum(stats.norm.logcdf((y - mean) / std)) - math.log(p)

    return optimize.brentq(f, (mean - 8 * std).min(), (mean + 8 * std).max(), xtol=1e-13)


@pytest.mark.parametrize("batch", [(), (3,), (2, 3)])
def test_quartiles_match_brentq(batch):
    mean, std = _moments(500, seed=1, batch=batch)
    q = max_value_quantiles(mean, std, (0.25, 0.75))
    assert q.shape == (2,) + batch
    flat_m, flat_s = mean.reshape(-1, 500).numpy(), std.reshape(-1, 500).numpy()
    flat_q = q.reshape(2, -1)
    for j in range(flat_m.shape[0]):
        for i, p in enumerate((0.25, 0.75)):
            assert flat_q[i, j].item() == pytest.approx(_brentq_quantile(flat_m[j], flat_s[j], p), abs=1e-9)


@pytest.mark.parametrize("tiny", [1e-8, 3e-9, 1e-10])
def test_quartiles_match_brentq_beside_a_nearly_certain_grid_point(tiny):
    """With one grid point far above the guess and a std near the moments' floor (1e-10), the quartiles match
    a
    Brent root and g* reaches the largest mean: the Newton step's phi(z)/Phi(z), exp of a difference of two
    ~1e20 terms, does not overflow into a step of zero taken as convergence at the first guess."""
    mean, std = _moments(1000, seed=0)
    mean[0] = mean.max() + 0.5
    std[0] = tiny
    q = max_value_quantiles(mean, std, (0.25, 0.75))
    for i, p in enumerate((0.25, 0.75)):
        ref = _brentq_quantile(mean.numpy(), std.numpy(), p)
        assert q[i].item() == pytest.approx(ref, abs=1e-9)
    g_star = sample_max_values(mean, std, 64, torch.Generator().manual_seed(0))
    assert g_star.max() > mean.max() - 1e-6


def test_fitted_gumbel_reproduces_quartiles_and_median():
    mean, std = _moments(500, seed=2)
    a, b = fit_gumbel(mean, std)
    y25, y75 = max_value_quantiles(mean, std)

    def G(y: torch.Tensor) -> torch.Tensor:
        return torch.exp(-torch.exp(-(y - a) / b))

    assert G(y25).item() == pytest.approx(0.25, abs=1e-10)
    assert G(y75).item() == pytest.approx(0.75, abs=1e-10)
    samples = sample_gumbel(a, b, 200_000, torch.Generator().manual_seed(0))
    assert samples.median().item() == pytest.approx((a - b * math.log(math.log(2))).item(), abs=3e-3)


def test_large_grid_quartiles():
    """2·10^4 grid points: F is a product of 10^5 CDFs, still located exactly (log-space bisection)."""
    mean, std = _moments(20_000, seed=3)
    y25, y75 = max_value_quantiles(mean, std)
    assert y25.item() == pytest.approx(_brentq_quantile(mean.numpy(), std.numpy(), 0.25), abs=1e-9)
    assert y75.item() == pytest.approx(_brentq_quantile(mean.numpy(), std.numpy(), 0.75), abs=1e-9)


def test_bracket_widens_when_product_is_below_level(monkeypatch):
    """The spec's bracket top max(μ + 5s) has F >= Φ(5)^N, below 0.75 once N > 10^6; the search then widens
    it. Shown here with a 1-std bracket (Φ(1)^50 ≈ 2e-4 < 0.75) to keep the grid small."""
    monkeypatch.setattr(gumbel, "BRACKET_STDS", 1.0)
    n = 50
    mean = torch.zeros(n, **TK)
    std = torch.ones(n, **TK)
    q75 = max_value_quantiles(mean, std, (0.75,))[0]
    assert q75.item() > 1.0
    assert q75.item() == pytest.approx(stats.norm.ppf(0.75 ** (1.0 / n)), abs=1e-9)


def test_samples_reproducible_and_floor():
    mean, std = _moments(200, seed=4)
    s1 = sample_max_values(mean, std, 10, torch.Generator().manual_seed(7))
    s2 = sample_max_values(mean, std, 10, torch.Generator().manual_seed(7))
    s3 = sample_max_values(mean, std, 10, torch.Generator().manual_seed(8))
    assert torch.equal(s1, s2) and not torch.equal(s1, s3)
    low = sample_max_values(mean, std, 10_000, torch.Generator().manual_seed(1))
    assert (low < mean.max()).any()  # without the floor some samples fall below the best mean
    floored = sample_max_values(mean, std, 10_000, torch.Generator().manual_seed(1), floor_at_max_mean=True)
    assert (floored >= mean.max()).all()


def test_coinciding_quartiles_fall_back_to_small_scale():
    mean = torch.zeros(5, **TK)
    std = torch.full((5,), 1e-300, **TK)
    a, b = fit_gumbel(mean, std)
    assert b.item() >= GUMBEL_MIN_SCALE * 1e-300 and b.item() > 0
    assert torch.isfinite(a)


def test_build_grid_contains_observed():
    X_obs = torch.rand(7, 3, **TK)
    grid = build_grid(X_obs, 50, 3, torch.Generator().manual_seed(0), **TK)
    assert grid.shape == (57, 3)
    assert torch.equal(grid[:7], X_obs)
    assert ((grid >= 0) & (grid <= 1)).all()


@pytest.mark.parametrize(
    "mean, std, match",
    [
        (torch.zeros(0, **TK), torch.ones(0, **TK), "empty"),
        (torch.tensor([0.0, float("nan")], **TK), torch.ones(2, **TK), r"posterior mean .* not "
                                                                       r"finite:.*index 1 \(nan\)"),
        (torch.zeros(2, **TK), torch.tensor([1.0, float("inf")], **TK), r"posterior std .* not "
                                                                        r"finite:.*index 1 \(inf\)"),
        (torch.zeros(2, **TK), torch.tensor([1.0, 0.0], **TK), "must be > 0"),
    ],
)
def test_bad_moments_raise(mean, std, match):
    with pytest.raises(InputDataError, match=match):
        max_value_quantiles(mean, std)


def test_bad_arguments_raise():
    with pytest.raises(InputDataError, match="num_samples"):
        sample_gumbel(torch.tensor(0.0), torch.tensor(1.0), 0, torch.Generator())
    with pytest.raises(InputDataError, match="grid_size"):
        build_grid(torch.zeros(0, 2), -1, 2, torch.Generator())
    with pytest.raises(InputDataError, match="levels"):
        max_value_quantiles(torch.zeros(3, **TK), torch.ones(3, **TK), (1.5,))
