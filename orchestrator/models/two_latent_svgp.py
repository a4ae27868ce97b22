"""The two-latent variational model (f, g = log sigma) and its test-input-free predictive factors.

quantile-expectile-bo.md §1.3-1.5 (Hensman et al. 2013; Saul et al. 2016): two independent latent GPs, each
with a constant mean and a Matern-5/2 ARD kernel (GPyTorch `ScaleKernel(MaternKernel)` with batch shape [2]),
fixed inducing inputs Z and a Gaussian q(u_f) q(u_g) stored whitened (GPyTorch
`CholeskyVariationalDistribution` over u~ = L^-1 u, L = chol k(Z, Z), allowed by §1.4).
`TwoLatentSVGP.marginals` and `kl_divergence` give the ELBO's terms; `PredictiveCache` holds one latent's
posterior factors, so a prediction costs O(m^2) per point and `... x n x d` batches need no Python loop. The
surrogate that fits this model is `orchestrator.models.svgp`.
"""

from __future__ import annotations

from typing import Any

import gpytorch
import torch
from gpytorch.constraints import GreaterThan
from gpytorch.kernels import MaternKernel, ScaleKernel
from gpytorch.means import ConstantMean
from gpytorch.priors import LogNormalPrior
from gpytorch.variational import CholeskyVariationalDistribution
from linear_operator.utils.cholesky import psd_safe_cholesky
from torch import Tensor

from orchestrator.models.base import TKWARGS
from orchestrator.models.kernels import matern52
from orchestrator.models.svgp_options import lengthscale_prior_params

__all__ = ["JITTER_REL", "MIN_OUTPUTSCALE", "MIN_VARIANCE", "PredictiveCache", "TwoLatentSVGP"]

#: jitter added to k(Z, Z), relative to the latent's outputscale (GPyTorch's float64 default is 1e-6 absolute)
JITTER_REL = 1e-6
#: floor of posterior marginal variances returned by `posterior_f`/`posterior_g` (roundoff guard)
MIN_VARIANCE = 1e-12
#: floor on the kernel outputscale (keeps k(Z, Z) positive definite)
MIN_OUTPUTSCALE = 1e-6


class TwoLatentSVGP(gpytorch.Module):
    """The variational model over (f, g): means, kernels, q(u) and the fixed inducing inputs `Z`.

    Index 0 of every batch-[2] parameter is f, index 1 is g. u_k are the values at Z of the zero-mean part of
    latent k (spec §1.4), q(u_k) = N(a_k, S_k); the parameters are the whitened a~ = L^-1 a and a lower factor
    R of S~ = L^-1 S L^-T = R R^T, with L L^T = k(Z, Z) + jitter I.

    Args:
        Z: `m x d` inducing inputs.
        lengthscale_init, outputscale_init: initial hyperparameters of both latents (lengthscale None: the
            default of `lengthscale_prior`, see `lengthscale_prior_params`).
        use_priors: register the LogNormal hyperpriors of spec §1.3.
        lengthscale_prior: "spec" or "dim-scaled" (`SVGPOptions`).
        constant_scale: g is its constant mean alone (`SVGPOptions.noise_scale` "constant"): its kernel
            variance is held at `MIN_OUTPUTSCALE`, its lengthscales get no gradient and its hyperpriors leave
            `log_prior`.
    """

    def __init__(
        self,
        Z: Tensor,
        lengthscale_init: float | None = None,
        outputscale_init: float = 0.5,
        use_priors: bool = True,
        lengthscale_prior: str = "spec",
        constant_scale: bool = False,
    ) -> None:
        super().__init__()
        m, d = Z.shape
        self.constant_scale = bool(constant_scale)
        batch = torch.Size([2])
        self.register_buffer("Z", Z.clone())
        self.mean_module = ConstantMean(batch_shape=batch)
        loc, scale, default_init = lengthscale_prior_params(lengthscale_prior, d)
        lengthscale_init = default_init if lengthscale_init is None else lengthscale_init
        ls_prior = LogNormalPrior(loc, scale) if use_priors else None
        os_prior = LogNormalPrior(0.0, 1.0) if use_priors else None
        self.covar_module = ScaleKernel(
            MaternKernel(nu=2.5, ard_num_dims=d, batch_shape=batch, lengthscale_prior=ls_prior),
            batch_shape=batch,
            outputscale_prior=os_prior,
            outputscale_constraint=GreaterThan(MIN_OUTPUTSCALE),
        )
        self.variational_distribution = CholeskyVariationalDistribution(m, batch_shape=batch)
        tk = {"dtype": TKWARGS["dtype"], "device": Z.device}  # the model lives where its inducing inputs do
        self.to(**tk)
        self.covar_module.base_kernel.lengthscale = torch.full((2, 1, d), float(lengthscale_init), **tk)
        self.covar_module.outputscale = torch.full((2,), float(outputscale_init), **tk)

    # --- hyperparameters --------------------------------------------------------------------------------
    @property
    def constant(self) -> Tensor:
        """`2` constant means (f, g)."""
        return self.mean_module.constant

    @property
    def lengthscale(self) -> Tensor:
        """`2 x 1 x d` ARD lengthscales; with `constant_scale`, g's are held where they were set (no gradient:
        they would act on a kernel of variance `MIN_OUTPUTSCALE`, and Adam's normalized steps would move them
        anyway)."""
        ls = self.covar_module.base_kernel.lengthscale
        if self.constant_scale:
            return torch.stack([ls[0], ls[1].detach()])
        return ls

    @property
    def outputscale(self) -> Tensor:
        """`2` kernel variances; with `constant_scale`, g's is `MIN_OUTPUTSCALE` whatever its parameter holds
        (g is then its constant mean, to within sqrt(MIN_OUTPUTSCALE) = 0.001)."""
        s = self.covar_module.outputscale
        if self.constant_scale:
            return torch.stack([s[0], torch.full_like(s[1], MIN_OUTPUTSCALE)])
        return s

    @property
    def white_mean(self) -> Tensor:
        """`2 x m` whitened variational means a~ = L^-1 a."""
        return self.variational_distribution.variational_mean

    @property
    def white_chol(self) -> Tensor:
        """`2 x m x m` lower factors R of the whitened variational covariances S~ = R R^T."""
        return self.variational_distribution.chol_variational_covar.tril()

    def unwhitened(self) -> tuple[Tensor, Tensor, Tensor]:
        """(a, L R, L): `2 x m` means, `2 x m x m` factors of S = (L R)(L R)^T, and L, all detached."""
        with torch.no_grad():
            L = self.kzz_chol()
            mean = (L @ self.white_mean.unsqueeze(-1)).squeeze(-1)
            return mean, L @ self.white_chol, L

    def jitter(self) -> Tensor:
        """`2` jitters added to k(Z, Z) (relative to each outputscale)."""
        return JITTER_REL * self.outputscale

    def kzz(self) -> Tensor:
        """`2 x m x m` prior covariance of u, k(Z, Z) + jitter I."""
        K = matern52(self.Z, self.Z, self.lengthscale, self.outputscale)
        return K + self.jitter()[:, None, None] * torch.eye(self.Z.shape[0], dtype=K.dtype, device=K.device)

    def kzz_chol(self) -> Tensor:
        """`2 x m x m` Cholesky factor of `kzz()`."""
        return psd_safe_cholesky(self.kzz())

    def set_variational(self, mean: Tensor, chol: Tensor) -> None:
        """Set q(u) from unwhitened `2 x m` means a and `2 x m x m` lower factors of S (whitened with the
        current hyperparameters)."""
        with torch.no_grad():
            L = self.kzz_chol()
            white_mean = torch.linalg.solve_triangular(L, mean.unsqueeze(-1), upper=False).squeeze(-1)
            white_chol = torch.linalg.solve_triangular(L, chol, upper=False)
            self.variational_distribution.variational_mean.copy_(white_mean)
            self.variational_distribution.chol_variational_covar.copy_(white_chol)

    # --- ELBO -------------------------------------------------------------------------------------------
    def marginals(self, X: Tensor) -> tuple[Tensor, Tensor]:
        """Posterior marginal means and variances of (f, g) at `b x d` inputs: two `2 x b` tensors."""
        L = self.kzz_chol()
        outputscale, a_w, R = self.outputscale, self.white_mean, self.white_chol
        Kzx = matern52(self.Z, X, self.lengthscale, outputscale)  # 2 x m x b
        W = torch.linalg.solve_triangular(L, Kzx, upper=False)  # L^-1 Kzx
        mean = self.constant.unsqueeze(-1) + (W * a_w.unsqueeze(-1)).sum(-2)  # Kxz K^-1 a = W^T a~
        V = R.transpose(-1, -2) @ W  # Kxz K^-1 S K^-1 Kzx = V^T V
        var = outputscale.unsqueeze(-1) - (W * W).sum(-2) + (V * V).sum(-2)
        self._kl_cache = (a_w, R)
        return mean, var.clamp_min(MIN_VARIANCE)

    def __getstate__(self) -> dict[str, Any]:
        # the factors `kl_divergence` reuses belong to one ELBO evaluation: left in, they would keep that
        # evaluation's autograd graph alive with the model, and a deep copy of a fitted model (of an
        # AskTellOptimizer) would fail on their non-leaf tensors
        state = dict(super().__getstate__())  # torch's own (it drops a compiled module's call)
        state.pop("_kl_cache", None)
        return state

    def kl_divergence(self) -> Tensor:
        """sum over k of KL(N(a_k, S_k) || N(0, K_ZZ + jitter I)) = KL(N(a~, S~) || N(0, I)), with the factors
        of the last `marginals` call."""
        a_w, R = self._kl_cache
        m = a_w.shape[-1]
        logdet_s = torch.log(torch.diagonal(R, dim1=-2, dim2=-1).pow(2)).sum(-1)
        kl = 0.5 * ((R * R).sum((-2, -1)) + (a_w * a_w).sum(-1) - m - logdet_s)
        return kl.sum()

    def log_prior(self) -> Tensor:
        """Sum of the registered hyperprior log-densities (0 when there are none); with `constant_scale`, f's
        alone (g has no kernel then: its lengthscales and outputscale act on nothing)."""
        total = torch.zeros((), dtype=self.Z.dtype, device=self.Z.device)
        for _, module, prior, closure, _ in self.named_priors():
            log_p = prior.log_prob(closure(module))  # leading dim 2: (f, g), as every hyperparameter here
            total = total + (log_p[0] if self.constant_scale else log_p).sum()
        return total


class PredictiveCache:
    """Factors of one latent's posterior that do not depend on the test inputs (detached)."""

    def __init__(self, model: TwoLatentSVGP, k: int) -> None:
        with torch.no_grad():
            L = model.kzz_chol()[k]
            self.Z = model.Z.detach().clone()
            self.constant = model.constant[k].detach().clone()
            self.lengthscale = model.lengthscale[k].detach().clone()  # 1 x d
            self.outputscale = model.outputscale[k].detach().clone()
            self.jitter = float(model.jitter()[k])
            self.L = L
            self.La = model.white_mean[k].detach().clone()  # L^-1 a
            self.B = model.white_chol[k].detach().clone()  # L^-1 (a factor of S)
            self.u_mean = L @ self.La
            LB = L @ self.B
            self.u_covar = LB @ LB.transpose(-1, -2)

    def posterior(self, X: Tensor, full_cov: bool) -> tuple[Tensor, Tensor]:
        """Mean `... x n` and covariance `... x n x n` (or variance `... x n`) at `... x n x d`."""
        # all points in one triangular solve: `m x N` with N = prod(...) * n (no per-batch copies of L)
        shape = X.shape[:-1]
        Kzx = matern52(self.Z, X.reshape(-1, X.shape[-1]), self.lengthscale, self.outputscale)  # m x N
        W = torch.linalg.solve_triangular(self.L, Kzx, upper=False)
        V = self.B.transpose(-1, -2) @ W
        mean = (self.constant + self.La @ W).reshape(shape)
        if full_cov:
            m = W.shape[0]
            Wb = W.reshape(m, *shape).movedim(0, -2)  # ... x m x n
            Vb = V.reshape(m, *shape).movedim(0, -2)
            Kxx = matern52(X, X, self.lengthscale, self.outputscale)
            cov = Kxx - Wb.transpose(-1, -2) @ Wb + Vb.transpose(-1, -2) @ Vb
            return mean, 0.5 * (cov + cov.transpose(-1, -2))
        var = self.outputscale - (W * W).sum(0) + (V * V).sum(0)
        return mean, var.reshape(shape).clamp_min(MIN_VARIANCE)
