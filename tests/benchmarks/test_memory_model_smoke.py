"""Smoke run of the memory benchmark (benchmarks/memory_model.py `--quick`): the optimizer fits and proposes
in a subprocess per n, and its peak memory, trial table and checkpoint sizes are recorded per 1,000
results."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.timeout(600)


def test_memory_model_quick_records_sizes_per_1000_results(tmp_path, load_benchmark):
    memory_model = load_benchmark("memory_model")
    out = memory_model.main(["--quick", "--out", str(tmp_path)])
    rows = out["rows"]
    assert [r["status"] for r in rows] == ["ok", "ok"]
    for r, n in zip(rows, (100, 300)):
        # n told results plus two asked-and-told batches of q = 8
        assert r["results"] == n + 2 * 8 and 0 < r["num_inducing"] <= r["results"]
        assert r["peak_mib"] > r["baseline_mib"] > 0
        assert 0 < r["table_after_mib"] and 0 < r["model_checkpoint_mib"] < r["checkpoint_mib"]
        assert r["checkpoint_trials_mib_per_1000"] > 0 and r["peak_above_baseline_mib_per_1000"] > 0
    (g,) = out["growth"]
    assert g["n_ratio"] > 1 and g["linear"] in (True, False) and g["table_after_mib"] > 1
    assert (tmp_path / "memory_model.csv").exists()
