"""Smoke run of the scale benchmark (benchmarks/scale.py `--quick`): both libraries fit, refit and propose in
their own subprocesses, the larger n of BoTorch's side is probed and printed as not run, the tables are
written."""

from __future__ import annotations

import json
import math

import pytest

pytestmark = pytest.mark.timeout(900)


def test_scale_quick_times_both_libraries_and_marks_what_was_not_run(tmp_path, load_benchmark):
    scale = load_benchmark("scale")
    out = scale.main(["--quick", "--out", str(tmp_path)])
    by = {(r["library"], r["n"]): r for r in out["rows"]}
    for key in (("qbatch", 12), ("qbatch", 24), ("botorch", 12)):
        r = by[key]
        assert r["status"] == "ok", r
        assert all(r[f"{stage}_s"] > 0 and r[f"{stage}_wall_s"] > 0 for stage in scale.STAGES)
        assert r["m"] == key[1] and r["q_proposed"] == 4 and r["peak_mib"] >= r["baseline_mib"] > 0
    assert by[("botorch", 24)]["status"].startswith("not run: n > --botorch-max-n")
    assert by[("botorch", 24)]["elbo_step_s"] > 0 and by[("botorch", 24)]["allocate_s"] > 0
    assert by[("botorch", 24)]["m_allocated"] == 24
    s12, s24 = out["summary"]
    assert s12["ratio_loop"] > 0 and s12["ratio_met"] in (True, False)
    assert math.isnan(s24["ratio_loop"]) and s24["ratio_met"] is None
    assert all(s["ratio_allocate"] > 0 for s in (s12, s24))  # the allocation is timed on both sides
    assert len(out["exponents"]) == 1 and math.isfinite(out["exponents"][0]["exponent"])
    assert (tmp_path / "summary.csv").exists() and (tmp_path / "scale.csv").exists()
    # --resume keeps every configuration's result file and reruns none
    before = {p.name: p.read_text() for p in (tmp_path / "runs").iterdir()}
    again = scale.main(["--quick", "--resume", "--out", str(tmp_path)])
    assert {p.name: p.read_text() for p in (tmp_path / "runs").iterdir()} == before
    assert [r["status"] for r in again["rows"]] == [r["status"] for r in out["rows"]]


def test_a_configuration_past_its_limit_is_recorded_as_not_run(tmp_path, load_benchmark):
    scale = load_benchmark("scale")
    path = tmp_path / "qbatch_n50.json"
    spec = {"library": "qbatch", "n": 50, "d": 2, "q": 2, "raw": 64, "restarts": 2, "maxiter": 5, "seed": 0,
            "path": str(path)}
    row = scale.run_config(spec, limit_s=0.5)
    assert row["status"].startswith("not run: ") and "did not finish within the 0 s limit" in row["status"]
    assert json.loads(path.read_text())["status"] == row["status"]
