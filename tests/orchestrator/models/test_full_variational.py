"""The full variational model's natural-gradient fit (orchestrator/models/full_variational.py).

The properties proved here: with a Gaussian likelihood the site fixed point is the exact GP posterior; the
sites written into the whitened q(u) give the same marginals; the profile fit reaches the optimum of the
free-factor fit in fewer L-BFGS iterations; rescaled sites are the rescaled posterior; repeated inputs
share one site; the fit falls back to the free factor when Z is not the observed inputs; the kernel and
its contracted gradient in numpy are the model's and autograd's; the profile gradient is the profile ELBO's
central difference.
"""

from __future__ import annotations

import math

import pytest
import torch
from threadpoolctl import threadpool_limits

from orchestrator.models import build_model
from orchestrator.models import full_variational as fv
from orchestrator.models.base import TKWARGS
from orchestrator.models.kernels import matern52
from orchestrator.models.likelihoods import HeteroscedasticGaussianLikelihood
from orchestrator.models.svgp import MIN_OUTPUTSCALE, TwoLatentSVGP


def _data(n: int, d: int = 2, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, d, generator=g, **TKWARGS)
    f = torch.sin(6 * X[:, 0]) + X[:, 1:].sum(-1)
    # skewed, input-dependent
    noise = -torch.log(torch.rand(n, generator=g, **TKWARGS)) * (0.2 + 0.5 * X[:, 0])
    return X, f - noise


def test_sites_of_a_gaussian_likelihood_are_the_exact_gp_posterior():
    X, Y = _data(25)
    model = TwoLatentSVGP(X, lengthscale_init=0.3, outputscale_init=0.8, constant_scale=True)
    with torch.no_grad():
        model.mean_module.constant.copy_(torch.tensor([0.1, math.log(0.3)], **TKWARGS))
    lik = HeteroscedasticGaussianLikelihood()
    idx = fv.observation_index(X, model.Z)
    nu, lam = torch.zeros(1, 25, **TKWARGS), torch.full((1, 25), 1e-6, **TKWARGS)
    nu, lam, steps = fv.solve_sites(model, lik, idx, Y, [0], nu, lam, tol=1e-12)
    assert steps < 100
    with torch.no_grad():
        K = matern52(X, X, model.lengthscale[0], model.outputscale[0]) + model.jitter()[0] * torch.eye(
            25, **TKWARGS
        )
        mean, var, _ = fv.site_posterior(K.unsqueeze(0), nu, lam)
        # E[exp(-2 g)] with g ~ N(c_g, MIN_OUTPUTSCALE + jitter): the Gaussian's effective noise precision
        noise_var = 1.0 / math.exp(-2 * math.log(0.3) + 2 * float(model.outputscale[1] + model.jitter()[1]))
        A = K + noise_var * torch.eye(25, **TKWARGS)
        exact_mean = K @ torch.linalg.solve(A, Y - 0.1)
        exact_var = torch.diagonal(K - K @ torch.linalg.solve(A, K))
    assert torch.allclose(lam, torch.full_like(lam, 1.0 / noise_var), rtol=1e-8)
    assert torch.allclose(mean[0], exact_mean, atol=1e-8)
    assert torch.allclose(var[0], exact_var, atol=1e-8)


def test_the_written_q_has_the_sites_marginals():
    X, Y = _data(30)
    model = build_model("quantile", tau=0.2, noise_scale="constant")
    info = model.fit(X, Y)
    assert info["full_variational"] == 1.0
    sites = model._sites
    with torch.no_grad():
        K = model.model.kzz()[[0]]
        mean, var, _ = fv.site_posterior(K, sites.nu, sites.lam)
        got_mean, got_var = model.model.marginals(model.model.Z)
    # the sites see h(Z) with k(Z, Z) + jitter I, the model's marginals k(Z, Z) K_jitter^-1 u: they differ by
    # jitter K_jitter^-1 u, well under 1e-3 here
    assert torch.allclose(got_mean[0], model.model.constant[0] + mean[0], atol=1e-3)
    assert torch.allclose(got_var[0], var[0], rtol=1e-3, atol=1e-6)
    # g is at its prior: its marginal is its constant, with the (tiny) kernel variance
    assert torch.allclose(got_mean[1], model.model.constant[1].expand(30), atol=1e-9)
    assert float(got_var[1].max()) <= 2 * MIN_OUTPUTSCALE


@pytest.mark.parametrize(
    "kind, noise_scale", [("quantile", "constant"), ("quantile", "gp"), ("expectile", "gp")]
)
def test_the_profile_fit_reaches_the_free_factor_optimum_in_fewer_iterations(kind, noise_scale):
    X, Y = _data(40, d=3, seed=1)
    profile = build_model(kind, tau=0.1, noise_scale=noise_scale)
    free = build_model(kind, tau=0.1, noise_scale=noise_scale, optimizer="lbfgs")
    info_p, info_f = profile.fit(X, Y), free.fit(X, Y)
    assert info_p.get("full_variational") == 1.0 and "full_variational" not in info_f
    # the negative ELBO per datum: the profile fit's is no higher (to 1e-3 nats per datum)
    assert -profile.elbo(X, Y) <= -free.elbo(X, Y) + 1e-3
    assert info_p["iterations"] < info_f["iterations"]


def test_rescaled_sites_give_the_rescaled_posterior():
    X, Y = _data(20)
    model = build_model("quantile", tau=0.3, noise_scale="constant")
    model.fit(X, Y)
    ratio = 2.5
    sites = model._sites
    with torch.no_grad():
        K = model.model.kzz()[[0]]
        mean, var, _ = fv.site_posterior(K, sites.nu, sites.lam)
        scaled = sites.rescaled(ratio)
        mean2, var2, _ = fv.site_posterior(K * ratio**2, scaled.nu, scaled.lam)
    assert torch.allclose(mean2, ratio * mean, rtol=1e-8, atol=1e-10)
    assert torch.allclose(var2, ratio**2 * var, rtol=1e-8, atol=1e-12)


def test_repeated_inputs_share_one_site():
    X, Y = _data(15)
    X = torch.cat([X, X[:5]])
    Y = torch.cat([Y, Y[:5] + 0.3])
    model = build_model("quantile", tau=0.5)  # both latents: one site per distinct input each
    info = model.fit(X, Y)
    assert info["full_variational"] == 1.0 and info["num_inducing"] == 15.0
    assert model._sites.nu.shape == (2, 15)


def test_a_warm_refit_from_the_previous_sites_reaches_the_cold_fits_optimum():
    X, Y = _data(45, seed=3)
    warm = build_model("quantile", tau=0.1)
    warm.fit(X[:35], Y[:35])
    info_warm = warm.fit(X, Y)
    cold = build_model("quantile", tau=0.1)
    cold.fit(X, Y)
    assert info_warm["full_variational"] == 1.0 and info_warm["warm"] == 1.0
    assert -warm.elbo(X, Y) <= -cold.elbo(X, Y) + 1e-2


def test_fewer_inducing_inputs_than_observations_fit_the_free_factor():
    X, Y = _data(30)
    model = build_model("quantile", tau=0.1, num_inducing=10)
    info = model.fit(X, Y)
    assert "full_variational" not in info and info["lbfgs"] == 1.0 and info["num_inducing"] == 10.0


def test_observation_index_needs_every_row_in_z():
    X, _ = _data(6)
    assert torch.equal(fv.observation_index(X[[2, 0, 2]], X), torch.tensor([2, 0, 2]))
    assert fv.observation_index(X, X[:5]) is None


def _random_model(
    n: int,
    d: int,
    constant_scale: bool = False,
    use_priors: bool = True,
    lengthscale_prior: str = "spec",
    seed: int = 0,
) -> tuple[TwoLatentSVGP, torch.Tensor, torch.Tensor]:
    """A model on Z = X with hyperparameters off their defaults, and its data."""
    X, Y = _data(n, d, seed)
    model = TwoLatentSVGP(X, use_priors=use_priors, lengthscale_prior=lengthscale_prior,
                          constant_scale=constant_scale)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        model.covar_module.base_kernel.lengthscale = 0.2 + torch.rand(2, 1, d, generator=g, **TKWARGS)
        model.covar_module.outputscale = 0.3 + torch.rand(2, generator=g, **TKWARGS)
        model.mean_module.constant.copy_(torch.tensor([0.2, math.log(0.4)], **TKWARGS))
    return model, X, Y


def _latents(model: TwoLatentSVGP) -> list[int]:
    return [0] if model.constant_scale else [0, 1]


@pytest.mark.parametrize(
    "constant_scale, use_priors, prior",
    [(False, True, "spec"), (True, True, "spec"), (False, False, "spec"), (False, True, "dim-scaled")],
)
def test_the_hyperparameter_side_is_the_model_kernel_and_its_gradient_autograds(
    constant_scale, use_priors, prior
):
    model, _, _ = _random_model(12, 3, constant_scale, use_priors, prior)
    latents = _latents(model)
    side = fv._Hyper(model, latents)
    K, parts = side.evaluate()
    with torch.no_grad():
        assert torch.allclose(torch.from_numpy(K), model.kzz()[latents], rtol=1e-12, atol=1e-14)
        assert torch.allclose(parts[-1], model.log_prior(), rtol=1e-12, atol=1e-12)
    g = torch.Generator().manual_seed(5)
    d_K = torch.randn(len(latents), 12, 12, generator=g, **TKWARGS)
    d_K = d_K + d_K.transpose(-1, -2)  # dG/dK of a symmetric K is symmetric
    d_const, d_prior_var = torch.randn(2, generator=g, **TKWARGS), torch.randn(2, generator=g, **TKWARGS)
    d_jitter = torch.randn(len(latents), generator=g, **TKWARGS)
    hyper = [p for name, p in model.named_parameters() if not name.startswith("variational_distribution.")]
    side.surrogate(parts, d_K.numpy(), d_const.numpy(), d_prior_var.numpy(), d_jitter.numpy()).backward()
    got = [None if p.grad is None else p.grad.clone() for p in hyper]
    model.zero_grad(set_to_none=True)
    ((d_K * model.kzz()[latents]).sum() + (d_const * model.constant).sum()
     + (d_prior_var * (model.outputscale + model.jitter())).sum() + (d_jitter * model.jitter()[latents]).sum()
     + model.log_prior()).backward()
    for p, a in zip(hyper, got):
        b = torch.zeros_like(p) if p.grad is None else p.grad
        a = torch.zeros_like(p) if a is None else a
        assert torch.allclose(a, b, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("constant_scale", [False, True])
def test_the_profile_gradient_is_the_profile_elbos_derivative(constant_scale):
    model, X, Y = _random_model(15, 2, constant_scale, seed=3)
    latents = _latents(model)
    lik = build_model("quantile", tau=0.2).likelihood
    idx = fv.observation_index(X, model.Z)
    side = fv._Hyper(model, latents)
    x0 = torch.cat([torch.zeros(len(latents) * 15), torch.full((len(latents) * 15,), 1e-6)]).numpy()
    hyper = [p for name, p in model.named_parameters()
             if p.requires_grad and not name.startswith("variational_distribution.")]
    _, _, x, _ = fv._profile_loss(side, idx, Y, lik, x0, 1e-12)
    grads = [p.grad.clone() for p in hyper]
    h = 1e-5
    with threadpool_limits(limits=1, user_api="blas"):
        _check_central_differences(model, side, idx, Y, lik, x, hyper, grads, h)


def _check_central_differences(model, side, idx, Y, lik, x, hyper, grads, h):
    for p, grad in zip(hyper, grads):
        for j in range(p.numel()):
            values = []
            for sign in (1.0, -1.0):
                with torch.no_grad():
                    p.view(-1)[j] += sign * h
                values.append(fv._profile_loss(side, idx, Y, lik, x, 1e-12)[0])
                with torch.no_grad():
                    p.view(-1)[j] -= sign * h
            model.zero_grad(set_to_none=True)
            numeric = (values[0] - values[1]) / (2 * h)
            assert abs(numeric - float(grad.view(-1)[j])) <= 1e-6 + 1e-5 * abs(numeric)


def test_the_model_loss_is_loss_fn_and_its_gradient_with_the_sites_held_autograds():
    """The model's marginals leave the jitter out of the cross-covariance; its loss at the sites' q is the
    model's `loss_fn` after the sites are written in, and its gradient is autograd's with the sites held."""
    model, X, Y = _random_model(12, 2, seed=6)
    with torch.no_grad():
        # small noise: the jitter shows
        model.mean_module.constant.copy_(torch.tensor([0.1, -2.5], **TKWARGS))
    surrogate = build_model("quantile", tau=0.2)
    lik = surrogate.likelihood
    idx = fv.observation_index(X, model.Z)
    side = fv._Hyper(model, [0, 1])
    x0 = torch.cat([torch.zeros(24), torch.full((24,), 1e-6)]).numpy()
    hyper = [p for name, p in model.named_parameters()
             if p.requires_grad and not name.startswith("variational_distribution.")]
    _, loss, x, _ = fv._profile_loss(side, idx, Y, lik, x0, 1e-12, model_loss=True)
    got = [p.grad.clone() for p in hyper]
    model.zero_grad(set_to_none=True)
    nu, lam = (torch.from_numpy(a.copy()) for a in fv._sites(x, 2))
    with torch.no_grad():
        fv.set_whitened(model, [0, 1], nu, lam)
        assert abs(loss - float(surrogate._loss(X, Y, 12, model))) <= 1e-9
    # autograd: q from the held sites, the model's marginals at Z, KL(q || N(0, K))
    K, j = model.kzz(), model.jitter()
    P = torch.linalg.inv(K)
    Sigma = torch.linalg.inv(P + torch.diag_embed(lam))
    mu = (Sigma @ nu.unsqueeze(-1)).squeeze(-1)
    alpha = (P @ mu.unsqueeze(-1)).squeeze(-1)
    PS = P @ Sigma

    def diag(A: torch.Tensor) -> torch.Tensor:
        return torch.diagonal(A, dim1=-2, dim2=-1)

    mean = model.constant[:, None] + mu - j[:, None] * alpha
    var = (
        diag(Sigma) + j[:, None] - 2 * j[:, None] * diag(PS) - j[:, None] ** 2 * diag(P - PS @ P)
    ).clamp_min(1e-12)
    order = torch.empty_like(idx).index_copy_(0, idx, torch.arange(12))  # observation j at input idx[j]
    ell = lik.expected_log_prob_moments(Y[order], mean[0], var[0], mean[1], var[1]).sum()
    kl = 0.5 * (diag(PS).sum() + (mu * alpha).sum() - 24 + torch.logdet(K).sum() - torch.logdet(Sigma).sum())
    expected = -(ell - kl + model.log_prior()) / 12
    assert abs(float(expected) - loss) <= 1e-9
    expected.backward()
    for p, a in zip(hyper, got):
        assert torch.allclose(a, p.grad, rtol=1e-8, atol=1e-10)


def test_a_fit_with_tiny_noise_goes_on_to_the_model_loss():
    """Where the noise is tiny the jitter parts the sites' optimum from the model's: the fit ends at the
    model's."""
    g = torch.Generator().manual_seed(4)
    X = torch.rand(20, 6, generator=g, **TKWARGS)
    w = torch.tensor([1.0, -0.8, 0.6, 0.5, -0.4, 0.3], **TKWARGS)
    Y = torch.sin(X @ w) + 0.05 * torch.randn(20, generator=g, **TKWARGS)
    model = build_model("quantile", tau=0.5, lengthscale_prior="dim-scaled")
    calls = []
    original = fv._profile_loss

    def spy(*args, **kwargs):
        out = original(*args, **kwargs)
        calls.append((kwargs.get("model_loss", args[6] if len(args) > 6 else False), out))
        return out

    fv._profile_loss = spy
    try:
        info = model.fit(X, Y)
    finally:
        fv._profile_loss = original
    assert any(flag for flag, _ in calls)
    sites_optimum = min(out[1] for flag, out in calls if not flag and math.isfinite(out[1]))
    assert info["loss"] < sites_optimum - 1e-3  # the model's loss where the sites' profile ELBO is best
