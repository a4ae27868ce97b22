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

import gpytorch
import torch

# BoTorch's public `InducingPointAllocator.allocate_inducing_points` calls `evaluate_kernel()` on the
# `n x n` training kernel (80 GB at n = 100,000). Its greedy pass, `_pivoted_cholesky_init`, reads only the
# kernel's diagonal and one row per chosen point, which a lazily evaluated GPyTorch kernel gives at O(n) cost
# each, so the allocation calls it on the lazy kernel and holds `m x n` floats instead of `n x n`.
from botorch.models.utils.inducing_point_allocators import (
    QualityFunction,
    UnitQualityFunction,
    _pivoted_cholesky_init,
)
from gpytorch.kernels import MaternKernel, ScaleKernel
from torch import Tensor

from orchestrator.checks import check_int

__all__ = ["AUTO_MAX", "CANDIDATES_PER_INDUCING", "FULL_UP_TO", "PLACEMENTS", "QUALITY_CHUNK",
           "allocate_inducing", "auto_num_inducing", "check_num_inducing", "unique_rows"]

#: observations up to which every distinct observed input is an inducing input ("auto")
FULL_UP_TO = 500
#: largest inducing set "auto" grows to (the cost of a minibatch step grows as m^3 + b m^2)
AUTO_MAX = 1000
#: smallest quality of a candidate inducing input, relative to the best (`_ImprovementQuality`)
QUALITY_FLOOR = 1e-2
#: names of the placements (`SVGPOptions.inducing_placement`)
PLACEMENTS = ("auto", "greedy-variance", "kmeans")
#: most candidates per inducing input the greedy pass scans. Its buffer is `m x candidates` floats and its
#: time grows as m^2 x candidates: at m = 1,000 and 20,000 candidates 160 MB and about 8 s of one core
#: (2-core shared machine, load 4); past the cap the pass runs on a preselection (`_preselect`)
CANDIDATES_PER_INDUCING = 20
#: seed of the preselection's uniform draw, so that the allocation is a function of its inputs
PRESELECT_SEED = 0
#: rows per call of the previous fit's posterior in `_ImprovementQuality` (its `m x rows` solves)
QUALITY_CHUNK = 8192


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
        parts = [self._posterior(rows) for rows in inputs.split(QUALITY_CHUNK)]
        mean, var = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
        sigma = var.clamp_min(1e-12).sqrt()
        u = (mean - mean.max()) / sigma
        normal = torch.distributions.Normal(torch.zeros_like(u), torch.ones_like(u))
        ei = sigma * (normal.log_prob(u).exp() + u * normal.cdf(u))
        return (ei / ei.max().clamp_min(1e-300)).clamp_min(QUALITY_FLOOR)


def _kernel(lengthscale: Tensor, outputscale: float, d: int, like: Tensor) -> ScaleKernel:
    kernel = ScaleKernel(MaternKernel(nu=2.5, ard_num_dims=d)).to(like)
    kernel.base_kernel.lengthscale = lengthscale.reshape(1, d).to(like)
    kernel.outputscale = torch.as_tensor(float(outputscale)).to(like)
    return kernel.requires_grad_(False)  # `_pivoted_cholesky_init` refuses a kernel that requires grad


def _preselect(quality: Tensor, cap: int) -> Tensor:
    """Ascending indices of `cap` of the `n > cap` candidates: the `cap // 2` of highest quality (none when
    the quality is constant, as under variance reduction) and a seeded uniform draw of the others.

    The greedy pass's first choice is the candidate of highest quality, and later ones weigh the quality
    squared, so the best candidates are all kept; the uniform part keeps the rest of the space covered."""
    n = quality.shape[0]
    g = torch.Generator().manual_seed(PRESELECT_SEED)
    if bool((quality == quality[0]).all()):
        keep = torch.randperm(n, generator=g)[:cap].to(quality.device)
    else:
        top = torch.topk(quality, cap // 2).indices
        rest = torch.ones(n, dtype=torch.bool, device=quality.device)
        rest[top] = False
        rest = rest.nonzero().squeeze(-1)
        keep = torch.cat([top, rest[torch.randperm(rest.numel(), generator=g)[: cap - top.numel()]
                                    .to(rest.device)]])
    return keep.sort().values


def _greedy_choice(U: Tensor, kernel: ScaleKernel, m: int, quality: Tensor) -> Tensor:
    """At most `m` rows of `U` (`n x d`) by BoTorch's greedy pivoted Cholesky on the lazily evaluated kernel:
    the diagonal and each chosen point's row at O(n) cost, the `m x n` buffer the only large allocation."""
    with torch.no_grad(), gpytorch.settings.lazily_evaluate_kernels(True):
        return _pivoted_cholesky_init(U, kernel(U), m, quality)


def allocate_inducing(X: Tensor, m: int, lengthscale: Tensor, outputscale: float,
                      posterior: Callable[[Tensor], tuple[Tensor, Tensor]] | None = None) -> Tensor:
    """`min(m, distinct rows)` inducing inputs among the observed inputs `X` (`n x d`).

    Every distinct row when there are at most `m`; else the greedy pivoted-Cholesky choice under a Matern-5/2
    kernel with the given hyperparameters, weighted by the expected improvement of `posterior` (the previous
    fit's f) when given, by variance reduction alone otherwise: the choice of BoTorch's
    `GreedyVarianceReduction` (or of its allocator with that quality) in `O(m n)` memory. Past
    `CANDIDATES_PER_INDUCING * m` distinct rows it chooses among a preselection of that many (`_preselect`).
    """
    U = unique_rows(X)
    if U.shape[0] <= m:
        return U
    quality = (UnitQualityFunction() if posterior is None else _ImprovementQuality(posterior))(U)
    cap = CANDIDATES_PER_INDUCING * m
    if U.shape[0] > cap:
        keep = _preselect(quality, cap)
        U, quality = U[keep], quality[keep]
    kernel = _kernel(lengthscale, outputscale, X.shape[-1], U)
    return _greedy_choice(U, kernel, m, quality).to(X)
