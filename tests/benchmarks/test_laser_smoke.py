"""Smoke runs of benchmarks/laser.py: `--quick` (40 initial points + 2 batches of 10, 2 runs, quantile TS,
Q-GIBBON, GPR-EI and Thompson sampling on the exact GP) on the LCLS-fitted simulator when the CSV is present
(else the synthetic one), checking the checkpoint table's rows, the exact quantiles and distances against
`LaserSimulator`, the initial design (measured settings), the summary and the plots; a run paused at a
checkpoint and continued by `--resume` equals the uninterrupted one; and the fallback to the synthetic
simulator when the CSV is missing. The full protocol (400 + 12 x 100, 10 runs) never runs in tests."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from tests.conftest import SHARED

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "laser.py"
CSV = SHARED / "data" / "lcls" / "data.csv"


@pytest.fixture(scope="module")
def mod():
    spec = importlib.util.spec_from_file_location("laser_benchmark", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    threads = torch.get_num_threads()
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        torch.set_num_threads(threads)
        sys.modules.pop(spec.name, None)


def _main(mod, argv):
    threads = torch.get_num_threads()
    try:
        return mod.main(argv)
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def quick(mod, tmp_path_factory):
    out = tmp_path_factory.mktemp("laser")
    argv = ["--quick", "--threads", "1", "--out", str(out)]
    return out, _main(mod, argv if CSV.is_file() else argv + ["--synthetic"])


def _check_table(mod, out: Path, methods, runs, sim, tau: float) -> list[dict]:
    q = mod.QUICK
    table = pq.read_table(out / "laser.parquet").to_pylist()
    from benchmarks._common import reevaluation_of

    checkpoints = [q["initial"] + k * q["batch"] for k in range(q["batches"] + 1)]  # 40, 50, 60
    # qbatch's own models keep the budget's last 10% (6) for re-evaluations: their search stops at 54
    spent = {m: [40, 50, 54, 60] if reevaluation_of(mod.METHODS[m])[0] > 0 else checkpoints for m in methods}
    assert all(spent[m] == checkpoints for m in methods if mod.METHODS[m].model == "exact-gp")
    expected = {(m, r, n) for m in methods for r in runs for n in spent[m]}
    assert {(r["method"], r["run"], r["n_evals"]) for r in table} == expected and len(table) == len(expected)
    assert (out / "laser.csv").read_text().count("\n") == len(table) + 1
    _, q_opt = sim.optimum(tau)
    for r in table:
        assert r["error"] in ("", None) and "synchronous" in r["mode"] and r["failures"] == 0
        params = json.loads(r["params"])
        # exact quantile of the recommendation, distance to q*, and q* >= the simulator's optimum
        assert r["q_rec"] == pytest.approx(sim.quantile(params, tau), rel=1e-9, abs=1e-12)
        assert r["q_opt_lbfgs"] == pytest.approx(q_opt, rel=1e-9)
        assert r["q_star"] >= q_opt - 1e-12 and r["q_star"] >= r["q_eval_max"] - 1e-12
        assert math.isfinite(r["q_eval_max"]) and r["q_eval_max"] >= r["q_rec"] - 1e-12  # x_hat was evaluated
        assert r["distance"] == pytest.approx(r["q_star"] - r["q_rec"], rel=1e-9, abs=1e-12)
        assert r["distance"] >= -1e-12
        assert r["distance_pct"] == pytest.approx(100 * r["distance"] / abs(r["q_star"]), rel=1e-9, abs=1e-12)
    summary = pq.read_table(out / "summary.parquet").to_pylist()
    assert sorted(s["method"] for s in summary) == sorted(methods)
    for s in summary:
        finals = [
            r["distance_pct"] for r in table if r["method"] == s["method"] and r["n_evals"] == checkpoints[-1]
        ]
        assert s["runs"] == len(runs) and s["distance_pct_mean"] == pytest.approx(float(np.mean(finals)))
        assert "target" not in s or s["target"] is None  # the 5% target applies to the full protocol only
    for name in ("laser_rel.png", "laser_abs.png"):
        assert (out / name).stat().st_size > 1000
    return table


def test_laser_quick(mod, quick, capsys):
    from objectives.laser import LaserSimulator

    out, result = quick
    q = mod.QUICK
    if CSV.is_file():
        sim = LaserSimulator.from_csv(CSV, **q["objective_options"])
    else:
        sim = LaserSimulator(**q["objective_options"])
    runs = mod.parse_runs(q["runs"])
    table = _check_table(mod, out, q["methods"], runs, sim, 0.1)
    assert {r["simulator"] for r in table} == ({f"csv:{CSV.resolve()}"} if CSV.is_file() else {"synthetic"})
    if CSV.is_file():
        # the initial design is the run's measured settings: with 40 points and nothing else told, the first
        # recommendation is one of them
        X, _ = sim.initial_data()
        for r in (r for r in table if r["n_evals"] == q["initial"]):
            rows = mod.initial_rows(len(X), q["initial"], r["run"])
            x = sim.to_array(json.loads(r["params"]))
            assert np.abs(X[rows] - x).max(axis=1).min() < 1e-9
        assert {r["initial_source"] for r in table} == {"measured settings, simulated outcomes"}
    assert len(result["rows"]) == len(table) and result["missing"] == 0
    assert not list((out / "runs").glob("*.ckpt.pt"))
    # paired.csv: quantile TS against each other method, run by run, from the final rows of the table
    pairs = pq.read_table(out / "paired.parquet").to_pylist()
    assert sorted(p["against"] for p in pairs) == sorted(m for m in q["methods"] if m != "quantile-ts")
    last = max(r["n_evals"] for r in table)
    for p in pairs:
        d = [a["distance_pct"] - b["distance_pct"] for a in table for b in table
             if a["n_evals"] == b["n_evals"] == last and a["run"] == b["run"]
             and a["method"] == "quantile-ts" and b["method"] == p["against"]]
        assert p["runs"] == len(runs) == len(d) and p["diff_pct_mean"] == pytest.approx(
            float(np.mean(d)), abs=1e-9
        )
        assert p["wins"] == sum(x < 0 for x in d)


def test_laser_resume_continues_a_checkpoint_exactly(mod, quick, tmp_path, capsys):
    _, ref = quick
    argv = ["--quick", "--methods", "quantile-ts", "--runs", "0-0", "--threads", "1", "--out", str(tmp_path)]
    if not CSV.is_file():
        argv.append("--synthetic")
    args = mod.parse_args(argv)
    (job,) = mod.make_jobs(args, mod.objective_of(args)[0])
    status, rows = job.fn(*job.args, checkpoint=job.checkpoint, stop_after=2)  # initial design + 1 batch
    assert status == "paused" and rows == [] and job.checkpoint.exists() and not job.csv.exists()
    result = _main(mod, argv + ["--resume"])
    assert result["counts"]["done"] == 1 and result["missing"] == 0 and not job.checkpoint.exists()
    theirs = {r["n_evals"]: r for r in ref["rows"] if r["method"] == "quantile-ts" and r["run"] == 0}
    assert {r["n_evals"] for r in result["rows"]} == set(theirs)
    for r in result["rows"]:
        t = theirs[r["n_evals"]]
        assert (r["params"], r["q_rec"], r["predicted"], r["q_eval_max"]) == (
            t["params"],
            t["q_rec"],
            t["predicted"],
            t["q_eval_max"],
        )


def test_laser_falls_back_to_synthetic(mod, tmp_path, capsys, monkeypatch):
    from objectives.laser import LaserSimulator

    argv = ["--quick", "--methods", "quantile-ts", "--runs", "0-0", "--threads", "1", "--out", str(tmp_path)]
    with pytest.raises(SystemExit, match="--csv: no such file"):  # a CSV asked for must exist
        _main(mod, argv + ["--csv", str(tmp_path / "missing.csv")])
    monkeypatch.setattr(mod, "DEFAULT_CSV", str(tmp_path / "missing.csv"))  # the default one may be absent
    _main(mod, argv)
    printed = capsys.readouterr().out
    assert "missing: falling back to the synthetic simulator" in printed and "Sobol design" in printed
    # the quick mode's n_gp_max is for the measurements: the synthetic simulator is built without it
    table = _check_table(mod, tmp_path, ["quantile-ts"], [0], LaserSimulator(), 0.1)
    assert {r["simulator"] for r in table} == {"synthetic"} and {r["initial_source"] for r in table} == {
        "sobol"
    }


def test_laser_peak_profile(mod, tmp_path, capsys):
    """`--peak` on the real data (when shipped) or the synthetic simulator: the optimum is a local maximum of
    the exact quantile (no nearby point beats it), the profile falls off with the radius, and peak.csv
    lands."""
    argv = ["--peak", "--out", str(tmp_path)] + ([] if Path(mod.DEFAULT_CSV).is_file() else ["--synthetic"])
    rows = _main(mod, argv)["peak"]
    assert [r["radius"] for r in rows] == [0.0, 0.01, 0.03, 0.1, 0.2, 0.4]
    q_star = rows[0]["q_mean"]
    assert rows[1]["q_max"] <= q_star + 1e-6
    assert rows[-1]["q_mean"] < rows[1]["q_mean"] <= q_star
    assert (tmp_path / "peak.csv").is_file() and "kernel" in capsys.readouterr().out


def test_laser_replicates_diagnostic(mod, tmp_path):
    """`--replicates 0 40` (quick model, synthetic simulator): a row per run and count; the design fit's
    recommendation is the protocol's first one (`LaserRun.start`), and 40 measurements at x* (as many as the
    design) raise the model's quantile there and make x* the recommendation."""
    argv = ["--replicates", "40", "0", "--quick", "--synthetic", "--runs", "1-1", "--out", str(tmp_path)]
    rows = _main(mod, argv)["replicates"]
    assert [(r["run"], r["replicates"]) for r in rows] == [(1, 0), (1, 40)]
    args = mod.parse_args(["--quick", "--synthetic"])
    objective, _ = mod.objective_of(args)
    first = mod.LaserRun("quantile-ts", 0.1, args.initial, 0, args.batch, 1, objective, "simulated",
                         args.model_options, args.proposer_options)
    first.start()
    before, after = rows
    assert before["q_rec"] == pytest.approx(first.records[0]["q_rec"], rel=1e-9)
    assert before["predicted_at_rec"] == pytest.approx(first.records[0]["predicted"], rel=1e-9)
    assert before["distance_pct"] > 1.0 and after["distance_pct"] == pytest.approx(0.0, abs=1e-6)
    assert after["predicted_at_opt"] > before["predicted_at_opt"]
    assert after["q_rec"] <= after["q_opt"] + 1e-9
    assert (tmp_path / "replicates.csv").is_file()
    # the design fit's ranking of the observed settings, recomputed from the model the first run's
    # recommendation came from
    from scipy.stats import spearmanr

    X, _ = first.opt.observations()
    rec = first.opt.recommender
    with torch.no_grad():
        f = rec.objective_mean(X).reshape(-1).numpy()
    loc, scale = rec.outcome_transform
    pred = first.opt.sign * (float(loc) + float(scale) * f)
    true = first.sim.quantile_array(
        np.array([first.sim.to_array(p) for p in first.opt.space.from_unit(X)]), 0.1
    )
    assert before["spearman"] == pytest.approx(spearmanr(pred, true)[0], rel=1e-9)
    assert (
        before["predicted_max"] == pytest.approx(pred.max(), rel=1e-9)
        and pred.max() >= before["predicted_at_rec"] - 1e-9
    )
    assert before["q_true_max"] == pytest.approx(true.max(), rel=1e-12) and -1 <= after["spearman"] <= 1
    # the noise the model reads at the observed settings (its likelihood's variance at f, g) and the
    # simulator's (scipy's skew-normal standard deviation)
    from scipy.stats import skewnorm

    with torch.no_grad():
        g, _ = rec.posterior_g(X)
        noise = rec.likelihood.forward(torch.stack([torch.as_tensor(f), g.reshape(-1)], dim=-1))
    assert before["model_noise_sd"] == pytest.approx(
        float(np.median(noise.variance.sqrt().numpy())) * abs(float(scale)), rel=1e-9
    )
    Xo = np.array([first.sim.to_array(p) for p in first.opt.space.from_unit(X)])
    _, omega, alpha = first.sim.sn_params(Xo)
    assert before["sim_noise_sd"] == pytest.approx(
        float(np.median(skewnorm.std(alpha, scale=omega))), rel=1e-9
    )


def test_laser_replicates_diagnostic_fits_the_named_method(mod, tmp_path):
    """`--replicates` with `--methods NAME` fits that method's model (here the expectile SVGP): its design-fit
    row is that method's first recommendation, the row names the method; naming two methods is refused."""
    argv = [
        "--replicates",
        "0",
        "--methods",
        "expectile-ts",
        "--quick",
        "--synthetic",
        "--runs",
        "1-1",
        "--out",
        str(tmp_path),
    ]
    (row,) = _main(mod, argv)["replicates"]
    args = mod.parse_args(["--quick", "--synthetic"])
    objective, _ = mod.objective_of(args)
    first = mod.LaserRun("expectile-ts", 0.1, args.initial, 0, args.batch, 1, objective, "simulated",
                         args.model_options, args.proposer_options)
    first.start()
    assert type(first.opt.model).__name__ == "ExpectileSVGP" and row["method"] == "expectile-ts"
    assert row["q_rec"] == pytest.approx(first.records[0]["q_rec"], rel=1e-9)
    assert row["predicted_at_rec"] == pytest.approx(first.records[0]["predicted"], rel=1e-9)
    assert math.isfinite(row["model_noise_sd"]) and row["model_noise_sd"] > 0
    with pytest.raises(SystemExit):
        mod.parse_args(["--replicates", "0", "--methods", "quantile-ts", "expectile-ts"])


def test_laser_simulators_diagnostic(mod, tmp_path):
    """`--simulators 0 1` on the real data (when shipped) or the synthetic simulator: a row per model seed
    whose q* is the `--peak` optimum of that seed's simulator and is at least the best measured setting's
    quantile; the two seeds build different simulators; simulators.csv lands; seeds in --objective-options are
    refused."""
    data = [] if Path(mod.DEFAULT_CSV).is_file() else ["--synthetic"]
    rows = _main(mod, ["--simulators", "0", "1", "--out", str(tmp_path)] + data)["simulators"]
    assert [r["model_seed"] for r in rows] == [0, 1]
    peak = _main(mod, ["--peak", "--out", str(tmp_path), "--objective-options", '{"model_seed": 1}'] + data)[
        "peak"
    ]
    assert rows[1]["q_star"] == pytest.approx(peak[0]["q_mean"], rel=1e-12)
    assert rows[1]["nearest_measured"] == pytest.approx(peak[0]["nearest_measured"], rel=1e-9, abs=1e-12)
    for r in rows:
        assert r["q_star"] >= r["best_measured_q"] - 1e-3 * abs(r["q_star"])
        assert r["best_measured_q"] > r["median_measured_q"]
    assert rows[0]["q_star"] != pytest.approx(rows[1]["q_star"], rel=1e-6)
    if not data:
        assert all(r["short_ls_1"].startswith("QUAD:") for r in rows)
    assert (tmp_path / "simulators.csv").is_file()
    with pytest.raises(SystemExit):
        mod.parse_args(["--simulators", "0", "--objective-options", '{"model_seed": 2}'])
