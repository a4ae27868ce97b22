"""Smoke run of benchmarks/gld.py (`--quick`: d = 3, tau = 0.75, batch 10, 2 problems, 3 methods, 40
evaluations): the checkpoint table's rows, regrets against the exact GLD quantile, the summary, the paired
comparison and the plot. The full grid never runs in tests."""

from __future__ import annotations

import json
import math

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch



@pytest.mark.benchmark
def test_gld_quick(tmp_path, capsys, load_benchmark):
    mod = load_benchmark("gld")
    threads = torch.get_num_threads()
    try:
        result = mod.main(["--quick", "--threads", "1", "--out", str(tmp_path)])
    finally:
        torch.set_num_threads(threads)
    printed = capsys.readouterr().out
    assert "synchronous" in printed and "Final simple regret" in printed and "Paired over problems" in printed

    q = mod.QUICK
    table = pq.read_table(tmp_path / "gld.parquet").to_pylist()
    (d, tau, batch), = q["settings"]
    checkpoints = list(range(q["initial"], q["budget"] + 1, batch))  # 20, 30, 40
    expected = {(m, p, n) for m in q["methods"] for p in q["problems"] for n in checkpoints}
    got = {(r["method"], r["problem"], r["n_evals"]) for r in table}
    assert got == expected and len(table) == len(expected)
    from objectives.gld import GLDProblem

    for r in table:
        assert (r["d"], r["tau"], r["batch"]) == (d, tau, batch)
        assert r["error"] in ("", None)
        assert "synchronous" in r["mode"]
        # regret is q* minus the exact quantile at the recommended point, and q* is at least the L-BFGS optimum
        x = np.asarray([json.loads(r["x_rec"])])
        q_rec = float(GLDProblem(dim=d, problem=r["problem"]).quantile_unit(x, tau)[0])
        assert q_rec == pytest.approx(r["q_rec"], rel=1e-9, abs=1e-12)
        assert r["regret"] == pytest.approx(r["q_star"] - q_rec, rel=1e-9, abs=1e-12)
        assert r["q_star"] >= r["q_star_lbfgs"] and r["regret"] >= -1e-9
        assert ((x >= 0) & (x <= 1)).all()
    # the CSV mirror and the summary (one row per method, over both problems)
    assert (tmp_path / "gld.csv").read_text().count("\n") == len(table) + 1
    summary = pq.read_table(tmp_path / "summary.parquet").to_pylist()
    assert sorted(s["method"] for s in summary) == sorted(q["methods"])
    for s in summary:
        assert s["problems"] == len(q["problems"]) and s["n_evals"] == q["budget"]
        finals = [r["regret"] for r in table if r["method"] == s["method"] and r["n_evals"] == q["budget"]]
        assert s["regret_mean"] == pytest.approx(float(np.mean(finals)))
        assert math.isfinite(s["regret_ci95"])
    paired = pq.read_table(tmp_path / "paired.parquet").to_pylist()
    assert {(p["method"], p["versus"]) for p in paired} == {("quantile-ts", "gpr-ei"), ("quantile-ts", "sobol")}
    assert (tmp_path / f"gld_d{d}-tau{tau:g}-b{batch}.png").stat().st_size > 1000
    assert len(result["rows"]) == len(table)
