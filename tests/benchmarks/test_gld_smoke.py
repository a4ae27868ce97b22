"""Smoke run of benchmarks/gld.py (`--quick`: d = 3, tau = 0.75, batch 10, 2 problems, 3 methods, 40
evaluations): the checkpoint table's rows, regrets against the exact GLD quantile, the summary, the paired
comparison and the plot; and the same run repeated in a fresh process gives the same recommendations (runs are
reproducible from their config and seed). The full grid never runs in tests."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from tests.benchmarks.conftest import BENCHMARKS


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    """The quick run, in this process (after whatever the suite ran before: any use of global random state
    would show up as a difference from the fresh process of the reproducibility test)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gld_benchmark", BENCHMARKS / "gld.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    try:
        spec.loader.exec_module(mod)
        out = tmp_path_factory.mktemp("gld_quick")
        threads = torch.get_num_threads()
        try:
            import contextlib
            import io

            with contextlib.redirect_stdout(io.StringIO()) as printed:
                result = mod.main(["--quick", "--threads", "1", "--out", str(out)])
        finally:
            torch.set_num_threads(threads)
        yield mod, out, result, printed.getvalue()
    finally:
        sys.modules.pop(spec.name, None)


def test_gld_quick(quick):
    mod, tmp_path, result, printed = quick
    assert "synchronous" in printed and "Final simple regret" in printed and "Paired over problems" in printed

    q = mod.QUICK
    table = pq.read_table(tmp_path / "gld.parquet").to_pylist()
    (d, tau, batch), = q["settings"]
    checkpoints = list(range(q["initial"], q["budget"] + 1, batch))  # 20, 30, 40
    # quantile TS keeps the budget's last 10% (4) for re-evaluations: its search stops at 36
    spent = {m: [20, 30, 36, 40] if mod.reevaluation(m)[0] > 0 else checkpoints for m in q["methods"]}
    assert spent["quantile-ts"] == [20, 30, 36, 40] and spent["gpr-ei"] == checkpoints
    expected = {(m, p, n) for m in q["methods"] for p in q["problems"] for n in spent[m]}
    got = {(r["method"], r["problem"], r["n_evals"]) for r in table}
    assert got == expected and len(table) == len(expected)
    from objectives.gld import GLDProblem

    for r in table:
        assert (r["d"], r["tau"], r["batch"]) == (d, tau, batch)
        assert r["error"] in ("", None)
        assert "synchronous" in r["mode"]
        # regret is q* minus the exact quantile at the recommended point, and q* is at least the L-BFGS
        # optimum
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
    # the recommendation gap: the recommended point is one the run evaluated, so its regret is at least the
    # best evaluated point's; the target allows 1.25 x that plus 1% of the quantile's range over the box
    for r in table:
        if r["method"] == "quantile-ts" and r["n_evals"] == q["budget"]:
            assert r["best_regret"] <= r["regret"] + 1e-12 and r["q_range"] > r["regret"]
            assert r["q_range"] == pytest.approx(mod.problem_range(d, tau, r["problem"]))
    (ts,) = [s for s in summary if s["method"] == "quantile-ts"]
    finals = [r for r in table if r["method"] == "quantile-ts" and r["n_evals"] == q["budget"]]
    best = float(np.mean([r["best_regret"] for r in finals]))
    assert ts["best_regret_mean"] == pytest.approx(best) and ts["best_regret_runs"] == len(q["problems"])
    bound = 1.25 * best + 0.01 * float(np.mean([r["q_range"] for r in finals]))
    assert ts["gap_target"] == pytest.approx(bound) and ts["gap_met"] == (ts["regret_mean"] <= bound)
    for s in summary:
        assert s["problems"] == len(q["problems"]) and s["n_evals"] == q["budget"]
        finals = [r["regret"] for r in table if r["method"] == s["method"] and r["n_evals"] == q["budget"]]
        assert s["regret_mean"] == pytest.approx(float(np.mean(finals)))
        assert math.isfinite(s["regret_ci95"])
    paired = pq.read_table(tmp_path / "paired.parquet").to_pylist()
    assert {(p["method"], p["versus"]) for p in paired} == {
        ("quantile-ts", "gpr-ei"),
        ("quantile-ts", "sobol"),
    }
    assert (tmp_path / f"gld_d{d}-tau{tau:g}-b{batch}.png").stat().st_size > 1000
    assert len(result["rows"]) == len(table)


def test_gld_run_is_reproducible_in_a_fresh_process(quick, tmp_path):
    """Same config and seed, another process: every checkpoint's recommended point, its predicted and exact
    quantile are equal, bit for bit, to the in-process run's (quantile TS, the method of the issue's
    target)."""
    _, _, result, _ = quick
    out = tmp_path / "again"
    subprocess.run([sys.executable, str(BENCHMARKS / "gld.py"), "--quick", "--methods", "quantile-ts",
                    "--threads", "1", "--out", str(out)], check=True, capture_output=True, timeout=600,
                   cwd=Path(BENCHMARKS).parent)
    again = pq.read_table(out / "gld.parquet").to_pylist()
    key = lambda r: (r["problem"], r["n_evals"])  # noqa: E731
    mine = {key(r): r for r in result["rows"] if r["method"] == "quantile-ts"}
    theirs = {key(r): r for r in again}
    assert set(mine) == set(theirs) and len(mine) >= 6
    for k, r in mine.items():
        assert (r["x_rec"], r["predicted"], r["q_rec"]) == (theirs[k]["x_rec"], theirs[k]["predicted"],
                                                            theirs[k]["q_rec"]), k


def test_tables_only_rebuilds_the_tables_from_the_run_files_and_runs_nothing(quick, tmp_path):
    import contextlib
    import io
    import shutil

    mod, out, result, _ = quick
    copy = tmp_path / "copy"
    shutil.copytree(out / "runs", copy / "runs")
    files = sorted(p.name for p in (copy / "runs").iterdir())
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        # one method of the quick run left out of the selection, one extra method with no files
        again = mod.main(["--quick", "--tables-only", "--methods", "quantile-ts", "gpr-ei", "random",
                          "--out", str(copy)])
    assert "[gld] 0 runs to do" in printed.getvalue()
    # a setting missing HetGP-TS and qLogNEI does not count toward "beats all present baselines"
    assert "quantile-ts: beats every baseline in 0/0 complete settings (1 more with a baseline missing or " \
           "partial)" in printed.getvalue()
    assert sorted(p.name for p in (copy / "runs").iterdir()) == files
    assert again["rows"] == [r for r in result["rows"] if r["method"] in ("quantile-ts", "gpr-ei")]
    assert {s["method"] for s in again["summary"]} == {"quantile-ts", "gpr-ei"}


def test_resume_and_merge_of_per_method_files(load_benchmark, tmp_path):
    """--resume counts a method as done when any file of its (setting, problem) holds its final checkpoint
    without an error (old one-file-per-problem layout included, p1 never matching p10); merging keeps one row
    per checkpoint (the later file wins) and measures every regret against the best q* of the problem's
    runs."""
    mod = load_benchmark("gld")
    from benchmarks._common import write_table

    s = mod.Setting(3, 0.75, 10, 20, 40)
    runs = tmp_path / "runs"
    runs.mkdir()

    def row(method, problem, n, q_star, q_rec, error=""):
        return {"method": method, "d": 3, "tau": 0.75, "batch": 10, "problem": problem, "n_evals": n,
                "q_star": q_star, "q_rec": q_rec, "regret": q_star - q_rec, "error": error,
                "initial": 20, "settings": mod.settings_tag(method, 20, {})}

    write_table([row("quantile-ts", 1, 20, 1.0, 0.5), row("quantile-ts", 1, 40, 1.0, 0.9),
                 row("gpr-ei", 1, 40, 1.0, 0.8)], runs / f"{s.label}-p1", parquet=False)  # old layout
    write_table([row("hetgp-ts", 1, 40, 1.2, 0.7)], mod.job_path(runs, s, 1, "hetgp-ts"), parquet=False)
    write_table([row("qlognei", 1, 20, 1.0, 0.1), row("qlognei", 1, 0, 1.0, float("nan"), "RuntimeError: x")],
                mod.job_path(runs, s, 1, "qlognei"), parquet=False)  # unfinished and failed: not done
    write_table([row("qgibbon", 10, 40, 2.0, 1.0)], mod.job_path(runs, s, 10, "qgibbon"), parquet=False)
    assert mod.done_methods(runs, s, 1) == {"quantile-ts", "gpr-ei", "hetgp-ts"}
    assert mod.done_methods(runs, s, 10) == {"qgibbon"} and mod.done_methods(runs, s, 2) == set()

    rows = [r for path in sorted(runs.glob("*.csv")) for r in mod.read_run_file(path)]
    rows.append(row("gpr-ei", 1, 40, 1.0, 0.85))  # a rerun of a checkpoint: replaces the earlier row
    merged = mod.merge_rows(rows)
    by = {(r["problem"], r["method"], r["n_evals"]): r for r in merged}
    assert len(merged) == len(rows) - 1
    assert by[(1, "gpr-ei", 40)]["q_rec"] == 0.85
    for (p, _, _), r in by.items():
        assert r["q_star"] == (1.2 if p == 1 else 2.0)  # the best q* over the problem's runs
        if r["q_rec"] == r["q_rec"]:
            assert r["regret"] == pytest.approx(r["q_star"] - r["q_rec"])


def test_gld_resume_continues_a_checkpoint_exactly(quick, tmp_path):
    """A GLD run paused at a checkpoint (after the initial design, or after one batch) and continued by
    `--resume` gives the uninterrupted run's recommendations bit for bit; the checkpoints are removed once
    the runs finish. `--time-limit 0` starts nothing and says how to go on."""
    import contextlib
    import io

    from benchmarks._common import checkpoint_path

    mod, _, result, _ = quick
    q = mod.QUICK
    (d, tau, batch), = q["settings"]
    s = mod.Setting(d, tau, batch, q["initial"], q["budget"])
    runs = tmp_path / "runs"
    runs.mkdir()
    threads = torch.get_num_threads()
    try:
        saved = {}
        for method, k in (("quantile-ts", 1), ("gpr-ei", 2)):
            ckpt = checkpoint_path(mod.job_path(runs, s, 0, method))
            status, rows = mod.run_problem(s, 0, method, q["model_options"], 1, ckpt, stop_after=k)
            assert status == "paused" and rows == [] and ckpt.exists()
            saved[method] = torch.load(ckpt, weights_only=True)["run"]["rows"]
            assert len(saved[method]) == k
        with contextlib.redirect_stdout(io.StringIO()) as printed:
            skipped = mod.main(
                ["--quick", "--threads", "1", "--resume", "--time-limit", "0", "--out", str(tmp_path)]
            )
        assert skipped["counts"]["skipped"] == 6 and skipped["missing"] == 6 and skipped["rows"] == []
        assert "run again with --resume" in printed.getvalue()
        # the two paused runs are listed with their progress (initial design 20, then GPR-EI's one batch
        # of 10)
        assert sorted(skipped["paused"]) == [
            (f"{s.label}-p0-gpr-ei", 30, 40),
            (f"{s.label}-p0-quantile-ts", 20, 40),
        ]
        assert f"{s.label}-p0-quantile-ts at 20 of 40" in printed.getvalue()
        with contextlib.redirect_stdout(io.StringIO()):
            again = mod.main(["--quick", "--threads", "1", "--resume", "--out", str(tmp_path)])
    finally:
        torch.set_num_threads(threads)
    assert again["counts"]["done"] == 6 and again["missing"] == 0
    assert not list(runs.glob("*.ckpt.pt"))
    key = lambda r: (r["method"], r["problem"], r["n_evals"])  # noqa: E731
    mine, theirs = {key(r): r for r in again["rows"]}, {key(r): r for r in result["rows"]}
    assert set(mine) == set(theirs)
    for method, rows in saved.items():  # continued, not started over: the checkpoint's rows, timings included
        for r in rows:
            assert mine[(method, 0, r["n_evals"])]["elapsed_s"] == r["elapsed_s"]
    for k, r in mine.items():
        assert (r["x_rec"], r["predicted"], r["q_rec"], r["regret"]) == (
            theirs[k]["x_rec"], theirs[k]["predicted"], theirs[k]["q_rec"], theirs[k]["regret"]), k


def test_target_compares_only_baselines_run_on_every_problem(load_benchmark):
    """A baseline with fewer problems than the quantile method (an unfinished qLogNEI) is listed as partial
    and left out of the comparison, and a setting counts as complete only with all three baselines in full."""
    mod = load_benchmark("gld")

    def row(method, problem, regret):
        return {"method": method, "d": 6, "tau": 0.75, "batch": 10, "problem": problem, "n_evals": 40,
                "regret": regret, "error": ""}

    rows = [row("quantile-ts", p, 0.1) for p in range(3)] + [row("hetgp-ts", p, 0.2) for p in range(3)]
    rows += [row("gpr-ei", p, 0.3) for p in range(3)] + [row("qlognei", 0, 0.05)]  # qLogNEI on one problem
    _, _, target = mod.summarize(rows)
    (t,) = target
    assert t["baselines_present"] == "gpr-ei,hetgp-ts" and t["baselines_partial"] == "qlognei"
    assert t["quantile-ts_beats_all"] is True and t["complete"] is False
    rows += [row("qlognei", p, 0.05) for p in (1, 2)]  # now in full, and ahead of quantile TS
    (t,) = mod.summarize(rows)[2]
    assert t["complete"] is True and t["baselines_partial"] == "" and t["quantile-ts_beats_all"] is False


def test_a_failing_gld_run_becomes_an_error_row(load_benchmark, capsys):
    """A run that raises (here: a bad model option) gives one row with the error, which `--resume` does not
    count as finished, instead of losing the grid's other runs."""
    mod = load_benchmark("gld")
    s = mod.Setting(3, 0.75, 10, 20, 40)
    status, rows = mod.run_problem(s, 0, "quantile-ts", {"quantile": {"bogus_option": 1}}, 1)
    assert status == "done" and len(rows) == 1
    assert rows[0]["error"].startswith("ConfigError: `model.options`: unknown model option(s) "
                                       "['bogus_option']")
    assert rows[0]["n_evals"] == 0 and rows[0]["q_star"] == rows[0]["q_star_lbfgs"]
    assert "problem 0 quantile-ts" in capsys.readouterr().out


def test_the_summary_median_is_the_median(load_benchmark):
    """With an even number of problems the median is the mean of the two middle regrets (it was the upper one,
    which moved every bracketed median of the README's GLD tables up: GPR-EI d3 tau 0.75 b50 0.829 for
    0.534)."""
    mod = load_benchmark("gld")
    regrets = [0.4, 0.1, 0.3, 0.2]
    rows = [
        {
            "method": "quantile-ts",
            "d": 3,
            "tau": 0.75,
            "batch": 10,
            "problem": p,
            "n_evals": n,
            "regret": r if n == 40 else 1.0,
            "error": "",
        }
        for p, r in enumerate(regrets)
        for n in (20, 30, 40)
    ]
    summary, _, _ = mod.summarize(rows)
    [row] = summary
    assert row["regret_median"] == pytest.approx(0.25) and row["regret_mean"] == pytest.approx(0.25)
    assert row["problems"] == 4 and row["n_evals"] == 40


def test_runs_of_another_budget_are_left_out_of_the_tables(load_benchmark):
    """File names do not hold the budget, so a run of another budget in the same folder would be compared as
    if its last checkpoint were final; it is left out (and named) instead. A failed run (error row, n = 0)
    stays."""
    mod = load_benchmark("gld")

    def row(method, problem, n, error=""):
        return {
            "method": method,
            "d": 3,
            "tau": 0.75,
            "batch": 10,
            "problem": problem,
            "n_evals": n,
            "error": error,
        }

    rows = [row("quantile-ts", 0, 20), row("quantile-ts", 0, 40), row("gpr-ei", 0, 20), row("gpr-ei", 0, 30),
            row("hetgp-ts", 0, 0, "RuntimeError: x")]
    keep, other = mod._at_budget(rows, {(3, 0.75, 10): 40})
    assert {(r["method"], r["n_evals"]) for r in keep} == {
        ("quantile-ts", 20),
        ("quantile-ts", 40),
        ("hetgp-ts", 0),
    }
    assert other == ["d3-tau0.75-b10-p0-gpr-ei"]


def test_runs_of_other_settings_are_neither_resumed_nor_tabulated(load_benchmark, tmp_path, capsys):
    """A result file made with another initial design or other model options (same file name: the name holds
    only the setting, problem and method) is not counted as done by `--resume` and is left out of the tables,
    with a line saying so; a file written before rows recorded their settings counts as the defaults'."""
    from benchmarks._common import write_table

    mod = load_benchmark("gld")
    s = mod.Setting(3, 0.75, 10, 20, 40)
    runs = tmp_path / "runs"
    runs.mkdir()
    opts = {"quantile": {"num_inducing": 16}}

    def row(method, problem, initial, options, **extra):
        return {"method": method, "d": 3, "tau": 0.75, "batch": 10, "problem": problem, "n_evals": 40,
                "q_star": 1.0, "q_rec": 0.5, "regret": 0.5, "error": "", "initial": initial,
                "settings": mod.settings_tag(method, initial, options), **extra}

    write_table([row("quantile-ts", 0, 20, opts)], mod.job_path(runs, s, 0, "quantile-ts"), parquet=False)
    write_table([row("quantile-ts", 1, 20, {})], mod.job_path(runs, s, 1, "quantile-ts"), parquet=False)
    write_table([row("gpr-ei", 0, 30, {})], mod.job_path(runs, s, 0, "gpr-ei"), parquet=False)
    assert mod.done_methods(runs, s, 0, opts) == {"quantile-ts"}
    assert mod.done_methods(runs, s, 0, {}) == set()  # other options, other initial design
    assert mod.done_methods(runs, s, 1, {}) == {"quantile-ts"}
    # not its model's options
    assert mod.settings_tag("gpr-ei", 20, opts) == mod.settings_tag("gpr-ei", 20, {})
    # proposer options (`--proposer-options`) are part of the tag of the methods whose proposer they name
    per_path = {"thompson": {"shared_features": False}}
    assert mod.settings_tag("quantile-ts", 20, per_path) != mod.settings_tag("quantile-ts", 20, {})
    assert mod.settings_tag("gpr-ei", 20, per_path) == mod.settings_tag("gpr-ei", 20, {})
    legacy = {k: v for k, v in row("sobol", 2, 150, {}).items() if k not in ("initial", "settings")}
    write_table([legacy], mod.job_path(runs, s, 2, "sobol"), parquet=False)
    assert mod.done_methods(runs, mod.Setting(3, 0.75, 10, 150, 40), 2) == {"sobol"}
    assert mod.done_methods(runs, s, 2) == set()

    capsys.readouterr()
    result = mod.main(["--settings", "3:0.75:10", "--initial", "20", "--budget", "40", "--problems", "0-1",
                       "--methods", "quantile-ts", "gpr-ei", "--tables-only", "--out", str(tmp_path)])
    assert {(r["problem"], r["method"]) for r in result["rows"]} == {(1, "quantile-ts")}
    assert "left out 2 runs made with other settings" in capsys.readouterr().out


def test_a_selection_with_no_finished_run_leaves_the_folders_tables_alone(load_benchmark, tmp_path, capsys):
    """Found filling the d = 6 grid in pieces: a run whose selected problems all ended paused wrote 0-row
    gld.csv and summary.csv over the tables a wider selection had written to the folder. Now they are left as
    they were, with a line saying so, and the paused runs are still listed."""
    from benchmarks._common import checkpoint_path

    mod = load_benchmark("gld")
    tables = {name: f"sentinel {name}\n" for name in ("gld.csv", "summary.csv", "paired.csv", "target.csv")}
    for name, text in tables.items():
        (tmp_path / name).write_text(text)
    s = mod.Setting(3, 0.75, 10, 20, 40)
    (tmp_path / "runs").mkdir()
    torch.save(
        {"run": {"n": 30, "rows": []}}, checkpoint_path(mod.job_path(tmp_path / "runs", s, 4, "sobol"))
    )
    capsys.readouterr()
    result = mod.main(["--settings", "3:0.75:10", "--initial", "20", "--budget", "40", "--problems", "4-4",
                       "--methods", "sobol", "--tables-only", "--out", str(tmp_path)])
    printed = capsys.readouterr().out
    assert result["rows"] == [] and result["summary"] == [] and result["plots"] == []
    assert {name: (tmp_path / name).read_text() for name in tables} == tables
    assert not list(tmp_path.glob("*.parquet")) and not list(tmp_path.glob("*.png"))
    assert (f"no finished run in the selection: the tables and plots in {tmp_path} are left as they "
            "were") in printed
    assert result["paused"] == [(f"{s.label}-p4-sobol", 30, 40)] and (f"{s.label}-p4-sobol at 30 of "
                                                                      "40") in printed


def test_quick_mode_takes_the_flags_given(load_benchmark, tmp_path):
    """`--quick` fills in only what the command line leaves out: --settings, --problems, --initial and
    --budget given with it are used (they were silently replaced by the quick values)."""
    mod = load_benchmark("gld")
    result = mod.main(["--quick", "--settings", "3:0.95:5", "--problems", "3-3", "--initial", "6", "--budget",
                       "11", "--methods", "sobol", "--out", str(tmp_path)])
    assert {(r["d"], r["tau"], r["batch"], r["problem"], r["initial"]) for r in result["rows"]} == {
        (3, 0.95, 5, 3, 6)
    }
    assert max(r["n_evals"] for r in result["rows"]) == 11


def test_rows_restored_from_an_older_checkpoint_take_the_runs_settings(load_benchmark):
    """Rows restored from a checkpoint whose rows hold no settings take the run's tag (the checkpoint's key
    matches the run's settings), not the defaults', so a resumed non-default run keeps its early checkpoints
    in the tables."""
    from objectives.gld import GLDProblem

    mod = load_benchmark("gld")
    s = mod.Setting(3, 0.75, 10, 20, 40)
    run = mod.GLDRun("sobol", s, GLDProblem(dim=3, problem=0), 0, {})
    run.set_records_state({"rows": [{"method": "sobol", "n_evals": 20}], "evaluated": []})
    assert run.rows == [{"initial": 20, "settings": mod.settings_tag("sobol", 20, {}), "method": "sobol",
                         "n_evals": 20}]
    assert mod.settings_tag("sobol", 20, {}) != mod.settings_tag("sobol", 150, {})


def test_proposer_options_reach_the_runs_and_leave_recorded_tags_alone(load_benchmark) -> None:
    """`--proposer-options` is merged over a method's own proposer options into the optimizer a run builds;
    given none, a run's tag is the one the recorded runs carry (so `--resume` and the tables still find
    them)."""
    import csv

    from objectives.gld import GLDProblem

    mod = load_benchmark("gld")
    recorded = BENCHMARKS / "results/gld_b50_s14/runs/d3-tau0.75-b50-p5-quantile-ts.csv"
    with open(recorded, newline="") as f:
        tag = next(csv.DictReader(f))["settings"]
    # recorded before quantile TS re-evaluated: the runs of now (which do) carry another tag
    assert tag == mod.settings_tag("quantile-ts", 150, {}, spends_repeats=False)
    assert tag != mod.settings_tag("quantile-ts", 150, {})
    recorded = BENCHMARKS / "results/gld_full/runs/d3-tau0.75-b50-p0-qlognei.csv"
    with open(recorded, newline="") as f:  # a baseline searches to the end, now as then
        assert next(csv.DictReader(f))["settings"] == mod.settings_tag("qlognei", 150, {})
    args = mod.parse_args(["--proposer-options", '{"thompson": {"shared_features": false}}'])
    assert args.proposer_options == {"thompson": {"shared_features": False}}
    s = mod.Setting(3, 0.75, 10, 20, 40)
    problem = GLDProblem(dim=3, problem=0)
    run = mod.GLDRun("quantile-ts", s, problem, 0, args.proposer_options)
    assert run.opt._build_proposer().shared_features is False
    assert mod.GLDRun("quantile-ts", s, problem, 0, {}).opt._build_proposer().shared_features is True
    with pytest.raises(SystemExit, match=r"--proposer-options: unknown name\(s\) \['thomson'\]"):
        mod.parse_args(["--proposer-options", '{"thomson": {}}'])


def test_options_for_keeps_the_other_methods_tags(load_benchmark) -> None:
    """`--options-for` gives `--proposer-options` to the methods it names alone: HetGP-TS shares quantile TS's
    Thompson proposer, and without the flag a screen of a Thompson option also changes its tag, so the tables
    leave its recorded runs out."""
    mod = load_benchmark("gld")
    option = ["--proposer-options", '{"thompson": {"local_fraction": 0.25}}']
    every = mod.method_options(mod.parse_args(option))
    assert every["hetgp-ts"] == every["quantile-ts"] == {"thompson": {"local_fraction": 0.25}}
    assert mod.settings_tag("hetgp-ts", 150, every["hetgp-ts"]) != mod.settings_tag("hetgp-ts", 150, {})
    named = mod.method_options(mod.parse_args([*option, "--options-for", "quantile-ts"]))
    assert named["quantile-ts"] == {"thompson": {"local_fraction": 0.25}}
    assert named["hetgp-ts"] == named["qlognei"] == {}
    assert mod.settings_tag("hetgp-ts", 150, named["hetgp-ts"]) == mod.settings_tag("hetgp-ts", 150, {})
    # the quick mode's short training stays with every method
    quick = mod.method_options(mod.parse_args(["--quick", *option, "--options-for", "quantile-ts"]))
    assert quick["gpr-ei"] == {"quantile": mod.QUICK["model_options"]["quantile"]}
    assert quick["quantile-ts"]["thompson"] == {"local_fraction": 0.25}
    with pytest.raises(SystemExit):
        mod.parse_args([*option, "--options-for", "quantile-tss"])


def test_paired_with_compares_with_the_default_runs_of_another_folder(load_benchmark, tmp_path) -> None:
    """`--paired-with DIR`: this folder's final recommendations against DIR's runs made with the default
    options (other options' runs and other budgets there are left out), per (setting, method), as differences
    of regret."""
    from benchmarks._common import write_table

    mod = load_benchmark("gld")
    s = mod.Setting(3, 0.75, 10, 20, 40)
    base = tmp_path / "base" / "runs"
    base.mkdir(parents=True)

    def row(problem, q_rec, options, n_evals=40):
        return {
            "method": "quantile-ts",
            "d": 3,
            "tau": 0.75,
            "batch": 10,
            "problem": problem,
            "n_evals": n_evals,
            "q_star": 2.0,
            "q_rec": q_rec,
            "regret": 2.0 - q_rec,
            "error": "",
            "initial": 20,
            "settings": mod.settings_tag("quantile-ts", 20, options),
        }

    theirs = [1.0, 1.5, 1.2]
    for p, q in enumerate(theirs):
        write_table([row(p, q - 0.5, {}, n_evals=30), row(p, q, {})], mod.job_path(base, s, p, "quantile-ts"),
                    parquet=False)
    other = {"thompson": {"shared_features": False}}
    # not the default
    write_table([row(3, 0.0, other)], mod.job_path(base, s, 3, "quantile-ts"), parquet=False)
    mine = [row(0, 1.1, other), row(1, 1.4, other), row(2, 1.5, other), row(3, 9.0, other)]
    pw = mod.paired_with(mine, tmp_path / "base", [s])
    # problem 3 has no default run there
    assert len(pw) == 1 and pw[0]["problems"] == 3 and pw[0]["better"] == 2
    # regret here - regret there = q_rec there - q_rec here
    assert pw[0]["mean_diff"] == pytest.approx(np.mean([1.0 - 1.1, 1.5 - 1.4, 1.2 - 1.5]))
    with pytest.raises(SystemExit):
        mod.parse_args(["--paired-with", str(tmp_path / "nowhere")])
    # a run recorded before re-evaluation (its older tag) in a file read after the current run's file (the
    # problem's combined file sorts after the method's own) does not replace the current run
    old = {**row(0, 0.2, {}), "settings": mod.settings_tag("quantile-ts", 20, {}, spends_repeats=False)}
    write_table([old], base / f"{s.label}-p0", parquet=False)
    assert sorted(base.glob("*p0*.csv"))[-1].name == f"{s.label}-p0.csv"
    pw = mod.paired_with(mine, tmp_path / "base", [s])
    assert pw[0]["mean_diff"] == pytest.approx(np.mean([1.0 - 1.1, 1.5 - 1.4, 1.2 - 1.5]))
    # where it is the only run of its problem, it is the one compared with
    Path(f"{mod.job_path(base, s, 0, 'quantile-ts')}.csv").unlink()
    pw = mod.paired_with(mine, tmp_path / "base", [s])
    assert pw[0]["mean_diff"] == pytest.approx(np.mean([0.2 - 1.1, 1.5 - 1.4, 1.2 - 1.5]))
