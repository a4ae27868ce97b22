"""Smoke run of benchmarks/hpo.py (`--quick`: CNN on digits and online LDA on the Lee corpus, quantile TS vs
qLogNEI vs random search, 2 seeds, 3 initial + one batch of 2 evaluations, cheap objective settings): the
checkpoint table's rows, best-found values re-evaluated against the real objectives, the shared initial
design, the summary, the paired comparisons, the plots, config validation and a reproducible rerun."""

from __future__ import annotations

import json
import math
from itertools import combinations

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch


def test_hpo_quick(tmp_path, capsys, load_benchmark):
    mod = load_benchmark("hpo")
    threads = torch.get_num_threads()
    try:
        result = mod.main(["--quick", "--threads", "1", "--out", str(tmp_path)])
    finally:
        torch.set_num_threads(threads)
    printed = capsys.readouterr().out
    assert "synchronous" in printed and "Best found" in printed and "Paired over seeds" in printed

    q = mod.QUICK
    proto = mod.Protocol(q["initial"], q["budget"], q["batch"])
    checkpoints = proto.checkpoints()
    assert checkpoints == [3, 5]
    table = pq.read_table(tmp_path / "hpo.parquet").to_pylist()
    expected = {
        (t, m, s, n) for t in q["tasks"] for m in q["methods"] for s in q["seeds"] for n in checkpoints
    }
    assert {(r["task"], r["method"], r["seed"], r["n_evals"]) for r in table} == expected
    assert len(table) == len(expected)
    assert (tmp_path / "hpo.csv").read_text().count("\n") == len(table) + 1

    runs: dict[tuple, list[dict]] = {}
    for r in table:
        assert r["error"] in ("", None) and r["failures"] == 0 and "synchronous" in r["mode"]
        assert math.isfinite(r["best_value"])
        if r["task"] == "cnn":
            assert 0.0 <= r["best_value"] <= 1.0  # a classification error
        else:
            assert 1.0 < r["best_value"] < 1e5  # a perplexity
        runs.setdefault((r["task"], r["method"], r["seed"]), []).append(r)
    for rows in runs.values():
        rows.sort(key=lambda r: r["n_evals"])
        assert rows[1]["best_value"] <= rows[0]["best_value"]  # best-so-far never gets worse
    # every method of a (task, seed) starts from the same Sobol design with the same evaluation seeds
    for t in q["tasks"]:
        for s in q["seeds"]:
            first = {runs[(t, m, s)][0]["best_value"] for m in q["methods"]}
            assert len(first) == 1, (t, s, first)
            assert runs[(t, q["methods"][-1], s)][-1]["cached_evals"] == q["initial"]
    # model-based runs carry a recommendation; random search never fits
    for (_, m, _), rows in runs.items():
        assert (json.loads(rows[-1]["recommended"]) == {}) == (m == "random")
    # the recorded best is a real evaluation: re-run the objective at best_params with best_seed
    from objectives.registry import load_objective

    for t in q["tasks"]:
        r = runs[(t, "quantile-ts", 0)][-1]
        obj = load_objective(q["objectives"][t]["name"], q["objectives"][t]["options"])
        value = obj.evaluate(json.loads(r["best_params"]), r["best_seed"])
        assert float(getattr(value, "value", value)) == pytest.approx(r["best_value"], rel=1e-12)

    summary = pq.read_table(tmp_path / "summary.parquet").to_pylist()
    assert {(s["task"], s["method"]) for s in summary} == {(t, m) for t in q["tasks"] for m in q["methods"]}
    for s in summary:
        finals = [runs[(s["task"], s["method"], seed)][-1]["best_value"] for seed in q["seeds"]]
        assert s["seeds"] == len(q["seeds"]) and s["n_evals"] == q["budget"]
        assert s["best_mean"] == pytest.approx(float(np.mean(finals)))
        assert s["best_min"] == pytest.approx(min(finals))
    paired = pq.read_table(tmp_path / "paired.parquet").to_pylist()
    pairs = set(combinations(q["methods"], 2))  # every pair, in the order of METHODS
    assert ("quantile-ts", "qlognei") in pairs and ("quantile-ts-dim", "random") in pairs
    assert {(p["task"], p["method"], p["versus"]) for p in paired} == {
        (t, a, b) for t in q["tasks"] for a, b in pairs
    }
    for p in paired:
        diffs = [
            runs[(p["task"], p["method"], s)][-1]["best_value"]
            - runs[(p["task"], p["versus"], s)][-1]["best_value"]
            for s in q["seeds"]
        ]
        assert p["n"] == len(q["seeds"]) and p["mean_diff"] == pytest.approx(float(np.mean(diffs)), abs=1e-12)
    for t in q["tasks"]:
        assert (tmp_path / f"hpo_{t}.png").stat().st_size > 1000
    assert len(result["rows"]) == len(table)

    # reproducible from config and seed: a fresh rerun (empty evaluation cache) gives the same rows
    mod._EVALS.clear()
    torch.set_num_threads(1)
    try:
        again = mod.optimize(
            "qlognei", "lda", proto, 1, q["objectives"]["lda"], q["model_options"], q["proposer_options"]
        )
    finally:
        torch.set_num_threads(threads)
    before = sorted(runs[("lda", "qlognei", 1)], key=lambda r: r["n_evals"])
    assert [(r["n_evals"], r["best_value"], r["best_params"], r["recommended"]) for r in again] == [
        (r["n_evals"], r["best_value"], r["best_params"], r["recommended"]) for r in before]


def test_hpo_config_errors(load_benchmark):
    """A bad setting is one ConfigError naming its key, before anything runs."""
    from orchestrator.errors import ConfigError

    mod = load_benchmark("hpo")
    proto = mod.Protocol(3, 5, 2)
    bad_space = {"name": "lda", "options": {"max_passes": 1},
                 "space": {"minibatch": {"type": "int", "low": 1, "high": 4096, "step": 1}}}
    with pytest.raises(ConfigError, match=r"space\.minibatch"):
        mod.build_optimizer(mod.method_config("random", "lda", proto, 0, bad_space, {}, {}))
    with pytest.raises(ConfigError, match=r"tau"):
        mod.build_optimizer(mod.method_config("random", "lda", mod.Protocol(3, 5, 2, tau=1.5), 0,
                                              {"name": "lda", "options": {}}, {}, {}))
    with pytest.raises(SystemExit):
        mod.parse_args(["--initial", "9", "--budget", "4"])


def test_hpo_resume_reruns_a_run_of_another_protocol(tmp_path, load_benchmark):
    """`--resume` skips a run only when its file holds this protocol's rows. A file of another protocol (here
    a budget of 99) used to be skipped and then left out of the tables: the run was silently missing."""
    from benchmarks._common import read_table, write_table

    mod = load_benchmark("hpo")
    argv = ["--quick", "--tasks", "lda", "--methods", "random", "--threads", "1", "--out", str(tmp_path)]
    threads = torch.get_num_threads()
    try:
        mod.main(argv)
        s0, s1 = tmp_path / "runs" / "lda-random-s0.csv", tmp_path / "runs" / "lda-random-s1.csv"
        write_table([{**r, "budget": 99} for r in read_table(s0)], s0.with_suffix(""), parquet=False)
        kept = s1.stat().st_mtime_ns
        result = mod.main(argv + ["--resume"])
        assert {(r["seed"], r["n_evals"]) for r in result["rows"]} == {(s, n) for s in (0, 1) for n in (3, 5)}
        # run again, replaced
        assert {int(float(r["budget"])) for r in read_table(s0)} == {mod.QUICK["budget"]}
        assert s1.stat().st_mtime_ns == kept  # a matching run is skipped
        # another quantile level is another protocol (`--resume --tau 0.9` must not skip both)
        result = mod.main(argv + ["--resume", "--tau", "0.9"])
        assert {float(r["tau"]) for r in read_table(s0)} == {float(r["tau"]) for r in read_table(s1)} == {0.9}
        assert {r["tau"] for r in result["rows"]} == {0.9}
    finally:
        torch.set_num_threads(threads)


def test_hpo_counts_only_runs_of_the_same_model_and_proposer_options(tmp_path, load_benchmark):
    """A run file made with other model or proposer options is not this invocation's: `--resume` runs it again
    and the tables leave it out (it used to be reported as the new settings' result). Files written before
    rows recorded their settings count as the methods' own options."""
    from benchmarks._common import write_table

    mod = load_benchmark("hpo")
    base = ["--quick", "--tasks", "lda", "--methods", "quantile-ts", "--seeds", "1"]
    args = mod.parse_args(base)
    other = mod.parse_args(base + ["--model-options", '{"quantile": {"num_inducing": 5}}'])
    assert mod.settings_tag("quantile-ts", "lda", args) != mod.settings_tag("quantile-ts", "lda", other)
    row = {"task": "lda", "method": "quantile-ts", "seed": 0, "n_evals": args.budget, "initial": args.initial,
           "budget": args.budget, "batch": args.batch, "tau": args.tau, "error": "",
           "objective": json.dumps(args.objectives["lda"], sort_keys=True)}
    path = tmp_path / "run"
    write_table([{**row, "settings": mod.settings_tag("quantile-ts", "lda", args)}], path, parquet=False)
    assert len(mod.recorded(path.with_suffix(".csv"), args)) == 1
    assert mod.recorded(path.with_suffix(".csv"), other) == []
    legacy = mod.parse_args(base)
    legacy.model_options, legacy.proposer_options = {}, {}  # the method's own only (quick mode adds its own)
    write_table([row], path, parquet=False)  # no `settings` column: the method's own options
    assert len(mod.recorded(path.with_suffix(".csv"), legacy)) == 1
    assert mod.recorded(path.with_suffix(".csv"), args) == []
