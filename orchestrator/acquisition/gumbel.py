"""Gumbel approximation of the distribution of the maximum g* = max_x f(x) (Wang & Jegelka 2017).

quantile-expectile-bo.md §3.3: on a grid X_g = (observed inputs) ∪ (random points), with the f-posterior
marginals μ_f, s_f (f only, never y), F(y) = Π_x Φ((y − μ_f(x))/s_f(x)) is evaluated as exp Σ log Φ; its
quartiles y_.25, y_.75 are found by a vectorised bisection in log space (all levels and batch entries at
once, each step a Newton step on −log(−log F), nearly linear in y, when it stays inside the bracket), a
max-Gumbel G(y) = exp(−e^{−(y−a)/b}) is matched to them, and samples g* = a − b log(−log U) drawn.

References:
    Wang, Z. and Jegelka, S. Max-value Entropy Search for Efficient Bayesian Optimization. ICML 2017.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from orchestrator.checks import check_int
from orchestrator.errors import InputDataError, describe_nonfinite

__all__ = [
    "GUMBEL_MIN_SCALE",
    "BISECTION_REL_TOL",
    "build_grid",
    "max_value_quantiles",
    "fit_gumbel",
    "sample_gumbel",
    "sample_max_values",
]

#: spec §3.5: if the two quartiles coincide the Gumbel scale b falls back to this small positive value
#: (relative to the largest posterior std on the grid, with an absolute floor of 1e-12)
GUMBEL_MIN_SCALE = 1e-8
#: the search stops when every step (or bracket) is smaller than this times the largest posterior std on the
#: grid
BISECTION_REL_TOL = 1e-12
#: spec §3.3: the initial bracket is [min(μ − 5s), max(μ + 5s)]
BRACKET_STDS = 5.0
_MAX_BISECTIONS = 200
_MAX_BRACKET_DOUBLINGS = 60
_Q25, _Q75 = 0.25, 0.75
_SQRT_2_OVER_PI = math.sqrt(2 / math.pi)
_SQRT_HALF = math.sqrt(0.5)


def build_grid(
    X_observed: Tensor, grid_size: int, d: int, generator: torch.Generator, **tkwargs
) -> Tensor:
    """X_g = observed inputs ∪ `grid_size` uniform points of `[0, 1]^d` (spec §3.3).

    Returns:
        `(n + grid_size) x d` grid.
    """
    grid_size = check_int("grid_size", grid_size, 0, error=InputDataError)
    rand = torch.rand(grid_size, d, generator=generator, dtype=torch.float64).to(**tkwargs)
    return torch.cat([X_observed.to(**tkwargs).reshape(-1, d), rand], dim=0)


def _log_cdf_max(y: Tensor, mean: Tensor, std: Tensor) -> Tensor:
    """log F(y) = Σ_x log Φ((y − μ(x))/s(x)); y `k x ...`, mean/std `... x n` -> `k x ...`."""
    return torch.special.log_ndtr((y.unsqueeze(-1) - mean) / std).sum(-1)


def max_value_quantiles(mean: Tensor, std: Tensor, probs: tuple[float, ...] = (_Q25, _Q75)) -> Tensor:
    """Quantiles of the independent-max CDF F(y) = Π Φ((y − μ)/s), by vectorised bisection in log space.

    Args:
        mean: `... x n` posterior means of f on the grid.
        std: `... x n` posterior standard deviations (> 0).
        probs: levels in (0, 1).

    Returns:
        `k x ...` quantiles, one row per level.

    Raises:
        InputDataError: empty grid, non-finite moments, non-positive std, or a level outside (0, 1).
    """
    if mean.shape[-1] == 0:
        raise InputDataError("the max-value grid is empty (no observed inputs and grid_size = 0)")
    for name, t in (("mean", mean), ("std", std)):
        if (what := describe_nonfinite(t)) is not None:
            raise InputDataError(f"posterior {name} on the max-value grid is not finite: {what}")
    if (std <= 0).any():
        raise InputDataError(f"posterior std on the max-value grid must be > 0; got min {std.min().item()}")
    for p in probs:
        if not 0.0 < p < 1.0:
            raise InputDataError(f"quantile levels must be in (0, 1); got {p}")
    with torch.no_grad():
        log_p = torch.log(torch.tensor(probs, dtype=mean.dtype, device=mean.device))
        log_p = log_p.reshape((-1,) + (1,) * (mean.ndim - 1))
        shape = (len(probs),) + mean.shape[:-1]
        lo = (mean - BRACKET_STDS * std).amin(-1).expand(shape).clone()
        hi = (mean + BRACKET_STDS * std).amax(-1).expand(shape).clone()
        # every term at hi is >= Φ(5), but a product over a huge grid may still be < p: widen until F(hi) >= p
        for _ in range(_MAX_BRACKET_DOUBLINGS):
            short = _log_cdf_max(hi, mean, std) < log_p
            if not short.any():
                break
            hi = torch.where(short, hi + (hi - lo), hi)
        tol = BISECTION_REL_TOL * std.amax(-1).expand(shape)
        y = 0.5 * (lo + hi)
        u_p = -torch.log(-log_p)
        for _ in range(_MAX_BISECTIONS):
            z = (y.unsqueeze(-1) - mean) / std
            log_cdf = torch.special.log_ndtr(z)
            L = log_cdf.sum(-1)  # log F(y) < 0
            below = L < log_p
            lo = torch.where(below, y, lo)
            hi = torch.where(below, hi, y)
            # Newton step on u(y) = -log(-log F(y)), nearly linear in y when F is close to a Gumbel;
            # kept only when it lands inside the bracket, otherwise bisect
            # phi(z)/Phi(z) = sqrt(2/pi) / erfcx(-z/sqrt(2)): exp(log phi - log Phi) is inf far in the left
            # tail (z ~ -1e10 at a std near the 1e-10 floor), and its zero step would pass for convergence
            dL = (_SQRT_2_OVER_PI / torch.special.erfcx(-z * _SQRT_HALF) / std).sum(-1)
            y_newton = y - (-torch.log(-L) - u_p) * (-L) / dL
            inside = (y_newton >= lo) & (y_newton <= hi) & torch.isfinite(y_newton) & torch.isfinite(dL)
            converged = inside & ((y_newton - y).abs() <= tol)
            y = torch.where(inside, y_newton, 0.5 * (lo + hi))
            if (converged | ((hi - lo) <= tol)).all():
                break
        return y


def fit_gumbel(mean: Tensor, std: Tensor) -> tuple[Tensor, Tensor]:
    """Location a and scale b of the max-Gumbel matching the quartiles of F (spec §3.3).

    b = (y_.75 − y_.25) / (log(−log .25) − log(−log .75)), a = y_.25 + b log(−log .25).

    Returns:
        (`...` a, `...` b) with b >= GUMBEL_MIN_SCALE · max std.
    """
    y25, y75 = max_value_quantiles(mean, std, (_Q25, _Q75))
    l25, l75 = math.log(-math.log(_Q25)), math.log(-math.log(_Q75))
    floor = (GUMBEL_MIN_SCALE * std.amax(-1)).clamp_min(1e-12)
    b = torch.maximum((y75 - y25) / (l25 - l75), floor)
    a = y25 + b * l25
    return a, b


def sample_gumbel(loc: Tensor, scale: Tensor, num_samples: int, generator: torch.Generator) -> Tensor:
    """g* = a − b log(−log U), U ~ U(0, 1): `num_samples x ...` draws (U kept inside the open interval)."""
    num_samples = check_int("num_samples", num_samples, 1, error=InputDataError)
    u = torch.rand((num_samples,) + loc.shape, generator=generator, dtype=torch.float64)
    u = u.to(dtype=loc.dtype, device=loc.device).clamp(1e-12, 1.0 - 1e-12)
    return loc - scale * torch.log(-torch.log(u))


def sample_max_values(
    mean: Tensor,
    std: Tensor,
    num_samples: int,
    generator: torch.Generator,
    floor_at_max_mean: bool = False,
) -> Tensor:
    """Draw `num_samples` max values g* from the Gumbel fitted to the grid moments (spec §3.3).

    Args:
        mean: `n` posterior means of f on the grid X_g.
        std: `n` posterior standard deviations of f on X_g.
        num_samples: |𝓜|.
        generator: random source (same seed, same samples).
        floor_at_max_mean: floor g* at max_x μ_f(x) on the grid (spec §3.5 option; off in the authors' code).

    Returns:
        `num_samples` max values.
    """
    a, b = fit_gumbel(mean, std)
    g_star = sample_gumbel(a, b, num_samples, generator)
    if floor_at_max_mean:
        g_star = torch.maximum(g_star, mean.amax(-1))
    return g_star
