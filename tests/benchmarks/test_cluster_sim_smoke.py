"""Smoke run of benchmarks/cluster_sim.py (`--quick`, in the default suite): the real central actor on 8 and
32 virtual slots with a small model; one CSV row per N, each U no higher than a zero-overhead scheduler's on
the same evaluation times, and the target lines printed."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_cluster_sim_benchmark_quick(tmp_path):
    cmd = [sys.executable, str(REPO / "benchmarks" / "cluster_sim.py"), "--quick", "--out", str(tmp_path)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(tmp_path / "cluster_sim.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert [(int(r["slots"]), int(r["evaluations"])) for r in rows] == [(8, 32), (32, 64)]
    for r in rows:
        u, ideal = float(r["U"]), float(r["U_ideal"])
        assert 0.0 < u <= ideal + 1e-6 <= 1.0 + 1e-6, r
        assert float(r["efficiency"]) == u / ideal or abs(float(r["efficiency"]) - u / ideal) < 1e-9, r
        assert 0.0 < float(r["U_fill"]) <= 1.0 + 1e-9, r
        assert int(r["refits"]) > 0 and int(r["proposals"]) > 0, r  # the model was in the loop
        assert float(r["span_s"]) > float(r["real_s"]), r  # minutes of virtual evaluations in seconds
        assert r["status"] == "finished", r
    assert proc.stdout.startswith("$ python benchmarks/cluster_sim.py --quick")
    assert "largest N with U >= 0.95:" in proc.stdout
    assert "largest N with U / U_ideal >= 0.95: " in proc.stdout


def test_fill_utilization_counts_the_span_before_the_last_start(load_benchmark):
    cs = load_benchmark("cluster_sim")
    # two slots: one busy 0-10, the other 0-4 then 6-8 (the last start at 6): busy 6 + 4 in 2 x 6
    assert cs.fill_utilization([(0, 10), (0, 4), (6, 8)], 2) == 10 / 12
    assert [cs.batch_size_for(n) for n in (100, 1000, 10000)] == [64, 250, 1024]


def test_the_zero_overhead_bound_grows_with_the_run_and_is_one_on_one_slot(load_benchmark):
    cs = load_benchmark("cluster_sim")
    rows = cs.bound_rows(100, [200, 2000], 60.0, 0.5, reps=5)
    assert [r["waves"] for r in rows] == [2.0, 20.0]
    assert 0.0 < rows[0]["U_ideal_mean"] < rows[1]["U_ideal_mean"] < 1.0
    # one slot never idles between evaluations, so its greedy schedule is fully busy
    assert abs(cs.bound_rows(1, [50], 60.0, 0.5, reps=3)[0]["U_ideal_mean"] - 1.0) < 1e-12


def test_the_bound_mode_writes_its_table_and_names_the_sizes_that_reach_the_target(tmp_path):
    cmd = [sys.executable, str(REPO / "benchmarks" / "cluster_sim.py"), "--bound", "--slots", "10",
           "--evals", "20,2000", "--bound-draws", "3", "--out", str(tmp_path)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(tmp_path / "ideal_bound.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert [int(r["evaluations"]) for r in rows] == [20, 2000]
    assert float(rows[1]["U_ideal_mean"]) >= 0.95 > float(rows[0]["U_ideal_mean"])
    assert "reaches U >= 0.95 from n = 2,000" in proc.stdout
