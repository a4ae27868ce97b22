"""Inducing-point sizing and placement of the two-latent SVGPs (orchestrator/models/allocation.py)."""

from __future__ import annotations

import math

import pytest
import torch

from orchestrator.errors import ConfigError
from orchestrator.models import build_model
from orchestrator.models.allocation import (
    AUTO_MAX,
    FULL_UP_TO,
    allocate_inducing,
    auto_num_inducing,
    check_num_inducing,
    unique_rows,
)

TK = {"dtype": torch.float64}


def test_auto_size_is_every_observation_then_grows_as_sqrt_n_to_its_cap():
    assert [auto_num_inducing(n) for n in (1, 20, FULL_UP_TO)] == [1, 20, FULL_UP_TO]
    assert auto_num_inducing(4 * FULL_UP_TO) == min(AUTO_MAX, 2 * FULL_UP_TO)
    sizes = [auto_num_inducing(n) for n in range(1, 20_000, 97)]
    assert sizes == sorted(sizes) and max(sizes) == AUTO_MAX
    assert auto_num_inducing(1000) == math.ceil(FULL_UP_TO * math.sqrt(2))


def test_num_inducing_is_auto_or_a_positive_integer():
    assert check_num_inducing("auto") == "auto" and check_num_inducing(7) == 7
    for bad in (0, -1, 2.5, True, "many"):
        with pytest.raises(ConfigError, match="num_inducing"):
            check_num_inducing(bad)
    with pytest.raises(ConfigError, match="inducing_placement"):
        build_model("quantile", tau=0.1, inducing_placement="random")
    with pytest.raises(ConfigError, match="optimizer"):
        build_model("quantile", tau=0.1, optimizer="sgd")


def test_unique_rows_keeps_first_seen_order():
    X = torch.tensor([[0.5, 0.1], [0.2, 0.2], [0.5, 0.1], [0.9, 0.3], [0.2, 0.2]], **TK)
    assert torch.equal(unique_rows(X), X[[0, 1, 3]])


def test_few_observations_are_all_inducing_inputs_and_replicates_count_once():
    X = torch.rand(30, 2, generator=torch.Generator().manual_seed(0), **TK)
    X = torch.cat([X, X[:5]])  # five replicated settings
    Z = allocate_inducing(X, 100, torch.full((2,), 0.3, **TK), 1.0)
    assert Z.shape == (30, 2) and torch.equal(Z, unique_rows(X))


def test_improvement_weighting_puts_more_inducing_inputs_near_the_optimum():
    X = torch.rand(600, 2, generator=torch.Generator().manual_seed(1), **TK)
    best = torch.tensor([0.8, 0.8], **TK)

    def posterior(Xc):  # a previous fit whose f peaks at `best`
        return -((Xc - best) ** 2).sum(-1) * 20, torch.full(Xc.shape[:1], 0.05, **TK)

    ls = torch.full((2,), 0.2, **TK)
    near = lambda Z: int(((Z - best).norm(dim=-1) < 0.25).sum())  # noqa: E731
    Z_var = allocate_inducing(X, 60, ls, 1.0)
    Z_ei = allocate_inducing(X, 60, ls, 1.0, posterior)
    assert Z_var.shape == Z_ei.shape == (60, 2)  # the floor on the quality keeps the greedy pass going to m
    assert near(Z_ei) >= 2 * near(Z_var)
    assert all(bool((X == z).all(-1).any()) for z in Z_ei)  # chosen among the observed inputs


def test_lbfgs_reaches_a_lower_loss_than_adam_on_a_small_fit():
    g = torch.Generator().manual_seed(2)
    X = torch.rand(40, 3, generator=g, **TK)
    Y = torch.sin(5 * X[:, 0]) + X[:, 1] + 0.2 * torch.randn(40, generator=g, **TK)
    losses = {}
    for name in ("lbfgs", "adam"):
        model = build_model("quantile", tau=0.2, optimizer=name, seed=0)
        info = model.fit(X, Y)
        assert info["lbfgs"] == float(name == "lbfgs") and info["num_inducing"] == 40
        losses[name] = -model.elbo(X, Y)
    assert losses["lbfgs"] < losses["adam"]
