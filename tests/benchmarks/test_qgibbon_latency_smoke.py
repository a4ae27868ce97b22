"""Smoke run of benchmarks/qgibbon_latency.py (quick mode, q = 3): it runs both methods and writes its CSV."""

from __future__ import annotations

import csv

import pytest


def test_qgibbon_latency_quick(tmp_path, load_benchmark):
    mod = load_benchmark("qgibbon_latency")
    rows = mod.main(["--quick", "--q", "3", "--out", str(tmp_path)])
    assert [r["method"] for r in rows] == ["qbatch.QGibbon", "botorch.qLowerBoundMaxValueEntropy(sequential)"]
    with open(tmp_path / "latency.csv") as fh:
        table = list(csv.DictReader(fh))
    assert len(table) == 2
    assert all(float(r["seconds"]) > 0 for r in table)
    assert float(table[0]["ratio_to_botorch"]) == pytest.approx(
        float(table[0]["seconds"]) / float(table[1]["seconds"]), rel=1e-2
    )
