"""Fit of the full variational model (an inducing input at every distinct observation) by natural gradients.

When Z holds every distinct observed input (quantile-expectile-bo.md §1.4 with Z = X, the default while n is
small), the optimal Gaussian q(h) of a latent GP under a likelihood that factorizes over the data is the
prior times one Gaussian site per input, q(h) ∝ N(h; 0, K) prod_i exp(nu_i h_i - lambda_i h_i^2 / 2)
(Opper & Archambeau 2009). At fixed hyperparameters the sites are the fixed point of conjugate-computation
variational inference (Khan & Lin 2017; natural-gradient VI, Salimbeni, Eleftheriadis & Hensman 2018),
`orchestrator.models.site_fixed_point`.

The hyperparameters are fitted by L-BFGS-B (SciPy's, as BoTorch's exact-GP fit) on the profile ELBO
G(theta) = max_q ELBO(q, theta), so it works on the 2 d + 4 hyperparameters alone instead of on m (m + 3) / 2
variational values per latent. At the sites' fixed point the gradient of G is the partial gradient of the
ELBO with q held (the envelope theorem). With q's mean and covariance held, theta enters through the
constant means (in the expected log-likelihood), the prior marginal of a latent without sites, and
KL(q || N(0, K)), whose gradient in K is (W - alpha alpha^T) / 2 with W = Lambda^1/2 B^-1 Lambda^1/2,
B = I + Lambda^1/2 K Lambda^1/2 and alpha = K^-1 mu; `_Hyper` contracts it with the kernel's derivatives, so
autograd runs through the hyperparameters' constraints and priors alone. The model's own loss (`loss_fn`, the
fit's reported loss) differs from G by the jitter of K, which its marginals leave out of the cross-covariance;
where that moves the optimum (tiny noise), L-BFGS-B goes on on the model's loss (`_profile_loss`).

The fitted q(h) is written into `TwoLatentSVGP`'s whitened q(u) (a~ = L^-1 mu, S~ = (I + L^T Lambda L)^-1,
L L^T = K), so prediction, Thompson sampling and checkpoints are unchanged.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from gpytorch.priors import LogNormalPrior
from linear_operator.utils.cholesky import psd_safe_cholesky
from scipy.linalg import lapack
from scipy.optimize import minimize
from threadpoolctl import threadpool_limits
from torch import Tensor

from orchestrator.models.base import TKWARGS, check_fit_stop
from orchestrator.models.site_fixed_point import (
    LAMBDA_BOUNDS,
    SiteProblem,
    extrapolate_sites,
    posterior_factors,
    solve_fixed_point,
)

__all__ = ["SiteState", "fit_full_variational", "observation_index", "site_posterior", "solve_sites"]

#: the fixed point stops when no marginal mean or standard deviation moves by more than this (model units)
SITE_TOL = 1e-5
#: the fixed point's tolerance while L-BFGS-B is far from the optimum, and per unit of the largest gradient
LOOSE_SITE_TOL = 1e-2
SITE_TOL_PER_GRAD = 3e-2
#: curvature pairs L-BFGS-B keeps (SciPy's default is 10; the d + 3 to 2 d + 4 hyperparameters gain from more)
LBFGS_HISTORY = 30
#: most fixed-point steps per hyperparameter value (a warm start from the previous value needs a few)
SITE_MAX_STEPS = 100
#: past hyperparameter values whose fixed points the next value's starting sites are extrapolated from
SITE_TRAIL = 4
#: the gap per datum between the model's loss and the sites' at the sites' optimum past which the fit goes on
#: on the model's loss (`_profile_loss`)
MODEL_GAP = 1e-3
#: the floor of the model's marginal variances (`two_latent_svgp.MIN_VARIANCE`: `TwoLatentSVGP.marginals`
#: clamps there)
MIN_VARIANCE = 1e-12
#: rows of X and Z closer than this in max-norm are one input (the tolerance of `allocation.unique_rows`)
MATCH_TOL = 1e-9


class SiteState:
    """Site natural parameters (nu, lambda), `k x m`, of the trained latents at inputs `Z`: a warm start."""

    def __init__(self, Z: Tensor, nu: Tensor, lam: Tensor) -> None:
        self.Z, self.nu, self.lam = Z.detach().clone(), nu.detach().clone(), lam.detach().clone()

    def rescaled(self, ratio: float) -> SiteState:
        """The same sites in units where f's zero-mean part is multiplied by `ratio` (a new standardization):
        exp(nu h - lambda h^2 / 2) with h = h' / ratio is exp((nu / ratio) h' - (lambda / ratio^2) h'^2 / 2).
        Row 0 is f; g = log sigma only shifts by a constant, which its constant mean takes."""
        nu, lam = self.nu.clone(), self.lam.clone()
        nu[0] = nu[0] / ratio
        lam[0] = lam[0] / ratio**2
        return SiteState(self.Z, nu, lam)


def _match(X: Tensor, Z: Tensor) -> tuple[Tensor, Tensor]:
    """For each row of `X`, the nearest row of `Z` (max-norm) and whether it is within `MATCH_TOL`."""
    best, idx = torch.cdist(X, Z, p=float("inf")).min(dim=-1)
    return idx, best <= MATCH_TOL


def observation_index(X: Tensor, Z: Tensor) -> Tensor | None:
    """For each row of `X`, the row of `Z` it equals (within `MATCH_TOL`); None when some row has none."""
    if Z.shape[0] == 0 or X.shape[0] == 0:
        return None
    idx, matched = _match(X, Z)
    return idx if bool(matched.all()) else None


def site_posterior(K: Tensor, nu: Tensor, lam: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(marginal means, marginal variances, KL(q || N(0, K)) summed), each latent's of q(h) ∝ N(0, K)
    prod_i exp(nu_i h_i - lam_i h_i^2 / 2); `K` is `k x m x m`, `nu` and `lam` are `k x m`
    (`site_fixed_point.posterior_factors`)."""
    f = posterior_factors(*(t.detach().numpy() for t in (K, nu, lam)))
    return torch.from_numpy(f.mean), torch.from_numpy(f.var), torch.tensor(f.kl, **TKWARGS)


def _prior(model: Any) -> tuple[np.ndarray, np.ndarray]:
    """(the `2` constant means, the `2` jittered outputscales): the latents' prior marginals."""
    return model.constant.detach().numpy(), (model.outputscale + model.jitter()).detach().numpy()


@torch.no_grad()
def solve_sites(
    model: Any,
    likelihood: Any,
    idx: Tensor,
    Y: Tensor,
    latents: list[int],
    nu: Tensor,
    lam: Tensor,
    max_steps: int = SITE_MAX_STEPS,
    tol: float = SITE_TOL,
) -> tuple[Tensor, Tensor, int]:
    """The sites' fixed point at the model's current hyperparameters, from (`nu`, `lam`); returns (nu, lam,
    steps). Observation j sits at inducing input `idx[j]`; `latents` is [0] (f) or [0, 1] (f and g)
    (`site_fixed_point.solve_fixed_point`)."""
    problem = SiteProblem(model.kzz()[latents].numpy(), _prior(model), idx, Y, likelihood)
    nu_np, lam_np, steps, _ = solve_fixed_point(problem, nu.numpy(), lam.numpy(), max_steps, tol)
    return torch.from_numpy(nu_np), torch.from_numpy(lam_np), steps


def set_whitened(model: Any, latents: list[int], nu: Tensor, lam: Tensor) -> None:
    """Write the sites' q(h_k) into the model's whitened q(u): a~ = L^-1 mu, S~ = (I + L^T Lambda L)^-1;
    latents not in `latents` get the prior (a~ = 0, S~ = I)."""
    with torch.no_grad():
        L = model.kzz_chol()
        m = L.shape[-1]
        eye = torch.eye(m, **TKWARGS)
        means = torch.zeros(2, m, **TKWARGS)
        chols = eye.repeat(2, 1, 1)
        K = L @ L.transpose(-1, -2)
        mean_t, _, _ = site_posterior(K[latents], nu, lam)
        for i, k in enumerate(latents):
            Lk = L[k]
            means[k] = torch.linalg.solve_triangular(Lk, mean_t[i].unsqueeze(-1), upper=False).squeeze(-1)
            M = eye + Lk.transpose(-1, -2) @ (lam[i].clamp(*LAMBDA_BOUNDS).unsqueeze(-1) * Lk)
            chols[k] = psd_safe_cholesky(torch.cholesky_inverse(torch.linalg.cholesky(M)))
        model.variational_distribution.variational_mean.copy_(means)
        model.variational_distribution.chol_variational_covar.copy_(chols)


def _initial_sites(model: Any, latents: list[int], previous: SiteState | None) -> tuple[Tensor, Tensor]:
    """Sites to start from: the previous fit's where Z kept their input, nu = 0 and the previous median lambda
    at new inputs; without a previous fit nu = 0 and lambda = 1e-6 (the prior)."""
    m = model.Z.shape[0]
    nu = torch.zeros(len(latents), m, **TKWARGS)
    lam = torch.full((len(latents), m), 1e-6, **TKWARGS)
    if previous is not None and previous.nu.shape[0] == len(latents) and previous.Z.shape[0] > 0:
        old, kept = _match(model.Z, previous.Z)
        lam[:] = previous.lam.median(dim=-1, keepdim=True).values
        nu[:, kept] = previous.nu[:, old[kept]]
        lam[:, kept] = previous.lam[:, old[kept]]
    return nu, lam


class _Hyper:
    """The hyperparameters' side of the profile ELBO: K = k(Z, Z) + jitter I of the latents with sites, in
    numpy (the Matern-5/2 ARD kernel of `kernels.matern52`, as `TwoLatentSVGP.kzz` has it), and, from dG/dK,
    dG/dc and the sites-free latent's dG/dvar, a scalar whose autograd gradient in the raw hyperparameters is
    dG/dtheta.

    With a = z / l, r^2 = |a_i|^2 + |a_j|^2 - 2 a_i . a_j, e = exp(-sqrt5 r) and p = (1 + sqrt5 r) e, the
    kernel is s^2 k with k = p + 5 r^2 e / 3, so dK/ds^2 = k, and dK_ij/dl_d = s^2 (5/3) p (z_id - z_jd)^2 /
    l_d^3, whose contraction with G is (5/3) s^2 / l_d^3 * 2 (z_d^2 . G_p 1 - z_d . G_p z_d) with G_p = G * p
    (G symmetric). The jitter's own dependence on s^2 stays with autograd (`model.jitter()`)."""

    def __init__(self, model: Any, latents: list[int]) -> None:
        self.model, self.latents = model, latents
        self.Z = model.Z.detach().numpy()
        self.Z2 = self.Z**2
        # LogNormal hyperpriors in closed form (gpytorch's `log_prob` goes through torch.distributions'
        # checks); other priors fall back to `model.log_prior()`
        priors = list(model.named_priors())
        self.fast_prior = all(isinstance(prior, LogNormalPrior) for _, _, prior, _, _ in priors)
        self.priors = [(module, prior, closure) for _, module, prior, closure, _ in priors]

    def log_prior(self) -> Tensor:
        if not self.fast_prior:
            return self.model.log_prior()
        total = torch.zeros((), **TKWARGS)
        for module, prior, closure in self.priors:
            x = closure(module)
            loc, scale = prior.base_dist.loc, prior.base_dist.scale
            log_x = x.log()  # Normal(loc, scale).log_prob(log x) - log x, term by term as torch has it
            log_p = -((log_x - loc) ** 2) / (2 * scale**2) - scale.log() - math.log(math.sqrt(2 * math.pi))
            log_p = log_p - log_x
            total = total + (log_p[0] if self.model.constant_scale else log_p).sum()
        return total

    def evaluate(self) -> tuple[np.ndarray, tuple[Tensor, ...]]:
        """(K, `k x m x m`, numpy) and the torch values the gradient needs, with their autograd graphs:
        (lengthscales `k x d`, outputscales `k`, jitters `k`, constants `2`, prior variances `2`, log prior).
        Keeps the kernel's factors for the next `surrogate`."""
        model = self.model
        with torch.enable_grad():
            ls = model.lengthscale[self.latents, 0]
            os = model.outputscale
            jitter = model.jitter()
            parts = (
                ls,
                os[self.latents],
                jitter[self.latents],
                model.constant,
                os + jitter,
                self.log_prior(),
            )
        ls_np, os_np, jit_np = (t.detach().numpy() for t in parts[:3])
        A = self.Z[None] / ls_np[:, None, :]
        sq = (A * A).sum(-1)
        r2 = sq[:, :, None] + sq[:, None, :] - 2.0 * A @ A.transpose(0, 2, 1)
        r = np.sqrt(np.maximum(r2, 1e-30))
        e = np.exp(-math.sqrt(5.0) * r)
        self.p = (1.0 + math.sqrt(5.0) * r) * e
        self.k_unit = self.p + (5.0 / 3.0) * np.maximum(r2, 0.0) * e
        K = os_np[:, None, None] * self.k_unit
        m = K.shape[-1]
        K.reshape(K.shape[0], -1)[:, :: m + 1] += jit_np[:, None]
        self.ls, self.os = ls_np, os_np
        return K, parts

    def surrogate(
        self,
        parts: tuple[Tensor, ...],
        d_K: np.ndarray,
        d_const: np.ndarray,
        d_prior_var: np.ndarray,
        d_jitter: np.ndarray,
    ) -> Tensor:
        """A scalar whose gradient is the ELBO's (plus the log prior's), from its gradients in K (`k x m x m`,
        symmetric), in the constants and in the prior variances (`2` each, 0 for the latents with sites), and
        in the jitters apart from K's (`k`)."""
        ls, os, jitter, const, prior_var, log_prior = parts
        Gp = d_K * self.p
        contraction = 2.0 * (self.Z2[None] * Gp.sum(-1)[..., None] - self.Z[None] * (Gp @ self.Z)).sum(1)
        d_ls = (5.0 / 3.0) * self.os[:, None] * contraction / self.ls**3
        d_os = (d_K * self.k_unit).sum((1, 2))
        d_jitter = d_jitter + np.trace(d_K, axis1=1, axis2=2)
        t = torch.from_numpy
        return ((t(d_ls) * ls).sum() + (t(d_os) * os).sum() + (t(d_jitter) * jitter).sum()
                + (t(d_const) * const).sum() + (t(d_prior_var) * prior_var).sum() + log_prior)


def _sites(x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(nu, lambda), `k x m` each, from x = (nu, lambda) flattened."""
    return x[: x.size // 2].reshape(k, -1), x[x.size // 2:].reshape(k, -1)


def _profile_loss(side: _Hyper, idx: Tensor, Y: Tensor, likelihood: Any, x: np.ndarray, tol: float,
                  model_loss: bool = False, report: bool = False) -> tuple[float, float, np.ndarray, int]:
    """The negative profile ELBO per datum at the model's hyperparameters, with q at the sites' fixed point
    found from x = (nu, lambda) to `tol`, and (with `model_loss` or `report`; else NaN) the model's `loss_fn`
    at that q; the gradient of the first (of the second with `model_loss`) in the hyperparameters is left in
    their `.grad`. Returns (the sites' loss, the model's loss, the fixed point's x, steps).

    The sites see h(Z) ~ N(0, K), K = k(Z, Z) + j I, and the profile gradient is the envelope theorem's, q's
    mean and covariance held (module docstring). The model's marginals at Z take the cross-covariance without
    the jitter j (`TwoLatentSVGP.marginals`): mean c + mu - j alpha (alpha = K^-1 mu) and variance Sigma_ii -
    j
    + 2 j lambda_i Sigma_ii - j^2 W_ii (W = Lambda^1/2 B^-1 Lambda^1/2; from K^-1 Sigma = I - Lambda Sigma and
    K^-1 - K^-1 Sigma K^-1 = W). Where the noise is tiny the expected log-likelihood is steep enough in these
    variances for the jitter to move the model's optimum away from the sites'; the model's loss then has the
    gradient with the sites held (q moves with K, d Sigma = Sigma K^-1 dK K^-1 Sigma), exact at the sites."""
    K, parts = side.evaluate()
    const, prior_var, log_prior = (t.detach().numpy() for t in parts[3:])
    jit = parts[2].detach().numpy()[:, None]
    k, n = K.shape[0], Y.shape[0]
    problem = SiteProblem(K, (const, prior_var), idx, Y, likelihood)
    nu, lam, steps, ev = solve_fixed_point(problem, *_sites(x, k), SITE_MAX_STEPS, tol)
    x = np.concatenate([nu.ravel(), lam.ravel()])
    post = ev.post
    L_inv = problem.L_K_inv
    alpha = (L_inv.transpose(0, 2, 1) @ (L_inv @ post.mean[..., None]))[..., 0]  # K^-1 mu
    B_inv = np.stack([lapack.dpotri(LB, lower=1)[0] for LB in post.LB])
    B_inv = np.tril(B_inv) + np.tril(B_inv, -1).transpose(0, 2, 1)
    W = post.s[:, :, None] * B_inv * post.s[:, None, :]
    loss, model_loss_value = -(ev.elbo + float(log_prior)) / n, math.nan
    if model_loss or report:
        W_diag = np.diagonal(W, axis1=1, axis2=2)
        var = post.var - jit + 2.0 * jit * post.lam * post.var - jit**2 * W_diag
        model_ev = problem.likelihood_terms(post._replace(mean=post.mean - jit * alpha,
                                                          var=np.maximum(var, MIN_VARIANCE)))
        model_loss_value = -(model_ev.elbo + float(log_prior)) / n
    if not math.isfinite(model_loss_value if model_loss else loss):
        return loss, model_loss_value, x, steps
    d_K = -0.5 * (W - alpha[:, :, None] * alpha[:, None, :])  # -dKL/dK
    terms, d_jitter = ev, np.zeros(k)
    if model_loss:
        terms = model_ev
        g, h = model_ev.g_mean, model_ev.g_var * (var >= MIN_VARIANCE)  # the clamped variances are constant
        K_inv = L_inv.transpose(0, 2, 1) @ L_inv
        eye = np.eye(K.shape[-1])
        Sigma = K - np.stack([A.T @ A for A in post.A])
        R = eye - post.lam[:, :, None] * Sigma  # K^-1 Sigma
        KH = K_inv * h[:, None, :]
        # q held: the marginals' K^-1 gives j K^-1 g alpha^T (mean) and 2 j (K^-1 H - K^-1 H Sigma Lambda) +
        # j^2 (K^-1 H W + W H K^-1 - K^-1 H K^-1) (variance), H = diag(h)
        extra = (jit[..., None] * (K_inv @ g[..., None]) * alpha[:, None, :]
                 + 2.0 * jit[..., None] * (KH - (KH @ Sigma) * post.lam[:, None, :])
                 + jit[..., None] ** 2 * (KH @ W + W @ KH.transpose(0, 2, 1) - KH @ K_inv))
        # the sites held: q's own gradients, the model's (through mean M mu and variance diag(M Sigma M), M =
        # I - j K^-1) less the sites' (the ELBO's vanish at their fixed point), times d mu = R^T dK alpha and
        # dSigma
        d_mean = g - jit * (K_inv @ g[..., None])[..., 0] - ev.g_mean
        d_var = (h[:, :, None] * eye - jit[..., None] * (KH + KH.transpose(0, 2, 1))
                 + jit[..., None] ** 2 * (KH @ K_inv) - ev.g_var[:, :, None] * eye)
        extra = extra + (R @ d_mean[..., None]) * alpha[:, None, :] + R @ d_var @ R.transpose(0, 2, 1)
        d_K = d_K + 0.5 * (extra + extra.transpose(0, 2, 1))
        # j also stands for itself in the marginals: d mean/dj = -alpha, d var/dj = 2 lambda Sigma_ii - 1 - 2
        # j W_ii
        d_jitter = -(g * alpha).sum(-1) + (h * (2.0 * post.lam * post.var - 1.0 - 2.0 * jit * W_diag)).sum(-1)
    # g at its prior marginal (k = 1): its variance enters the expected log-likelihood
    d_prior_var = np.zeros(2) if k == 2 else np.array([0.0, terms.obs_g_var[1].sum()])
    with torch.enable_grad():
        (-side.surrogate(parts, d_K, terms.obs_g_mean.sum(-1), d_prior_var, d_jitter) / n).backward()
    return loss, model_loss_value, x, steps


def _minimize(objective: Any, hyper: list[Tensor], split: np.ndarray, max_iter: int) -> int:
    """Minimize `objective(theta) -> (loss, gradient)` over the hyperparameters `hyper` (flattened into theta,
    split at `split`) by SciPy's L-BFGS-B, as BoTorch's `fit_gpytorch_mll` does, from their current values, at
    most `max_iter` iterations; leaves them at the result and returns the iterations."""
    theta0 = torch.cat([p.detach().reshape(-1) for p in hyper]).numpy().copy()
    result = minimize(objective, theta0, jac=True, method="L-BFGS-B",
                      options={"maxiter": max_iter, "maxcor": LBFGS_HISTORY})
    _assign(hyper, result.x, split)
    return int(result.nit)


def _assign(hyper: list[Tensor], theta: np.ndarray, split: np.ndarray) -> None:
    with torch.no_grad():
        for p, part in zip(hyper, np.split(theta, split)):
            p.copy_(torch.from_numpy(part).view_as(p))


def fit_full_variational(model: Any, loss_fn: Any, likelihood: Any, X: Tensor, Y: Tensor, max_iter: int,
                         previous: SiteState | None = None) -> tuple[dict[str, float], SiteState] | None:
    """Fit the hyperparameters by L-BFGS-B on the profile ELBO, the sites by their fixed point at each value.

    Args:
        model: a `TwoLatentSVGP` whose `Z` holds every distinct row of `X`.
        loss_fn: `loss_fn(model)`, the model's negative ELBO per datum on (X, Y) (the whitened one): the
            fitted model's reported loss.
        likelihood: the model's likelihood (`expected_log_prob_grads`).
        X, Y: `n x d` inputs and `n` outcomes in the model's units.
        max_iter: most L-BFGS-B iterations on the hyperparameters.
        previous: the sites of the previous fit (warm start), or None.

    Returns:
        (info, sites) with the fitted q(u) written into `model`; None when some row of `X` is not in `Z` or
        the fit fails numerically (the model's parameters are then as they came).
    """
    idx = observation_index(X, model.Z)
    if idx is None:
        return None
    latents = [0] if model.constant_scale else [0, 1]
    nu, lam = _initial_sites(model, latents, previous)
    hyper = [p for name, p in model.named_parameters()
             if p.requires_grad and not name.startswith("variational_distribution.")]
    start = [p.detach().clone() for p in hyper]
    variational = list(model.variational_distribution.parameters())
    for p in variational:
        p.requires_grad_(False)
    k = len(latents)
    state: dict[str, Any] = {"x": np.concatenate([nu.numpy().ravel(), lam.numpy().ravel()]), "steps": 0,
                             "evals": 0, "tol": LOOSE_SITE_TOL, "trail": [], "best": (math.inf, None, None)}

    hyper_side = _Hyper(model, latents)
    split = np.cumsum([p.numel() for p in hyper])[:-1]

    def objective(theta: np.ndarray, model_loss: bool = False) -> tuple[float, np.ndarray]:
        check_fit_stop()
        theta = theta.copy()
        _assign(hyper, theta, split)
        for p in hyper:
            p.grad = None
        start_x = extrapolate_sites(state["trail"], theta, state["x"])
        try:
            losses = _profile_loss(hyper_side, idx, Y, likelihood, start_x, state["tol"], model_loss)
        except torch.linalg.LinAlgError:
            return math.inf, np.zeros_like(theta)
        loss, x = losses[int(model_loss)], losses[2]
        state["evals"] += 1
        state["steps"] += losses[3]
        if not math.isfinite(loss):
            return math.inf, np.zeros_like(theta)
        state["x"] = x
        state["trail"] = (state["trail"] + [(theta, x)])[-SITE_TRAIL:]
        if loss < state["best"][0]:
            state["best"] = (loss, theta, x)
        grad = np.concatenate(
            [np.zeros(p.numel()) if p.grad is None else p.grad.numpy().ravel() for p in hyper]
        )
        # the gradient's error is of the order of the sites' error: far from the optimum a loose fixed point
        # serves, near it the tolerance tightens with the gradient
        state["tol"] = min(LOOSE_SITE_TOL, max(SITE_TOL, SITE_TOL_PER_GRAD * float(np.abs(grad).max())))
        return loss, grad

    try:
        # one BLAS thread for the sites' small LAPACK calls, as BoTorch's fits and `acquisition.optimize` do:
        # thread hand-offs would cost more than the work (20x slower on a loaded 2-core machine)
        with threadpool_limits(limits=1, user_api="blas"):
            iterations = _minimize(objective, hyper, split, max_iter)
            # the model's loss where the sites' profile ELBO is best; where they part by more than
            # `MODEL_GAP` per datum (tiny noise: the jitter matters), L-BFGS-B goes on on the model's loss
            sites_loss, model_loss, state["x"], steps = _profile_loss(
                hyper_side, idx, Y, likelihood, state["x"], SITE_TOL, report=True
            )
            state["steps"] += steps
            if model_loss - sites_loss > MODEL_GAP:
                theta = torch.cat([p.detach().reshape(-1) for p in hyper]).numpy().copy()
                state["best"], state["trail"] = (model_loss, theta, state["x"]), []
                iterations += _minimize(lambda t: objective(t, True), hyper, split, max_iter)
                _, theta, state["x"] = state["best"]
                _assign(hyper, theta, split)
            with torch.no_grad():
                nu, lam, steps = solve_sites(model, likelihood, idx, Y, latents,
                                             *(torch.from_numpy(a.copy()) for a in _sites(state["x"], k)))
                state["steps"] += steps
                set_whitened(model, latents, nu, lam)
                loss = float(loss_fn(model))
        ok = math.isfinite(loss) and all(bool(torch.isfinite(p).all()) for p in hyper)
    except torch.linalg.LinAlgError:
        ok = False
    finally:
        for p in variational:
            p.requires_grad_(True)
        model.zero_grad(set_to_none=True)
    if not ok:
        with torch.no_grad():
            for p, p0 in zip(hyper, start):
                p.copy_(p0)
        return None
    info = {
        "iterations": float(iterations),
        "epochs": 1.0,
        "loss": loss,
        "stopped_early": 0.0,
        "lbfgs": 1.0,
        "evaluations": float(state["evals"]),
        "site_steps": float(state["steps"]),
        "full_variational": 1.0,
    }
    return info, SiteState(model.Z, nu, lam)
