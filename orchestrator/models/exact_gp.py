"""Exact GP baseline (`model: exact-gp`): one latent f with homoscedastic Gaussian noise.

A BoTorch `SingleTaskGP` with BoTorch's default priors (what a BoTorch user gets, the usual user's choice):
the dimension-scaled LogNormal lengthscale prior of Hvarfner et al. (2024) with its lower bound
0.025 (`get_covar_module_with_dim_scaled_prior`, here its Matern-5/2 form, the kernel of every qbatch model),
no outputscale (outcomes are standardized) and the LogNormal(-4, 1) noise prior; a constant mean. Fitted by
maximising the exact marginal likelihood (`fit_gpytorch_mll`, with the fallback chain of `mll_fit`), on
standardized outcomes. Without hyperpriors and with a free outputscale (`KERNEL_LEGACY`, kept so that states
saved with it still load), very noisy data can pull the lengthscales to 1e-7, a white-noise kernel.
It speaks the `Surrogate` interface of quantile-expectile-bo.md §1 with family "gaussian": g = log noise
std is a constant (zero posterior variance), `tau` is the plug-in quantile level (§1.7), and
`sparse_parts("f")` expresses the exact posterior in the sparse form with Z = the training inputs, so the
pathwise Thompson sampler of §2 works unchanged.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch
from botorch.models import SingleTaskGP
from botorch.models.utils.gpytorch_modules import get_covar_module_with_dim_scaled_prior
from gpytorch.kernels import MaternKernel, ScaleKernel
from gpytorch.mlls import ExactMarginalLogLikelihood
from torch import Tensor

from orchestrator.checks import check_bool
from orchestrator.errors import ConfigError, InputDataError
from orchestrator.models.base import TKWARGS, SparseLatentParts, Surrogate, check_training_data
from orchestrator.models.likelihoods import check_tau
from orchestrator.models.mll_fit import check_fit_maxiter, fit_exact_mll
from orchestrator.models.svgp_options import standardization
from orchestrator.models.two_latent_svgp import JITTER_REL, MIN_VARIANCE

__all__ = ["ExactGP", "KERNEL", "KERNEL_LEGACY"]

_LATENTS = ("f", "g")
#: the kernel of `_build` (saved in the state): Matern-5/2, BoTorch's dimension-scaled lengthscale prior, no
#: outputscale
KERNEL = "matern52-dim-scaled"
#: the kernel of states saved before the priors: ScaleKernel(Matern-5/2), no hyperpriors
KERNEL_LEGACY = "scaled-matern52"


class ExactGP(Surrogate):
    """Exact GP regression (family "gaussian", one latent).

    Args:
        tau: level of the plug-in quantile mu_f + Phi^-1(tau) sigma that is optimized, in (0, 1).
        warm_start: start each marginal-likelihood fit from the previous hyperparameters (fewer iterations
            while the optimum moves little). A warm chain can stay in a worse local optimum than a cold fit
            finds: on the laser benchmark's exact-ts run 7 (a chain of warm refits from a cold fit at 500
            points) its loss per point was 0.054-0.066 above a cold fit's at 1,000, 1,100 and 1,200 points,
            and equal up to 900. `AskTellOptimizer.fit(restart=True)` (the central actor's final fit) tries
            both, keeps the better.
        fit_maxiter: cap on the L-BFGS-B iterations of each fit attempt (None, the default, as BoTorch:
            scipy's convergence test alone). A refit on 1,000+ points can take minutes (`mll_fit`); a cap
            bounds its time at the cost of a less converged fit. `fit`'s diagnostics report the iterations.
    """

    family = "gaussian"

    def __init__(self, tau: float = 0.5, warm_start: bool = True, fit_maxiter: int | None = None,
                 **unknown: Any) -> None:
        if unknown:
            raise ConfigError(f"unknown model option(s) {sorted(unknown)} for exact-gp; valid options: "
                              "['fit_maxiter', 'warm_start'] (tau is the config's top-level key)")
        self.fit_maxiter = check_fit_maxiter(fit_maxiter)
        self.tau = check_tau(tau)
        self.warm_start = check_bool("`warm_start`", warm_start)
        self.model: SingleTaskGP | None = None
        self._X: Tensor | None = None
        self._Y: Tensor | None = None
        self._y_mean = 0.0
        self._y_std = 1.0
        self._parts: SparseLatentParts | None = None

    # --- construction ------------------------------------------------------------------------------------
    @staticmethod
    def _build(X: Tensor, Y_std: Tensor, kernel: str = KERNEL) -> SingleTaskGP:
        d = X.shape[-1]
        if kernel == KERNEL:
            covar = get_covar_module_with_dim_scaled_prior(ard_num_dims=d, use_rbf_kernel=False)
        elif kernel == KERNEL_LEGACY:
            covar = ScaleKernel(MaternKernel(nu=2.5, ard_num_dims=d))
        else:
            raise InputDataError(f"unknown exact-GP kernel {kernel!r} in the state; known: "
                                 f"{[KERNEL, KERNEL_LEGACY]}")
        # BoTorch's default likelihood (LogNormal(-4, 1) noise prior, noise >= 1e-4): none is passed
        model = SingleTaskGP(X, Y_std.unsqueeze(-1), covar_module=covar, outcome_transform=None)
        return model.to(**TKWARGS)

    @staticmethod
    def _kernel_hyperparameters(model: SingleTaskGP) -> tuple[Tensor, Tensor]:
        """(lengthscale `d`, outputscale scalar) of either kernel: 1 where there is no ScaleKernel."""
        covar = model.covar_module
        if isinstance(covar, ScaleKernel):
            return covar.base_kernel.lengthscale.detach().reshape(-1), covar.outputscale.detach().reshape(())
        return covar.lengthscale.detach().reshape(-1), torch.ones((), **TKWARGS)

    def fit(self, X: Tensor, Y: Tensor) -> dict[str, float]:
        """Fit the hyperparameters by exact marginal likelihood on all data (`n x d`, `n`)."""
        check_training_data(X, Y)
        if self._X is not None and X.shape[-1] != self._X.shape[-1]:
            raise InputDataError(f"X must have d = {self._X.shape[-1]} columns as in the previous fit; "
                                 f"got shape {tuple(X.shape)}")
        t0 = time.perf_counter()
        X, Y = X.to(**TKWARGS), Y.to(**TKWARGS)
        y_mean, y_std = standardization(Y)
        warm = self.model is not None and self.warm_start
        previous = {k: v for k, v in self.model.state_dict().items() if "raw_" in k} if warm else None

        def build(warm_start: bool) -> ExactMarginalLogLikelihood:
            model = self._build(X, (Y - y_mean) / y_std)
            if warm_start:
                model.load_state_dict(previous, strict=False)
            return ExactMarginalLogLikelihood(model.likelihood, model)

        mll, step, iterations = fit_exact_mll(build, warm, name="exact-gp", maxiter=self.fit_maxiter)
        model = mll.model
        model.train()
        with torch.no_grad():
            loss = -float(mll(model(X), model.train_targets))  # negative MLL per datum
        model.eval()
        self.model, self._X, self._Y, self._y_mean, self._y_std, self._parts = (
            model,
            X,
            Y,
            y_mean,
            y_std,
            None,
        )
        return {
            "iterations": float(iterations),
            "loss": loss,
            "seconds": time.perf_counter() - t0,
            "warm": float(warm),
            "fit_fallback": float(step),
        }

    # --- Surrogate interface -------------------------------------------------------------------------------
    @property
    def num_outputs_latent(self) -> int:
        return 1

    @property
    def outcome_transform(self) -> tuple[float, float]:
        return (self._y_mean, self._y_std)

    @property
    def is_fitted(self) -> bool:
        return self.model is not None

    @property
    def noise_variance(self) -> float:
        """Homoscedastic noise variance in standardized units."""
        self._require_fit()
        return float(self.model.likelihood.noise.detach().squeeze())

    def _require_fit(self) -> None:
        if self.model is None:
            raise InputDataError("ExactGP has not been fitted yet; call fit(X, Y) first")

    def _check_X(self, X: Tensor) -> Tensor:
        self._require_fit()
        d = self._X.shape[-1]
        if not torch.is_tensor(X) or X.ndim < 2 or X.shape[-1] != d:
            raise InputDataError(f"X must be a `... x n x d` tensor with d = {d}; "
                                 f"got shape {tuple(getattr(X, 'shape', ()))}")
        return X.to(**TKWARGS)

    def posterior_f(self, X: Tensor, full_cov: bool = True) -> tuple[Tensor, Tensor]:
        X = self._check_X(X)
        mvn = self.model.posterior(X).mvn
        mean = mvn.mean
        if full_cov:
            cov = mvn.covariance_matrix
            return mean, 0.5 * (cov + cov.transpose(-1, -2))
        return mean, mvn.variance.clamp_min(MIN_VARIANCE)

    def posterior_g(self, X: Tensor, full_cov: bool = False) -> tuple[Tensor, Tensor]:
        X = self._check_X(X)
        shape = X.shape[:-1]
        mean = torch.full(shape, 0.5 * math.log(self.noise_variance), **TKWARGS)
        if full_cov:
            return mean, torch.zeros(*shape, shape[-1], **TKWARGS)
        return mean, torch.zeros(shape, **TKWARGS)

    def sparse_parts(self, latent: str = "f") -> SparseLatentParts:
        """Exact posterior in sparse form.

        "f": Z = the training inputs and q(u) = N(K~ A^-1 (y - c), K~ - K~ A^-1 K~) with K~ = k(Z, Z) + jitter
        I and A = k(Z, Z) + noise I, so that c + k_xZ K~^-1 u_mean and k_xx - k_xZ K~^-1 (K~ - S) K~^-1 k_Zx
        are the exact posterior mean and covariance. "g": the constant log noise std (zero kernel variance,
        one dummy inducing input, jitter 1).
        """
        self._require_fit()
        if latent not in _LATENTS:
            raise ConfigError(f"`latent` must be one of {list(_LATENTS)}; got {latent!r}")
        if latent == "g":
            d = self._X.shape[-1]
            return SparseLatentParts(
                constant_mean=torch.tensor(0.5 * math.log(self.noise_variance), **TKWARGS),
                lengthscale=torch.ones(d, **TKWARGS), outputscale=torch.zeros((), **TKWARGS),
                Z=torch.full((1, d), 0.5, **TKWARGS), u_mean=torch.zeros(1, **TKWARGS),
                u_covar=torch.zeros(1, 1, **TKWARGS), nu=2.5, jitter=1.0,
            )
        if self._parts is None:
            self._parts = self._exact_parts()
        p = self._parts
        return SparseLatentParts(
            p.constant_mean.clone(),
            p.lengthscale.clone(),
            p.outputscale.clone(),
            p.Z.clone(),
            p.u_mean.clone(),
            p.u_covar.clone(),
            p.nu,
            p.jitter,
        )

    def _exact_parts(self) -> SparseLatentParts:
        model = self.model
        with torch.no_grad():
            Z = self._X
            c = model.mean_module.constant.detach().reshape(())
            lengthscale, outputscale = self._kernel_hyperparameters(model)
            noise = self.noise_variance
            jitter = min(JITTER_REL * float(outputscale), 0.5 * noise)
            K = model.covar_module(Z).to_dense()
            eye = torch.eye(Z.shape[0], **TKWARGS)
            K_j = K + jitter * eye
            L = torch.linalg.cholesky(K + noise * eye)
            resid = (model.train_targets - c).unsqueeze(-1)
            A_inv_r = torch.cholesky_solve(resid, L)
            A_inv_Kj = torch.cholesky_solve(K_j, L)
            u_mean = (K_j @ A_inv_r).squeeze(-1)
            u_covar = K_j - K_j @ A_inv_Kj
            u_covar = 0.5 * (u_covar + u_covar.T)
        return SparseLatentParts(c, lengthscale, outputscale, Z.clone(), u_mean, u_covar, 2.5, jitter)

    # --- state -------------------------------------------------------------------------------------------
    def get_state(self) -> dict[str, Any]:
        """Tensors and plain values only (loads with `torch.load(weights_only=True)`)."""
        state: dict[str, Any] = {
            "class": "ExactGP",
            "family": self.family,
            "tau": self.tau,
            "warm_start": self.warm_start,
            # the kernel of `model`: the earlier one after loading an earlier state, until the next fit
            "kernel": KERNEL_LEGACY
            if self.model is not None and isinstance(self.model.covar_module, ScaleKernel)
            else KERNEL,
            "y_mean": self._y_mean,
            "y_std": self._y_std,
            "X": None,
            "Y": None,
            "model": None,
        }
        if self.model is not None:
            state.update(X=self._X.cpu().clone(), Y=self._Y.cpu().clone(),
                         model={k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()})
        return state

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore from `get_state()` (rebuilds the GP on the stored data and hyperparameters)."""
        if state.get("class") != "ExactGP":
            raise InputDataError(f"state is for {state.get('class')!r}, not 'ExactGP'")
        self.tau = check_tau(state["tau"])
        self.warm_start = bool(state["warm_start"])
        self._y_mean, self._y_std = float(state["y_mean"]), float(state["y_std"])
        self._parts = None
        if state["model"] is None:
            self.model, self._X, self._Y = None, None, None
            return
        X, Y = state["X"].to(**TKWARGS), state["Y"].to(**TKWARGS)
        # a state saved before the priors (no "kernel") holds a ScaleKernel's hyperparameters: rebuilt as it
        # was; the next fit builds the current kernel (its warm start takes the noise and mean, not the
        # kernel's)
        kernel = state.get("kernel", KERNEL_LEGACY)
        model = self._build(X, (Y - self._y_mean) / self._y_std, kernel)
        model.load_state_dict(state["model"])
        model.eval()
        self.model, self._X, self._Y = model, X, Y
