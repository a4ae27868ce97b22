"""GPR on replicated empirical quantiles: the model of the GPR-EI baseline (quantile-expectile-bo.md §4.4).

Observations are grouped by unique input. At each unique x the model computes the empirical tau-quantile of
the replicates and its bootstrap variance (100 resamples), then fits a full GP to those quantiles with the
bootstrap variances as known, per-point Gaussian noise: a constant mean and a Matérn-5/2 ARD kernel with the
same hyperpriors as the SVGPs (§1.3), hyperparameters by maximum marginal likelihood (BoTorch `SingleTaskGP`
with `train_Yvar`, `fit_gpytorch_mll`).

The paper fits a full *variational* GP with natural gradients for the same model. With a Gaussian likelihood
of known per-point noise the optimal Gaussian q(u) at inducing inputs Z = the training inputs IS the exact
posterior (natural gradients reach it in one step of size 1) and the collapsed ELBO equals the exact marginal
likelihood, so this exact GP is the VGP's optimum, computed in closed form (Plumlee & Tuo 2014's framing).

Everything downstream reads f = the tau-quantile of y, so the model reports family "asymmetric_laplace":
`objective_mean` is the posterior mean of f, and `forecast` is an asymmetric Laplace around f whose
constant scale sigma matches the pooled within-replicate variance of y (Var = c_v sigma^2, spec §1.2) --
a homoscedastic approximation used only for forecasts; g has no GP and `sparse_parts("g")` is unsupported.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch
from torch import Tensor

from orchestrator.checks import check_bool, check_float, check_int
from orchestrator.errors import InputDataError, UnsupportedError
from orchestrator.limits import MAX_BOOTSTRAP, check_at_most
from orchestrator.models.base import TKWARGS, SparseLatentParts, Surrogate, check_training_data
from orchestrator.models.distributions import al_constants
from orchestrator.models.kernels import matern52
from orchestrator.models.likelihoods import check_tau
from orchestrator.models.svgp_options import standardization

__all__ = ["ReplicateQuantileGP", "group_replicates", "bootstrap_quantiles"]

#: inputs equal after rounding to this grid (1e-9 in the unit cube) count as replicates of one point
GROUP_DECIMALS = 9
#: floor of the per-point noise variance, in standardized units (FixedNoiseGaussianLikelihood's own floor is
#: 1e-4 of raw units; quantiles from many replicates can be more precise than that, so a relative floor is
#: used)
MIN_NOISE = 1e-6
#: floor of the outcome std used for standardization (constant outcomes)
MIN_Y_STD = 1e-9
#: jitter on k(Z, Z) in `sparse_parts`, relative to the outputscale (the exact posterior never needs it)
SPARSE_JITTER_REL = 1e-8


def group_replicates(X: Tensor, decimals: int = GROUP_DECIMALS) -> tuple[Tensor, Tensor]:
    """Unique inputs of `X` (`n x d`) and the group index of each row.

    Returns:
        `k x d` unique inputs (first occurrence of each, in order of first appearance) and an `n` long tensor
        of group indices in [0, k).
    """
    key = torch.round(X * 10**decimals)
    _, inverse = torch.unique(key, dim=0, return_inverse=True)
    # relabel groups in order of first appearance (torch.unique sorts lexicographically)
    order: dict[int, int] = {}
    labels = torch.empty_like(inverse)
    first: list[int] = []
    for i, g in enumerate(inverse.tolist()):
        if g not in order:
            order[g] = len(order)
            first.append(i)
        labels[i] = order[g]
    return X[first].clone(), labels


def bootstrap_quantiles(
    Y: Tensor, labels: Tensor, tau: float, num_bootstrap: int, generator: torch.Generator
) -> tuple[Tensor, Tensor, Tensor]:
    """Empirical tau-quantile of each group and its bootstrap variance.

    The empirical quantile is `torch.quantile`'s linear interpolation (numpy's default, Hyndman-Fan type 7).
    The bootstrap draws `num_bootstrap` resamples with replacement of each group's values and takes the
    variance (ddof 1) of their quantiles. Groups of the same size are resampled together.

    Args:
        Y: `n` outcomes.
        labels: `n` group indices in [0, k).
        tau: quantile level in (0, 1).
        num_bootstrap: resamples per group (>= 2).
        generator: random generator of the resampling.

    Returns:
        `k` quantiles, `k` bootstrap variances (0 for groups of one value) and `k` group sizes.
    """
    k = int(labels.max()) + 1
    counts = torch.bincount(labels, minlength=k)
    quant = torch.empty(k, dtype=Y.dtype, device=Y.device)
    var = torch.zeros(k, dtype=Y.dtype, device=Y.device)
    order = torch.argsort(labels, stable=True)
    starts = torch.cumsum(counts, 0) - counts
    for size in torch.unique(counts).tolist():
        groups = (counts == size).nonzero().squeeze(-1)
        idx = starts[groups].unsqueeze(-1) + torch.arange(size, device=Y.device)  # G x size
        vals = Y[order[idx]]  # G x size
        quant[groups] = torch.quantile(vals, tau, dim=-1)
        if size > 1:
            draw = torch.randint(0, size, (groups.numel(), num_bootstrap, size), generator=generator)
            resampled = torch.gather(vals.unsqueeze(1).expand(-1, num_bootstrap, -1), -1, draw.to(Y.device))
            var[groups] = torch.quantile(resampled, tau, dim=-1).var(dim=-1)
    return quant, var, counts


class ReplicateQuantileGP(Surrogate):
    """Exact GP of the empirical tau-quantiles at unique inputs, noise = bootstrap variance (GPR-EI, spec
    §4.4).

    Args:
        tau: quantile level in (0, 1).
        num_bootstrap: bootstrap resamples per unique input (100, spec §4.4).
        min_noise: floor of the per-point noise variance in standardized units.
        use_priors: the SVGPs' hyperpriors outputscale ~ LogNormal(0, 1), lengthscale ~ LogNormal(log 0.2, 1).
        seed: seed of the bootstrap resampling.
        fit_maxiter: cap on the L-BFGS-B iterations of each marginal-likelihood fit attempt (None: scipy's
            convergence test alone, as BoTorch; see `mll_fit`).

    A unique input observed once has no bootstrap variance; its noise variance is the pooled within-group
    variance of y (from the groups with replicates; the variance of all y when no group has any), i.e. the
    variance of a one-sample quantile estimate to first order. GPR-EI always replicates, so this only
    matters when the model is used on unreplicated data.

    Example:
        >>> model = ReplicateQuantileGP(tau=0.75)
        >>> model.fit(X, Y)  # `n x d` with repeated rows, `n`
        >>> mean, var = model.posterior_f(X_test, full_cov=False)
    """

    family = "asymmetric_laplace"

    def __init__(
        self,
        tau: float = 0.5,
        num_bootstrap: int = 100,
        min_noise: float = MIN_NOISE,
        use_priors: bool = True,
        seed: int = 0,
        fit_maxiter: int | None = None,
    ) -> None:
        from orchestrator.models.mll_fit import check_fit_maxiter

        self.tau = check_tau(tau)
        self.fit_maxiter = check_fit_maxiter(fit_maxiter)
        num_bootstrap = check_int("`num_bootstrap`", num_bootstrap, 2)
        check_at_most("`num_bootstrap`", num_bootstrap, MAX_BOOTSTRAP)
        min_noise = check_float("`min_noise`", min_noise, 0.0, lo_open=True, must="a positive number")
        use_priors = check_bool("`use_priors`", use_priors)
        seed = check_int("`seed`", seed, 0, 2**62, hi_open=True, must="an integer in [0, 2**62)")
        self.num_bootstrap, self.min_noise, self.use_priors, self.seed = (
            num_bootstrap,
            float(min_noise),
            use_priors,
            seed,
        )
        self._hyper: dict[str, Tensor] | None = None  # constant, lengthscale (1 x d), outputscale
        self._Z: Tensor | None = None
        self._loc, self._scale, self._log_sigma = 0.0, 1.0, 0.0
        self._num_fits = 0

    # ----------------------------------------------------------------------------------------- properties
    @property
    def num_outputs_latent(self) -> int:
        return 1

    @property
    def outcome_transform(self) -> tuple[float, float]:
        return self._loc, self._scale

    @property
    def is_fitted(self) -> bool:
        return self._Z is not None

    @property
    def train_inputs(self) -> Tensor:
        """`k x d` unique inputs of the last fit."""
        self._require_fit()
        return self._Z

    @property
    def train_targets(self) -> tuple[Tensor, Tensor, Tensor]:
        """Empirical quantiles, bootstrap noise variances (both standardized) and group sizes of the last
        fit."""
        self._require_fit()
        return self._q, self._noise, self._counts

    def _require_fit(self) -> None:
        if self._Z is None:
            raise InputDataError("ReplicateQuantileGP is not fitted yet: call fit(X, Y) first")

    # ----------------------------------------------------------------------------------------- fitting
    def fit(self, X: Tensor, Y: Tensor) -> dict[str, float]:
        """Group by unique input, bootstrap the quantiles, fit the GP's hyperparameters (warm start).

        Args:
            X: `n x d` inputs in [0, 1]^d (replicates are equal rows).
            Y: `n` outcomes to maximize.

        Returns:
            {"seconds", "unique", "mll", "loss", "mean_noise", "fit_fallback", "iterations"} (the step of
            `mll_fit.FIT_STEPS` that produced the hyperparameters; the L-BFGS-B iterations of its attempts).

        Raises:
            InputDataError: bad rows (named), or fewer than 2 unique inputs.
        """
        from botorch.models import SingleTaskGP
        from gpytorch.constraints import GreaterThan
        from gpytorch.kernels import MaternKernel, ScaleKernel
        from gpytorch.means import ConstantMean
        from gpytorch.mlls import ExactMarginalLogLikelihood
        from gpytorch.priors import LogNormalPrior

        from orchestrator.models.mll_fit import fit_exact_mll

        t0 = time.perf_counter()
        X = torch.as_tensor(X).to(**TKWARGS)
        Y = torch.as_tensor(Y).to(**TKWARGS)
        check_training_data(X, Y)
        Z, labels = group_replicates(X)
        if Z.shape[0] < 2:
            raise InputDataError(f"ReplicateQuantileGP needs at least 2 unique inputs; got {Z.shape[0]}")
        # seeded by the data size, not the fit count: a warm and a cold fit of the same data (the final
        # `fit(restart=True)`) bootstrap the same quantiles, so their losses compare
        gen = torch.Generator().manual_seed(self.seed + Y.shape[0])
        q_raw, var_raw, counts = bootstrap_quantiles(Y, labels, self.tau, self.num_bootstrap, gen)
        # noise of unreplicated points: pooled within-group variance of y (class docstring)
        resid = Y - torch.zeros_like(q_raw).index_add_(0, labels, Y)[labels] / counts[labels]
        dof = int((counts - 1).sum())
        pooled = float((resid**2).sum() / dof) if dof > 0 else float(Y.var()) if Y.numel() > 1 else 1.0
        var_raw = torch.where(counts > 1, var_raw, torch.full_like(var_raw, pooled))

        loc, scale = standardization(q_raw)
        q = (q_raw - loc) / scale
        noise = (var_raw / scale**2).clamp_min(self.min_noise)

        d = Z.shape[-1]
        ls_prior = LogNormalPrior(math.log(0.2), 1.0) if self.use_priors else None
        os_prior = LogNormalPrior(0.0, 1.0) if self.use_priors else None
        warm = self._hyper is not None and self._hyper["lengthscale"].shape[-1] == d

        def build(warm_start: bool) -> ExactMarginalLogLikelihood:
            covar = ScaleKernel(
                MaternKernel(nu=2.5, ard_num_dims=d, lengthscale_prior=ls_prior), outputscale_prior=os_prior,
                outputscale_constraint=GreaterThan(1e-6),
            )
            gp = SingleTaskGP(
                Z, q.unsqueeze(-1), train_Yvar=noise.unsqueeze(-1), covar_module=covar,
                mean_module=ConstantMean(), outcome_transform=None,
            ).to(**TKWARGS)
            if warm_start:  # from the previous fit
                gp.mean_module.constant = self._hyper["constant"]
                gp.covar_module.base_kernel.lengthscale = self._hyper["lengthscale"]
                gp.covar_module.outputscale = self._hyper["outputscale"]
            else:
                gp.covar_module.base_kernel.lengthscale = torch.full((1, d), 0.2, **TKWARGS)
                gp.covar_module.outputscale = torch.tensor(0.5, **TKWARGS)
            return ExactMarginalLogLikelihood(gp.likelihood, gp)

        mll, step, iterations = fit_exact_mll(build, warm, name="gpr-replicates", maxiter=self.fit_maxiter)
        gp = mll.model
        mll.train()
        with torch.no_grad():
            mll_value = float(mll(gp(Z), q))
        hyper = {
            "constant": gp.mean_module.constant.detach().reshape(()).clone(),
            "lengthscale": gp.covar_module.base_kernel.lengthscale.detach().reshape(1, d).clone(),
            "outputscale": gp.covar_module.outputscale.detach().reshape(()).clone(),
        }
        # forecast scale: AL variance c_v sigma^2 = pooled within-replicate variance (standardized)
        _, c_v = al_constants(self.tau)
        log_sigma = 0.5 * math.log(max(pooled / scale**2, MIN_Y_STD**2) / c_v)
        self._set_fitted(Z, q, noise, counts, hyper, loc, scale, log_sigma)
        self._num_fits += 1
        return {
            "seconds": time.perf_counter() - t0,
            "unique": float(Z.shape[0]),
            "mll": mll_value,
            "loss": -mll_value,  # the exact GP's convention (per datum), for the warm/cold comparison
            "mean_noise": float(noise.mean()),
            "fit_fallback": float(step),
            "iterations": float(iterations),
        }

    def _set_fitted(
        self, Z: Tensor, q: Tensor, noise: Tensor, counts: Tensor, hyper: dict[str, Tensor], loc: float,
        scale: float, log_sigma: float,
    ) -> None:
        K = matern52(Z, Z, hyper["lengthscale"], hyper["outputscale"])
        L = torch.linalg.cholesky(K + torch.diag(noise))
        alpha = torch.cholesky_solve((q - hyper["constant"]).unsqueeze(-1), L).squeeze(-1)
        self._Z, self._q, self._noise, self._counts = Z, q, noise, counts
        self._hyper, self._L, self._alpha = hyper, L, alpha
        self._loc, self._scale, self._log_sigma = float(loc), float(scale), float(log_sigma)

    # ----------------------------------------------------------------------------------------- posterior
    def _check_X(self, X: Tensor) -> Tensor:
        self._require_fit()
        if X.shape[-1] != self._Z.shape[-1]:
            raise InputDataError(f"X must be `... x n x {self._Z.shape[-1]}`; got shape {tuple(X.shape)}")
        return X.to(**TKWARGS)

    def posterior_f(self, X: Tensor, full_cov: bool = True) -> tuple[Tensor, Tensor]:
        """Exact posterior of the tau-quantile f at `... x n x d` (standardized): mean `... x n` and
        covariance `... x n x n` (variance `... x n` when `full_cov` is False). Differentiable in `X`."""
        X = self._check_X(X)
        h = self._hyper
        Kxz = matern52(X, self._Z, h["lengthscale"], h["outputscale"])  # ... x n x k
        mean = h["constant"] + Kxz @ self._alpha
        V = torch.linalg.solve_triangular(self._L, Kxz.transpose(-1, -2), upper=False)  # ... x k x n
        if full_cov:
            cov = matern52(X, X, h["lengthscale"], h["outputscale"]) - V.transpose(-1, -2) @ V
            return mean, cov
        var = (h["outputscale"] - (V * V).sum(-2)).clamp_min(1e-12)
        return mean, var

    def posterior_g(self, X: Tensor, full_cov: bool = False) -> tuple[Tensor, Tensor]:
        """The constant forecast log-scale (no GP on g): value `... x n`, zero (co)variance."""
        X = self._check_X(X)
        mean = torch.full(X.shape[:-1], self._log_sigma, **TKWARGS)
        n = X.shape[-2]
        zero = torch.zeros(*X.shape[:-1], n, **TKWARGS) if full_cov else torch.zeros_like(mean)
        return mean, zero

    def sparse_parts(self, latent: str = "f") -> SparseLatentParts:
        """Parts of f with Z = the unique inputs and q(u) = the exact posterior of h(Z) (see
        `SparseLatentParts`)."""
        if latent == "g":
            raise UnsupportedError(
                "ReplicateQuantileGP has no GP on the noise latent g (its noise is the bootstrap variance); "
                "use it with proposer gpr-ei or thompson"
            )
        if latent != "f":
            raise InputDataError(f"latent must be 'f' or 'g'; got {latent!r}")
        self._require_fit()
        h = self._hyper
        # the consumers (Thompson paths, acquisitions) use K~ = K + jitter I, so q(u) is written with K~ too:
        # then K~^-1 u_mean = (K + N)^-1 r and K~ - u_covar = K~ (K + N)^-1 K~, which give posterior_f exactly
        # at any x. u_covar = K~ (K + N)^-1 (N - jitter I) is PSD only for jitter <= min N: hence the cap
        jitter = min(SPARSE_JITTER_REL * float(h["outputscale"]), 0.5 * float(self._noise.min()))
        K = matern52(self._Z, self._Z, h["lengthscale"], h["outputscale"])
        K_j = K + jitter * torch.eye(K.shape[0], dtype=K.dtype)
        W = torch.cholesky_solve(K_j, self._L)  # (K + N)^-1 K~
        u_mean = K_j @ self._alpha
        u_covar = K_j - K_j @ W
        u_covar = 0.5 * (u_covar + u_covar.T)
        return SparseLatentParts(
            constant_mean=h["constant"].clone(), lengthscale=h["lengthscale"].reshape(-1).clone(),
            outputscale=h["outputscale"].clone(), Z=self._Z.clone(), u_mean=u_mean, u_covar=u_covar, nu=2.5,
            jitter=jitter,
        )

    # ----------------------------------------------------------------------------------------- state
    def get_state(self) -> dict[str, Any]:
        """Tensors and plain values only (loads with `torch.load(weights_only=True)`)."""
        self._require_fit()
        return {
            "class": type(self).__name__,
            "tau": self.tau,
            "Z": self._Z.cpu(),
            "q": self._q.cpu(),
            "noise": self._noise.cpu(),
            "counts": self._counts.cpu(),
            "constant": self._hyper["constant"].cpu(),
            "lengthscale": self._hyper["lengthscale"].cpu(),
            "outputscale": self._hyper["outputscale"].cpu(),
            "loc": self._loc,
            "scale": self._scale,
            "log_sigma": self._log_sigma,
            "num_fits": self._num_fits,
        }

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore a fitted model from `get_state()` (the class and tau must match)."""
        if state.get("class") != type(self).__name__ or float(state.get("tau", -1)) != self.tau:
            raise InputDataError(
                f"state is for {state.get('class')!r} at tau={state.get('tau')!r}; this is "
                f"{type(self).__name__} at tau={self.tau}"
            )
        hyper = {
            k: torch.as_tensor(state[k]).to(**TKWARGS) for k in ("constant", "lengthscale", "outputscale")
        }
        self._set_fitted(
            torch.as_tensor(state["Z"]).to(**TKWARGS), torch.as_tensor(state["q"]).to(**TKWARGS),
            torch.as_tensor(state["noise"]).to(**TKWARGS), torch.as_tensor(state["counts"]), hyper,
            state["loc"], state["scale"], state["log_sigma"],
        )
        self._num_fits = int(state["num_fits"])
