"""Tests of the exact-GP baseline surrogate (`model: exact-gp`)."""

from __future__ import annotations

import io
import math

import gpytorch
import pytest
import torch

from orchestrator.errors import ConfigError, InputDataError
from orchestrator.models import build_model
from orchestrator.models.base import Surrogate
from orchestrator.models.exact_gp import ExactGP

TK = {"dtype": torch.float64}


@pytest.fixture(scope="module")
def data():
    g = torch.Generator().manual_seed(0)
    X = torch.rand(60, 2, generator=g, **TK)
    Y = 10.0 + 3.0 * torch.sin(5 * X[:, 0]) * X[:, 1] + 0.3 * torch.randn(60, generator=g, **TK)
    return X, Y


@pytest.fixture(scope="module")
def fitted(data):
    model = ExactGP(tau=0.25)
    model.fit(*data)
    return model


def test_interface(fitted, data):
    X, Y = data
    assert isinstance(fitted, Surrogate) and fitted.family == "gaussian" and fitted.num_outputs_latent == 1
    loc, scale = fitted.outcome_transform
    assert loc == pytest.approx(float(Y.mean())) and scale == pytest.approx(float(Y.std()))
    # the fitted GP interpolates the smooth signal well
    mean, _ = fitted.posterior_f(X, full_cov=False)
    truth = 10.0 + 3.0 * torch.sin(5 * X[:, 0]) * X[:, 1]
    assert float((loc + scale * mean - truth).pow(2).mean().sqrt()) < 0.3
    assert 0.05 < math.sqrt(fitted.noise_variance) * scale < 0.8  # noise std 0.3


def test_matches_a_direct_gpytorch_computation(fitted, data):
    """posterior_f = the textbook exact-GP posterior with the fitted hyperparameters."""
    X, Y = data
    loc, scale = fitted.outcome_transform
    y = (Y - loc) / scale
    parts = fitted.sparse_parts("f")
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.MaternKernel(2.5, ard_num_dims=2)).to(**TK)
    kernel.base_kernel.lengthscale = parts.lengthscale.reshape(1, -1)
    kernel.outputscale = parts.outputscale
    Xt = torch.rand(7, 2, generator=torch.Generator().manual_seed(1), **TK)
    with torch.no_grad():
        A = kernel(X).to_dense() + fitted.noise_variance * torch.eye(60, **TK)
        Kxz = kernel(Xt, X).to_dense()
        mean = parts.constant_mean + Kxz @ torch.linalg.solve(A, y - parts.constant_mean)
        cov = kernel(Xt).to_dense() - Kxz @ torch.linalg.solve(A, Kxz.T)
        got_mean, got_cov = fitted.posterior_f(Xt)
    torch.testing.assert_close(got_mean, mean, atol=1e-7, rtol=0)
    torch.testing.assert_close(got_cov, cov, atol=1e-7, rtol=0)


def test_sparse_parts_reproduce_posterior(fitted):
    parts = fitted.sparse_parts("f")
    assert parts.Z.shape == (60, 2) and parts.u_covar.shape == (60, 60) and parts.jitter > 0
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.MaternKernel(2.5, ard_num_dims=2)).to(**TK)
    kernel.base_kernel.lengthscale = parts.lengthscale.reshape(1, -1)
    kernel.outputscale = parts.outputscale
    Xt = torch.rand(9, 2, generator=torch.Generator().manual_seed(2), **TK)
    with torch.no_grad():
        Kzz = kernel(parts.Z).to_dense() + parts.jitter * torch.eye(60, **TK)
        Kxz = kernel(Xt, parts.Z).to_dense()
        A = torch.linalg.solve(Kzz, Kxz.T).T
        mean = parts.constant_mean + A @ parts.u_mean
        cov = kernel(Xt).to_dense() - A @ (Kzz - parts.u_covar) @ A.T
        got_mean, got_cov = fitted.posterior_f(Xt)
    torch.testing.assert_close(got_mean, mean, atol=1e-8, rtol=0)
    torch.testing.assert_close(got_cov, cov, atol=1e-8, rtol=0)
    assert torch.linalg.eigvalsh(parts.u_covar).min() > -1e-8  # q(u) is a valid Gaussian


def test_posterior_g_is_constant_log_noise_std(fitted):
    X = torch.rand(2, 3, 4, 2, **TK)
    mean, var = fitted.posterior_g(X)
    assert mean.shape == (2, 3, 4) and (var == 0).all()
    torch.testing.assert_close(mean, torch.full_like(mean, 0.5 * math.log(fitted.noise_variance)))
    parts = fitted.sparse_parts("g")
    assert float(parts.constant_mean) == pytest.approx(0.5 * math.log(fitted.noise_variance))
    # plug-in quantile (spec §1.7): mu_f + Phi^-1(tau) sigma
    mu, _ = fitted.posterior_f(X[0, 0], full_cov=False)
    expected = mu + float(torch.special.ndtri(torch.tensor(0.25, **TK))) * math.sqrt(fitted.noise_variance)
    torch.testing.assert_close(fitted.objective_mean(X[0, 0]), expected)


@pytest.mark.parametrize("batch", [(), (3,), (2, 3)])
def test_batched_posterior(fitted, batch):
    X = torch.rand(*batch, 4, 2, generator=torch.Generator().manual_seed(3), **TK)
    mean, cov = fitted.posterior_f(X)
    _, var = fitted.posterior_f(X, full_cov=False)
    assert mean.shape == (*batch, 4) and cov.shape == (*batch, 4, 4)
    torch.testing.assert_close(var, cov.diagonal(dim1=-2, dim2=-1))
    for i, Xi in enumerate(X.reshape(-1, 4, 2)):
        torch.testing.assert_close(fitted.posterior_f(Xi)[1], cov.reshape(-1, 4, 4)[i])


def test_state_round_trip(fitted, data):
    buffer = io.BytesIO()
    torch.save(fitted.get_state(), buffer)
    buffer.seek(0)
    clone = ExactGP()
    clone.set_state(torch.load(buffer, weights_only=True))
    Xt = torch.rand(5, 2, **TK)
    for a, b in zip(clone.posterior_f(Xt), fitted.posterior_f(Xt)):
        torch.testing.assert_close(a, b)
    assert clone.tau == 0.25 and clone.outcome_transform == fitted.outcome_transform
    assert clone.fit(*data)["warm"] == 1.0


def test_bad_input(data):
    X, Y = data
    model = ExactGP()
    Yb = Y.clone()
    Yb[5] = float("nan")
    with pytest.raises(InputDataError, match="row 5 of Y"):
        model.fit(X, Yb)
    Xb = X.clone()
    Xb[9, 0] = 1.5
    with pytest.raises(InputDataError, match="row 9 of X is outside the unit cube"):
        model.fit(Xb, Y)
    with pytest.raises(InputDataError, match="not been fitted"):
        model.posterior_f(X)
    with pytest.raises(ConfigError, match="`tau`.*1.0"):
        ExactGP(tau=1.0)
    with pytest.raises(ConfigError, match="unknown model 'gp'.*exact-gp"):
        build_model("gp")
    with pytest.raises(ConfigError, match=r"unknown model \['exact-gp'\]"):  # not "unhashable type"
        build_model(["exact-gp"])
    with pytest.raises(ConfigError, match="unknown model option.*'num_inducing'.*warm_start"):
        build_model("exact-gp", num_inducing=3)


def test_build_model_names():
    from orchestrator.models.expectile_svgp import ExpectileSVGP
    from orchestrator.models.het_svgp import HeteroscedasticSVGP
    from orchestrator.models.quantile_svgp import QuantileSVGP

    assert isinstance(build_model("exact-gp", tau=0.3), ExactGP)
    assert isinstance(build_model("quantile", tau=0.3, num_inducing=8), QuantileSVGP)
    assert isinstance(build_model("expectile", tau=0.3), ExpectileSVGP)
    assert isinstance(build_model("heteroscedastic", tau=0.3), HeteroscedasticSVGP)
    with pytest.raises(ConfigError, match="unknown model option"):
        build_model("quantile", tau=0.3, bogus=1)


def test_priors_are_botorchs_defaults(fitted, data):
    """The qLogNEI baseline's GP is what a BoTorch user gets from `SingleTaskGP(X, Y)`: the dimension-scaled
    lengthscale prior with its bound 0.025 (in its Matern-5/2 form), no outputscale, the LogNormal(-4, 1)
    noise prior."""
    from botorch.models import SingleTaskGP

    X, Y = data
    default = SingleTaskGP(X, Y.unsqueeze(-1))
    ours = fitted.model
    assert not isinstance(ours.covar_module, gpytorch.kernels.ScaleKernel)
    assert isinstance(ours.covar_module, gpytorch.kernels.MaternKernel) and ours.covar_module.nu == 2.5
    for name in ("loc", "scale"):
        assert float(getattr(ours.covar_module.lengthscale_prior, name)) == pytest.approx(
            float(getattr(default.covar_module.lengthscale_prior, name)))
        assert float(getattr(ours.likelihood.noise_covar.noise_prior, name)) == pytest.approx(
            float(getattr(default.likelihood.noise_covar.noise_prior, name)))
    assert float(ours.covar_module.lengthscale_prior.loc) == pytest.approx(math.sqrt(2) + math.log(2) / 2)
    assert float(ours.covar_module.raw_lengthscale_constraint.lower_bound) == pytest.approx(0.025)
    assert float(fitted.sparse_parts("f").outputscale) == 1.0


def test_very_noisy_data_keep_the_lengthscales_at_botorchs_bound():
    """On data whose noise (sd 30) dwarfs the signal (range 3), the hyperpriors keep the lengthscales from
    falling to 1e-4 (1e-7 in this test without them), a white-noise kernel that warm starts would keep.
    BoTorch's default also explains these data by short lengthscales (its noise prior favours small noise),
    but not below its bound."""
    g = torch.Generator().manual_seed(4)
    X = torch.rand(80, 2, generator=g, **TK)
    Y = 3.0 * torch.sin(3 * X[:, 0]) + 30.0 * torch.randn(80, generator=g, **TK)
    model = ExactGP()
    for n in (40, 60, 80):  # warm-started refits, as a run does them
        model.fit(X[:n], Y[:n])
        assert float(model.sparse_parts("f").lengthscale.min()) >= 0.025 * (1 - 1e-6)


def test_a_state_saved_before_the_priors_still_loads(data):
    """States of runs saved with the earlier kernel (ScaleKernel(Matern-5/2), no priors; no "kernel" key) load
    as they were, and the next fit moves to the current kernel."""
    X, Y = data
    loc, scale = float(Y.mean()), float(Y.std())
    legacy = ExactGP._build(X, (Y - loc) / scale, "scaled-matern52")
    legacy.covar_module.outputscale = 2.0
    legacy.covar_module.base_kernel.lengthscale = torch.tensor([[0.3, 0.7]], **TK)
    legacy.eval()
    state = {"class": "ExactGP", "family": "gaussian", "tau": 0.5, "warm_start": True, "y_mean": loc,
             "y_std": scale, "X": X.clone(), "Y": Y.clone(),
             "model": {k: v.detach().clone() for k, v in legacy.state_dict().items()}}
    model = ExactGP()
    model.set_state(state)
    Xt = torch.rand(5, 2, generator=torch.Generator().manual_seed(6), **TK)
    torch.testing.assert_close(model.posterior_f(Xt)[0], legacy.posterior(Xt).mean.squeeze(-1))
    parts = model.sparse_parts("f")
    assert float(parts.outputscale) == pytest.approx(2.0)
    torch.testing.assert_close(parts.lengthscale, torch.tensor([0.3, 0.7], **TK))
    again = ExactGP()  # saved again before a refit, it is still the earlier kernel's state
    again.set_state(model.get_state())
    torch.testing.assert_close(again.posterior_f(Xt)[0], model.posterior_f(Xt)[0])
    model.fit(X, Y)
    assert isinstance(model.model.covar_module, gpytorch.kernels.MaternKernel)
    assert model.get_state()["kernel"] == "matern52-dim-scaled"
    with pytest.raises(InputDataError, match="unknown exact-GP kernel 'rbf'"):
        ExactGP().set_state({**state, "kernel": "rbf"})
