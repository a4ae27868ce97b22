"""Smoke run of benchmarks/threads.py (`--quick`: two small rounds of the README's library loop in each arm):
both arms run, torch's setting outside is as each arm left it, the ratio prints, and the tables are written.
The ratio's target is the full run's (benchmarks/results/threads/), not asserted on a shared CI machine."""

from __future__ import annotations

import csv
import math

import torch


def test_threads_quick(tmp_path, capsys, load_benchmark):
    mod = load_benchmark("threads")
    before = torch.get_num_threads()
    try:
        result = mod.main(["--quick", "--out", str(tmp_path)])
    finally:
        torch.set_num_threads(before)
    printed = capsys.readouterr().out
    assert "ratio default / single-thread:" in printed and "target <= 1.5" in printed
    with open(tmp_path / "threads.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert [r["arm"] for r in rows] == ["default", "single"]
    by = {r["arm"]: r for r in rows}
    assert by["single"]["threads_outside"] == "1" and by["default"]["threads_outside"] == str(
        mod.TORCH_DEFAULT
    )
    for r in rows:
        assert r["threads_after"] == r["threads_outside"]  # qbatch put the caller's setting back
        assert r["qbatch_threads"] == "auto" and int(r["threads_inside"]) <= int(r["threads_outside"])
        assert float(r["seconds"]) > 0 and math.isfinite(float(r["first_model_ask_s"]))
    assert by["default"]["predicted"] == by["single"]["predicted"]  # the same loop, whatever the threads
    with open(tmp_path / "summary.csv") as fh:
        summary = {r["arm"]: r for r in csv.DictReader(fh)}
    assert float(summary["default"]["ratio_to_single"]) == result["ratio"] > 0
    assert float(summary["single"]["ratio_to_single"]) == 1.0
