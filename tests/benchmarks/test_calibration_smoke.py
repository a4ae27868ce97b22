"""Smoke runs of benchmarks/calibration.py: paper 000's protocol on Forrester (1 repetition, 2 steps, every
method: the CSV/Parquet tables, the Table-1-style table, the plot) and paper 002's noisy Ackley (`--noisy-ackley
--quick`: 2 seeds, 3 steps, BO / OCBO / LOCBO variants: per-step rows re-checked against the objective, the
shared initial design, summary, paired comparison, plot). The full protocols never run in tests."""

from __future__ import annotations

import csv
import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "calibration.py"


def _load(monkeypatch):
    spec = importlib.util.spec_from_file_location("calibration_benchmark", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, mod)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_calibration_benchmark_smoke(tmp_path, capsys, monkeypatch, one_thread):
    mod = _load(monkeypatch)
    rc = mod.main(["--functions", "forrester", "--reps", "1", "--steps", "2", "--restarts", "2", "--raw-samples", "32",
                   "--out", str(tmp_path)])
    assert rc == 0
    out = capsys.readouterr().out
    assert "Minimum Found" in out and "Frac. beats none" in out
    runs = list(csv.DictReader(open(tmp_path / "runs.csv")))
    assert {r["method"] for r in runs} == set(mod.METHODS)
    for r in runs:
        best = [float(v) for v in r["best_so_far"].split(";")]
        assert len(best) == 3 and all(b1 <= b0 + 1e-12 for b0, b1 in zip(best, best[1:]))
        assert float(r["minimum"]) >= -6.0208 and float(r["regret"]) >= -1e-6
    assert len(pq.read_table(tmp_path / "runs.parquet")) == len(runs)
    summary = list(csv.DictReader(open(tmp_path / "summary.csv")))
    assert len(summary) == len(mod.METHODS)
    assert pq.read_table(tmp_path / "summary.parquet").to_pylist()[0]["function"] == "forrester"
    assert (tmp_path / "table.txt").read_text().count("forrester") == len(mod.METHODS)
    assert (tmp_path / "calibration_forrester.png").stat().st_size > 1000


def test_noisy_ackley_quick(tmp_path, capsys, monkeypatch, one_thread):
    mod = _load(monkeypatch)
    assert mod.main(["--noisy-ackley", "--quick", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "Noisy Ackley" in printed and "Paired over seeds" in printed

    q, n_init = mod.ACKLEY_QUICK, mod.ACKLEY_PROTOCOL["n_init"]
    methods = list(mod.ACKLEY_DEFAULT)
    steps = pq.read_table(tmp_path / "noisy_ackley_steps.parquet").to_pylist()
    expected = {(m, s, t) for m in methods for s in range(q["seeds"]) for t in range(q["steps"] + 1)}
    assert {(r["method"], r["seed"], r["step"]) for r in steps} == expected and len(steps) == len(expected)
    assert (tmp_path / "noisy_ackley_steps.csv").read_text().count("\n") == len(steps) + 1

    from objectives.functions import NoisyAckley

    obj = NoisyAckley()
    by_run: dict[tuple, list[dict]] = {}
    for r in steps:
        by_run.setdefault((r["method"], r["seed"]), []).append(r)
        # simple regret of the noisy argmax is >= that of the best true value observed (>= 0: max f = 0)
        assert 0.0 <= r["oracle_regret"] <= r["regret"] + 1e-12
        if r["step"] == 0:
            continue
        # each BO observation is the objective at the recorded point with the run's noise seed
        params = {"x0": r["x0"], "x1": r["x1"]}
        assert -10 <= r["x0"] <= 10 and -10 <= r["x1"] <= 10
        assert r["y"] == obj.evaluate(params, mod._noise_seed(r["seed"], n_init + r["step"] - 1))
        assert r["f"] == pytest.approx(float(obj.f(np.array([[r["x0"], r["x1"]]]))[0]), abs=1e-12)
        assert r["covered"] in (0.0, 1.0)
    for s in range(q["seeds"]):  # one initial design per seed, shared by every method
        assert len({by_run[(m, s)][0]["regret"] for m in methods}) == 1
    for rows in by_run.values():
        rows.sort(key=lambda r: r["step"])
        assert [r["n_obs"] for r in rows] == list(range(n_init, n_init + q["steps"] + 1))
        assert all(b["oracle_regret"] <= a["oracle_regret"] + 1e-12 for a, b in zip(rows, rows[1:]))

    runs = pq.read_table(tmp_path / "noisy_ackley_runs.parquet").to_pylist()
    assert len(runs) == len(methods) * q["seeds"]
    for run in runs:
        rows = by_run[(run["method"], run["seed"])]
        assert run["final_regret"] == rows[-1]["regret"]
        assert run["miscoverage"] == pytest.approx(1 - np.mean([r["covered"] for r in rows[1:]]))
        assert run["mean_regret"] == pytest.approx(np.mean([r["regret"] for r in rows[1:]]))
    summary = pq.read_table(tmp_path / "noisy_ackley_summary.parquet").to_pylist()
    assert [s["method"] for s in summary] == methods
    for s in summary:
        finals = [r["final_regret"] for r in runs if r["method"] == s["method"]]
        assert s["seeds"] == q["seeds"] and s["final_regret"] == pytest.approx(float(np.mean(finals)))
        assert math.isfinite(s["final_ci95"])
    paired = pq.read_table(tmp_path / "noisy_ackley_paired.parquet").to_pylist()
    assert {(p["method"], p["versus"]) for p in paired} == {("locbo", m) for m in methods if m != "locbo"}
    assert (tmp_path / "noisy_ackley.png").stat().st_size > 1000


def test_noisy_ackley_bad_method(monkeypatch, tmp_path):
    mod = _load(monkeypatch)
    with pytest.raises(SystemExit, match="online"):  # names the noisy-Ackley methods
        mod.main(["--noisy-ackley", "--methods", "online", "--out", str(tmp_path)])
