"""Outcome standardization (orchestrator/models/svgp.py `standardization`): every model fits the same problem at
any outcome scale. Found in review: a spread below 1e-9 was taken for a constant outcome and replaced by 1, so
outcomes of order 1e-10 were flattened and the recommendation went to a corner of the cube."""

from __future__ import annotations

import pytest
import torch

from orchestrator.ask_tell import AskTellOptimizer
from orchestrator.models.svgp import standardization

SPACE = {"a": {"type": "float", "low": 0.0, "high": 1.0}}


def _fit_best(model: str, scale: float):
    xs = torch.linspace(0, 1, 25, dtype=torch.float64)
    y = -4 * (xs - 0.7) ** 2 + 0.02 * torch.randn(25, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    opts = {"num_inducing": 12, "max_steps": 300} if model not in ("exact-gp", "gpr-replicates") else {}
    opt = AskTellOptimizer(SPACE, model=model, tau=0.5, initial_design=5, model_options=opts)
    for x, v in zip(xs.tolist(), (scale * y).tolist()):
        opt.tell_point({"a": x}, v)
    opt.fit()
    params, value = opt.best()
    return params["a"], value / scale


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
    assert standardization(torch.tensor([1e-10, 3e-10], dtype=torch.float64))[1] == pytest.approx(2 ** 0.5 * 1e-10)
