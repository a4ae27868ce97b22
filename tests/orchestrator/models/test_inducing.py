"""Tests of the k-means inducing-point selector (spec §1.4)."""

from __future__ import annotations

import pytest
import torch

from orchestrator.errors import ConfigError, InputDataError
from orchestrator.models.inducing import KMeansInducingPointSelector

TK = {"dtype": torch.float64}


def test_centroids_follow_the_data():
    """Two tight clusters get centroids inside them, in proportion to their sizes."""
    g = torch.Generator().manual_seed(0)
    a = 0.1 + 0.02 * torch.rand(300, 2, generator=g, **TK)
    b = 0.8 + 0.02 * torch.rand(100, 2, generator=g, **TK)
    X = torch.cat([a, b])
    Z = KMeansInducingPointSelector(8)(X, generator=torch.Generator().manual_seed(1))
    assert Z.shape == (8, 2) and Z.dtype == torch.float64
    in_a = ((Z >= 0.1 - 1e-9) & (Z <= 0.12 + 1e-9)).all(-1)
    in_b = ((Z >= 0.8 - 1e-9) & (Z <= 0.82 + 1e-9)).all(-1)
    assert bool((in_a | in_b).all())
    assert int(in_a.sum()) > int(in_b.sum()) >= 1


def test_centroids_reduce_quantization_error_versus_random_subset():
    g = torch.Generator().manual_seed(2)
    X = torch.rand(1000, 3, generator=g, **TK) ** 2
    Z = KMeansInducingPointSelector(20)(X, generator=torch.Generator().manual_seed(3))
    subset = X[torch.randperm(1000, generator=g)[:20]]
    err = lambda C: float(torch.cdist(X, C).min(-1).values.pow(2).mean())  # noqa: E731
    assert err(Z) < 0.8 * err(subset)


def test_fewer_points_than_inducing_inputs_fills_the_bounding_box():
    X = torch.tensor([[0.2, 0.3], [0.4, 0.9], [0.3, 0.5]], **TK)
    Z = KMeansInducingPointSelector(10)(X, generator=torch.Generator().manual_seed(0))
    assert Z.shape == (10, 2)
    assert bool((Z >= X.min(0).values - 1e-12).all() and (Z <= X.max(0).values + 1e-12).all())
    # every data point is one of the centroids (k = n)
    assert float(torch.cdist(X, Z).min(-1).values.max()) < 1e-9


def test_constant_column_and_reproducibility():
    g = torch.Generator().manual_seed(4)
    X = torch.cat([torch.rand(50, 1, generator=g, **TK), torch.full((50, 1), 0.5, **TK)], dim=1)
    sel = KMeansInducingPointSelector(5)
    Z1 = sel(X, generator=torch.Generator().manual_seed(7))
    Z2 = sel(X, generator=torch.Generator().manual_seed(7))
    torch.testing.assert_close(Z1, Z2)
    assert torch.isfinite(Z1).all() and torch.allclose(Z1[:, 1], torch.full((5,), 0.5, **TK))


@pytest.mark.parametrize("m", [0, -3, 2.5, True])
def test_bad_num_inducing(m):
    with pytest.raises(ConfigError, match=f"`num_inducing`.*{m!r}"):
        KMeansInducingPointSelector(m)


def test_bad_data():
    with pytest.raises(InputDataError, match="shape"):
        KMeansInducingPointSelector(3)(torch.zeros(0, 2, **TK))


def test_warm_start_from_previous_centroids():
    """Starting from the previous Z converges to centroids as good as a fresh k-means, and follows new
    data."""
    g = torch.Generator().manual_seed(5)
    X = torch.rand(2000, 3, generator=g, **TK)
    sel = KMeansInducingPointSelector(30)
    Z0 = sel(X[:1500], generator=torch.Generator().manual_seed(0))
    X_new = torch.cat([X, 0.9 + 0.05 * torch.rand(300, 3, generator=g, **TK)])
    Z_warm = sel(X_new, init=Z0)
    Z_cold = sel(X_new, generator=torch.Generator().manual_seed(1))
    err = lambda C: float(torch.cdist(X_new, C).min(-1).values.pow(2).mean())  # noqa: E731
    assert Z_warm.shape == (30, 3)
    assert err(Z_warm) < 1.1 * err(Z_cold) and err(Z_warm) < 0.9 * err(Z0)
    # a wrong-sized init is ignored (falls back to random initialisation)
    assert sel(X, init=Z0[:5], generator=torch.Generator().manual_seed(2)).shape == (30, 3)
