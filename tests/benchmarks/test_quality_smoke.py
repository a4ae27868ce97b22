"""Smoke run of the quality benchmark (benchmarks/quality.py `--quick`) and its summary of the targets."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

pytestmark = pytest.mark.timeout(600)


def test_quality_quick_records_the_recommendation_and_the_best_point(tmp_path, load_benchmark):
    quality = load_benchmark("quality")
    out = quality.main(["--quick", "--out", str(tmp_path)])
    rows = {r["method"]: r for r in out["rows"]}
    assert set(rows) == {"quantile-ts", "sobol"}
    for r in rows.values():
        assert r["regret_rec"] >= 0 and 0 <= r["regret_best_evaluated"] <= r["regret_rec"] + 1e-12
    assert {"regret_mean", "regret_lcb", "regret_lcb-2"} <= set(rows["quantile-ts"])
    assert (tmp_path / "runs.csv").exists() and (tmp_path / "summary_loop.csv").exists()


def test_the_recorded_summary_is_what_its_tables_give(load_benchmark):
    from benchmarks import _quality_summary as quality_summary

    quality = load_benchmark("quality")
    path = REPO / "benchmarks" / "results" / "quality" / "summary.csv"
    with open(path, newline="") as fh:
        recorded = list(csv.DictReader(fh))
    assert recorded and list(recorded[0]) == quality_summary.COLUMNS
    # rewrites the file from the same tables: it must not change
    rebuilt = quality.main(["--summary"])["summary_rows"]
    with open(path, newline="") as fh:
        assert list(csv.DictReader(fh)) == recorded
    assert len(rebuilt) == len(recorded)


def test_the_gap_target_allows_one_percent_of_the_problems_quantile_range(load_benchmark):
    import numpy as np

    from benchmarks import _quality_summary as quality_summary

    quality = load_benchmark("quality")
    prob = quality.make_problem("skewed-3d", 0)
    grid = np.random.default_rng(0).random((20000, 3))
    sampled = prob.quantile_unit(grid, quality.TAU)
    q_range = quality.quantile_range(prob, 0)
    # the optimizer's range contains every sampled spread and is not far past it
    assert sampled.max() - sampled.min() <= q_range + 1e-9 <= sampled.max() - sampled.min() + 0.05
    run = {
        "problem": "skewed-3d",
        "method": "quantile-ts",
        "seed": "0",
        "budget": "80",
        "q_range": str(q_range),
        "regret_rec": "0.0",
        "regret_best_evaluated": "0.1",
    }
    bound = quality_summary.GAP_FACTOR * 0.1 + quality_summary.RANGE_ALLOWANCE * q_range
    def gap_row(regret: float) -> dict:
        rows = quality_summary.loop_rows([{**run, "regret_rec": str(regret)}])
        return next(r for r in rows if r["metric"].startswith("mean recommendation regret"))

    just_in, just_out = gap_row(bound - 1e-6), gap_row(bound + 1e-6)
    assert just_in["met"] and not just_out["met"]
    # a row recorded without the column gets the same range computed
    assert quality_summary._q_range({**run, "q_range": ""}) == pytest.approx(q_range)


def test_the_repicked_gld_rows_lead_only_below_every_baseline(tmp_path, monkeypatch):
    """`gld_repicked_rows` scores the final recommendation of now (`screen_rec/screen.csv`, `const_full`)
    against the baselines' recorded means: a setting counts when it is below all three, and a setting whose
    re-picked runs do not cover every problem is left out."""
    from benchmarks import _quality_summary as quality_summary

    folder = tmp_path / quality_summary.GLD_CURRENT
    (folder / "screen_rec").mkdir(parents=True)

    def write(path, rows):
        with open(path, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)

    summary = [{"d": "3", "tau": tau, "batch": "10", "method": m, "problems": "2", "regret_mean": v,
                "range_mean": "10.0"}
               for tau in ("0.75", "0.95")
               for m, v in (("quantile-ts", "0.5"), ("gpr-ei", "0.3"), ("hetgp-ts", "0.2"),
                            ("qlognei", "0.4"))]
    write(folder / "summary.csv", summary)
    picks = [{"setting": "3:0.75:10", "problem": "0", "best_eval": "0.01", "const_full": "0.1"},
             {"setting": "3:0.75:10", "problem": "1", "best_eval": "0.03", "const_full": "0.2"},
             {"setting": "3:0.95:10", "problem": "0", "best_eval": "0.01", "const_full": "0.05"}]
    write(folder / "screen_rec" / "screen.csv", picks)
    monkeypatch.setattr(quality_summary, "RESULTS", tmp_path)
    head, *rows = quality_summary.gld_repicked_rows()
    assert head["value"] == 1 and "1 settings" in head["setting"]  # tau 0.95 covers 1 of its 2 problems
    assert len(rows) == 1 and rows[0]["value"] == pytest.approx(0.15)
    assert rows[0]["met"] == (0.15 <= quality_summary.gap_bound(0.02, 10.0))
    picks[1]["const_full"] = "0.5"  # mean 0.3: not below HetGP-TS's 0.2
    write(folder / "screen_rec" / "screen.csv", picks)
    assert quality_summary.gld_repicked_rows()[0]["value"] == 0
