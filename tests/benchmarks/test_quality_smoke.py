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


def test_the_gld_rows_count_the_settings_led_and_score_each_gap(tmp_path, monkeypatch):
    """`gld_current_rows` counts the settings where `target.csv` has a quantile method ahead of every
    baseline, calls that count met only when both dimensions of the full grid have runs, and scores each
    setting's recommendation regret against the gap bound gld.py recorded beside it."""
    from benchmarks import _quality_summary as quality_summary

    folder = tmp_path / quality_summary.GLD_CURRENT
    folder.mkdir(parents=True)

    def write(path, rows):
        with open(path, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)

    targets = [{"d": "3", "tau": tau, "batch": "10", "quantile-ts_beats_all": ahead}
               for tau, ahead in (("0.75", "True"), ("0.95", "False"))]
    summary = [{"d": "3", "tau": tau, "batch": "10", "method": "quantile-ts", "problems": "10",
                "regret_mean": regret, "best_regret_mean": "0.01", "range_mean": "10.0", "gap_target": bound}
               for tau, regret, bound in (("0.75", "0.1", "0.1125"), ("0.95", "0.2", "0.1125"))]
    summary.append({**summary[0], "method": "hetgp-ts", "regret_mean": "9.0"})
    write(folder / "target.csv", targets)
    write(folder / "summary.csv", summary)
    monkeypatch.setattr(quality_summary, "RESULTS", tmp_path)
    head, *rows = quality_summary.gld_current_rows()
    assert head["value"] == 1 and not head["met"] and "2 settings x 10 problems" in head["setting"]
    assert [r["value"] for r in rows] == [0.1, 0.2]  # quantile TS's rows alone
    assert [r["met"] for r in rows] == [True, False]
    targets[1]["quantile-ts_beats_all"] = "True"
    write(folder / "target.csv", targets)
    assert quality_summary.gld_current_rows()[0]["value"] == 2
    assert "d = 6 not run" in quality_summary.gld_current_rows()[0]["setting"]
    # both halves of the grid, six settings led: the count is met and names no missing dimension
    targets = [{**t, "d": d, "batch": b} for d in ("3", "6") for b in ("10", "50") for t in targets]
    for t in targets[:6]:
        t["quantile-ts_beats_all"] = "True"
    for t in targets[6:]:
        t["quantile-ts_beats_all"] = "False"
    write(folder / "target.csv", targets)
    write(folder / "summary.csv", summary + [{**summary[0], "d": "6"}])
    head = quality_summary.gld_current_rows()[0]
    assert head["value"] == 6 and head["met"] and "not run" not in head["setting"]
