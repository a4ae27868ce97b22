"""Smoke run of benchmarks/proposal_latency.py (`--quick`: one tiny setting): both tasks, both libraries,
the printed table, and the CSV/Parquet rows. The full grid never runs in tests."""

from __future__ import annotations

import csv
import math

import pyarrow.parquet as pq
import pytest
import torch


def test_proposal_latency_quick(tmp_path, capsys, load_benchmark):
    mod = load_benchmark("proposal_latency")
    threads = torch.get_num_threads()
    try:
        rows = mod.main(["--quick", "--threads", "1", "--out", str(tmp_path)])
    finally:
        torch.set_num_threads(threads)
    printed = capsys.readouterr().out
    assert "thompson_batch" in printed and "warm_refit_+100" in printed and "ratio" in printed

    with open(tmp_path / "proposal_latency.csv") as fh:
        table = list(csv.DictReader(fh))
    assert [(r["task"], r["library"]) for r in table] == [
        ("thompson_batch", "qbatch"), ("thompson_batch", "botorch"),
        ("warm_refit_+100", "qbatch"), ("warm_refit_+100", "botorch"),
    ]
    n, d, m, q = mod.QUICK
    for r in table:
        assert (int(r["n"]), int(r["d"]), int(r["m"]), int(r["q"])) == (n, d, m, q)
        assert float(r["seconds"]) > 0 and math.isfinite(float(r["peak_mib"]))
    for qb, bt in ((table[0], table[1]), (table[2], table[3])):
        assert float(qb["ratio_qbatch_to_botorch"]) == pytest.approx(
            float(qb["seconds"]) / float(bt["seconds"]), rel=1e-9
        )
    assert pq.read_table(tmp_path / "proposal_latency.parquet").num_rows == 4
    assert len(rows) == 4
