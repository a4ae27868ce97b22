"""Smoke run of benchmarks/utilization.py (marked `benchmark`): every system runs, the CSV has one row each
with a utilization in (0, 1] and the ratio columns. Run with `scripts/loopback python -m pytest -m benchmark`."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.benchmark
def test_utilization_benchmark_quick(tmp_path):
    cmd = [sys.executable, str(REPO / "benchmarks" / "utilization.py"), "--quick", "--no-progress",
           "--evals", "48", "--tune-evals", "16", "--slots", "8", "--out", str(tmp_path)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = list(csv.DictReader(open(tmp_path / "utilization.csv")))
    assert [r["system"] for r in rows] == ["qbatch", "qbatch-sync", "plain-ray", "tune", "tune-reuse"]
    for r in rows:
        n = 16 if r["system"].startswith("tune") else 48
        assert int(r["evaluations"]) == n, r
        assert 0.0 < float(r["U"]) <= 1.0 + 1e-9, r
        assert r["U_over_tune_best"] and r["U_minus_plain"], r
    assert "qbatch / Ray Tune best" in proc.stdout
