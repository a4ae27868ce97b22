"""Smoke run of benchmarks/load.py: `--quick` (120 evaluations on 4 slots; ~35 s here, most of
it Ray's and the actor's start-up; default suite) and the full 5,000 evaluations on 64 slots with the peak
memory compared at 1,000 (marked `benchmark`). Every result is logged exactly once, the central actor's peak
memory is measured and bounded, and the tables are printed. Run inside scripts/loopback."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.ray


def _run(tmp_path, *extra, timeout):
    cmd = [
        sys.executable,
        str(REPO / "benchmarks" / "load.py"),
        "--no-progress",
        "--out",
        str(tmp_path),
        *extra,
    ]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    rows = list(csv.DictReader(open(tmp_path / "load.csv"))) if (tmp_path / "load.csv").exists() else []
    memory = (
        list(csv.DictReader(open(tmp_path / "load_memory.csv")))
        if (tmp_path / "load_memory.csv").exists()
        else []
    )
    return proc, rows, memory


def _check(proc, rows, memory, mark, n):
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert [r["system"] for r in rows] == ["qbatch", "plain-ray"]
    r = rows[0]
    assert int(r["evaluations"]) == n and int(r["trials_logged"]) == n, r
    assert (
        int(r["lost"]) == 0
        and int(r["duplicated"]) == 0
        and int(r["failed"]) == 0
        and r["each_once"] == "True"
    ), r
    assert mark <= int(r["done_at_mark"]) < n, r
    assert 0 < float(r["actor_peak_at_mark_mb"]) <= float(r["actor_peak_mb"]) < 4096, r
    assert float(r["evals_per_s"]) > 0 and float(r["pool_peak_mb"]) > 0, r
    assert len(memory) == 1 and memory[0]["bounded"] == "True", memory
    assert "every result logged exactly once: yes" in proc.stdout
    assert "actor_peak_mb" in proc.stdout and "peak_ratio" in proc.stdout  # the printed tables


def test_load_benchmark_quick(tmp_path):
    proc, rows, memory = _run(tmp_path, "--quick", timeout=300)
    _check(proc, rows, memory, 40, 120)


@pytest.mark.benchmark
@pytest.mark.slow  # the marked slow suite runs node loss and load
def test_load_benchmark_full_5000_evaluations_on_64_slots(tmp_path):
    proc, rows, memory = _run(tmp_path, timeout=1800)
    _check(proc, rows, memory, 1000, 5000)
    print(proc.stdout)
