"""Smoke run of benchmarks/lander.py (`--quick`: tau = 0.1, 2 runs, quantile TS and GPR-EI, 20 + 2 x 10
episodes, true quantiles from 20 fresh episodes): the checkpoint table's rows, the true quantiles against
fresh episodes of the objective, the Table-1-shaped table, the summary and the plot; a run paused at a
checkpoint and continued by `--resume` equals the uninterrupted run; `--resume` skips finished runs and
`--time-limit` leaves unstarted ones. The full protocol (300 + 1200 evaluations, 10 runs) never runs here."""

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

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "lander.py"
CHECKPOINTS = [20, 30, 40]


@pytest.fixture(scope="module")
def mod():
    spec = importlib.util.spec_from_file_location("lander_benchmark", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up in sys.modules
    threads = torch.get_num_threads()
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        torch.set_num_threads(threads)
        sys.modules.pop(spec.name, None)


@pytest.fixture(scope="module")
def quick(mod, tmp_path_factory):
    out = tmp_path_factory.mktemp("lander")
    threads = torch.get_num_threads()
    try:
        result = mod.main(["--quick", "--threads", "1", "--out", str(out)])
    finally:
        torch.set_num_threads(threads)
    return out, result


def test_lander_quick(mod, quick, capsys):
    out, result = quick
    q = mod.QUICK
    (tau,) = q["taus"]
    runs = mod.parse_runs(q["runs"])
    table = pq.read_table(out / "lander.parquet").to_pylist()
    expected = {(m, r, n) for m in q["methods"] for r in runs for n in CHECKPOINTS}
    assert {(r["method"], r["run"], r["n_evals"]) for r in table} == expected and len(table) == len(expected)
    assert (out / "lander.csv").read_text().count("\n") == len(table) + 1
    assert len(list((out / "runs").glob("*.csv"))) == len(q["methods"]) * len(runs)
    assert not list((out / "runs").glob("*.ckpt.pt"))  # finished runs leave no checkpoint

    from objectives.lunar_lander import LunarLander

    lander = LunarLander()
    for r in table:
        assert r["tau"] == tau and r["error"] in ("", None) and "synchronous" in r["mode"]
        assert r["episodes"] == q["episodes"] and r["failures"] == 0
        assert r["batch_end"] == r["n_evals"]  # every checkpoint is a batch end here
        params = json.loads(r["params"])
        assert set(params) == set(lander.space)
        assert all(0.0 <= v <= 1.2 for v in params.values())
        assert np.isfinite(r["q_true"]) and np.isfinite(r["predicted"])
        assert r["fit_s"] > 0 and r["eval_s"] > 0
    # the true quantile is the empirical quantile of fresh, held-out episodes at the recommended gains
    for r in (r for r in table if r["n_evals"] == 40):
        w = lander.params_to_gains(json.loads(r["params"]))
        rewards = [lander.episode(w, mod.EVAL_SEED0 + i)[0] for i in range(q["episodes"])]
        assert r["q_true"] == pytest.approx(float(np.quantile(rewards, tau)), rel=1e-9, abs=1e-9)
        assert r["run_s"] >= r["fit_s"] + r["propose_s"]

    t1 = pq.read_table(out / "table1.parquet").to_pylist()
    assert [(t["level"], t["method"], t["runs"]) for t in t1] == [("10%", m, 2) for m in q["methods"]]
    for t in t1:
        finals = [r["q_true"] for r in table if r["method"] == t["method"] and r["n_evals"] == 40]
        assert t["40 obs"] == f"{np.mean(finals):.1f} ({np.std(finals, ddof=1):.1f})"
        assert t["paper 1500"]  # the paper's figure sits next to ours
    summary = pq.read_table(out / "summary.parquet").to_pylist()
    assert sorted(s["method"] for s in summary) == sorted(q["methods"])
    for s in summary:
        finals = [r["q_true"] for r in table if r["method"] == s["method"] and r["n_evals"] == 40]
        assert s["runs"] == 2 and s["q_true_mean"] == pytest.approx(float(np.mean(finals)))
        assert math.isfinite(s["q_true_ci95"]) and s["n_evals"] == 40
        assert "target" not in s or s["target"] is None  # the 240 target applies to the full protocol only
    assert (out / "lander_tau0.1.png").stat().st_size > 1000
    assert len(result["rows"]) == len(table) and result["missing"] == 0
    assert result["counts"]["done"] == len(q["methods"]) * len(runs)


def test_lander_resume_continues_a_checkpoint_exactly(mod, quick, tmp_path, capsys):
    ref_out, ref = quick
    argv = ["--quick", "--runs", "0-0", "--threads", "1", "--out", str(tmp_path)]
    jobs = mod.make_jobs(mod.parse_args(argv))
    assert [j.args[0] for j in jobs] == mod.QUICK["methods"]
    # pause each run: after the initial design (stop_after=1) and after one more batch (stop_after=2)
    for job, k in zip(jobs, (1, 2)):
        status, rows = job.fn(*job.args, checkpoint=job.checkpoint, stop_after=k)
        assert status == "paused" and rows == [] and job.checkpoint.exists() and not job.csv.exists()
    result = mod.main(argv + ["--resume"])
    assert result["counts"]["done"] == len(jobs) and result["missing"] == 0
    assert not list((tmp_path / "runs").glob("*.ckpt.pt"))
    mine = {(r["method"], r["n_evals"]): r for r in result["rows"]}
    theirs = {(r["method"], r["n_evals"]): r for r in ref["rows"] if r["run"] == 0}
    assert set(mine) == set(theirs)
    for k, r in mine.items():  # the same recommendations and true quantiles as the uninterrupted runs
        assert (r["params"], r["q_true"], r["predicted"]) == (theirs[k]["params"], theirs[k]["q_true"],
                                                              theirs[k]["predicted"])
    # a resumed command skips finished runs and rewrites the same tables
    again = mod.main(argv + ["--resume"])
    assert again["counts"]["finished before"] == len(jobs) and again["counts"]["done"] == 0
    assert [r["q_true"] for r in again["rows"]] == [r["q_true"] for r in result["rows"]]


def test_lander_time_limit_leaves_runs_for_resume(mod, tmp_path, capsys):
    result = mod.main(["--quick", "--time-limit", "0", "--threads", "1", "--out", str(tmp_path)])
    assert result["counts"]["skipped"] == 4 and result["missing"] == 4 and result["rows"] == []
    assert "run again with --resume" in capsys.readouterr().out
    assert not (tmp_path / "lander.csv").exists() and not list((tmp_path / "runs").iterdir())


def test_lander_config_errors_name_the_key(mod, tmp_path):
    from orchestrator.errors import ConfigError

    proto = mod.Protocol(0.1, 20, 40, 10)
    raw = mod.method_config("quantile-ts", proto, 0, {"name": "lunar-lander", "options": {}},
                            {"quantile": {"num_inducing": 0}}, {})
    with pytest.raises(ConfigError, match="`model.options`: `num_inducing`"):  # when the optimizer is built
        mod.build_optimizer(raw)
    raw = mod.method_config("gpr-ei", proto, 0, {"name": "lunar-lander", "options": {}}, {}, {})
    assert raw["initial_design"] == 2 and raw["batch_size"] == 10  # round(20 / 10) replicated points
    raw["batch_size"] = 0
    with pytest.raises(ConfigError, match="batch_size"):
        mod.build_optimizer(raw)
    with pytest.raises(SystemExit, match="--runs"):
        mod.main(["--runs", "0", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="--model-options"):
        mod.main(["--quick", "--model-options", "[1]", "--out", str(tmp_path)])
    # explicit options override the quick ones, per model
    args = mod.parse_args(
        ["--quick", "--model-options", '{"quantile": {"num_inducing": 8}}', "--runs", "0-0"]
    )
    assert args.model_options["quantile"] == {**mod.QUICK["model_options"]["quantile"], "num_inducing": 8}
    assert args.runs == [0] and args.budget == mod.QUICK["budget"]


def test_lander_objective_options_reach_the_objective_and_name_the_run_files(mod, tmp_path, capsys):
    """`--objective-options` (e.g. the pubcode's timeout sign, A11) builds the runs' objective and gives their
    result files another settings hash, so `--resume` never mixes them with runs of the default objective."""
    default = mod.make_jobs(mod.parse_args(["--quick", "--out", str(tmp_path)]))
    a11 = mod.make_jobs(mod.parse_args(["--quick", "--objective-options", '{"timeout_penalty": -100}',
                                        "--out", str(tmp_path)]))
    assert len(default) == len(a11) and all(j.stem != k.stem for j, k in zip(default, a11))
    assert a11[0].args[-1] == {"timeout_penalty": -100}
    run = mod.LanderRun("quantile-ts", mod.Protocol(0.1, 20, 40, 10), 0, 20, 10, {}, {},
                        {"timeout_penalty": -100})
    assert run.obj.timeout_penalty == -100.0
    with pytest.raises(SystemExit):
        mod.parse_args(["--objective-options", "[1]"])
    assert "--objective-options: a JSON object" in capsys.readouterr().err
    from objectives.base import ObjectiveError
    with pytest.raises(ObjectiveError, match="timeout_penalty"):
        mod.LanderRun(
            "quantile-ts", mod.Protocol(0.1, 20, 40, 10), 0, 20, 10, {}, {}, {"timeout_penalty": "x"}
        )


def test_lander_cross_levels_scores_the_final_recommendations_on_the_runs_own_episodes(mod, quick, capsys):
    """`--cross-levels` (run on the finished quick runs: `--resume` skips them) scores each run's final
    recommendation at other levels on the same held-out episodes: the entry at the run's own level is its
    recorded q_true, a lower level is never above a higher one, and one row per finished run is written."""
    out, result = quick
    again = mod.main(["--quick", "--threads", "1", "--resume", "--cross-levels", "0.02", "0.1", "0.5",
                      "--out", str(out)])
    assert again["counts"]["finished before"] == len(
        mod.make_jobs(mod.parse_args(["--quick", "--out", str(out)]))
    )
    levels = again["levels"]
    finals = {(r["method"], r["run"]): r for r in result["rows"] if r["n_evals"] == mod.QUICK["budget"]}
    assert {(r["method"], r["run"]) for r in levels} == set(finals) and len(levels) == len(finals)
    for r in levels:
        assert r["q10"] == pytest.approx(finals[(r["method"], r["run"])]["q_true"], abs=1e-9)
        assert r["q2"] <= r["q10"] <= r["q50"] and 0.0 <= r["p_below_0"] <= 1.0
    assert pq.read_table(out / "levels.parquet").num_rows == len(levels)
    assert "Final recommendations at every level" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        mod.parse_args(["--cross-levels", "1.5"])
    assert "--cross-levels" in capsys.readouterr().err


def test_lander_cross_env_flies_the_final_recommendations_in_another_environment(mod, quick, capsys):
    """`--cross-env ENV_ID` flies each finished run's final recommendation in a second environment on the same
    held-out episodes: the entry in ours is the run's recorded q_true. Here the second environment is ours
    again (gymnasium v3), so both columns must agree seed by seed; that the paper's gym v2 gives the same
    rewards is tested on the objective (tests/objectives/test_lunar_lander.py), where it is cheap (v2's
    decorative particles are Box2D bodies and slow its episodes down). An environment that cannot be made is
    refused before any run starts."""
    out, result = quick
    # one finished run is enough: quantile TS, run 0
    again = mod.main(["--quick", "--threads", "1", "--resume", "--methods", "quantile-ts", "--runs", "1",
                      "--cross-env", "LunarLander-v3", "--out", str(out)])
    envs = again["envs"]
    finals = {(r["method"], r["run"]): r for r in result["rows"]
              if r["n_evals"] == mod.QUICK["budget"] and r["method"] == "quantile-ts" and r["run"] == 0}
    assert {(r["method"], r["run"]) for r in envs} == set(finals) and len(envs) == len(finals) == 1
    for r in envs:
        assert r["q_env"] == pytest.approx(finals[(r["method"], r["run"])]["q_true"], abs=1e-9)
        assert r["env"] == "LunarLander-v3" and r["other_env"] == "LunarLander-v3"
        assert r["q_other"] == r["q_env"] and r["mean_other"] == r["mean_env"]
        assert r["same_seed_equal"] == 1.0 and r["ks_p"] == pytest.approx(1.0)
    assert pq.read_table(out / "envs.parquet").num_rows == len(envs)
    assert "Final recommendations in two environments" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        mod.parse_args(["--cross-env", "NoSuchLander-v0"])
    assert "--cross-env" in capsys.readouterr().err


def test_lander_cross_levels_and_cross_env_fly_our_environment_once(mod, quick, monkeypatch):
    """With both re-scorings asked, each final recommendation's held-out episodes in our own environment are
    flown once and shared (the second environment's are always flown, even when it is ours again)."""
    from objectives.lunar_lander import LunarLander

    out, _ = quick
    calls: list[str] = []
    real = LunarLander.episode_rewards

    def spy(self, params, n_episodes=100, seed0=10**6):
        calls.append(self.env_id)
        return real(self, params, n_episodes, seed0)

    monkeypatch.setattr(LunarLander, "episode_rewards", spy)
    again = mod.main(["--quick", "--threads", "1", "--resume", "--methods", "quantile-ts", "--runs", "1",
                      "--cross-levels", "0.1", "--cross-env", "LunarLander-v3", "--out", str(out)])
    assert len(again["levels"]) == len(again["envs"]) == 1
    assert again["levels"][0]["q10"] == pytest.approx(again["envs"][0]["q_env"], abs=1e-9)
    assert calls == ["LunarLander-v3", "LunarLander-v3"]  # ours once (levels, reused by envs), the other once


def test_lander_paired_with_compares_runs_of_another_folder_by_run_number(mod, quick, tmp_path, capsys):
    """`--paired-with DIR` pairs each finished run with the same method, level and run number in another
    folder (how the README's variants are compared with the default): against a copy of itself every
    difference is 0, and a shifted copy gives exactly the shift with every run ahead."""
    import shutil

    from benchmarks._common import read_table, write_table

    out, result = quick
    other = tmp_path / "other"
    shutil.copytree(out / "runs", other / "runs")
    for f in (other / "runs").glob("*.csv"):
        write_table(
            [{**r, "q_true": float(r["q_true"]) - 5.0} for r in read_table(f)],
            f.with_suffix(""),
            parquet=False,
        )
    same = mod.main(["--quick", "--threads", "1", "--resume", "--time-limit", "0", "--out", str(out),
                     "--paired-with", str(out)])["paired_with"]
    shifted = mod.main(["--quick", "--threads", "1", "--resume", "--time-limit", "0", "--out", str(out),
                        "--paired-with", str(other)])["paired_with"]
    methods = {r["method"] for r in result["rows"]}
    assert {r["method"] for r in same} == methods and all(r["n_evals"] == mod.QUICK["budget"] for r in same)
    for a, b in zip(same, shifted):
        assert a["runs"] == b["runs"] == 2 and a["mean_diff"] == 0.0 and a["ahead"] == 0
        assert b["mean_diff"] == pytest.approx(5.0) and b["ahead"] == 2
    assert "True quantiles against" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        mod.parse_args(["--paired-with", str(tmp_path / "nowhere")])
    assert "no runs/ folder there" in capsys.readouterr().err


def test_lander_damping_places_each_folders_final_recommendations(mod, tmp_path, capsys):
    """`--damping DIR ...` reads recorded folders and runs nothing: each quantile-ts run's LAST checkpoint at
    the level asked for (other levels and methods left out), the angle of (hover_gain, vertical_speed_gain) in
    degrees and the bands of its true quantile."""
    names = ("angle_gain", "angular_speed_gain", "hover_gain", "vertical_speed_gain", "contact_angle",
             "contact_damping")

    def row(method, tau, run, n, q, hover, vertical):
        gains = dict(zip(names, (1.0, 1.0, hover, vertical, 0.0, 0.5)))
        return {
            "method": method,
            "tau": tau,
            "run": run,
            "n_evals": n,
            "q_true": q,
            "params": json.dumps(gains),
            "error": "",
        }

    a, b = tmp_path / "a", tmp_path / "b"
    # superseded by its run's last checkpoint
    mod.write_table([row("quantile-ts", 0.1, 0, 750, 240.0, 0.2, 0.2),
                     row("quantile-ts", 0.1, 0, 1500, -20.0, 0.8, 0.6),
                     row("quantile-ts", 0.1, 1, 1500, 245.0, 0.2, 0.6),
                     row("quantile-ts", 0.02, 2, 1500, -50.0, 1.0, 0.1),  # another level
                     row("gpr-ei", 0.1, 3, 1500, -30.0, 1.0, 0.1)], a / "lander")  # another method
    mod.write_table([row("quantile-ts", 0.1, 0, 1500, 190.0, 0.0, 0.4)], b / "lander")
    (tmp_path / "no-table").mkdir()  # a folder a glob also matched: left out, and said so
    result = mod.main(["--damping", str(a), str(tmp_path / "no-table"), str(b), "--taus", "0.1", "--out",
                       str(tmp_path / "out")])
    runs = {(r["folder"], r["run"]): r for r in result["damping_runs"]}
    assert set(runs) == {("a", 0), ("a", 1), ("b", 0)}
    assert runs["a", 0]["q_true"] == -20.0 and runs["a", 0]["damping_deg"] == pytest.approx(
        math.degrees(math.atan2(0.6, 0.8))
    )
    assert runs["b", 0]["damping_deg"] == pytest.approx(90.0)
    bands = {b["q_true"]: b for b in result["damping"]}
    assert [bands[k]["runs"] for k in ("< 50", "50 to 200", ">= 200")] == [1, 1, 1]
    assert bands[">= 200"]["damping_deg_median"] == pytest.approx(math.degrees(math.atan2(0.6, 0.2)))
    assert (tmp_path / "out" / "damping.csv").is_file() and not (tmp_path / "out" / "runs").exists()
    printed = capsys.readouterr().out
    assert "(3 runs)" in printed and f"no lander.csv in ['{tmp_path / 'no-table'}'], left out" in printed
    with pytest.raises(SystemExit):
        mod.main(["--damping", str(tmp_path / "nowhere"), "--out", str(tmp_path / "out")])


def test_lander_inspect_asks_a_rerun_runs_final_model_about_recorded_recommendations(
    mod, quick, tmp_path, capsys
):
    """`--inspect DIR` re-runs a run to its end (no run files) and asks its final model about its own final
    recommendation and DIR's: the re-run is the recorded run (same recommendation, same predicted value
    through the model's outcome transform), an observed recommendation is at distance 0 from the observations,
    and the same controller asked twice gets the same answer."""
    folder, _ = quick
    recorded = {
        r["run"]: r
        for r in mod.final_recommendations(
            [
                {
                    **r,
                    "tau": float(r["tau"]),
                    "run": int(r["run"]),
                    "n_evals": int(r["n_evals"]),
                    "error": r["error"] or "",
                }
                for r in mod.read_table(folder / "lander.csv")
            ]
        )
        if r["method"] == "quantile-ts"
    }
    out = tmp_path / "out"
    threads = torch.get_num_threads()
    try:
        rows = mod.main(["--quick", "--methods", "quantile-ts", "--runs", "1-1", "--threads", "1",
                         "--inspect", str(folder), "--out", str(out)])["inspect"]
    finally:
        torch.set_num_threads(threads)
    assert [(r["run"], r["source"], r["source_run"]) for r in rows] == [
        (1, "own", 1), *((1, folder.name, run) for run in sorted(recorded))]
    own, again = rows[0], next(r for r in rows[1:] if r["source_run"] == 1)
    assert json.loads(own["params"]) == json.loads(recorded[1]["params"])
    assert own["q_true"] == pytest.approx(float(recorded[1]["q_true"]), rel=1e-12)
    assert own["predicted"] == pytest.approx(float(recorded[1]["predicted"]), rel=1e-9)
    assert own["nearest_dist_min"] == 0.0 and own["nearest_dist_max"] > 0
    assert (again["predicted"], again["f_sd"]) == pytest.approx((own["predicted"], own["f_sd"]), rel=1e-9)
    for r in rows:
        assert r["f_sd"] > 0 and r["z"] == pytest.approx((r["q_true"] - r["predicted"]) / r["f_sd"])
        assert len(json.loads(r["nearest_rewards"])) == mod.INSPECT_NEAREST
        assert len(json.loads(r["lengthscales_f"])) == 6
    assert (out / "inspect.csv").is_file() and not (out / "runs").exists()
    assert "lengthscales of f" in capsys.readouterr().out
    for bad, says in ((["--methods", "gpr-ei"], "--inspect: the first --methods"),
                      (["--methods", "quantile-ts", "--inspect", str(tmp_path)], "no lander.csv there")):
        argv = ["--quick", "--inspect", str(folder), *bad, "--out", str(out)]
        with pytest.raises(SystemExit):
            mod.main(argv)
        assert says in capsys.readouterr().err
