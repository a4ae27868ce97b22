"""Smoke run of benchmarks/gld_fit.py (`--quick`: 2 GLD problems, n = 40, short fits): the fit table's rows,
its metrics recomputed for one fit, the summary and the paired comparison, and argument errors."""

from __future__ import annotations

import math

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch


def test_gld_fit_quick(tmp_path, capsys, load_benchmark):
    mod = load_benchmark("gld_fit")
    threads = torch.get_num_threads()
    try:
        result = mod.main(["--quick", "--out", str(tmp_path)])
    finally:
        torch.set_num_threads(threads)
    printed = capsys.readouterr().out
    assert "Estimate of q_tau" in printed and "Paired over problems" in printed

    fits = pq.read_table(tmp_path / "fits.parquet").to_pylist()
    expected = {(p, 0.75, 40, m) for p in (0, 1) for m in mod.MODELS}
    assert {(r["problem"], r["tau"], r["n"], r["model"]) for r in fits} == expected and len(fits) == len(
        expected
    )
    for r in fits:
        assert r["rmse"] > 0 and -1 <= r["corr"] <= 1 and r["regret"] >= -1e-9 and r["q_sd"] > 0

    # the regret and the rmse of one fit, recomputed from the same seeded data and model
    row = next(r for r in fits if r["problem"] == 1 and r["model"] == "exact-gp")
    again = mod.fit_one(3, 1, 0.75, 40, ["exact-gp"], {}, 1)[0]
    assert again["rmse"] == pytest.approx(row["rmse"], rel=1e-6)
    assert again["regret"] == pytest.approx(row["regret"], rel=1e-6, abs=1e-9)

    summary = pq.read_table(tmp_path / "summary.parquet").to_pylist()
    assert {(s["tau"], s["n"], s["model"]) for s in summary} == {(0.75, 40, m) for m in mod.MODELS}
    for s in summary:
        vals = [r["rmse"] for r in fits if r["model"] == s["model"]]
        assert s["rmse"] == pytest.approx(np.mean(vals)) and s["problems"] == 2
    paired = pq.read_table(tmp_path / "paired.parquet").to_pylist()
    assert {(p["metric"], p["vs"]) for p in paired} == {
        (m, o) for m in ("rmse", "regret") for o in ("quantile-dim", "heteroscedastic", "exact-gp")
    }
    for p in paired:
        assert p["n"] == 40 and p["pairs"] == 2
        q = {r["problem"]: r[p["metric"]] for r in fits if r["model"] == "quantile"}
        o = {r["problem"]: r[p["metric"]] for r in fits if r["model"] == p["vs"]}
        assert p["mean_diff"] == pytest.approx(np.mean([q[k] - o[k] for k in q]))
    assert result["out"] == tmp_path and not math.isnan(summary[0]["rmse"])


@pytest.mark.parametrize("argv, message", [
    (["--taus", "1.5"], "--taus"),
    (["--n", "5"], "--n"),
    (["--problems", "x"], "--problems"),
])
def test_gld_fit_bad_arguments_name_the_flag(load_benchmark, argv, message):
    mod = load_benchmark("gld_fit")
    with pytest.raises(SystemExit, match=message):
        mod.parse_args(argv)
