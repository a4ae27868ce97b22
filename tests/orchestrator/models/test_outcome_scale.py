"""Outcome standardization (orchestrator/models/svgp.py `standardization`): every model fits the same problem
at any outcome scale. A spread below 1e-9 is not taken for a constant outcome and replaced by 1, which would
flatten outcomes of order 1e-10 and send the recommendation to a corner of the cube."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from orchestrator.ask_tell import AskTellOptimizer
from orchestrator.models.svgp import standardization, svgp_standardization

SPACE = {"a": {"type": "float", "low": 0.0, "high": 1.0}}


def _fit_best(model: str, scale: float, offset: float = 0.0, outlier: float | None = None):
    xs = torch.linspace(0, 1, 25, dtype=torch.float64)
    y = -4 * (xs - 0.7) ** 2 + 0.02 * torch.randn(
        25, generator=torch.Generator().manual_seed(0), dtype=torch.float64
    )
    values = (offset + scale * y).tolist()
    if outlier is not None:
        values[3] = outlier  # at a = 0.125, far from the optimum
    opts = {"num_inducing": 12} if model not in ("exact-gp", "gpr-replicates") else {}
    opt = AskTellOptimizer(SPACE, model=model, tau=0.5, initial_design=5, model_options=opts)
    for x, v in zip(xs.tolist(), values):
        opt.tell_point({"a": x}, v)
    opt.fit()
    params, value = opt.best()
    return params["a"], (value - offset) / scale


@pytest.mark.parametrize("model", ["quantile", "exact-gp", "heteroscedastic", "gpr-replicates"])
def test_the_fit_does_not_depend_on_the_outcome_scale(model):
    a1, v1 = _fit_best(model, 1.0)
    for scale in (1e-10, 1e-13, 1e8):
        a, v = _fit_best(model, scale)
        assert abs(a - 0.7) < 0.05 and a == pytest.approx(a1, abs=1e-6), (scale, a)
        assert v == pytest.approx(v1, rel=1e-3, abs=1e-3), (scale, v, v1)


def test_constant_outcomes_get_unit_scale():
    assert standardization(torch.full((5,), 3.0, dtype=torch.float64)) == (3.0, 1.0)
    assert standardization(torch.zeros(5, dtype=torch.float64)) == (0.0, 1.0)
    assert standardization(torch.tensor([2.0], dtype=torch.float64)) == (2.0, 1.0)
    roundoff = torch.tensor([0.1 + 0.2, 0.3, 0.3], dtype=torch.float64)  # 5.6e-17 apart
    assert standardization(roundoff)[1] == 1.0
    assert standardization(torch.tensor([1e-10, 3e-10], dtype=torch.float64))[1] == pytest.approx(
        2**0.5 * 1e-10
    )


@pytest.mark.parametrize("model", ["quantile", "exact-gp"])
def test_a_large_offset_with_a_small_spread_is_not_a_constant(model):
    """1e9 + 1e-4 y spreads over ~150 float64 ulps: a real signal (a 1e-12 roundoff cut-off would take it for
    a constant)."""
    a1, _ = _fit_best(model, 1.0)
    a, _ = _fit_best(model, 1e-4, offset=1e9)
    assert abs(a - 0.7) < 0.05 and a == pytest.approx(a1, abs=0.05)


@pytest.mark.parametrize("model", ["quantile", "expectile", "heteroscedastic"])
def test_one_outlier_does_not_flatten_an_svgp(model):
    """One -1e6 (a user's "failed" sentinel) among 25 outcomes of order 1: the recommendation is still the
    optimum and its predicted value lies among the outcomes (with mean/std standardization the signal was
    1e-5 standardized units: the recommendation was arbitrary and its prediction far outside the data)."""
    a, v = _fit_best(model, 1.0, outlier=-1e6)
    assert abs(a - 0.7) < 0.1, a
    assert -0.5 < v < 0.1, v


def test_svgp_standardization_uses_quartiles_only_when_outliers_dominate():
    g = torch.Generator().manual_seed(1)
    y = torch.randn(200, generator=g, dtype=torch.float64)
    assert svgp_standardization(y) == standardization(y)
    heavy = torch.as_tensor(np.random.default_rng(2).standard_t(3, 200))  # heavy tails, no outlier
    assert svgp_standardization(heavy) == standardization(heavy)
    y[7] = -1e6
    center, scale = svgp_standardization(y)
    q1, med, q3 = torch.quantile(y, torch.tensor([0.25, 0.5, 0.75], dtype=torch.float64)).tolist()
    assert (center, scale) == pytest.approx((med, (q3 - q1) / 1.349)) and 0.5 < scale < 2
    assert svgp_standardization(y[:3]) == standardization(y[:3])  # too few points for quartiles
    ties = torch.tensor([0.0] * 10 + [1e6], dtype=torch.float64)  # IQR 0: the std stays
    assert svgp_standardization(ties) == standardization(ties)
