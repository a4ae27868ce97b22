"""Smoke run of the fit-speed benchmark (benchmarks/fit_speed.py `--quick`): both fits time, the ratio
prints."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.timeout(600)


def test_fit_speed_quick_prints_a_ratio(tmp_path, load_benchmark):
    fit_speed = load_benchmark("fit_speed")
    out = fit_speed.main(["--quick", "--out", str(tmp_path)])
    assert out["worst"] > 0 and out["summary"][0]["n"] == 20
    assert (tmp_path / "summary.csv").exists() and len(out["rows"]) == 1
