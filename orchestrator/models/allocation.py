"""How many inducing inputs the two-latent SVGPs use, and where they go (quantile-expectile-bo.md §1.4).

While a run is small, every distinct observed input is an inducing input: the SVGP is then the full
variational model and the sparse approximation limits nothing. Past `FULL_UP_TO` observations the inducing
set keeps growing, as sqrt(n), up to `AUTO_MAX`, and is chosen among the observed inputs by BoTorch's greedy
pivoted-Cholesky allocators (Moss, Ober & Picheny 2023, "Inducing point allocation for sparse Gaussian
processes in high-throughput Bayesian optimisation"): `GreedyVarianceReduction` at a cold fit, and at a
warm refit a greedy improvement reduction whose quality is the expected improvement of the previous fit's
objective latent f, so that the region of the optimum keeps its resolution.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from botorch.models.utils.inducing_point_allocators import (
    GreedyVarianceReduction,
    InducingPointAllocator,
    QualityFunction,
)
from gpytorch.kernels import MaternKernel, ScaleKernel
from torch import Tensor

from orchestrator.checks import check_int

__all__ = ["AUTO_MAX", "FULL_UP_TO", "PLACEMENTS", "allocate_inducing", "auto_num_inducing",
           "check_num_inducing", "unique_rows"]

#: observations up to which every distinct observed input is an inducing input ("auto")
FULL_UP_TO = 500
#: largest inducing set "auto" grows to (the cost of a minibatch step grows as m^3 + b m^2)
AUTO_MAX = 1000
#: smallest quality of a candidate inducing input, relative to the best (`_ImprovementQuality`)
QUALITY_FLOOR = 1e-2
#: names of the placements (`SVGPOptions.inducing_placement`)
PLACEMENTS = ("auto", "greedy-variance", "kmeans")


def check_num_inducing(value: Any) -> int | str:
    """`value` if it is "auto" or a positive integer; else a ConfigError naming the option."""
    if value == "auto":
        return value
    return check_int("`num_inducing`", value, 1, must="'auto' or a positive integer")


def auto_num_inducing(n: int) -> int:
    """m(n) of `num_inducing: auto`: n up to `FULL_UP_TO`, then FULL_UP_TO sqrt(n / FULL_UP_TO), at most
    `AUTO_MAX` (m(1000) = 708, m(2000) = 1000)."""
    if n <= FULL_UP_TO:
        return max(int(n), 1)
    return min(AUTO_MAX, math.ceil(FULL_UP_TO * math.sqrt(n / FULL_UP_TO)))


def unique_rows(X: Tensor, tol: float = 1e-9) -> Tensor:
    """The distinct rows of `X` (`n x d`), in first-seen order (rows closer than `tol` in max-norm are
    one)."""
    if X.shape[0] <= 1:
        return X.clone()
    keys = torch.round(X / tol).to(torch.int64) if tol > 0 else X
    _, inverse = torch.unique(keys, dim=0, return_inverse=True)
    first = torch.full((int(inverse.max()) + 1,), X.shape[0], dtype=torch.long, device=X.device)
    first = first.scatter_reduce(0, inverse, torch.arange(X.shape[0], device=X.device), reduce="amin")
    return X[first.sort().values].clone()


class _ImprovementQuality(QualityFunction):
    """Expected improvement of the previous fit's f over its largest mean at the candidate inputs (the quality
    of Moss et al. 2023's greedy improvement reduction), from a callable giving f's posterior mean and
    variance.

    It is scaled to a maximum of 1 and floored at `QUALITY_FLOOR`: where the EI underflows to 0 the greedy
    pivoted Cholesky would otherwise stop before m points, and the floor lets it fall back on variance
    reduction away from the optimum."""

    def __init__(self, posterior: Callable[[Tensor], tuple[Tensor, Tensor]]) -> None:
        self._posterior = posterior

    @torch.no_grad()
    def __call__(self, inputs: Tensor) -> Tensor:
        mean, var = self._posterior(inputs)
        sigma = var.clamp_min(1e-12).sqrt()
        u = (mean - mean.max()) / sigma
        normal = torch.distributions.Normal(torch.zeros_like(u), torch.ones_like(u))
        ei = sigma * (normal.log_prob(u).exp() + u * normal.cdf(u))
        return (ei / ei.max().clamp_min(1e-300)).clamp_min(QUALITY_FLOOR)


class _GreedyImprovement(InducingPointAllocator):
    def __init__(self, quality: QualityFunction) -> None:
        self._quality = quality

    def _get_quality_function(self) -> QualityFunction:
        return self._quality


def _kernel(lengthscale: Tensor, outputscale: float, d: int, like: Tensor) -> ScaleKernel:
    kernel = ScaleKernel(MaternKernel(nu=2.5, ard_num_dims=d)).to(like)
    kernel.base_kernel.lengthscale = lengthscale.reshape(1, d).to(like)
    kernel.outputscale = torch.as_tensor(float(outputscale)).to(like)
    return kernel


def allocate_inducing(X: Tensor, m: int, lengthscale: Tensor, outputscale: float,
                      posterior: Callable[[Tensor], tuple[Tensor, Tensor]] | None = None) -> Tensor:
    """`min(m, distinct rows)` inducing inputs among the observed inputs `X` (`n x d`).

    Every distinct row when there are at most `m`; else the greedy pivoted-Cholesky choice under a Matern-5/2
    kernel with the given hyperparameters, weighted by the expected improvement of `posterior` (the previous
    fit's f) when given, by variance reduction alone otherwise.
    """
    U = unique_rows(X)
    if U.shape[0] <= m:
        return U
    kernel = _kernel(lengthscale, outputscale, X.shape[-1], U)
    allocator = (
        GreedyVarianceReduction() if posterior is None else _GreedyImprovement(_ImprovementQuality(posterior))
    )
    Z = allocator.allocate_inducing_points(U, kernel, m, torch.Size([]))
    return Z.to(X)
