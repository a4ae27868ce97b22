"""The sites' fixed point at fixed hyperparameters, on numpy arrays: the inner problem of
`orchestrator.models.full_variational` (quantile-expectile-bo.md §1.4 with Z = X).

q(h) ∝ N(h; 0, K) prod_i exp(nu_i h_i - lambda_i h_i^2 / 2) per latent; with B = I + Lambda^1/2 K Lambda^1/2 =
L_B L_B^T, Sigma = K - A^T A (A = L_B^-1 Lambda^1/2 K) and mu = Sigma nu. The fixed point of
conjugate-computation variational inference (Khan & Lin 2017), lambda <- -2 dE/dv and nu <- dE/dmu - 2 dE/dv
mu, is found by Anderson acceleration (Walker & Ni 2011) of that map, each step after a few quasi-Newton steps
on the means at the current lambda (matrix-vector products with A, no factorization), with damped steps where
the ELBO would
fall. The steps run on numpy arrays with LAPACK directly: at these sizes a torch call's overhead is most of a
step's cost. `extrapolate_sites` starts the next hyperparameter value's fixed point from the last ones.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import torch
from scipy.linalg import lapack
from torch import Tensor

__all__ = [
    "LAMBDA_BOUNDS",
    "Evaluation",
    "Factors",
    "SiteProblem",
    "clamp_precisions",
    "extrapolate_sites",
    "posterior_factors",
    "solve_fixed_point",
]

#: first step size beta of the damped steps (halved on an ELBO decrease, grown by 1.5 up to 1)
INITIAL_STEP = 0.7
#: past steps that the Anderson acceleration combines, and the means' steps at fixed lambda before each
ANDERSON_MEMORY = 5
MEAN_STEPS = 4
#: the iteration also stops when a step under 10 tolerances leaves an error, predicted from the contraction
#: r of the last two steps as moved r / (1 - r), under this share of the tolerance
PREDICTED_SHARE = 0.5
#: bounds on the site precisions lambda_i (1e-12 says nothing about h_i; 1e12 pins it)
LAMBDA_BOUNDS = (1e-12, 1e12)


def _cholesky(A: np.ndarray) -> np.ndarray:
    """Lower Cholesky factor of the symmetric positive definite `A` (LAPACK potrf, upper triangle zeroed)."""
    L, info = lapack.dpotrf(A, lower=1, clean=1)
    if info != 0:
        raise torch.linalg.LinAlgError("a site posterior's matrix is not positive definite (potrf info "
                                       f"{info})")
    return L


class Factors(NamedTuple):
    """The sites' posterior at one (nu, lambda), numpy arrays: marginal means and variances (`k x m`), the
    summed KL, each latent's factor L_B of B and A = L_B^-1 Lambda^1/2 K (Sigma = K - A^T A), Lambda^1/2, the
    clamped lambda and KL's sum of mu^T K^-1 mu."""

    mean: np.ndarray
    var: np.ndarray
    kl: float
    LB: list[np.ndarray]
    A: list[np.ndarray]
    s: np.ndarray
    lam: np.ndarray
    quad: float


def clamp_precisions(lam: np.ndarray) -> np.ndarray:
    """`lam` within `LAMBDA_BOUNDS`."""
    return np.maximum(np.minimum(lam, LAMBDA_BOUNDS[1]), LAMBDA_BOUNDS[0])


def posterior_factors(K: np.ndarray, nu: np.ndarray, lam: np.ndarray, diag_K: np.ndarray | None = None,
                      L_K_inv: np.ndarray | None = None) -> Factors:
    """The sites' posterior (`Factors`) on numpy arrays: `K` is `k x m x m` (`diag_K` its diagonals and
    `L_K_inv` its `inverse_factors` when the caller has them), `nu` and `lam` are `k x m`.

    KL = 1/2 (tr B^-1 + mu^T K^-1 mu - m + log |B|), with tr B^-1 = m - sum_i lam_i Sigma_ii (Woodbury:
    B^-1 = I - Lambda^1/2 Sigma Lambda^1/2) and mu^T K^-1 mu = |L_K^-1 mu|^2: mu^T (nu - Lambda mu), equal in
    exact arithmetic, subtracts terms of size |nu mu|, which sites that pin an ill-conditioned K make huge."""
    m = K.shape[-1]
    lam = clamp_precisions(lam)
    s = np.sqrt(lam)
    diag_K = np.diagonal(K, axis1=-2, axis2=-1) if diag_K is None else diag_K
    L_K_inv = inverse_factors(K) if L_K_inv is None else L_K_inv
    mean, var, factors, products, logdet = np.empty_like(lam), np.empty_like(lam), [], [], 0.0
    for i in range(lam.shape[0]):
        sK = s[i][:, None] * K[i]
        B = sK * s[i]
        B.flat[:: m + 1] += 1.0
        LB = _cholesky(B)
        Knu = K[i] @ nu[i]
        rhs = np.empty((m, m + 1), order="F")  # [Lambda^1/2 K, Lambda^1/2 K nu]: one triangular solve
        rhs[:, :m] = sK
        rhs[:, m] = s[i] * Knu
        sol, _ = lapack.dtrtrs(LB, rhs, lower=1, overwrite_b=1)
        A = sol[:, :m]  # L_B^-1 Lambda^1/2 K
        mean[i] = Knu - A.T @ sol[:, m]
        var[i] = diag_K[i] - np.einsum("ij,ij->j", A, A)
        logdet += np.log(LB.diagonal()).sum()
        factors.append(LB)
        products.append(A)
    var = np.maximum(var, 1e-300)
    quad = _quadratic(L_K_inv, mean)
    kl = 0.5 * (quad - (lam * var).sum()) + logdet
    return Factors(mean, var, float(kl), factors, products, s, lam, quad)


def _quadratic(L_K_inv: np.ndarray, mean: np.ndarray) -> float:
    """sum over latents of mu^T K^-1 mu = |L_K^-1 mu|^2 (`L_K_inv`: `k x m x m` inverse Cholesky factors)."""
    w = L_K_inv @ mean[..., None]
    return float((w * w).sum())


def inverse_factors(K: np.ndarray) -> np.ndarray:
    """L_K^-1, `k x m x m`, of each `m x m` K = L_K L_K^T in `K` (LAPACK potrf and trtri)."""
    return np.stack([lapack.dtrtri(_cholesky(K[i]), lower=1)[0] for i in range(K.shape[0])])


class Evaluation(NamedTuple):
    """The ELBO's parts at one (nu, lambda): the posterior's factors, the expected log-likelihood (summed) and
    the ELBO without the log prior, the expected log-likelihood's gradients in the sites' marginal means and
    variances (`k x m`, summed over the observations at each input) and in every observation's means and
    variances of (f, g) (`2 x n` each)."""

    post: Factors
    ell: float
    elbo: float
    g_mean: np.ndarray
    g_var: np.ndarray
    obs_g_mean: np.ndarray
    obs_g_var: np.ndarray


class SiteProblem:
    """The sites' problem at fixed hyperparameters, on numpy arrays: the prior covariances `K` (`k x m x m`)
    of the first k latents (f, or f and g), the other latent's prior marginal (`prior`: the `2` constant means
    and jittered outputscales), the likelihood and the observations (observation j at input `idx[j]`; when
    `idx` is a permutation, the observations are put in the inputs' order once)."""

    def __init__(self, K: np.ndarray, prior: tuple[np.ndarray, np.ndarray], idx: Tensor, Y: Tensor,
                 likelihood: Any) -> None:
        self.K, self.likelihood = K, likelihood
        self.k, self.m = K.shape[0], K.shape[-1]
        self.diag_K = np.diagonal(self.K, axis1=-2, axis2=-1).copy()
        self.L_K_inv = inverse_factors(K)
        const, prior_var = prior
        idx_np, Y_np = idx.numpy(), Y.detach().numpy()
        self.idx: np.ndarray | None = idx_np
        if idx_np.shape[0] == self.m and bool((np.bincount(idx_np, minlength=self.m) == 1).all()):
            Y_np = np.empty_like(Y_np)
            Y_np[idx_np] = Y.detach().numpy()  # the observation of input i at i
            self.idx = None
        self.Y = Y_np
        self.const = const[: self.k, None]
        self.prior_mean = np.full(Y_np.shape[0], const[1])
        self.prior_var = np.full(Y_np.shape[0], prior_var[1])

    def _sites_sum(self, g: np.ndarray) -> np.ndarray:
        if self.idx is None:
            return g
        return np.stack([np.bincount(self.idx, weights=row, minlength=self.m) for row in g])

    def evaluate(self, nu: np.ndarray, lam: np.ndarray) -> Evaluation:
        return self.likelihood_terms(posterior_factors(self.K, nu, lam, self.diag_K, self.L_K_inv))

    def refine(self, nu: np.ndarray, ev: Evaluation) -> tuple[np.ndarray, Evaluation]:
        """One step of the means' fixed point at the evaluation's lambda, K^-1 mu = dE/dmu, as nu = dE/dmu +
        lambda mu (a quasi-Newton step on the means): Sigma and its factors stay, so the step costs
        matrix-vector products (O(m^2)) instead of a factorization (O(m^3)). Returns (nu, the evaluation
        there)."""
        post = ev.post
        nu_new = ev.g_mean + post.lam * post.mean
        mean = np.empty_like(nu_new)
        for i in range(self.k):
            mean[i] = self.K[i] @ nu_new[i] - post.A[i].T @ (post.A[i] @ nu_new[i])
        quad = _quadratic(self.L_K_inv, mean)  # only KL's mu^T K^-1 mu / 2 changes
        return nu_new, self.likelihood_terms(post._replace(mean=mean, kl=post.kl + 0.5 * (quad - post.quad),
                                                            quad=quad))

    def likelihood_terms(self, post: Factors) -> Evaluation:
        """The evaluation at the posterior `post` (its marginals may be any, e.g. the model's)."""
        means, variances = self.const + post.mean, post.var
        if self.idx is not None:
            means, variances = means[:, self.idx], variances[:, self.idx]
        if self.k == 2:
            g_moments = (means[1], variances[1])
        else:
            g_moments = (self.prior_mean, self.prior_var)
        value, grads = self.likelihood.expected_log_prob_grads(self.Y, means[0], variances[0], *g_moments)
        obs = np.empty((4, value.shape[0]))  # rows: d/dmu_f, d/dmu_g, d/dvar_f, d/dvar_g
        obs[0], obs[2], obs[1], obs[3] = grads
        obs_g_mean, obs_g_var = obs[:2], obs[2:]
        ell = float(value.sum())
        return Evaluation(post, ell, ell - post.kl, self._sites_sum(obs_g_mean[: self.k]),
                           self._sites_sum(obs_g_var[: self.k]), obs_g_mean, obs_g_var)


class _History:
    """The Anderson acceleration's memory: the last `ANDERSON_MEMORY` steps' differences of x and of the
    residual f = T(x) - x (columns of `dX`, `dF`, in any order: the combination does not depend on it), and
    the last (x, f)."""

    def __init__(self, size: int) -> None:
        self.dX = np.empty((size, ANDERSON_MEMORY))
        self.dF = np.empty((size, ANDERSON_MEMORY))
        self.count = 0
        self.last: tuple[np.ndarray, np.ndarray] | None = None

    def push(self, x: np.ndarray, f: np.ndarray) -> None:
        if self.last is not None:
            j = self.count % ANDERSON_MEMORY
            self.dX[:, j] = x - self.last[0]
            self.dF[:, j] = f - self.last[1]
            self.count += 1
        self.last = (x, f)

    def clear(self) -> None:
        self.count = 0

    def step(self, x: np.ndarray, f: np.ndarray) -> np.ndarray | None:
        """The accelerated point x + f - (dX + dF) gamma, gamma = argmin |f - dF gamma|; None without
        memory."""
        used = min(self.count, ANDERSON_MEMORY)
        if used == 0:
            return None
        dX, dF = self.dX[:, :used], self.dF[:, :used]
        gram = dF.T @ dF
        gram.flat[:: used + 1] += 1e-12 * gram.diagonal().max() + 1e-300
        gamma = lapack.dgesv(gram, dF.T @ f)[2]
        return x + f - (dX + dF) @ gamma


def _refined(
    problem: SiteProblem, x: np.ndarray, ev: Evaluation, tol: float
) -> tuple[np.ndarray, Evaluation]:
    """x and its evaluation after up to `MEAN_STEPS` of `SiteProblem.refine`, each kept while the ELBO rises;
    they stop once a step moves no mean by more than `tol`."""
    size = x.size // 2
    for _ in range(MEAN_STEPS):
        nu, new = problem.refine(x[:size].reshape(ev.post.mean.shape), ev)
        if not new.elbo > ev.elbo:
            break
        moved = np.abs(new.post.mean - ev.post.mean).max()
        x, ev = np.concatenate([nu.ravel(), x[size:]]), new
        if moved <= tol:
            break
    return x, ev


def solve_fixed_point(problem: SiteProblem, nu: np.ndarray, lam: np.ndarray, max_steps: int, tol: float
                      ) -> tuple[np.ndarray, np.ndarray, int, Evaluation]:
    """The fixed point of the natural-gradient map on x = (nu, lambda), accelerated; returns (nu, lam, steps,
    the evaluation at the result).

    Each step refines the means at the current lambda (`_refined`: cheap, no factorization), then takes the
    map's target T = (dE/dmu - 2 dE/dv mu, -2 dE/dv) there. The accelerated point (Anderson acceleration of
    x -> T on the last `ANDERSON_MEMORY` steps) is the next x while the ELBO does not fall; a fall clears the
    memory and takes the damped step x + beta (T - x) from the refined x instead, beta halved until the ELBO
    holds (the check loss's kink can make the plain step overshoot) and grown back by 1.5 after. The
    iteration stops when no marginal mean or standard deviation moves by more than `tol`, or when a step under
    10 `tol` leaves an error, predicted from its contraction against the step before, under
    `PREDICTED_SHARE` `tol`."""
    shape, size = nu.shape, nu.size
    history = _History(2 * size)
    cur = problem.evaluate(nu, lam)
    x = np.concatenate([nu.ravel(), lam.ravel()])
    beta, steps, previous = INITIAL_STEP, 0, None
    for steps in range(1, max_steps + 1):  # noqa: B007 -- `steps` is read after the loop
        x_ref, cur = _refined(problem, x, cur, tol)
        lam_target = clamp_precisions(-2.0 * cur.g_var)
        target = np.concatenate([(cur.g_mean + lam_target * cur.post.mean).ravel(), lam_target.ravel()])
        history.push(x, target - x)
        floor = cur.elbo - 1e-12 * abs(cur.elbo)
        new, x_new = None, history.step(x, target - x)
        if x_new is not None:
            x_new[size:] = clamp_precisions(x_new[size:])
            new = problem.evaluate(x_new[:size].reshape(shape), x_new[size:].reshape(shape))
            if not new.elbo >= floor:
                new = None
                history.clear()
        if new is None:
            while True:
                x_new = x_ref + beta * (target - x_ref)
                new = problem.evaluate(x_new[:size].reshape(shape), x_new[size:].reshape(shape))
                if new.elbo >= floor or beta < 1e-4:
                    break
                beta *= 0.5
            beta = min(1.0, 1.5 * beta)
        moved = max(np.abs(new.post.mean - cur.post.mean).max(),
                    np.abs(np.sqrt(new.post.var) - np.sqrt(cur.post.var)).max())
        x, cur = x_new, new
        # near the fixed point the steps shrink by a rate r: the error left is about moved r / (1 - r)
        rate = moved / previous if previous is not None and moved < previous else 1.0
        if moved <= tol or (moved <= 10.0 * tol and moved * rate <= PREDICTED_SHARE * tol * (1.0 - rate)):
            break
        previous = moved
    x, cur = _refined(problem, x, cur, tol)
    return x[:size].reshape(shape), x[size:].reshape(shape), steps, cur


def extrapolate_sites(
    trail: list[tuple[np.ndarray, np.ndarray]], theta: np.ndarray, x: np.ndarray
) -> np.ndarray:
    """Starting sites x = (nu, lambda) at hyperparameters `theta` from the fixed points (theta_j, x_j) of the
    last values (multi-secant): theta - theta_b, b the last, projected on the span of theta_j - theta_b, moves
    the sites as the same combination of x_j - x_b. Without two past values, `x`."""
    if len(trail) < 2:
        return x
    theta_b, x_b = trail[-1]
    dT = np.stack([t - theta_b for t, _ in trail[:-1]], -1)
    dX = np.stack([v - x_b for _, v in trail[:-1]], -1)
    gram = dT.T @ dT
    if not gram.diagonal().max() > 0.0:
        return x
    gram.flat[:: gram.shape[0] + 1] += 1e-10 * gram.diagonal().max()
    out = x_b + dX @ np.linalg.solve(gram, dT.T @ (theta - theta_b))
    out[out.size // 2:] = clamp_precisions(out[out.size // 2:])
    return out
