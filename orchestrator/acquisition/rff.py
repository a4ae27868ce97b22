"""Random Fourier features and pathwise (Matheron) posterior sample paths of one sparse GP latent.

Implements quantile-expectile-bo.md §2 steps 1-4 (decoupled sampling, Wilson et al. 2020):
Matérn-ν ARD random Fourier features with Student-t frequencies (`MaternFourierFeatures`), and
`MatheronPaths`, which turns a `SparseLatentParts` (§1.4 / §1.7) into `q` posterior paths
f_b(x) = c + φ(x)ᵀw_b + k(x, Z)v_b with v_b = K_ZZ⁻¹(u_b − Φ_Z w_b), u_b ~ q(u), vectorised over paths.

Ambiguity A3 (spec §5): by default the paths of one batch SHARE the frequencies and phases (ω, β)
and draw their own (w, u), as the authors' code does (`renew_rff` once per model update). That makes
scoring all paths on a common candidate set one matrix product (`evaluate_shared`) and keeps memory at
O(L d) for (ω, β). Each path is still an exact Gaussian process given (ω, β); paths of one batch share
the RFF kernel error (of order s²·sqrt(2/L)). `shared_features=False` redraws (ω, β) per path (exact
posterior marginally over ω; O(q L d) memory): `ThompsonSampling(shared_features=False)`, and the tests'
unbiased reference.
"""

from __future__ import annotations

import math

import torch
from gpytorch.kernels import MaternKernel, ScaleKernel
from linear_operator.utils.cholesky import psd_safe_cholesky
from torch import Tensor

from orchestrator.checks import check_int
from orchestrator.device import rand, randn
from orchestrator.errors import InputDataError, UnsupportedError, describe_nonfinite
from orchestrator.models.base import SparseLatentParts

__all__ = ["SUPPORTED_NU", "MaternFourierFeatures", "MatheronPaths", "matern_kernel"]

#: Matérn smoothness values with a Student-t spectral density of integer degrees of freedom 2ν (spec §2
#: step 1)
SUPPORTED_NU = (0.5, 1.5, 2.5)


def _check_finite(name: str, t: Tensor) -> None:
    """`InputDataError` naming the `SparseLatentParts` field, the count and the first non-finite entry."""
    if (what := describe_nonfinite(t)) is not None:
        raise InputDataError(f"SparseLatentParts.{name} is not finite: {what}")


def _check_nu(nu: float) -> float:
    if float(nu) not in SUPPORTED_NU:
        raise UnsupportedError(f"Matérn nu must be one of {SUPPORTED_NU}; got {nu!r}")
    return float(nu)


def matern_kernel(lengthscale: Tensor, outputscale: Tensor, nu: float = 2.5) -> ScaleKernel:
    """GPyTorch `ScaleKernel(MaternKernel(nu, ARD))` holding the given hyperparameters (no gradients).

    Args:
        lengthscale: `d` ARD lengthscales.
        outputscale: scalar signal variance s².
        nu: Matérn smoothness in `SUPPORTED_NU`.
    """
    nu = _check_nu(nu)
    d = lengthscale.shape[-1]
    kern = ScaleKernel(MaternKernel(nu=nu, ard_num_dims=d)).to(
        dtype=lengthscale.dtype, device=lengthscale.device
    )
    kern.base_kernel.lengthscale = lengthscale.detach().reshape(1, d)
    kern.outputscale = outputscale.detach().reshape(())
    kern.requires_grad_(False)
    return kern


class MaternFourierFeatures:
    """Random Fourier features φ(x) = sqrt(2s²/L) cos(ωᵀx + β) of a Matérn-ν ARD kernel (spec §2 step 1).

    ω = z·sqrt(2ν/c)/ℓ with z ~ N(0, I_d) and c ~ χ²_{2ν} (a multivariate t with 2ν degrees of
    freedom, the normalised spectral density of Matérn-ν), β ~ U(0, 2π). E[φ(x)ᵀφ(x')] = k(x, x').

    Args:
        lengthscale: `d` ARD lengthscales ℓ.
        outputscale: scalar signal variance s².
        nu: Matérn smoothness, one of `SUPPORTED_NU`.
        num_features: L, the number of features.
        batch_shape: independent feature sets (e.g. `(q,)` for one set per path); `()` for one set.
        generator: the source of randomness (reproducible draws).
    """

    def __init__(
        self,
        lengthscale: Tensor,
        outputscale: Tensor,
        nu: float = 2.5,
        num_features: int = 1000,
        batch_shape: torch.Size | tuple[int, ...] = (),
        generator: torch.Generator | None = None,
    ) -> None:
        nu = _check_nu(nu)
        num_features = check_int("num_features", num_features, 1, error=InputDataError)
        tk = {"dtype": lengthscale.dtype, "device": lengthscale.device}
        d = lengthscale.shape[-1]
        batch_shape = torch.Size(batch_shape)
        dof = int(round(2 * nu))
        z = randn(*batch_shape, d, num_features, generator=generator, **tk)
        # chi-square with an integer number of degrees of freedom: a sum of squared normals (keeps
        # `generator`)
        c = (
            randn(*batch_shape, dof, num_features, generator=generator, **tk)
            .square()
            .sum(-2, keepdim=True)
        )
        #: `*batch x d x L` frequencies (stored transposed, ready for `X @ omega`)
        self.omega = z * torch.sqrt(2 * nu / c) / lengthscale.detach().reshape(d, 1)
        #: `*batch x L` phases
        self.beta = 2 * math.pi * rand(*batch_shape, num_features, generator=generator, **tk)
        self.amplitude = torch.sqrt(2 * outputscale.detach() / num_features)
        self.num_features = num_features
        self.batch_shape = batch_shape

    def __call__(self, X: Tensor) -> Tensor:
        """Features at `X` (`... x n x d`, broadcasting against `batch_shape`): `... x n x L`."""
        return self.amplitude * torch.cos(X @ self.omega + self.beta.unsqueeze(-2))


class MatheronPaths:
    """`q` pathwise posterior samples of one latent: f_b(x) = c + φ(x)ᵀw_b + k(x, Z)v_b (spec §2 steps 2-4).

    One Cholesky of K_ZZ (GPyTorch's `psd_safe_cholesky` adds jitter from its settings only when needed)
    and one of the q(u) covariance are shared by all paths. Evaluation is vectorised over paths.

    Args:
        parts: the latent's `SparseLatentParts` (standardized units).
        num_paths: q, the number of paths.
        num_features: L random Fourier features.
        generator: the source of randomness.
        shared_features: share (ω, β) across the paths (A3, the default; see the module docstring).

    Raises:
        InputDataError: when a field of `parts` has the wrong shape or is not finite (the field is named).
    """

    def __init__(
        self,
        parts: SparseLatentParts,
        num_paths: int,
        num_features: int = 1000,
        generator: torch.Generator | None = None,
        shared_features: bool = True,
    ) -> None:
        num_paths = check_int("num_paths", num_paths, 1, error=InputDataError)
        Z = parts.Z
        _check_parts(parts)
        m, d = Z.shape
        self.num_paths, self.d, self.m = num_paths, d, m
        self.shared_features = bool(shared_features)
        self.Z = Z
        self.constant_mean = parts.constant_mean.detach().reshape(())
        self.kernel = matern_kernel(parts.lengthscale, parts.outputscale, parts.nu)
        with torch.no_grad():
            # K_ZZ = k(Z, Z) + parts.jitter * I exactly as the model's own formulas; psd_safe_cholesky adds
            # GPyTorch's `cholesky_jitter` on top only if that matrix is numerically singular
            K_zz = self.kernel.forward(Z, Z) + float(parts.jitter) * torch.eye(
                m, dtype=Z.dtype, device=Z.device
            )
            self._chol_zz = psd_safe_cholesky(K_zz)
            self.features = MaternFourierFeatures(
                parts.lengthscale,
                parts.outputscale,
                nu=parts.nu,
                num_features=num_features,
                batch_shape=() if shared_features else (num_paths,),
                generator=generator,
            )
            #: `q x L` prior weights
            self.w = randn(num_paths, num_features, generator=generator, dtype=Z.dtype, device=Z.device)
            u_mean = parts.u_mean.detach()
            chol_s = psd_safe_cholesky(parts.u_covar.detach())
            eps = randn(num_paths, m, generator=generator, dtype=Z.dtype, device=Z.device)
            u = u_mean + eps @ chol_s.mT  # `q x m`
            phi_z = self.features(Z)  # `m x L` or `q x m x L`
            if shared_features:
                prior_z = self.w @ phi_z.mT  # `q x m`
            else:
                prior_z = (phi_z @ self.w.unsqueeze(-1)).squeeze(-1)
            # the update solves with K~ = k(Z, Z) + jitter I, so the prior draw at Z must have covariance K~
            # as well: without this term the paths' covariance falls short of the posterior's by
            # jitter k_xZ K~^-2 k_Zx (18-24% of the variance for an exact GP on nearly noiseless data)
            jitter = float(parts.jitter)
            if jitter > 0:
                prior_z = prior_z + math.sqrt(jitter) * randn(
                    num_paths, m, generator=generator, dtype=Z.dtype, device=Z.device)
            #: `q x m` update weights v = K_ZZ^-1 (u - Φ_Z w)
            self.v = torch.cholesky_solve((u - prior_z).mT, self._chol_zz).mT.contiguous()
            #: `m` posterior-mean weights K_ZZ^-1 a, so that μ(x) = c + k(x, Z) K_ZZ^-1 a (spec §1.4)
            self.mean_weights = torch.cholesky_solve(u_mean.unsqueeze(-1), self._chol_zz).squeeze(-1)

    def cross_covariance(self, X: Tensor) -> Tensor:
        """k(X, Z) for `X` of shape `... x n x d`: `... x n x m` (differentiable in `X`)."""
        # flatten the batch: a batched kernel call would expand Z to `... x m x d` (memory and time)
        K = self.kernel.forward(X.reshape(-1, self.d), self.Z)
        return K.reshape(*X.shape[:-1], self.m)

    def __call__(self, X: Tensor, path_index: Tensor | None = None) -> Tensor:
        """Evaluate each path on its own points.

        Args:
            X: `k x n x d`; row i holds the points of path `path_index[i]` (of path i when `path_index`
                is None, so then `k = q`).
            path_index: optional `k` long tensor of path indices (repeats allowed).

        Returns:
            `k x n` path values (differentiable in `X`).
        """
        if X.ndim != 3 or X.shape[-1] != self.d:
            raise InputDataError(f"X must be `k x n x {self.d}`; got shape {tuple(X.shape)}")
        idx = torch.arange(self.num_paths, device=X.device) if path_index is None else path_index
        if idx.shape != X.shape[:1]:
            raise InputDataError(f"X has {X.shape[0]} rows but there are {idx.shape[0]} path indices")
        phi = self.features(X) if self.shared_features else self._features_of(idx, X)  # `k x n x L`
        # elementwise products: far faster than `k` tiny batched matrix products when n is small
        prior = (phi * self.w[idx].unsqueeze(-2)).sum(-1)
        update = (self.cross_covariance(X) * self.v[idx].unsqueeze(-2)).sum(-1)
        return self.constant_mean + prior + update

    def evaluate_shared(self, X: Tensor, path_index: Tensor | None = None) -> Tensor:
        """All paths (or the paths `path_index`, `k` long) on the same points `X` (`n x d`): `n x q` (or `n x
        k`).

        With shared features, two matrix products (`n x L` features). With features per path, each path's
        features are computed on `X`: `k x n x L` numbers, k times the time and memory.
        """
        w, v = (self.w, self.v) if path_index is None else (self.w[path_index], self.v[path_index])
        update = self.cross_covariance(X) @ v.mT
        if self.shared_features:
            return self.constant_mean + self.features(X) @ w.mT + update
        prior = (self._features_of(path_index, X) @ w.unsqueeze(-1)).squeeze(-1).mT  # `k x n x L` -> `n x k`
        return self.constant_mean + prior + update

    def _features_of(self, idx: Tensor | None, X: Tensor) -> Tensor:
        """Features per path (`shared_features=False`): path `idx[i]`'s features (every path's when `idx` is
        None, without indexing a copy) at `X[i]` (`k x n x d`) or at a shared `X` (`n x d`): `k x n x L`."""
        f = self.features
        omega, beta = (f.omega, f.beta) if idx is None else (f.omega[idx], f.beta[idx])
        return f.amplitude * torch.cos(X @ omega + beta.unsqueeze(-2))

    def mean(self, X: Tensor) -> Tensor:
        """Posterior mean of the latent at `... x n x d` (the variational posterior's mean, spec §1.4): `... x
        n`."""
        return self.constant_mean + self.cross_covariance(X) @ self.mean_weights


def _check_parts(parts: SparseLatentParts) -> None:
    Z = parts.Z
    if Z.ndim != 2 or Z.shape[0] < 1:
        raise InputDataError(f"SparseLatentParts.Z must be `m x d` with m >= 1; got shape {tuple(Z.shape)}")
    m, d = Z.shape
    expected = {
        "constant_mean": (),
        "lengthscale": (d,),
        "outputscale": (),
        "u_mean": (m,),
        "u_covar": (m, m),
    }
    for name, shape in expected.items():
        t = getattr(parts, name)
        if (
            not isinstance(t, Tensor)
            or t.numel() != math.prod(shape)
            or (len(shape) == 2 and t.shape != shape)
        ):
            got = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
            raise InputDataError(f"SparseLatentParts.{name} must have shape {shape}; got {got}")
        _check_finite(name, t)
    _check_finite("Z", Z)
    for name in ("lengthscale", "outputscale"):
        t = getattr(parts, name)
        if (t <= 0).any():
            raise InputDataError(f"SparseLatentParts.{name} must be positive; got {t.tolist()}")
    _check_nu(parts.nu)
