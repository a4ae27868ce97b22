"""Fit of the full variational model (an inducing input at every distinct observation) by natural gradients.

When Z holds every distinct observed input (quantile-expectile-bo.md §1.4 with Z = X, the default while n is
small), the optimal Gaussian q(h) of a latent GP under a likelihood that factorizes over the data is the
prior times one Gaussian site per input, q(h) ∝ N(h; 0, K) prod_i exp(nu_i h_i - lambda_i h_i^2 / 2)
(Opper & Archambeau 2009). The sites are found by conjugate-computation variational inference (Khan & Lin
2017; natural-gradient VI, Salimbeni, Eleftheriadis & Hensman 2018), a damped fixed point on the gradients
of the expected log-likelihood with respect to the marginal means and variances,

    lambda <- (1 - beta) lambda + beta (-2 dE/dv),    nu <- (1 - beta) nu + beta (dE/dmu - 2 dE/dv mu),

which costs one m x m Cholesky per step and converges in tens of steps for the log-concave likelihoods
here (asymmetric Laplace, asymmetric Gaussian, Gaussian; lambda >= 0 always). The hyperparameters are fitted
by L-BFGS on the profile ELBO G(theta) = max_q ELBO(q, theta): at the sites' fixed point the gradient of
G is the partial gradient of the ELBO with q held (the envelope theorem), so L-BFGS works on the d + 3
hyperparameters alone, as BoTorch's exact-GP fit does, instead of on m (m + 3) / 2 variational values per
latent. With B = I + Lambda^1/2 K Lambda^1/2 = L_B L_B^T (eigenvalues >= 1):

    Sigma = K - K Lambda^1/2 B^-1 Lambda^1/2 K,    mu = Sigma nu.

The fitted q(h) is written into `TwoLatentSVGP`'s whitened q(u) (a~ = L^-1 mu, S~ = (I + L^T Lambda L)^-1,
L L^T = K), so prediction, Thompson sampling and checkpoints are unchanged.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from linear_operator.utils.cholesky import psd_safe_cholesky
from torch import Tensor

from orchestrator.models.base import TKWARGS, check_fit_stop

__all__ = ["SiteState", "fit_full_variational", "observation_index", "site_posterior", "solve_sites"]

#: the fixed point stops when no marginal mean or standard deviation moves by more than this (model units)
SITE_TOL = 1e-5
#: the fixed point's tolerance while L-BFGS is far from the optimum, and per unit of the largest gradient
LOOSE_SITE_TOL = 1e-3
SITE_TOL_PER_GRAD = 1e-2
#: L-BFGS iterations between progress checks, and the least gain per datum of a chunk that goes on
LBFGS_CHUNK = 5
MIN_GAIN = 1e-6
#: most fixed-point steps per hyperparameter value (a warm start from the previous value needs a few)
SITE_MAX_STEPS = 100
#: first step size beta of the site fixed point (then halved on an ELBO decrease, grown by 1.5 up to 1)
INITIAL_STEP = 0.7
#: bounds on the site precisions lambda_i (1e-12 says nothing about h_i; 1e12 pins it)
LAMBDA_BOUNDS = (1e-12, 1e12)
#: rows of X and Z closer than this in max-norm are one input (the tolerance of `allocation.unique_rows`)
MATCH_TOL = 1e-9


class SiteState:
    """Site natural parameters (nu, lambda), `k x m`, of the trained latents at inputs `Z`: a warm start."""

    def __init__(self, Z: Tensor, nu: Tensor, lam: Tensor) -> None:
        self.Z, self.nu, self.lam = Z.detach().clone(), nu.detach().clone(), lam.detach().clone()

    def rescaled(self, ratio: float) -> "SiteState":
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
    prod_i exp(nu_i h_i - lam_i h_i^2 / 2); `K` is `k x m x m`, `nu` and `lam` are `k x m`.

    KL = 1/2 (tr B^-1 + mu^T K^-1 mu - m + log |B|), with tr B^-1 = m - sum_i lam_i Sigma_ii (Woodbury:
    B^-1 = I - Lambda^1/2 Sigma Lambda^1/2) and K^-1 mu = nu - Lambda mu (from Sigma^-1 mu = nu)."""
    m = K.shape[-1]
    lam = lam.clamp(*LAMBDA_BOUNDS)
    s = lam.sqrt()
    LB = torch.linalg.cholesky(s.unsqueeze(-1) * K * s.unsqueeze(-2) + torch.eye(m, **TKWARGS))
    A = torch.linalg.solve_triangular(LB, s.unsqueeze(-1) * K, upper=False)  # L_B^-1 Lambda^1/2 K
    Knu = (K @ nu.unsqueeze(-1)).squeeze(-1)
    c = torch.linalg.solve_triangular(LB, (s * Knu).unsqueeze(-1), upper=False)  # L_B^-1 Lambda^1/2 K nu
    mean = Knu - (A.transpose(-1, -2) @ c).squeeze(-1)
    var = (torch.diagonal(K, dim1=-2, dim2=-1) - (A * A).sum(-2)).clamp_min(1e-300)
    kl = 0.5 * (-(lam * var).sum(-1) + (mean * (nu - lam * mean)).sum(-1)
                + 2.0 * torch.log(torch.diagonal(LB, dim1=-2, dim2=-1)).sum(-1))
    return mean, var, kl.sum()


def _marginals(prior: tuple[Tensor, Tensor], latents: list[int], idx: Tensor, mean_t: Tensor, var_t: Tensor
               ) -> tuple[list[Tensor], list[Tensor]]:
    """Per-observation means and variances of (f, g): latents in `latents` from the sites' posterior, the others
    at their prior. `prior` is (the `2` constant means, the `2` jittered outputscales)."""
    const, prior_var = prior
    pos = {k: i for i, k in enumerate(latents)}
    means, variances = [], []
    for k in (0, 1):
        if k in pos:
            means.append(const[k] + mean_t[pos[k]][idx])
            variances.append(var_t[pos[k]][idx])
        else:
            means.append(const[k].expand(idx.shape[0]))
            variances.append(prior_var[k].expand(idx.shape[0]))
    return means, variances


@torch.no_grad()
def solve_sites(model: Any, likelihood: Any, idx: Tensor, Y: Tensor, latents: list[int], nu: Tensor,
                lam: Tensor, max_steps: int = SITE_MAX_STEPS, tol: float = SITE_TOL) -> tuple[Tensor, Tensor, int]:
    """The sites' fixed point at the model's current hyperparameters, from (`nu`, `lam`); returns (nu, lam,
    steps). Observation j sits at inducing input `idx[j]`.

    Each step is a natural-gradient step of size beta on q (beta = 1 is the plain fixed point); a step that
    lowers the ELBO is undone and beta halved (the check loss's kink can make the plain fixed point
    overshoot), an accepted one grows beta back toward 1. The iteration stops when no marginal mean or
    standard deviation moves by more than `tol`."""
    K = model.kzz()[latents]
    m = K.shape[-1]
    prior = (model.constant.detach(), (model.outputscale + model.jitter()).detach())
    beta = INITIAL_STEP

    def evaluate(nu: Tensor, lam: Tensor) -> tuple[Tensor, Tensor, float, tuple[Tensor, ...]]:
        mean_t, var_t, kl = site_posterior(K, nu, lam)
        means, variances = _marginals(prior, latents, idx, mean_t, var_t)
        leaves = [t.detach().clone().requires_grad_(True) for t in (*means, *variances)]
        with torch.enable_grad():
            ell = likelihood.expected_log_prob_moments(Y, leaves[0], leaves[2], leaves[1], leaves[3]).sum()
            grads = torch.autograd.grad(ell, leaves)
        return mean_t, var_t, float(ell) - float(kl), grads

    mean_t, var_t, elbo, grads = evaluate(nu, lam)
    steps = 0
    for steps in range(1, max_steps + 1):
        g_mean = torch.stack([torch.zeros(m, **TKWARGS).index_add_(0, idx, grads[k]) for k in latents])
        g_var = torch.stack([torch.zeros(m, **TKWARGS).index_add_(0, idx, grads[2 + k]) for k in latents])
        lam_target = (-2.0 * g_var).clamp(*LAMBDA_BOUNDS)
        nu_target = g_mean + lam_target * mean_t
        while True:
            nu_new = (1.0 - beta) * nu + beta * nu_target
            lam_new = (1.0 - beta) * lam + beta * lam_target
            new = evaluate(nu_new, lam_new)
            if new[2] >= elbo - 1e-12 * abs(elbo) or beta < 1e-4:
                break
            beta *= 0.5
        moved = max(float((new[0] - mean_t).abs().max()), float((new[1].sqrt() - var_t.sqrt()).abs().max()))
        nu, lam = nu_new, lam_new
        mean_t, var_t, elbo, grads = new
        beta = min(1.0, 1.5 * beta)
        if moved <= tol:
            break
    return nu, lam, steps


def set_whitened(model: Any, latents: list[int], nu: Tensor, lam: Tensor) -> None:
    """Write the sites' q(h_k) into the model's whitened q(u): a~ = L^-1 mu, S~ = (I + L^T Lambda L)^-1; latents
    not in `latents` get the prior (a~ = 0, S~ = I)."""
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


def fit_full_variational(model: Any, loss_fn: Any, likelihood: Any, X: Tensor, Y: Tensor, max_iter: int,
                         previous: SiteState | None = None) -> tuple[dict[str, float], SiteState] | None:
    """Fit the hyperparameters by L-BFGS on the profile ELBO, the sites by their fixed point at each value.

    Args:
        model: a `TwoLatentSVGP` whose `Z` holds every distinct row of `X`.
        loss_fn: `loss_fn(model)`, the model's negative ELBO per datum on (X, Y) (the whitened one).
        likelihood: the model's likelihood (`expected_log_prob_moments`).
        X, Y: `n x d` inputs and `n` outcomes in the model's units.
        max_iter: most L-BFGS iterations on the hyperparameters.
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
    state = {"nu": nu, "lam": lam, "steps": 0, "evals": 0, "tol": LOOSE_SITE_TOL}

    def refresh(tol: float) -> None:
        """The sites' fixed point at the current hyperparameters, written into the model's q(u)."""
        state["nu"], state["lam"], steps = solve_sites(model, likelihood, idx, Y, latents, state["nu"],
                                                       state["lam"], tol=tol)
        state["steps"] += steps
        set_whitened(model, latents, state["nu"], state["lam"])

    chunk = max(1, min(LBFGS_CHUNK, max_iter))
    lbfgs = torch.optim.LBFGS(hyper, lr=1.0, max_iter=chunk, max_eval=2 * chunk, history_size=10,
                              tolerance_grad=1e-6, tolerance_change=1e-9, line_search_fn="strong_wolfe")

    def closure() -> Tensor:
        check_fit_stop()
        lbfgs.zero_grad(set_to_none=True)
        try:
            refresh(state["tol"])
            loss = loss_fn(model)
        except torch.linalg.LinAlgError:
            return torch.tensor(math.inf, **TKWARGS)
        if torch.isfinite(loss):
            loss.backward()
            # the gradient's error is of the order of the sites' error: far from the optimum a loose fixed
            # point serves, near it the tolerance tightens with the gradient
            gmax = max((float(p.grad.abs().max()) for p in hyper if p.grad is not None), default=0.0)
            state["tol"] = min(LOOSE_SITE_TOL, max(SITE_TOL, SITE_TOL_PER_GRAD * gmax))
        state["evals"] += 1
        return loss.detach()

    try:
        # L-BFGS in chunks (its memory carries over): stop once a chunk gains under `MIN_GAIN` per datum, where
        # the inexact fixed point's noise would otherwise keep the line searches going for tiny gains
        done, before = 0, math.inf
        while done < max_iter:
            loss_now = float(lbfgs.step(closure))
            done = int(lbfgs.state[hyper[0]].get("n_iter", max_iter)) if hyper else max_iter
            if not math.isfinite(loss_now) or before - loss_now < MIN_GAIN:
                break
            before = loss_now
        with torch.no_grad():
            refresh(SITE_TOL)
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
    iterations = float(lbfgs.state[hyper[0]].get("n_iter", 0)) if hyper else 0.0
    info = {"iterations": iterations, "epochs": 1.0, "loss": loss, "stopped_early": 0.0, "lbfgs": 1.0,
            "evaluations": float(state["evals"]), "site_steps": float(state["steps"]), "full_variational": 1.0}
    return info, SiteState(model.Z, state["nu"], state["lam"])
