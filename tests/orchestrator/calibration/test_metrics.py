"""Calibration reporting: PITs, central-interval coverage, PIT histogram, paper 000's score."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from orchestrator.calibration import (
    build_calibrator,
    calibration_score,
    calibration_summary,
    interval_coverage,
    pit_histogram,
    pit_values,
    running_coverage,
)
from orchestrator.errors import InputDataError
from orchestrator.models.predictive import Forecast


@pytest.mark.parametrize(
    "family,tau", [("gaussian", 0.5), ("asymmetric_laplace", 0.2), ("asymmetric_gaussian", 0.7)]
)
def test_coverage_from_pits_matches_intervals(family: str, tau: float) -> None:
    g = torch.Generator().manual_seed(0)
    # quantile bisection (x quadrature for AG) is the slow part
    n = 3 if family == "asymmetric_gaussian" else 6
    fc = Forecast(
        family,
        tau,
        torch.randn(n, generator=g),
        torch.rand(n, generator=g) * 0.3,
        torch.randn(n, generator=g) * 0.3,
        torch.rand(n, generator=g) * 0.1,
    )
    y = fc.mean() + 1.5 * fc.variance().sqrt() * torch.randn(n, generator=g, dtype=torch.float64)
    cov = interval_coverage(pit_values(fc, y))
    for c in (0.5, 0.8, 0.9):
        lo, hi = fc.interval(c)
        direct = ((y >= lo) & (y <= hi)).double().mean().item()
        assert cov[c] == pytest.approx(direct)


def test_calibrated_forecasts_score_well_and_overconfident_badly() -> None:
    g = torch.Generator().manual_seed(1)
    n = 2000
    mu = torch.randn(n, generator=g, dtype=torch.float64)
    y = mu + torch.randn(n, generator=g, dtype=torch.float64)
    good = Forecast("gaussian", 0.5, mu, 0.0, 0.0, 0.0)  # N(mu, 1): the truth
    bad = Forecast("gaussian", 0.5, mu, 0.0, np.log(0.3), 0.0)  # 3.3x too narrow
    s_good, s_bad = calibration_summary(good, y), calibration_summary(bad, y)
    assert abs(s_good["coverage_80"] - 0.8) < 0.03 and abs(s_good["coverage_50"] - 0.5) < 0.03
    assert s_bad["coverage_80"] < 0.4
    assert s_good["calibration_score"] < 0.01 < 0.2 < s_bad["calibration_score"]
    counts = torch.tensor(s_good["pit_histogram"])
    assert counts.sum() == n and (counts / n - 0.1).abs().max() < 0.03
    counts_bad = torch.tensor(s_bad["pit_histogram"])
    assert counts_bad[0] + counts_bad[-1] > 0.5 * n  # U-shaped
    assert set(s_good) == {
        "n",
        "coverage_50",
        "coverage_80",
        "coverage_90",
        "calibration_score",
        "pit_mean",
        "pit_histogram",
        "pit_edges",
    }
    # a recalibrated forecast is scored the same way
    cal = build_calibrator("online", eta=0.01)
    cal.update(bad[:50], y[:50])  # the per-result path
    cal.update_pit(bad[50:].cdf(y[50:]))  # the same steps, vectorised PITs
    assert calibration_summary(cal.recalibrate(bad), y)["calibration_score"] < s_bad["calibration_score"] / 4


def test_score_and_histogram_values() -> None:
    u = torch.tensor([0.05, 0.15, 0.25, 0.35, 0.45, 0.55, 0.65, 0.75, 0.85, 0.95], dtype=torch.float64)
    counts, edges = pit_histogram(u, bins=10)
    assert counts.tolist() == [1.0] * 10 and edges[0] == 0 and edges[-1] == 1
    assert calibration_score(u, levels=[0.1, 0.5, 0.9]) == pytest.approx(0.0)
    assert calibration_score(torch.zeros(4), levels=[0.5]) == pytest.approx(0.25)
    rc = running_coverage(torch.tensor([0.5, 0.99, 0.5]), levels=[0.8])
    torch.testing.assert_close(rc[:, 0], torch.tensor([1.0, 0.5, 2 / 3], dtype=torch.float64))
    with pytest.raises(InputDataError, match=r"PIT values must lie in \[0, 1\]"):
        calibration_score(torch.tensor([1.5]))
    with pytest.raises(InputDataError, match=r"2 of 3 do not, the first u\[1\] = 1.7"):  # names the index
        calibration_score([0.2, 1.7, float("nan")])
    with pytest.raises(InputDataError, match="bins must be an integer"):
        pit_histogram(u, bins=0)
    fc = Forecast("gaussian", 0.5, torch.zeros(2), 1.0, 0.0, 0.0)
    with pytest.raises(InputDataError, match="y has 3 values but the forecasts have 2"):
        pit_values(fc, torch.zeros(3))
