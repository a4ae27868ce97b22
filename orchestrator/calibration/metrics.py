"""Calibration reporting from (forecast recorded at proposal time, observed y) pairs.

- PIT values u_t = F_t(y_t) (calibrated-bo.md §1.1);
- one-step-ahead coverage of the central 50/80/90% intervals: y in [Q(0.5 - c/2), Q(0.5 + c/2)] iff
  |2u - 1| <= c, computed from PITs without quantile bisection;
- the PIT histogram (uniform when calibrated);
- paper 000's calibration score cal = sum_j (p_j - p̂_j)^2 with p̂_j = |{t : u_t <= p_j}| / N (spec §1.1;
  the paper leaves m and p_j open, here p_j = 0.05, 0.10, ..., 0.95).
Every function also accepts a `CalibratedForecast` (anything with `.cdf`), to score a recalibrated forecast.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from orchestrator.checks import check_int
from orchestrator.errors import InputDataError

__all__ = [
    "COVERAGE_LEVELS",
    "SCORE_LEVELS",
    "calibration_score",
    "calibration_summary",
    "interval_coverage",
    "pit_histogram",
    "pit_values",
    "running_coverage",
]

#: central interval coverages reported per run
COVERAGE_LEVELS: tuple[float, ...] = (0.5, 0.8, 0.9)
#: levels p_j of paper 000's calibration score
SCORE_LEVELS: tuple[float, ...] = tuple(round(0.05 * j, 2) for j in range(1, 20))


def pit_values(forecasts: Any, y: Tensor | Sequence[float]) -> Tensor:
    """PIT values F_t(y_t): `n` in [0, 1] for a forecast of `n` points and `n` observations."""
    y = torch.as_tensor(y, dtype=torch.float64).reshape(-1)
    if y.shape[0] != len(forecasts):
        raise InputDataError(f"y has {y.shape[0]} values but the forecasts have {len(forecasts)} points")
    if not torch.isfinite(y).all():
        i = int((~torch.isfinite(y)).nonzero()[0])
        raise InputDataError(f"y[{i}] is not finite ({y[i].item()})")
    return forecasts.cdf(y).reshape(-1)


def _as_pit(u: Tensor | Sequence[float]) -> Tensor:
    u = torch.as_tensor(u, dtype=torch.float64).reshape(-1)
    bad = (u < 0) | (u > 1) | ~torch.isfinite(u)
    if bad.any():
        i = int(bad.nonzero()[0])
        raise InputDataError(f"PIT values must lie in [0, 1]; {int(bad.sum())} of {u.numel()} do not, the "
                             f"first u[{i}] = {u[i].item()}")
    return u


def interval_coverage(
    u: Tensor | Sequence[float], levels: Sequence[float] = COVERAGE_LEVELS
) -> dict[float, float]:
    """Fraction of PITs inside each central interval: {c: mean 1{|2u - 1| <= c}} (NaN when empty)."""
    u = _as_pit(u)
    if u.numel() == 0:
        return {float(c): float("nan") for c in levels}
    return {float(c): float(((2 * u - 1).abs() <= c).double().mean()) for c in levels}


def running_coverage(u: Tensor | Sequence[float], levels: Sequence[float] = COVERAGE_LEVELS) -> Tensor:
    """Coverage after each result, for plots: `n x k` (row t = coverage over the first t+1 results)."""
    u = _as_pit(u)
    c = torch.as_tensor(list(levels), dtype=torch.float64)
    inside = ((2 * u - 1).abs().unsqueeze(-1) <= c).double()
    return inside.cumsum(0) / torch.arange(1, u.numel() + 1, dtype=torch.float64).unsqueeze(-1)


def pit_histogram(u: Tensor | Sequence[float], bins: int = 10) -> tuple[Tensor, Tensor]:
    """Counts of PITs in `bins` equal bins of [0, 1] (`bins`) and the bin edges (`bins + 1`)."""
    bins = check_int("bins", bins, 1, error=InputDataError)
    u = _as_pit(u)
    edges = torch.linspace(0.0, 1.0, bins + 1, dtype=torch.float64)
    idx = (u * bins).floor().long().clamp(0, bins - 1)
    counts = torch.bincount(idx, minlength=bins).to(torch.float64)
    return counts, edges


def calibration_score(u: Tensor | Sequence[float], levels: Sequence[float] = SCORE_LEVELS) -> float:
    """Paper 000's score sum_j (p_j - p̂_j)^2, p̂_j = fraction of PITs <= p_j (0 = perfectly calibrated)."""
    u = _as_pit(u)
    if u.numel() == 0:
        return float("nan")
    p = torch.as_tensor(list(levels), dtype=torch.float64)
    p_hat = (u.unsqueeze(-1) <= p).double().mean(0)
    return float(((p - p_hat) ** 2).sum())


def calibration_summary(forecasts: Any, y: Tensor | Sequence[float], bins: int = 10) -> dict[str, Any]:
    """Everything `qbatch report` shows about calibration, from one-step-ahead (forecast, y) pairs.

    Args:
        forecasts: a `Forecast` (or `CalibratedForecast`) of `n` points, recorded at proposal time.
        y: the `n` observed values, in the same order.
        bins: number of PIT histogram bins.

    Returns:
        {"n", "coverage_50", "coverage_80", "coverage_90", "calibration_score", "pit_mean",
        "pit_histogram" (list of `bins` counts), "pit_edges" (list of `bins + 1`)}; plain floats and lists.
    """
    u = pit_values(forecasts, y)
    cov = interval_coverage(u)
    counts, edges = pit_histogram(u, bins)
    out: dict[str, Any] = {"n": int(u.numel())}
    for c, v in cov.items():
        out[f"coverage_{int(round(100 * c))}"] = v
    out["calibration_score"] = calibration_score(u)
    out["pit_mean"] = float(u.mean()) if u.numel() else float("nan")
    out["pit_histogram"] = counts.tolist()
    out["pit_edges"] = edges.tolist()
    return out
