"""Smoke run of benchmarks/calibration.py on Forrester (1 repetition, 2 steps, every method): the CSVs, the
Table-1-style table, and the summary's fields. The full protocol never runs in tests."""

from __future__ import annotations

import csv
import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "calibration.py"


@pytest.mark.benchmark
def test_calibration_benchmark_smoke(tmp_path, capsys, monkeypatch):
    spec = importlib.util.spec_from_file_location("calibration_benchmark", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, mod)
    spec.loader.exec_module(mod)
    rc = mod.main(["--functions", "forrester", "--reps", "1", "--steps", "2", "--restarts", "2", "--raw-samples", "32",
                   "--out", str(tmp_path)])
    assert rc == 0
    out = capsys.readouterr().out
    assert "Minimum Found" in out and "Frac. beats none" in out
    runs = list(csv.DictReader(open(tmp_path / "runs.csv")))
    assert {r["method"] for r in runs} == set(mod.METHODS)
    for r in runs:
        best = [float(v) for v in r["best_so_far"].split(";")]
        assert len(best) == 3 and all(b1 <= b0 + 1e-12 for b0, b1 in zip(best, best[1:]))
        assert float(r["minimum"]) >= -6.0208 and float(r["regret"]) >= -1e-6
    summary = list(csv.DictReader(open(tmp_path / "summary.csv")))
    assert len(summary) == len(mod.METHODS)
    assert (tmp_path / "table.txt").read_text().count("forrester") == len(mod.METHODS)
