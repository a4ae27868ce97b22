"""Smoke run of benchmarks/utilization.py (`--quick`, in the default suite: every benchmark's quick mode
runs in CI): every system runs, the CSV has one row each with a utilization in (0, 1] and the ratio
columns."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.ray
def test_utilization_benchmark_quick(tmp_path):
    cmd = [sys.executable, str(REPO / "benchmarks" / "utilization.py"), "--quick", "--no-progress",
           "--evals", "32", "--tune-evals", "8", "--slots", "8", "--out", str(tmp_path)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = list(csv.DictReader(open(tmp_path / "utilization.csv")))
    assert [r["system"] for r in rows] == ["qbatch", "qbatch-sync", "plain-ray", "tune", "tune-reuse"]
    for r in rows:
        n = 8 if r["system"].startswith("tune") else 32
        assert int(r["evaluations"]) == n, r
        assert 0.0 < float(r["U"]) <= 1.0 + 1e-9, r
        assert r["U_over_tune_best"] and r["U_minus_plain"], r
        # no scheduler beats a zero-overhead one given the same durations in the same order
        assert float(r["U"]) <= float(r["U_ideal_same_draw"]) + 1e-6, r
    assert "qbatch / Ray Tune best" in proc.stdout
    summary = {r["system"]: r for r in csv.DictReader(open(tmp_path / "summary.csv"))}
    assert list(summary) == ["qbatch", "qbatch-sync", "plain-ray", "tune", "tune-reuse", "ideal (simulated)"]
    assert float(summary["qbatch"]["U"]) == pytest.approx(float(rows[0]["U"]))
    assert 0.5 < float(summary["ideal (simulated)"]["U"]) < 1.0


def test_ideal_scheduler_reference():
    """The zero-overhead reference: equal durations fill whole rounds (U = 1) and one extra evaluation
    leaves the other slots idle for a whole round; lognormal tails sit in between."""
    from benchmarks.utilization import ideal_utilization

    assert ideal_utilization(32, 16, 2.0, 1e-9, reps=5)[0] == pytest.approx(1.0)
    assert ideal_utilization(17, 16, 2.0, 1e-9, reps=5)[0] == pytest.approx(17 / 32)
    mean, std = ideal_utilization(640, 16, 2.0, 0.5, reps=200)
    assert 0.93 < mean < 0.99 and 0.003 < std < 0.03


def test_summary_of_recorded_runs_uses_a_student_t_interval(tmp_path):
    """`--from-csv` summarizes recorded per-run rows without running anything; with 3 repeats the 95% interval
    of the mean uses t(2) = 4.30, not the normal's 1.96 (which made the README's intervals 2.2x too
    narrow)."""
    import math

    import numpy as np
    from scipy import stats

    rec = REPO / "benchmarks" / "results" / "utilization_fresh" / "utilization.csv"
    cmd = [sys.executable, str(REPO / "benchmarks" / "utilization.py"), "--systems",
           "qbatch,qbatch-sync,plain-ray,tune-reuse", "--from-csv", str(rec), "--out", str(tmp_path)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = list(csv.DictReader(open(rec)))
    summary = {r["system"]: r for r in csv.DictReader(open(tmp_path / "summary.csv"))}
    for system in ("qbatch", "qbatch-sync", "plain-ray", "tune-reuse"):
        us = np.array([float(r["U"]) for r in runs if r["system"] == system])
        half = stats.t.ppf(0.975, len(us) - 1) * us.std(ddof=1) / math.sqrt(len(us))
        assert float(summary[system]["U_ci95"]) == pytest.approx(half)
        assert int(summary[system]["evaluations"]) == 640
    assert "qbatch / Ray Tune best = 2.67x" in proc.stdout


def test_summary_of_recorded_runs_simulates_their_load(tmp_path):
    """The "ideal (simulated)" row of `--from-csv` is simulated on the recorded runs' load (evaluations,
    slots, mean duration, cv), not on the command line's defaults (640 x 16 slots x 2 s), which gave a wrong
    qbatch / ideal ratio; rows of several loads are refused."""
    from benchmarks.utilization import ideal_utilization

    fields = ["system", "repeat", "evaluations", "failed", "slots", "mean_s", "cv", "U", "U_ideal_same_draw",
              "efficiency", "busy_s", "span_s", "wall_s"]
    rec = tmp_path / "rec.csv"
    with open(rec, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(fields)
        for rep, u in enumerate((0.80, 0.82, 0.81)):
            w.writerow(["qbatch", rep, 94, 2, 8, 0.5, 0.3, u, 0.9, u / 0.9, 40.0, 6.0, 7.0])
    cmd = [sys.executable, str(REPO / "benchmarks" / "utilization.py"), "--systems", "qbatch", "--from-csv",
           str(rec), "--out", str(tmp_path)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ideal = {r["system"]: r for r in csv.DictReader(open(tmp_path / "summary.csv"))}["ideal (simulated)"]
    assert int(ideal["evaluations"]) == 96
    assert float(ideal["U"]) == pytest.approx(ideal_utilization(96, 8, 0.5, 0.3, seed=0)[0])
    with open(rec, "a", newline="") as fh:
        csv.writer(fh).writerow(["qbatch", 3, 94, 2, 16, 0.5, 0.3, 0.8, 0.9, 0.9, 40.0, 6.0, 7.0])
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "mix loads" in proc.stdout + proc.stderr
