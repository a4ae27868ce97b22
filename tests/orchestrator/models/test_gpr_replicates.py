"""Tests of the GPR-EI model: empirical quantiles of replicates + bootstrap noise + exact GP (spec §4.4)."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch
from scipy.stats import norm

from orchestrator.errors import InputDataError, UnsupportedError
from orchestrator.models.gpr_replicates import ReplicateQuantileGP, bootstrap_quantiles, group_replicates
from tests.orchestrator.acquisition.proposer_contract import PartsSurrogate

TK = {"dtype": torch.float64}


pytestmark = pytest.mark.usefixtures("one_thread")


def _replicated(
    n_unique: int, reps: int, d: int, noise: float, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    Xu = torch.rand(n_unique, d, generator=g, **TK)
    X = Xu.repeat_interleave(reps, 0)
    f = torch.sin(6 * X[:, 0]) + X[:, 1:].sum(-1)
    Y = f + noise * torch.randn(X.shape[0], generator=g, **TK)
    return Xu, X, Y


def test_group_replicates_order_and_labels() -> None:
    X = torch.tensor([[0.5, 0.5], [0.1, 0.2], [0.5, 0.5], [0.1, 0.2 + 1e-12], [0.9, 0.0]], **TK)
    Z, labels = group_replicates(X)
    assert torch.equal(Z, X[[0, 1, 4]])
    assert labels.tolist() == [0, 1, 0, 1, 2]


def test_empirical_quantile_matches_numpy_and_singletons_have_zero_bootstrap() -> None:
    g = torch.Generator().manual_seed(1)
    Y = torch.randn(23, generator=g, **TK)
    labels = torch.tensor([0] * 10 + [1] * 12 + [2])
    q, var, counts = bootstrap_quantiles(Y, labels, 0.75, 100, g)
    assert counts.tolist() == [10, 12, 1]
    np.testing.assert_allclose(q[0].item(), np.quantile(Y[:10].numpy(), 0.75), rtol=1e-12)
    np.testing.assert_allclose(q[1].item(), np.quantile(Y[10:22].numpy(), 0.75), rtol=1e-12)
    assert q[2].item() == Y[22].item()
    assert var[2].item() == 0.0 and var[0] > 0 and var[1] > 0


def test_bootstrap_variance_shrinks_with_replicates_at_the_asymptotic_rate() -> None:
    """Var of the empirical tau-quantile of n N(0,1) draws ~ tau(1-tau) / (n phi(z_tau)^2)."""
    tau = 0.75
    g = torch.Generator().manual_seed(2)
    sizes = [10, 40, 160]
    groups = 30  # average over groups to tame the bootstrap's own noise
    labels, Y = [], []
    for k, n in enumerate(sizes):
        for j in range(groups):
            labels += [k * groups + j] * n
            Y.append(torch.randn(n, generator=g, **TK))
    _, var, _ = bootstrap_quantiles(torch.cat(Y), torch.tensor(labels), tau, 100, g)
    mean_var = var.reshape(len(sizes), groups).mean(-1)
    assert mean_var[0] > mean_var[1] > mean_var[2]
    assert mean_var[0] / mean_var[2] > 8.0  # 16 asymptotically
    z = norm.ppf(tau)
    asym = tau * (1 - tau) / (160 * norm.pdf(z) ** 2)
    assert 0.6 * asym < mean_var[2].item() < 1.6 * asym


def test_posterior_mean_matches_empirical_quantile_when_noise_is_small() -> None:
    Xu, X, Y = _replicated(n_unique=15, reps=20, d=2, noise=0.01)
    model = ReplicateQuantileGP(tau=0.75)
    info = model.fit(X, Y)
    assert info["unique"] == 15
    loc, scale = model.outcome_transform
    mu, var = model.posterior_f(Xu, full_cov=False)
    emp = torch.stack([torch.quantile(Y[i * 20 : (i + 1) * 20], 0.75) for i in range(15)])
    err = (loc + scale * mu - emp).abs()
    # the replicate noise is 0.01, so the quantile's bootstrap std is ~0.003: the GP must follow it
    assert err.max() < 0.01, err.max()
    assert (scale * var.sqrt()).max() < 0.01
    # far from the data the posterior reverts towards the prior (much larger variance)
    _, var_far = model.posterior_f(torch.tensor([[0.999, 0.999]], **TK), full_cov=False)
    assert var_far.item() > 10 * var.max().item()


def test_noisy_replicates_are_smoothed_not_interpolated() -> None:
    """With large replicate noise, the GP must not interpolate the noisy quantiles exactly."""
    Xu, X, Y = _replicated(n_unique=20, reps=5, d=1, noise=0.5, seed=3)
    model = ReplicateQuantileGP(tau=0.5)
    model.fit(X, Y)
    q, noise, _ = model.train_targets
    mu, _ = model.posterior_f(Xu, full_cov=False)
    assert (mu - q).abs().max() > 0.05
    truth = (torch.sin(6 * Xu[:, 0]) - model.outcome_transform[0]) / model.outcome_transform[1]
    assert ((mu - truth) ** 2).mean() < ((q - truth) ** 2).mean()


def test_full_and_marginal_posteriors_agree_and_batch_shapes() -> None:
    Xu, X, Y = _replicated(n_unique=12, reps=6, d=3, noise=0.1)
    model = ReplicateQuantileGP(tau=0.25)
    model.fit(X, Y)
    Xt = torch.rand(2, 3, 7, 3, generator=torch.Generator().manual_seed(0), **TK)
    mean, cov = model.posterior_f(Xt)
    assert mean.shape == (2, 3, 7) and cov.shape == (2, 3, 7, 7)
    m2, var = model.posterior_f(Xt, full_cov=False)
    torch.testing.assert_close(mean, m2)
    torch.testing.assert_close(cov.diagonal(dim1=-2, dim2=-1), var)
    assert torch.linalg.eigvalsh(cov).min() > -1e-8


@pytest.mark.parametrize("n_unique, noise", [(10, 0.2), (200, 0.0)])
def test_sparse_parts_reproduce_the_posterior(n_unique: int, noise: float) -> None:
    """Z = the unique inputs and q(u) = the exact posterior at Z give back `posterior_f` (Thompson sampling's
    input), also when noiseless replicates put the bootstrap noise at its floor, where the jitter of K~ = K +
    jitter I is
    not negligible: q(u) written with K in place of K~ gives 1.3-1.9 times the variance there."""
    Xu, X, Y = _replicated(n_unique=n_unique, reps=8 if noise else 4, d=2, noise=noise)
    model = ReplicateQuantileGP(tau=0.9)
    model.fit(X, Y)
    parts = model.sparse_parts("f")
    torch.testing.assert_close(parts.Z, Xu)
    assert parts.jitter <= 0.5 * float(model.train_targets[1].min())  # q(u)'s covariance stays PSD
    ref = PartsSurrogate(parts)
    Xt = torch.rand(9, 2, generator=torch.Generator().manual_seed(5), **TK)
    m1, c1 = model.posterior_f(Xt)
    m2, c2 = ref.posterior_f(Xt)
    torch.testing.assert_close(m1, m2, atol=1e-5 * c1.diagonal().sqrt().min().item(), rtol=1e-5)
    torch.testing.assert_close(c1.diagonal(), c2.diagonal(), atol=0.0, rtol=1e-3)
    torch.testing.assert_close(c1, c2, atol=1e-5, rtol=1e-5)
    with pytest.raises(UnsupportedError, match="no GP on the noise latent g"):
        model.sparse_parts("g")


def test_unreplicated_points_get_the_pooled_variance_and_target_is_f() -> None:
    Xu, X, Y = _replicated(n_unique=8, reps=10, d=1, noise=0.3, seed=4)
    X = torch.cat([X, torch.tensor([[0.33]], **TK)])
    Y = torch.cat([Y, torch.tensor([0.0], **TK)])
    model = ReplicateQuantileGP(tau=0.5)
    model.fit(X, Y)
    _, noise, counts = model.train_targets
    scale = model.outcome_transform[1]
    assert counts[-1] == 1
    # pooled within-replicate variance ~ 0.3^2
    assert 0.5 * 0.09 < noise[-1].item() * scale**2 < 1.5 * 0.09
    torch.testing.assert_close(model.objective_mean(Xu), model.posterior_f(Xu, full_cov=False)[0])
    fc = model.forecast(Xu)
    # forecast: the tau-quantile of the predictive is (close to) f's posterior mean in y units
    qs = fc.quantile([0.5])[:, 0]
    torch.testing.assert_close(
        qs, model.outcome_transform[0] + scale * model.posterior_f(Xu, full_cov=False)[0], atol=0.05, rtol=0.0
    )


def test_state_round_trip_and_warm_refit(tmp_path) -> None:
    Xu, X, Y = _replicated(n_unique=10, reps=4, d=2, noise=0.1)
    model = ReplicateQuantileGP(tau=0.75)
    model.fit(X, Y)
    path = tmp_path / "m.pt"
    torch.save(model.get_state(), path)
    other = ReplicateQuantileGP(tau=0.75)
    other.set_state(torch.load(path, weights_only=True))
    torch.testing.assert_close(other.posterior_f(Xu)[0], model.posterior_f(Xu)[0])
    with pytest.raises(InputDataError, match="tau=0.5"):
        ReplicateQuantileGP(tau=0.5).set_state(model.get_state())
    info = model.fit(torch.cat([X, X[:4]]), torch.cat([Y, Y[:4] + 0.1]))  # warm refit
    assert info["unique"] == 10 and math.isfinite(info["mll"])


def test_bad_inputs_name_the_row() -> None:
    model = ReplicateQuantileGP(tau=0.5)
    X = torch.rand(6, 2, **TK)
    Y = torch.randn(6, **TK)
    Y[3] = float("nan")
    with pytest.raises(InputDataError, match=re.escape("row 3 of Y is not finite")):
        model.fit(X, Y)
    with pytest.raises(InputDataError, match="at least 2 unique inputs; got 1"):
        model.fit(torch.full((5, 2), 0.5, **TK), torch.randn(5, **TK))
    with pytest.raises(InputDataError, match="not fitted"):
        model.posterior_f(X)
    with pytest.raises(Exception, match="num_bootstrap"):
        ReplicateQuantileGP(tau=0.5, num_bootstrap=1)


def test_the_final_restart_compares_warm_and_cold_fits_of_the_same_bootstrap():
    """The fit reports its `loss`, so `fit(restart=True)` compares the warm and the cold fit (without it, NaN
    with NaN keeps the warm fit, logging `restart_kept: warm` as if it had compared); and both fits draw the
    same bootstrap quantiles, so their losses compare."""
    from orchestrator.ask_tell import AskTellOptimizer

    space = {"a": {"type": "float", "low": 0.0, "high": 1.0}, "b": {"type": "float", "low": 0.0, "high": 1.0}}
    g = torch.Generator().manual_seed(2)
    opt = AskTellOptimizer(space, model="gpr-replicates", tau=0.7, proposer="gpr-ei", initial_design=3)
    for x in torch.rand(4, 2, generator=g).tolist():
        for _ in range(5):
            opt.tell_point({"a": x[0], "b": x[1]}, 5 * x[0] + float(torch.randn(1, generator=g)))
    opt.fit()
    for x in torch.rand(40, 2, generator=g).tolist():
        for _ in range(5):
            opt.tell_point(
                {"a": x[0], "b": x[1]},
                math.sin(15 * x[0]) * math.cos(11 * x[1]) + 0.2 * float(torch.randn(1, generator=g)),
            )
    d = opt.fit(restart=True)
    assert math.isfinite(d["loss_warm"]) and math.isfinite(d["loss_cold"])
    assert d["restart_kept"] == ("cold" if d["loss_cold"] < d["loss_warm"] else "warm")
    X, Y = opt.observations()
    cold = ReplicateQuantileGP(tau=0.7).fit(X, Y)  # a fresh model on the same data: the same bootstrap draw
    assert cold["loss"] == pytest.approx(d["loss_cold"], rel=1e-9)
