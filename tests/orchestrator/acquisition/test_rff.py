"""Tests of random Fourier features and Matheron paths (quantile-expectile-bo.md §2 steps 1-4).

Statistical checks use Monte-Carlo standard errors (z-scores), and each comes with a negative control
showing that the same check rejects a wrong sampler.
"""

from __future__ import annotations

import math
import re

import pytest
import torch
from proposer_contract import PartsSurrogate, random_parts
from scipy import stats

from orchestrator.acquisition.rff import SUPPORTED_NU, MaternFourierFeatures, MatheronPaths, matern_kernel
from orchestrator.errors import InputDataError, UnsupportedError
from orchestrator.models.base import SparseLatentParts

TK = {"dtype": torch.float64}
#: |z| bound for many simultaneous z-scores (two-sided p ~ 1e-5 each)
Z_MAX = 4.5


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("nu", SUPPORTED_NU)
def test_rff_inner_products_match_matern_ard_kernel(nu: float) -> None:
    d, L = 3, 20_000
    ls = torch.tensor([0.2, 0.5, 1.1], **TK)
    s2 = torch.tensor(1.7, **TK)
    X = torch.rand(25, d, generator=torch.Generator().manual_seed(0), **TK)
    K = matern_kernel(ls, s2, nu).forward(X, X)
    phi = MaternFourierFeatures(ls, s2, nu, L, generator=torch.Generator().manual_seed(1))(X)
    err = (phi @ phi.mT - K).abs().max().item()
    bound = 4 * s2.item() * math.sqrt(2 / L)  # O(s²·sqrt(2/L)); each entry has sd <= s²/sqrt(L)
    assert err < bound, f"nu={nu}: max kernel error {err:.4f} >= {bound:.4f}"
    # negative control: features of another smoothness miss this kernel by far more than the bound
    other = 0.5 if nu != 0.5 else 2.5
    phi_wrong = MaternFourierFeatures(ls, s2, other, L, generator=torch.Generator().manual_seed(1))(X)
    assert (phi_wrong @ phi_wrong.mT - K).abs().max().item() > 2 * bound


@pytest.mark.parametrize("nu", SUPPORTED_NU)
def test_frequencies_are_student_t_with_2nu_dof_scaled_by_lengthscale(nu: float) -> None:
    ls = torch.tensor([0.25, 2.0], **TK)
    f = MaternFourierFeatures(
        ls, torch.tensor(1.0, **TK), nu, 4000, generator=torch.Generator().manual_seed(2)
    )
    assert f.omega.shape == (2, 4000) and f.beta.shape == (4000,)
    for j in range(2):
        # each coordinate of a multivariate t is a univariate t with the same degrees of freedom
        p = stats.kstest((f.omega[j] * ls[j]).numpy(), stats.t(df=2 * nu).cdf).pvalue
        assert p > 1e-4, f"nu={nu}, dim {j}: KS p-value {p:.2e}"
    assert (f.beta >= 0).all() and (f.beta < 2 * math.pi).all()


def _posterior(parts: SparseLatentParts, X: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return PartsSurrogate(parts).posterior_f(X, full_cov=True)


def _moment_z_scores(paths: torch.Tensor, mean: torch.Tensor, cov: torch.Tensor) -> tuple[float, float]:
    """Largest |z| of the empirical mean and covariance of `s x n` path values against (mean, cov)."""
    s = paths.shape[0]
    emp_mean = paths.mean(0)
    z_mean = (emp_mean - mean) / (cov.diagonal() / s).sqrt()
    c = paths - mean
    emp_cov = c.mT @ c / s
    # sd of a Gaussian sample covariance entry: sqrt((S_ii S_jj + S_ij²) / s)
    sd_cov = ((cov.diagonal().unsqueeze(-1) * cov.diagonal() + cov.square()) / s).sqrt()
    z_cov = (emp_cov - cov) / sd_cov
    return z_mean.abs().max().item(), z_cov.abs().max().item()


@pytest.mark.filterwarnings("ignore:A not p.d.")  # the negative control has a zero q(u) covariance
def test_paths_match_sparse_posterior_mean_and_covariance() -> None:
    """Per-path features: paths are exact posterior samples marginally over ω, so moments match within MC
    error."""
    d, s = 2, 2000
    parts = random_parts(d, m=10, seed=3, mean=0.4, lengthscale=torch.tensor([0.3, 0.5]), outputscale=1.3)
    X = torch.cat([parts.Z[:2] + 0.02, torch.tensor([[0.9, 0.1], [0.5, 0.5], [0.05, 0.95]], **TK)])
    mean, cov = _posterior(parts, X)
    paths = MatheronPaths(parts, s, 500, generator=torch.Generator().manual_seed(4), shared_features=False)
    vals = paths(X.expand(s, -1, -1))
    zm, zc = _moment_z_scores(vals, mean, cov)
    assert zm < Z_MAX and zc < Z_MAX, (zm, zc)
    # negative control: ignoring q(u)'s covariance (u = u_mean) gives too little variance near Z
    no_s = SparseLatentParts(**{**parts.__dict__, "u_covar": torch.zeros_like(parts.u_covar)})
    bad = MatheronPaths(no_s, s, 500, generator=torch.Generator().manual_seed(4), shared_features=False)
    assert _moment_z_scores(bad(X.expand(s, -1, -1)), mean, cov)[1] > 2 * Z_MAX


def test_paths_of_an_exact_gp_on_noiseless_data_have_the_posterior_covariance() -> None:
    """Exact GP on noiseless data: the noise sits at its floor and the jitter of K~ = K + jitter I is a
    sizeable share of the posterior variance. The prior draw at Z must have covariance K~ too; drawn with k(Z,
    Z) alone the paths fall 18-24% short of the posterior variance. The jitter is 1e-6 x the outputscale,
    at most half the noise: the exact GP's kernel without an outputscale (BoTorch's default priors) leaves it
    at 1e-6, too small a share to test, so the GP here is the earlier kernel (a fitted outputscale), loaded as
    a state saved before the priors."""
    from botorch.fit import fit_gpytorch_mll
    from gpytorch.mlls import ExactMarginalLogLikelihood

    from orchestrator.models.exact_gp import KERNEL_LEGACY, ExactGP
    from orchestrator.models.svgp import standardization

    g = torch.Generator().manual_seed(0)
    X = torch.rand(40, 1, generator=g, **TK)
    Y = torch.sin(6 * X[:, 0])
    loc, scale = standardization(Y)
    gp = ExactGP._build(X, (Y - loc) / scale, KERNEL_LEGACY)
    fit_gpytorch_mll(ExactMarginalLogLikelihood(gp.likelihood, gp))
    model = ExactGP()
    model.set_state({"class": "ExactGP", "family": "gaussian", "tau": 0.5, "warm_start": True, "y_mean": loc,
                     "y_std": scale, "X": X, "Y": Y, "model": gp.state_dict()})
    parts = model.sparse_parts("f")
    Xt = torch.tensor([[0.123], [0.5], [0.777]], **TK)
    mean, cov = model.posterior_f(Xt)
    mean, cov = mean.detach(), cov.detach()
    k = matern_kernel(parts.lengthscale, parts.outputscale, parts.nu).forward
    A = torch.linalg.solve(k(parts.Z, parts.Z) + parts.jitter * torch.eye(40, **TK), k(Xt, parts.Z).mT).mT
    assert (parts.jitter * A.square().sum(-1) / cov.diagonal()).min() > 0.1  # the jitter term matters here
    s = 4000
    paths = MatheronPaths(parts, s, 400, generator=torch.Generator().manual_seed(1), shared_features=False)
    zm, zc = _moment_z_scores(paths(Xt.expand(s, -1, -1)).detach(), mean, cov)
    assert zm < Z_MAX and zc < Z_MAX, (zm, zc)


def test_shared_feature_paths_match_rff_conditional_posterior() -> None:
    """Shared (ω, β) (A3): given the features, paths are Gaussian with the posterior of the RFF-approximate
    prior."""
    d, s = 2, 2000
    parts = random_parts(d, m=8, seed=5, lengthscale=0.4)
    X = torch.tensor([[0.1, 0.2], [0.15, 0.22], [0.7, 0.9], [0.4, 0.6]], **TK)
    paths = MatheronPaths(parts, s, 300, generator=torch.Generator().manual_seed(6))
    vals = paths(X.expand(s, -1, -1))
    k = paths.kernel.forward
    K = k(parts.Z, parts.Z) + parts.jitter * torch.eye(8, **TK)
    A = torch.linalg.solve(K, k(X, parts.Z).mT).mT
    phi_x, phi_z = paths.features(X), paths.features(parts.Z)
    kt_xx, kt_xz, kt_zz = phi_x @ phi_x.mT, phi_x @ phi_z.mT, phi_z @ phi_z.mT
    # the prior draw at Z carries the jitter too (its covariance is K~ = K + jitter I, as the update's solve)
    kt_zz = kt_zz + parts.jitter * torch.eye(8, **TK)
    cov = kt_xx - kt_xz @ A.mT - A @ kt_xz.mT + A @ kt_zz @ A.mT + A @ parts.u_covar @ A.mT
    mean = parts.constant_mean + A @ parts.u_mean
    zm, zc = _moment_z_scores(vals, mean, cov)
    assert zm < Z_MAX and zc < Z_MAX, (zm, zc)
    # the posterior mean used for `spread` is the model's
    assert torch.allclose(paths.mean(X), _posterior(parts, X)[0], atol=1e-10)


def test_path_evaluation_modes_agree_and_index_paths() -> None:
    parts = random_parts(3, m=6, seed=1)
    paths = MatheronPaths(parts, 5, 64, generator=torch.Generator().manual_seed(0))
    X = torch.rand(4, 3, generator=torch.Generator().manual_seed(1), **TK)
    shared = paths.evaluate_shared(X)  # `n x q`
    own = paths(X.expand(5, -1, -1))  # `q x n`
    assert shared.shape == (4, 5) and own.shape == (5, 4)
    assert torch.allclose(shared.mT, own, atol=1e-12)
    idx = torch.tensor([4, 0, 4])
    assert torch.allclose(paths(X[:3].unsqueeze(1), idx).squeeze(1), shared[torch.arange(3), idx], atol=1e-12)
    # batched kernel call (flattened internally) equals per-row calls
    Xb = torch.rand(3, 2, 3, **TK)
    assert torch.allclose(
        paths.cross_covariance(Xb), torch.stack([paths.kernel.forward(x, parts.Z) for x in Xb])
    )


def test_evaluate_shared_with_features_per_path_matches_each_paths_own_evaluation() -> None:
    parts = random_parts(3, m=6, seed=1)
    paths = MatheronPaths(parts, 5, 64, generator=torch.Generator().manual_seed(0), shared_features=False)
    X = torch.rand(4, 3, generator=torch.Generator().manual_seed(1), **TK)
    shared = paths.evaluate_shared(X)  # `n x q`, each path with its own (omega, beta)
    own = paths(X.expand(5, -1, -1))  # `q x n`
    assert shared.shape == (4, 5) and torch.allclose(shared.mT, own, atol=1e-12)
    idx = torch.tensor([4, 0, 4])
    assert torch.allclose(paths.evaluate_shared(X, idx), shared[:, idx], atol=1e-12)


def test_same_generator_state_gives_same_paths() -> None:
    parts = random_parts(2, m=5, seed=2)
    X = torch.rand(7, 2, **TK)
    a = MatheronPaths(parts, 3, 50, generator=torch.Generator().manual_seed(11)).evaluate_shared(X)
    b = MatheronPaths(parts, 3, 50, generator=torch.Generator().manual_seed(11)).evaluate_shared(X)
    c = MatheronPaths(parts, 3, 50, generator=torch.Generator().manual_seed(12)).evaluate_shared(X)
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_bad_inputs_raise_naming_the_field() -> None:
    parts = random_parts(2, m=4, seed=0)
    with pytest.raises(InputDataError, match="SparseLatentParts.u_mean must have shape"):
        MatheronPaths(SparseLatentParts(**{**parts.__dict__, "u_mean": torch.zeros(3, **TK)}), 2)
    with pytest.raises(InputDataError, match="SparseLatentParts.lengthscale must have shape"):
        MatheronPaths(SparseLatentParts(**{**parts.__dict__, "lengthscale": torch.ones(3, **TK)}), 2)
    nan_covar = parts.u_covar.clone()
    nan_covar[0, 0] = float("nan")
    with pytest.raises(InputDataError, match=r"SparseLatentParts.u_covar is not finite: 1 of 16 entries, the "
                                             r"first at flat index 0 \(nan\)"):
        MatheronPaths(SparseLatentParts(**{**parts.__dict__, "u_covar": nan_covar}), 2)
    with pytest.raises(InputDataError, match=re.escape("SparseLatentParts.lengthscale must be positive; got "
                                                       "[0.3, -0.2]")):
        MatheronPaths(
            SparseLatentParts(**{**parts.__dict__, "lengthscale": torch.tensor([0.3, -0.2], **TK)}), 2
        )
    with pytest.raises(InputDataError, match=re.escape("SparseLatentParts.outputscale must be positive; got "
                                                       "0.0")):
        MatheronPaths(SparseLatentParts(**{**parts.__dict__, "outputscale": torch.tensor(0.0, **TK)}), 2)
    with pytest.raises(InputDataError, match="num_paths must be an integer >= 1; got 0"):
        MatheronPaths(parts, 0)
    with pytest.raises(InputDataError, match="num_features must be an integer >= 1; got -1"):
        MatheronPaths(parts, 2, num_features=-1)
    with pytest.raises(UnsupportedError, match="nu must be one of"):
        MatheronPaths(SparseLatentParts(**{**parts.__dict__, "nu": 3.5}), 2)
    paths = MatheronPaths(parts, 2, 16)
    with pytest.raises(InputDataError, match="X must be `k x n x 2`"):
        paths(torch.rand(2, 3, **TK))
