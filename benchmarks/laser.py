"""Laser (FEL) tuning: quantile TS and Q-GIBBON against GPR-EI on the 16-D LCLS simulator (paper 003 §4.5).

Reproduces quantile-expectile-bo.md §4.3 (the paper's §4.5 / Fig. 4) with qbatch's objective `laser`
(objectives/laser.py, `LaserSimulator`: a GP of the pulse energy with skew-normal noise whose scale and shape
are GPs too, all fitted to the LCLS measurements). The simulator is built from `--csv` (default
data/lcls/data.csv in the project's ../shared folder, or in $QBATCH_SHARED; `LaserSimulator.from_csv`);
when that file is missing, or with `--synthetic`, the synthetic simulator of the same form is used instead
(recorded in column `simulator`).

Each method is built exactly as the central actor builds it (benchmarks/lander.py `build_optimizer`: config
validated by `load_config`, objective by `load_objective`, `AskTellOptimizer`), and run in **synchronous
batches in this process** (the orchestrator's `synchronous: true` protocol without Ray).

qbatch's own models (quantile, expectile) run as a run with the defaults does (`_common.ask_batch`): the
budget's last `reevaluation` share (10%) re-evaluates their best observed points, and they refit warm after
each batch, with the restart from scratch at the budget's end only. The baselines search to the end and refit
warm and from scratch after every batch, as BoTorch's loops do (`_common.restarts_every_refit`).

Protocol (spec §4.3): 400 initial points, then 12 batches of 100, 10 runs. With the CSV the initial points
are 400 of the CSV's measured settings drawn at random (run r: rows chosen by seed r, the same rows for every
method), registered with the optimizer as its initial design and evaluated by the SIMULATOR (so every
observation follows the law the distance is measured against; `--initial-y measured` tells the measured pulse
energies instead). With the synthetic simulator (no measured settings) the initial design is qbatch's own
scrambled Sobol design of 400 points. tau = 0.1 (A15: blank in the paper; 0.1 as examples/laser.yaml).

Methods: quantile-ts (quantile SVGP + Thompson sampling), qgibbon (quantile SVGP + Q-GIBBON, repulsion
"paper"), gpr-ei (gpr-replicates + gpr-ei: each batch is ONE point measured 100 times; the initial data are
not replicated), optionally hetgp-ts (heteroscedastic SVGP + Thompson), expectile-ts (the paper's expectile
SVGP + Thompson sampling on its tau-expectile; scored, like the others, by the exact tau-quantile),
quantile-ts-const and expectile-ts-const (those two models with the model option noise_scale: constant, one
noise scale everywhere), exact-ts (exact GP + Thompson sampling on its plug-in quantile) and qlognei (exact GP
+ qLogNEI).
Recommendation (spec §1.7) = `AskTellOptimizer.best()` after each fit. Metric: distance of its EXACT
tau-quantile (`LaserSimulator.quantile`) from the optimum q* = max(`LaserSimulator.optimum(tau)` (multi-start
L-BFGS-B), the best exact quantile of any point any run evaluated), absolute (mJ) and relative (% of q*).

Long runs are checkpointed after every batch and continued by `--resume`; `--time-limit S` pauses them after
S seconds (see benchmarks/lander.py: the same machinery).

Usage:
    python benchmarks/laser.py --quick                          # CI smoke run (~20 s)
    python benchmarks/laser.py --workers 16 --resume --time-limit 420   # full: 3 methods x 10 runs
    python benchmarks/laser.py --methods quantile-ts gpr-ei --runs 0-4 --workers 2
    python benchmarks/laser.py --peak        # the optimum's neighbourhood: is q* a broad hump or a spike?
    python benchmarks/laser.py --replicates 0 10 30 --runs 0-2  # measurements at x* needed to pick it
    python benchmarks/laser.py --replicates 0 --methods expectile-ts  # the same for another method's model
    python benchmarks/laser.py --simulators 0 1 2 3  # how the simulator's optimum depends on its fit's sample
Results in --out (default results/laser/): runs/*.csv (one per method x run; named with the protocol and a
hash of the settings), laser.csv + laser.parquet (every checkpoint: one per batch), summary.csv/.parquet
(final distance, mean +- 95% CI, with the issue's target), paired.csv/.parquet (Thompson sampling against each
other method, by run), laser_rel.png / laser_abs.png (distance vs
evaluations, mean +- 95% CI over runs).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks._common import (  # noqa: E402
    MODELS,
    PROPOSERS,
    BatchRun,
    Job,
    Method,
    ask_batch,
    code_mix_note,
    config_tag,
    drive_guarded,
    format_table,
    mean_ci,
    merge_options,
    paired_comparison,
    plot_curves,
    preflight,
    read_table,
    reevaluation_section,
    restarts_every_refit,
    run_jobs,
    run_settings,
    write_table,
)
from benchmarks.lander import (  # noqa: E402
    _as_types,
    _std,
    add_common_args,
    build_optimizer,
    curves_by_method,
    parse_runs,
)
from objectives.laser import MEASUREMENT_OPTIONS  # noqa: E402
from orchestrator.ask_tell.repeats import repeat_share  # noqa: E402

MODE = "synchronous batches, in-process AskTellOptimizer built from a validated config (the orchestrator's " \
       "synchronous protocol without Ray)"
#: the LCLS measurements in the shared folder beside the repository (as the tests find it)
DEFAULT_CSV = str(
    Path(os.environ.get("QBATCH_SHARED", REPO.parent / "shared")) / "data" / "lcls" / "data.csv"
)
METHODS: dict[str, Method] = {
    "quantile-ts": Method("quantile", "thompson"),
    "qgibbon": Method("quantile", "qgibbon", proposer_options={"repulsion": "paper"}),
    "gpr-ei": Method("gpr-replicates", "gpr-ei", replicate=True),
    "hetgp-ts": Method("heteroscedastic", "thompson"),
    # the paper's expectile variant (asymmetric-Gaussian likelihood), scored, as every method, by the exact
    # quantile
    "expectile-ts": Method("expectile", "thompson"),
    # the same two-latent models with one noise scale everywhere (model option noise_scale: constant)
    "quantile-ts-const": Method("quantile", "thompson", model_options={"noise_scale": "constant"}),
    "expectile-ts-const": Method("expectile", "thompson", model_options={"noise_scale": "constant"}),
    "qlognei": Method("exact-gp", "qlognei"),
    # Thompson sampling (the same pathwise sampler) on the exact GP's plug-in quantile
    "exact-ts": Method("exact-gp", "thompson"),
}
DEFAULT_METHODS = ("quantile-ts", "qgibbon", "gpr-ei")
#: the acceptance target: quantile TS within 5% of the optimum quantile at the end (full protocol)
TARGET = {"method": "quantile-ts", "max_rel_pct": 5.0}
#: the paper's protocol (spec §4.3)
FULL: dict[str, Any] = {"initial": 400, "batches": 12, "batch": 100, "runs": "10"}
#: smoke-run settings; options given on the command line override these
QUICK: dict[str, Any] = {
    "initial": 40,
    "batches": 2,
    "batch": 10,
    "runs": "2",
    "methods": ["quantile-ts", "qgibbon", "gpr-ei", "exact-ts"],
    # smoke only: a smaller energy-GP subsample, short SVGP training, cheap acquisition searches
    "objective_options": {"n_gp_max": 100},
    "model_options": {
        "quantile": {"max_steps": 100, "warm_max_steps": 30, "num_inducing": 16},
        "heteroscedastic": {"max_steps": 100, "warm_max_steps": 30, "num_inducing": 16},
        "expectile": {"max_steps": 100, "warm_max_steps": 30, "num_inducing": 16},
    },
    "proposer_options": {
        "thompson": {"raw_samples": 512, "num_restarts": 2, "num_features": 256},
        "qgibbon": {"raw_samples": 128, "num_restarts": 2, "maxiter": 20, "num_max_samples": 5},
    },
}


def method_config(
    name: str, tau: float, initial: int, budget: int, batch: int, run: int, objective: Mapping[str, Any],
    model_options: Mapping[str, Any], proposer_options: Mapping[str, Any],
) -> dict[str, Any]:
    """The experiment config (orchestrator/config/) of one method run."""
    m = METHODS[name]
    return {
        "name": f"laser-{name}",
        "objective": dict(objective),
        "tau": tau,
        "model": {"type": m.model, "options": {**m.model_options, **model_options.get(m.model, {})}},
        "proposer": {
            "type": m.proposer,
            "options": {**m.proposer_options, **proposer_options.get(m.proposer, {})},
        },
        "batch_size": batch,
        "initial_design": initial,
        "budget": budget,
        "synchronous": True,
        "seed": int(run),
        "reevaluation": reevaluation_section(m),
    }


def initial_rows(n_rows: int, initial: int, run: int) -> list[int]:
    """The measured rows of run `run`'s initial design (the same for every method)."""
    import numpy as np

    if initial > n_rows:
        raise SystemExit(f"--initial ({initial}) exceeds the {n_rows} measured settings of the CSV")
    return sorted(
        np.random.default_rng([int(run), 0x1A5E]).choice(n_rows, size=initial, replace=False).tolist()
    )


def protocol_budget(initial: int, batches: int, batch: int) -> int:
    """Evaluations of one run of the protocol: the initial design, then `batches` batches of `batch`."""
    return initial + batches * batch


class LaserRun(BatchRun):
    """One method, one run of the laser protocol (see the module docstring)."""

    def __init__(self, name: str, tau: float, initial: int, batches: int, batch: int, run: int,
                 objective: Mapping[str, Any], initial_y: str, model_options: Mapping[str, Any],
                 proposer_options: Mapping[str, Any]) -> None:
        self.tau, self.initial, self.run, self.initial_y = tau, initial, run, initial_y
        self.budget = protocol_budget(initial, batches, batch)
        raw = method_config(
            name, tau, initial, self.budget, batch, run, objective, model_options, proposer_options
        )
        self.key = json.dumps(
            [{**raw, "objective": portable(objective)}, initial_y], sort_keys=True, default=str
        )
        self.cfg, self.sim, self.opt = build_optimizer(raw)
        self.final = repeat_share(self.budget, self.cfg.reevaluation.fraction)
        self.restart_always = restarts_every_refit(METHODS[name])
        self.synthetic = "csv_path" not in objective["options"]
        _, self.q_opt = self.sim.optimum(tau)  # cached per simulator (one per process)
        self.n = 0
        self.q_eval_max = float("-inf")  # best exact quantile of the points this run evaluated
        self.records: list[dict] = []
        self.times = {"fit_s": 0.0, "propose_s": 0.0, "run_s": 0.0, "cpu_s": 0.0}

    def _note_evaluated(self, X: Any) -> None:
        import numpy as np

        if len(X):
            self.q_eval_max = max(
                self.q_eval_max, float(self.sim.quantile_array(np.asarray(X), self.tau).max())
            )

    def _evaluate(self, trials: Sequence[Any]) -> None:
        X = []
        for t in trials:
            try:
                y, error = self.sim.evaluate(t.params, t.seed), None
            except Exception as exc:  # a failing evaluation is a failed trial, as in the orchestrator
                y, error = None, f"{type(exc).__name__}: {exc}"
            if self.opt.tell(t.trial_id, y, error=error) == "completed":
                X.append(self.sim.to_array(t.params))
        self._note_evaluated(X)
        self.n += len(trials)

    def _fit_and_record(self) -> None:
        t0 = time.perf_counter()
        self.opt.fit(restart=self.restart_always or self.done)
        self.times["fit_s"] += time.perf_counter() - t0
        params, predicted = self.opt.best()
        self.records.append(
            {
                "n_evals": self.n,
                "params": json.dumps(params),
                "predicted": float(predicted),
                "q_rec": self.sim.quantile(params, self.tau),
                "fit_s": self.times["fit_s"],
                "propose_s": self.times["propose_s"],
                "failures": self.opt.num_failed,
            }
        )

    def start(self) -> None:
        from orchestrator.ask_tell import trial_seed

        if self.synthetic:
            self._evaluate(self.opt.ask(self.initial))
        else:
            X_data, y_data = self.sim.initial_data()
            picked = initial_rows(len(X_data), self.initial, self.run)
            trials = []
            for i, j in enumerate(picked):
                # registered as the optimizer's initial design: its Sobol counter reaches `initial`, so the
                # next `ask` proposes with the model
                params = self.sim.params_of(X_data[j])
                tid = f"data-{i}"
                trials.append(self.opt.restore_trial(tid, params, self.opt.space.to_unit([params])[0], -1,
                                                     seed=trial_seed(self.cfg.seed, tid), source="data",
                                                     sobol_index=i))
            if self.initial_y == "measured":
                for t, j in zip(trials, picked):
                    self.opt.tell(t.trial_id, float(y_data[j]))
                self._note_evaluated(X_data[picked])
                self.n += len(picked)
            else:
                self._evaluate(trials)
        self._fit_and_record()

    def step(self) -> None:
        t0 = time.perf_counter()
        trials = ask_batch(self.opt, self.n, self.budget, self.cfg.batch_size, self.final,
                           self.cfg.reevaluation.repeats, fit=False)
        self.times["propose_s"] += time.perf_counter() - t0
        self._evaluate(trials)
        self._fit_and_record()

    @property
    def done(self) -> bool:
        return self.n >= self.budget

    def records_state(self) -> dict[str, Any]:
        return {"q_eval_max": self.q_eval_max, "records": [dict(r) for r in self.records]}

    def set_records_state(self, state: Mapping[str, Any]) -> None:
        self.q_eval_max = float(state["q_eval_max"])
        self.records = [dict(r) for r in state["records"]]

    def rows(self, base: Mapping[str, Any]) -> list[dict]:
        """One row per fit (after the initial design and after each batch); `q_eval_max` is the run's
        final."""
        rows = [{**base, **r, "q_opt_lbfgs": self.q_opt, "q_eval_max": self.q_eval_max, "error": ""}
                for r in self.records]
        rows[-1].update(run_s=self.times["run_s"], cpu_s=self.times["cpu_s"])
        return rows


def run_one(
    name: str, tau: float, initial: int, batches: int, batch: int, run: int, objective: Mapping[str, Any],
    initial_y: str, model_options: Mapping[str, Any], proposer_options: Mapping[str, Any], threads: int = 1,
    checkpoint: Path | None = None, deadline: float | None = None, stop_after: int | None = None,
) -> tuple[str, list[dict]]:
    """One method, one run: ("done", a row per fit), ("paused", []) or ("skipped", []) as lander.run_one."""
    if deadline is not None and time.time() > deadline:
        return "skipped", []
    synthetic = "csv_path" not in objective["options"]
    base = {
        "method": name,
        "tau": tau,
        "run": run,
        "batch": batch,
        "initial": initial,
        "budget": protocol_budget(initial, batches, batch),
        "simulator": "synthetic" if synthetic else f"csv:{objective['options']['csv_path']}",
        "initial_source": "sobol" if synthetic else f"measured settings, {initial_y} outcomes",
        "mode": MODE,
    }
    status, laser, error = drive_guarded(
        lambda: LaserRun(name, tau, initial, batches, batch, run, objective, initial_y, model_options,
                         proposer_options),
        checkpoint, deadline, stop_after, threads, f"[laser] {name} run {run}")
    if error:
        return "done", [{**base, "n_evals": 0, "params": "{}", "q_rec": float("nan"), "error": error}]
    if status != "done":
        return status, []
    rows = laser.rows(base)
    t = laser.times
    print(f"[laser] {name} run {run}: final q(x_hat) {rows[-1]['q_rec']:.4f} vs optimum {laser.q_opt:.4f} "
          f"({t['run_s']:.0f} s, CPU {t['cpu_s']:.0f} s: fit {t['fit_s']:.0f}, propose "
          f"{t['propose_s']:.0f})", flush=True)
    return status, rows


# --------------------------------------------------------------------------------------------------- analysis
def add_distances(rows: list[dict]) -> float:
    """Fill `q_star`, `distance` and `distance_pct` in place; returns q*.

    q* = max(the L-BFGS-B optimum, the best exact quantile of any point evaluated in these runs).
    """
    good = [r for r in rows if not r["error"]]
    q_star = max([r["q_opt_lbfgs"] for r in good] + [r["q_eval_max"] for r in good], default=float("nan"))
    for r in rows:
        r["q_star"] = q_star
        r["distance"] = q_star - r["q_rec"]
        r["distance_pct"] = 100.0 * r["distance"] / abs(q_star)
    return q_star


def final_rows(rows: Sequence[dict]) -> dict[str, list[dict]]:
    """Each method's rows (errors left out) at its largest evaluation count, the end of its runs."""
    out = {}
    for m in METHODS:
        sel = [r for r in rows if r["method"] == m and not r["error"]]
        if sel:
            last = max(r["n_evals"] for r in sel)
            out[m] = [r for r in sel if r["n_evals"] == last]
    return out


def summarize(rows: Sequence[dict], full: bool) -> list[dict]:
    """Final distance to the optimum per method: mean, std, 95% CI over runs, with the target check."""
    out = []
    for m, fin in final_rows(rows).items():
        last = fin[0]["n_evals"]
        d_mean, d_half, k = mean_ci([r["distance"] for r in fin])
        p_mean, p_half, _ = mean_ci([r["distance_pct"] for r in fin])
        row = {
            "method": m,
            "n_evals": last,
            "runs": k,
            "q_rec_mean": mean_ci([r["q_rec"] for r in fin])[0],
            "q_star": fin[0]["q_star"],
            "distance_mean": d_mean,
            "distance_ci95": d_half,
            "distance_pct_mean": p_mean,
            "distance_pct_std": _std([r["distance_pct"] for r in fin]),
            "distance_pct_ci95": p_half,
            "distance_pct_max": max(r["distance_pct"] for r in fin),
            "run_s_mean": mean_ci([r["run_s"] for r in fin])[0],
            "cpu_s_mean": mean_ci([r["cpu_s"] for r in fin])[0],
        }
        if full and m == TARGET["method"]:
            row["target"] = (f"<= {TARGET['max_rel_pct']:g}%: "
                             f"{'met' if p_mean <= TARGET['max_rel_pct'] else 'MISSED'}")
        out.append(row)
    return out


def paired(rows: Sequence[dict]) -> list[dict]:
    """Thompson sampling's final distance (% of q*) against each other method's, paired by run (the same
    initial design): mean difference (negative: Thompson sampling closer) +- 95% CI, its wins, Wilcoxon p."""
    finals = {m: {r["run"]: r["distance_pct"] for r in fin} for m, fin in final_rows(rows).items()}
    a = TARGET["method"]
    out = []
    for b in (m for m in finals if m != a and a in finals):
        c = paired_comparison(finals[a], finals[b])
        if c["n"]:
            out.append(
                {
                    "method": a,
                    "against": b,
                    "runs": c["n"],
                    "diff_pct_mean": c["mean_diff"],
                    "diff_pct_ci95": c["ci"],
                    "wins": round(c["wins"] * c["n"]),
                    "p_wilcoxon": c["p_wilcoxon"],
                }
            )
    return out


def make_plots(rows: Sequence[dict], out: Path) -> list[Path]:
    """Relative and absolute distance to the optimum vs evaluations, mean +- 95% CI over runs."""
    paths = []
    for key, fname, ylabel in (("distance_pct", "laser_rel.png", "q* - q(x_hat), % of q*"),
                               ("distance", "laser_abs.png", "q* - q(x_hat) (mJ)")):
        curves = curves_by_method(rows, list(METHODS), key, lambda r: True)
        if curves:
            paths.append(plot_curves(curves, out / fname, logy=False, ylabel=ylabel,
                                     title=f"Laser, tau={rows[0]['tau']:g}: distance to the optimum quantile "
                                           f"(mean +- 95% CI over runs)"))
    return paths


# ---------------------------------------------------------------------------------------------------- CLI
def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="CI smoke run: 2 runs, 3 methods, 40 + 2 x 10 evaluations, a smaller simulator fit, "
                         "short fits (options given explicitly still apply)")
    ap.add_argument("--methods", nargs="+", choices=sorted(METHODS),
                    help=f"methods (default: {' '.join(DEFAULT_METHODS)})")
    ap.add_argument("--tau", type=float, default=0.1, help="quantile level (0.1; A15)")
    ap.add_argument("--peak", action="store_true",
                    help="no optimization: the fitted fields and the quantile around the simulator's optimum")
    ap.add_argument("--replicates", type=int, nargs="+", metavar="K",
                    help="diagnostic instead of the protocol: fit the quantile SVGP (quantile-ts's model; "
                         "another method's with --methods NAME) to each run's initial design plus K "
                         "simulated measurements at the optimum's setting (cumulative, ascending K), refit "
                         "as at a run's end (warm and cold, the lower loss kept), and record the "
                         "recommendation; writes replicates.csv")
    ap.add_argument("--simulators", type=int, nargs="+", metavar="SEED",
                    help="diagnostic instead of the protocol: build the simulator with each model_seed "
                         "(which rows fit its energy GP) and record its optimum q*, the best measured "
                         "setting's exact quantile, the optimum's distance to the nearest measured setting "
                         "and the energy GP's shortest lengthscales; writes simulators.csv")
    ap.add_argument("--initial", type=int, help="initial points (400)")
    ap.add_argument("--batches", type=int, help="BO batches after the initial points (12)")
    ap.add_argument("--batch", type=int, help="batch size (100)")
    ap.add_argument("--csv", help=f"LCLS-format CSV for LaserSimulator.from_csv (default {DEFAULT_CSV}; the "
                                  "synthetic simulator when the default is missing, an error when a given "
                                  "one is)")
    ap.add_argument("--synthetic", action="store_true", help="use the synthetic simulator (also when --csv "
                                                             "is missing)")
    ap.add_argument("--initial-y", choices=("simulated", "measured"), default="simulated",
                    help="outcomes of the initial measured settings: drawn from the simulator (default) or "
                         "the CSV's")
    ap.add_argument("--objective-options", type=json.loads,
                    help='JSON: extra LaserSimulator options, e.g. {"n_gp_max": 400}')
    add_common_args(ap, str(REPO / "results" / "laser"))
    args = ap.parse_args(argv)
    # --replicates fits one method's model: the one --methods names, else quantile-ts's
    args.design_method = args.methods[0] if args.methods else "quantile-ts"
    if args.replicates is not None and args.methods and len(args.methods) != 1:
        ap.error(f"--replicates fits one method's model; --methods names {len(args.methods)}")
    defaults = QUICK if args.quick else {**FULL, "methods": list(DEFAULT_METHODS), "objective_options": {}}
    for k in ("initial", "batches", "batch", "runs", "methods"):
        if getattr(args, k) is None:
            setattr(args, k, defaults[k])
    if args.objective_options is not None and not isinstance(args.objective_options, dict):
        raise SystemExit(f'--objective-options: a JSON object, e.g. {{"n_gp_max": 400}}; got '
                         f'{args.objective_options!r}')
    args.user_objective_options = dict(args.objective_options or {})
    args.objective_options = {**defaults["objective_options"], **args.user_objective_options}
    quick_opts = (QUICK["model_options"], QUICK["proposer_options"]) if args.quick else ({}, {})
    args.model_options = merge_options(quick_opts[0], args.model_options, "--model-options", MODELS)
    args.proposer_options = merge_options(
        quick_opts[1], args.proposer_options, "--proposer-options", PROPOSERS
    )
    args.runs = parse_runs(str(args.runs))
    if args.workers < 1 or args.threads < 1 or args.batches < 0 or args.batch < 1 or args.initial < 2:
        ap.error("--workers, --threads, --batch must be >= 1, --batches >= 0, --initial >= 2")
    if not 0 < args.tau < 1:
        ap.error(f"--tau must be in (0, 1); got {args.tau}")
    if args.replicates is not None and (args.peak or min(args.replicates) < 0):
        ap.error("--replicates: counts >= 0, and not with --peak")
    if args.simulators is not None and (args.peak or args.replicates is not None or min(args.simulators) < 0):
        ap.error("--simulators: seeds >= 0, and not with --peak or --replicates")
    if args.simulators is not None and "model_seed" in args.user_objective_options:
        ap.error("--simulators sets model_seed itself; leave it out of --objective-options")
    if args.time_limit is not None and args.time_limit < 0:
        ap.error(f"--time-limit must be >= 0 seconds; got {args.time_limit}")
    return args


def make_jobs(args: argparse.Namespace, objective: Mapping[str, Any]) -> list[Job]:
    """The runs `args` ask for, run-major (a time limit leaves the same runs finished for every method), their
    result files named with the simulator, the protocol and a hash of the settings."""
    budget = protocol_budget(args.initial, args.batches, args.batch)
    sim_tag = "syn" if "csv_path" not in objective["options"] else "csv"
    jobs = []
    for r in args.runs:
        for m in args.methods:
            settings = method_config(m, args.tau, args.initial, budget, args.batch, 0, portable(objective),
                                     args.model_options, args.proposer_options)
            tag = config_tag([run_settings(settings), args.initial_y])
            name = f"{m}-{sim_tag}-tau{args.tau:g}-n{args.initial}+{args.batches}x{args.batch}-{tag}-r{r}"
            jobs.append(
                Job(
                    Path(args.out) / "runs" / name,
                    run_one,
                    (
                        m,
                        args.tau,
                        args.initial,
                        args.batches,
                        args.batch,
                        r,
                        objective,
                        args.initial_y,
                        args.model_options,
                        args.proposer_options,
                        args.threads,
                    ),
                )
            )
    return jobs


def objective_of(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    """The objective config ({"name": "laser", "options"}) of `args` and a line describing the simulator."""
    options = dict(args.objective_options)
    csv = Path(args.csv or DEFAULT_CSV)
    if args.csv is not None and not args.synthetic and not csv.is_file():
        raise SystemExit(f"--csv: no such file {args.csv!r} (leave --csv out to fall back to the synthetic "
                         "simulator)")
    if not args.synthetic and csv.is_file():
        options["csv_path"] = str(csv.resolve())
        simulator = f"LCLS CSV {options['csv_path']}; initial points: {args.initial} measured settings " \
                    f"drawn at random per run ({args.initial_y} outcomes)"
    else:
        if not args.synthetic:
            print(f"[laser] {csv} is missing: falling back to the synthetic simulator", flush=True)
        # the quick mode's fit options are for the measurements; options the user gave stay (and are refused)
        options = {
            k: v
            for k, v in options.items()
            if k not in MEASUREMENT_OPTIONS or k in args.user_objective_options
        }
        simulator = f"synthetic simulator; initial points: a scrambled Sobol design of {args.initial}"
    return {"name": "laser", "options": options}, simulator


def optimum_site(sim: Any, tau: float) -> tuple[Any, Any, float, dict[str, Any]]:
    """The simulator's optimum: its setting `x`, `x` in the unit cube, q*, and where it lies (its unit-cube
    distance to the nearest measured (or synthetic stand-in) setting, and its coordinates on the box's
    edge)."""
    import numpy as np

    params, q_star = sim.optimum(tau)
    x = np.array([params[n] for n in sim.names])
    z = sim._to_unit(x[None])[0]
    X_data, _ = sim.initial_data()
    return (
        x,
        z,
        q_star,
        {
            "nearest_measured": float(np.sqrt(((sim._to_unit(X_data) - z) ** 2).sum(axis=1)).min()),
            "box_edge_coords": int(((z < 1e-3) | (z > 1 - 1e-3)).sum()),
        },
    )


def peak_profile(
    sim: Any,
    tau: float,
    radii: Sequence[float] = (0.01, 0.03, 0.1, 0.2, 0.4),
    n_dirs: int = 200,
    seed: int = 0,
) -> list[dict]:
    """The exact tau-quantile around the simulator's optimum: for each radius r (unit-cube units), `n_dirs`
    random directions, points clipped to the box; mean/min/max of q, and the mean of the fields (mean energy,
    omega, alpha). Row r = 0 is the optimum itself, with the distance to the nearest measured setting."""
    import numpy as np

    x, z, q_star, site = optimum_site(sim, tau)
    _, om, al = sim.sn_params(x[None])
    rows = [
        {
            "radius": 0.0,
            "q_mean": q_star,
            "q_min": q_star,
            "q_max": q_star,
            "mean_energy": float(sim.mean_array(x[None])[0]),
            "omega": float(om[0]),
            "alpha": float(al[0]),
            **site,
        }
    ]
    rng = np.random.default_rng(seed)
    for r in radii:
        U = rng.standard_normal((n_dirs, len(z)))
        U /= np.linalg.norm(U, axis=1, keepdims=True)
        Xs = sim._from_unit(np.clip(z + r * U, 0.0, 1.0))
        q = sim.quantile_array(Xs, tau)
        _, om, al = sim.sn_params(Xs)
        rows.append(
            {
                "radius": float(r),
                "q_mean": float(q.mean()),
                "q_min": float(q.min()),
                "q_max": float(q.max()),
                "mean_energy": float(sim.mean_array(Xs).mean()),
                "omega": float(om.mean()),
                "alpha": float(al.mean()),
                "nearest_measured": float("nan"),
                "box_edge_coords": -1,
            }
        )
    return rows


def run_peak(args: argparse.Namespace) -> list[dict]:
    """`--peak`: print the fitted fields' kernels and the quantile profile around q*; writes peak.csv."""
    from objectives.registry import load_objective

    objective, simulator = objective_of(args)
    sim = load_objective(objective["name"], objective["options"])
    print(f"[laser] {simulator}; tau {args.tau:g}")
    for name in ("mean", "log_omega", "alpha_raw"):
        kernel = getattr(getattr(sim._fields, name, None), "kernel", None)
        print(f"  {name:<10} kernel: {kernel if kernel is not None else type(sim._fields).__name__}")
    rows = peak_profile(sim, args.tau)
    print(format_table(rows))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_table(rows, out / "peak")
    return rows


def simulator_row(sim: Any, tau: float, n_lengthscales: int = 3) -> dict[str, Any]:
    """One simulator's optimum against its measured (or, synthetic, stand-in) settings: q*, the best and the
    median exact quantile of those settings, the optimum's unit-cube distance to the nearest of them, its
    coordinates on the box's edge, and the energy GP's shortest lengthscales (a fitted simulator only)."""
    import numpy as np

    _, _, q_star, site = optimum_site(sim, tau)
    q_data = sim.quantile_array(sim.initial_data()[0], tau)
    row = {"model_seed": sim.model_seed, "q_star": q_star, "best_measured_q": float(q_data.max()),
           "median_measured_q": float(np.median(q_data)), **site}
    kernel = getattr(getattr(sim._fields, "mean", None), "kernel", None)
    ls = np.atleast_1d(getattr(getattr(kernel, "k2", None), "length_scale", np.array([])))
    for i, j in enumerate(np.argsort(ls)[:n_lengthscales] if ls.size == len(sim.names) else []):
        row[f"short_ls_{i + 1}"] = f"{sim.names[j]}={ls[j]:.3g}"
    return row


def run_simulators(args: argparse.Namespace) -> list[dict]:
    """`--simulators SEED ...`: the simulator built with each model_seed (with the CSV: which rows fit the
    energy GP), its optimum and measured settings (`simulator_row`); writes simulators.csv."""
    from objectives.registry import load_objective

    objective, simulator = objective_of(args)
    print(f"[laser] --simulators {args.simulators}: {simulator.split(';')[0]}; tau {args.tau:g}", flush=True)
    rows = []
    for seed in args.simulators:
        sim = load_objective(objective["name"], {**objective["options"], "model_seed": seed})
        rows.append(simulator_row(sim, args.tau))
        print(f"[laser] model_seed {seed}: q* {rows[-1]['q_star']:.3f}, best measured "
              f"{rows[-1]['best_measured_q']:.3f}, nearest measured setting "
              f"{rows[-1]['nearest_measured']:.3f} away", flush=True)
    print(format_table(rows))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_table(rows, out / "simulators")
    return rows


def design_fit(laser: LaserRun, loc: float, scale: float) -> dict[str, float]:
    """How the recommending model's (`opt.recommender`) tau-quantile at the observed settings compares with
    their exact quantiles:
    Spearman's rank correlation, the largest prediction and the largest exact quantile (a model can rank the
    settings well and still recommend the wrong one when it compresses the top); and the noise the model reads
    there against the simulator's: the median over those settings of the model's noise standard deviation
    (``sqrt(c_v) e^g``, g at its posterior mean, in the outcome's units; NaN for a model without a scale
    latent) and of the skew-normal's."""
    import math

    import numpy as np
    import torch
    from scipy.stats import spearmanr

    from orchestrator.models.distributions import noise_constants

    X, _ = laser.opt.observations()
    model = laser.opt.recommender  # the model the recommendation came from
    with torch.no_grad():
        pred = laser.opt.sign * (loc + scale * model.objective_mean(X).reshape(-1).numpy())
        family = getattr(getattr(model, "likelihood", None), "family", None)
        noise_sd = float("nan")
        if family is not None and hasattr(model, "posterior_g"):
            g_mean, _ = model.posterior_g(X)
            noise_sd = float(np.median(math.sqrt(noise_constants(family, laser.tau)[1]) * abs(scale)
                                       * g_mean.exp().reshape(-1).numpy()))
    Xo = np.array([laser.sim.to_array(p) for p in laser.opt.space.from_unit(X)])
    true = laser.sim.quantile_array(Xo, laser.tau)
    sim_sd = float(np.median(laser.sim.noise_sd_array(Xo)))
    return {
        "spearman": float(spearmanr(pred, true)[0]),
        "predicted_max": float(pred.max()),
        "q_true_max": float(true.max()),
        "model_noise_sd": noise_sd,
        "sim_noise_sd": sim_sd,
    }


def run_replicates(args: argparse.Namespace) -> list[dict]:
    """`--replicates K ...`: how many measurements at the optimum's setting x* the quantile SVGP needs before
    it
    recommends x*. Per run: the protocol's initial design (as `LaserRun.start`, the model quantile-ts uses, or
    that of the one method `--methods` names, with --model-options), then K simulated measurements at x*
    (seeds 10**6 + i, added cumulatively in ascending K), each time `AskTellOptimizer.fit(restart=True)` (what
    a run's end asks for) and its recommendation scored by its exact quantile, with the fit's ranking of the
    observed settings (`design_fit`). Writes replicates.csv (a row per run and K)."""
    import torch

    objective, simulator = objective_of(args)
    print(f"[laser] --replicates {args.replicates}: {simulator}; tau {args.tau:g}; method "
          f"{args.design_method}; runs {args.runs}", flush=True)
    rows: list[dict] = []
    torch.set_num_threads(args.threads)
    for run in args.runs:
        laser = LaserRun(
            args.design_method,
            args.tau,
            args.initial,
            0,
            args.batch,
            run,
            objective,
            args.initial_y,
            args.model_options,
            args.proposer_options,
        )
        laser.start()
        params_star, q_opt = laser.sim.optimum(args.tau)
        x_star = torch.as_tensor(laser.opt.space.to_unit([params_star]), dtype=torch.float64)
        X_design, _ = laser.opt.observations()
        # the design's measured settings at x* (the CSV's optimum is a replicated measurement)
        at_star = int(((X_design.to(x_star) - x_star).abs().amax(dim=-1) < 1e-9).sum())
        told = 0
        for k in sorted(set(args.replicates)):
            ys = [laser.sim.evaluate(params_star, 10**6 + i) for i in range(told, k)]
            for y in ys:
                laser.opt.tell_point(params_star, y)
            told = k
            diag = laser.opt.fit(restart=True) if k else {"restart_kept": "(design fit)"}
            params, predicted = laser.opt.best()
            q_rec = laser.sim.quantile(params, args.tau)
            rec = laser.opt.recommender  # the model the recommendation came from
            with torch.no_grad():
                f_star = float(rec.objective_mean(x_star).reshape(-1)[0])
            loc, scale = rec.outcome_transform
            fit = design_fit(laser, float(loc), float(scale))
            rows.append(
                {
                    "run": run,
                    "design_at_opt": at_star,
                    "replicates": k,
                    "q_rec": q_rec,
                    "q_opt": q_opt,
                    "distance_pct": 100.0 * (q_opt - q_rec) / abs(q_opt),
                    "predicted_at_rec": float(predicted),
                    "predicted_at_opt": laser.opt.sign * float(loc + scale * f_star),
                    **fit,
                    "fit_kept": diag.get("restart_kept", ""),
                    "simulator": simulator,
                    "method": args.design_method,
                }
            )
            print(f"[laser] run {run}, {k} measurements at x*: q(x_hat) {q_rec:.4f} "
                  f"({rows[-1]['distance_pct']:.1f}% from q* {q_opt:.4f}); model's quantile at x_hat "
                  f"{predicted:.3f}, at x* {rows[-1]['predicted_at_opt']:.3f}", flush=True)
    print(
        format_table(
            rows,
            [
                "run",
                "design_at_opt",
                "replicates",
                "q_rec",
                "distance_pct",
                "predicted_at_rec",
                "predicted_at_opt",
                "spearman",
                "predicted_max",
                "q_true_max",
                "model_noise_sd",
                "sim_noise_sd",
                "fit_kept",
            ],
        )
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_table(rows, out / "replicates")
    return rows


def portable(objective: Mapping[str, Any]) -> dict[str, Any]:
    """`objective` with its CSV path replaced by the file's name and content checksum: result-file names and
    checkpoint keys then survive moving the repository (e.g. to another machine between `--resume`s)."""
    options = dict(objective["options"])
    if "csv_path" in options:
        path = Path(options.pop("csv_path"))
        options["csv"] = f"{path.name}:{zlib.crc32(path.read_bytes()) & 0xFFFFFFFF:08x}"
    return {**objective, "options": options}


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.peak:
        return {"peak": run_peak(args)}
    if args.replicates is not None:
        return {"replicates": run_replicates(args)}
    if args.simulators is not None:
        return {"simulators": run_simulators(args)}
    out = Path(args.out)
    (out / "runs").mkdir(parents=True, exist_ok=True)
    deadline = None if args.time_limit is None else time.time() + args.time_limit
    objective, simulator = objective_of(args)
    print(f"[laser] {MODE}; {simulator}; tau {args.tau:g}; methods {args.methods}; runs {args.runs}; "
          f"{args.initial} + {args.batches} x {args.batch} evaluations", flush=True)
    t_start = time.perf_counter()
    budget = protocol_budget(args.initial, args.batches, args.batch)
    preflight(
        {
            m: functools.partial(
                build_optimizer,
                method_config(
                    m,
                    args.tau,
                    args.initial,
                    budget,
                    args.batch,
                    0,
                    objective,
                    args.model_options,
                    args.proposer_options,
                ),
            )
            for m in args.methods
        },
        "laser",
    )
    jobs = make_jobs(args, objective)
    counts = run_jobs(jobs, args.workers, args.resume, deadline, "laser")

    rows = []
    for job in jobs:
        if job.csv.exists():
            for r in read_table(job.csv):
                rows.append(
                    _as_types(
                        {**r, "tau": float(r["tau"]), "run": int(r["run"])},
                        ("n_evals", "batch", "initial", "budget", "failures"),
                        (
                            "q_rec",
                            "q_opt_lbfgs",
                            "q_eval_max",
                            "predicted",
                            "fit_s",
                            "propose_s",
                            "run_s",
                            "cpu_s",
                        ),
                    )
                )
    rows.sort(key=lambda r: (list(METHODS).index(r["method"]), r["run"], r["n_evals"]))
    if note := code_mix_note(rows):
        print(f"[laser] {note}", flush=True)
    missing = len(jobs) - len({(r["method"], r["run"]) for r in rows})
    q_star, summary, pairs, plots = float("nan"), [], [], []
    if rows:
        q_star = add_distances(rows)
        write_table(rows, out / "laser")
        full = (args.initial, args.batches, args.batch) == (FULL["initial"], FULL["batches"], FULL["batch"])
        summary = summarize(rows, full)
        if summary:
            write_table(summary, out / "summary")
        pairs = paired(rows)
        if pairs:
            write_table(pairs, out / "paired")
        plots = make_plots(rows, out)

    print(f"\n[laser] {MODE}; {simulator}")
    q_lbfgs = next((r["q_opt_lbfgs"] for r in rows if not r["error"]), float("nan"))
    print(f"optimum q* = {q_star:.4f} (L-BFGS-B optimum {q_lbfgs:.4f}; raised to the best evaluated point if "
          "higher)")
    print(f"\nFinal distance of the recommendation's exact {args.tau:g}-quantile from q* (over runs):")
    print(
        format_table(
            summary,
            [
                "method",
                "n_evals",
                "runs",
                "q_rec_mean",
                "q_star",
                "distance_mean",
                "distance_ci95",
                "distance_pct_mean",
                "distance_pct_std",
                "distance_pct_ci95",
                "distance_pct_max",
                "run_s_mean",
                "cpu_s_mean",
            ]
            + (["target"] if any("target" in s for s in summary) else []),
        )
    )
    if pairs:
        print(f"\nPaired by run (distance, % of q*; negative: {TARGET['method']} closer):")
        print(format_table(pairs))
    errors = [r for r in rows if r["error"]]
    if errors:
        print(f"\n{len(errors)} failed runs: " + "; ".join(f"{r['method']} run {r['run']}: "
                                                           f"{r['error']}" for r in errors))
    if missing:
        print(f"\n[laser] {missing} of {len(jobs)} runs not finished ({counts['paused']} paused at a "
              f"checkpoint, {counts['skipped']} not started): run again with --resume")
    print(f"\n[laser] wrote {out} ({len(rows)} rows, {len(plots)} plots) in "
          f"{time.perf_counter() - t_start:.1f} s")
    return {
        "rows": rows,
        "summary": summary,
        "paired": pairs,
        "plots": plots,
        "q_star": q_star,
        "missing": missing,
        "counts": counts,
    }


if __name__ == "__main__":
    main()
