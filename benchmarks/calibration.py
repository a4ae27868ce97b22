"""Calibrated BO benchmark: each calibrator against none on paper 000's functions (calibrated-bo.md §2).

Protocol of paper 000's Tables 1–3 (§2.1–2.5): minimise each function from `n_init` random initial points
(3 for Forrester and the Table 2 functions, 5 otherwise) for `steps` BO steps with the exact GP
(`build_model("exact-gp")`, refit every step), the same initial design for every calibrator within a
repetition, acquisition UCB for Forrester, PI for the Table 2 functions, EI otherwise (LOCBO defines EI
only). Calibration is the pure online variant (§1.5 (i)): the forecast made for x_t is scored against y_t
before the model is refit; offline-cv refits on folds (§1.3). Reported per function and method, as paper
000's Table 1: minimum found (SE), fraction of repetitions where the method beats the uncalibrated run
(lower minimum, or the same minimum in fewer steps), normalised area under the best-so-far curve
(mean over steps of (best_t - f*) / (best_0 - f*)), plus paper 000's calibration score of the
one-step-ahead PITs (of the model, and after recalibration).

Noisy Ackley (`--noisy-ackley`, paper 002 §V-C, locbo.md §3.2 and checklist items 13–14): maximise the
negated 2-D Ackley on [-10, 10]^2 observed with heteroscedastic noise N(0, (||x|| + 10)/20) (objectives.
functions.NoisyAckley; `--ackley-noise 0` gives Fig. 5a's noise-free variant) with the homoscedastic exact GP
(misspecified on purpose) and EI: BO (no calibration), OCBO (paper 000's online quantile recalibrator, EI on
the recalibrated quantiles), LOCBO with kappa = 0 (plain online CP with the denoised EI: the code's "OCBO"
label), LOCBO (l = inf) and LOCBO (l = 5, i.e. 0.25 in the unit cube); alpha 0.2, eta0 5e-3, w 0.05,
lambda_reg 4e-3, kappa 4 (A6: "5 and 4"; 4 is taken for LOCBO). 5 uniform initial points (the paper; A10: the
code excludes a band around the optimum), T = 50 BO steps, 7 seeds; the same initial design and noise
stream (seeded by (seed, point)) for every method of a seed. Metric (eq. 41): simple regret max f - f(x_t*)
with t* = argmax_t of the NOISY observations (initial design included), per step (and `oracle_regret`, that of
the best TRUE value observed, a lower bound); also the long-run miscoverage of each method's (1 - alpha) set
(LOCBO's lambda_t(x) set; the central interval of the recalibrated predictive for the others). OCBO-L (localized recalibrator) and CBO (conformal;
`--methods conformal` adds qbatch's conformal EI) are not in the default set.

    python benchmarks/calibration.py --quick                # Forrester, 2 repetitions, 8 steps
    python benchmarks/calibration.py --reps 5 --steps 25     # the papers' protocol on every function
    python benchmarks/calibration.py --noisy-ackley --quick  # LOCBO smoke run: 2 seeds, 3 steps
    python benchmarks/calibration.py --noisy-ackley          # paper 002's protocol: 7 seeds, 50 steps

Writes one row per (function, method, repetition) (runs.csv/.parquet), the summary table (summary.csv/
.parquet, table.txt) and one PNG per function (best-so-far regret vs step, mean +- 95% CI over repetitions)
to `--out` (default results/calibration/). The noisy-Ackley run writes noisy_ackley_steps.csv/.parquet (one
row per method x seed x step), noisy_ackley_runs.csv/.parquet, noisy_ackley_summary.csv/.parquet,
noisy_ackley_paired.csv/.parquet (LOCBO vs the others, paired over seeds) and noisy_ackley.png. GLD quantile
problems with Thompson batches are not part of this script yet.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import warnings
import zlib
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks._common import mean_ci, paired_comparison, plot_curves, write_table  # noqa: E402
from benchmarks._common import format_table as format_rows  # noqa: E402

#: function name -> (objectives.functions class name, constructor kwargs, n_init, acquisition)
FUNCTIONS: dict[str, tuple[str, dict[str, Any], int, str]] = {
    "forrester": ("Forrester", {}, 3, "ucb"),
    "ackley": ("Ackley", {"dim": 2}, 5, "ei"),
    "alpine": ("Alpine", {"dim": 10}, 5, "ei"),
    "cosines": ("Cosines", {}, 5, "ei"),
    "beale": ("Beale", {}, 3, "pi"),
    "mccormick": ("McCormick", {}, 3, "pi"),
    "powers": ("Powers", {}, 3, "pi"),
    "cross-in-tray": ("CrossInTray", {}, 3, "pi"),
    "dropwave": ("Dropwave", {}, 3, "pi"),
}
METHODS = ("none", "online", "offline-cv", "locbo", "conformal")


def _objective(name: str) -> Any:
    import objectives.functions as F

    cls, kwargs, _, _ = FUNCTIONS[name]
    return getattr(F, cls)(**kwargs)


def run_one(fn: str, method: str, seed: int, steps: int, restarts: int, raw: int) -> dict[str, Any]:
    """One BO run; returns the row of the CSV (best-so-far curve as a ';'-joined string)."""
    from orchestrator.acquisition.calibrated import AcquisitionProposer
    from orchestrator.calibration import attach, build_calibrator, calibration_score
    from orchestrator.models import build_model

    obj = _objective(fn)
    _, _, n_init, acq = FUNCTIONS[fn]
    if method == "locbo":
        acq = "ei"
    if method == "conformal" and acq == "pi":
        acq = "ei"
    lo, hi = obj.bounds[:, 0], obj.bounds[:, 1]

    def f(Z: torch.Tensor) -> torch.Tensor:
        return torch.as_tensor(obj.f(lo + Z.numpy() * (hi - lo)), dtype=torch.float64)

    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n_init, obj.dim, generator=g, dtype=torch.float64)
    Y = -f(X)  # maximise -f
    opts: dict[str, Any] = {}
    if method == "offline-cv":
        opts = {"splits": "time-series", "n_splits": 8}
    if method == "conformal":
        opts = {"num_labels": 32, "ratio_steps": 32}
    cal = build_calibrator(method, **opts)
    if method == "offline-cv":
        cal.fit(X, Y)
    prop = attach(cal, AcquisitionProposer(acq, num_restarts=restarts, raw_samples=raw, maxiter=100))
    model = build_model("exact-gp")
    u_raw, u_cal, best = [], [], [float(-Y.max())]
    t0 = time.perf_counter()
    for t in range(steps):
        model.fit(X, Y)
        x = prop.propose(model, 1, X_observed=X, seed=seed * 10_000 + t)
        y = -f(x)
        fc = model.forecast(x)
        u_raw.append(float(fc.cdf(y)[0]))
        u_cal.append(float(cal.recalibrate(fc).cdf(y)[0]))
        cal.update(fc, y, X=x)
        X, Y = torch.cat([X, x]), torch.cat([Y, y])
        best.append(float(-Y.max()))
    fstar = obj.optimal_value
    span = max(best[0] - fstar, 1e-12)
    auc = float(np.mean([(b - fstar) / span for b in best[1:]])) if steps else float("nan")
    reached = next((i for i, b in enumerate(best) if b <= best[-1] + 1e-9), len(best))
    return {
        "function": fn, "method": method, "seed": seed, "acquisition": acq, "steps": steps, "n_init": n_init,
        "minimum": best[-1], "regret": best[-1] - fstar, "steps_to_minimum": reached, "auc": auc,
        "cal_score_model": calibration_score(torch.tensor(u_raw)) if u_raw else float("nan"),
        "cal_score_recalibrated": calibration_score(torch.tensor(u_cal)) if u_cal else float("nan"),
        "seconds": time.perf_counter() - t0, "best_so_far": ";".join(f"{b:.6g}" for b in best),
    }


def summarise(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Table-1 rows: per (function, method) mean minimum (SE), fraction beating `none`, mean AUC, scores."""
    out = []
    for fn in dict.fromkeys(r["function"] for r in rows):
        base = {r["seed"]: r for r in rows if r["function"] == fn and r["method"] == "none"}
        for method in dict.fromkeys(r["method"] for r in rows if r["function"] == fn):
            rs = [r for r in rows if r["function"] == fn and r["method"] == method]
            mins = np.array([r["minimum"] for r in rs])
            wins = []
            for r in rs:
                b = base.get(r["seed"])
                if b is None or method == "none":
                    continue
                better = r["minimum"] < b["minimum"] - 1e-9 or (
                    abs(r["minimum"] - b["minimum"]) <= 1e-9 and r["steps_to_minimum"] < b["steps_to_minimum"]
                )
                wins.append(float(better))
            out.append({
                "function": fn, "method": method, "reps": len(rs), "minimum": float(mins.mean()),
                "se": float(mins.std(ddof=1) / math.sqrt(len(rs))) if len(rs) > 1 else float("nan"),
                "fraction_beats_none": float(np.mean(wins)) if wins else float("nan"),
                "auc": float(np.mean([r["auc"] for r in rs])),
                "cal_score_model": float(np.mean([r["cal_score_model"] for r in rs])),
                "cal_score_recalibrated": float(np.mean([r["cal_score_recalibrated"] for r in rs])),
                "seconds": float(np.mean([r["seconds"] for r in rs])),
            })
    return out


def format_table(summary: list[dict[str, Any]]) -> str:
    """Paper 000's Table 1 layout, plus the calibration scores."""
    head = f"{'Objective':<14} {'Method':<12} {'Minimum Found (↓)':<20} {'Frac. beats none (↑)':<21} {'AUC (↓)':<8} {'Cal. model':<11} {'Cal. recal.':<11}"
    lines = [head, "-" * len(head)]
    for s in summary:
        frac = "—" if math.isnan(s["fraction_beats_none"]) else f"{s['fraction_beats_none']:.2f}"
        se = "" if math.isnan(s["se"]) else f" ({s['se']:.3f})"
        lines.append(
            f"{s['function']:<14} {s['method']:<12} {s['minimum']:.3f}{se:<12} {frac:<21} {s['auc']:<8.4f} "
            f"{s['cal_score_model']:<11.4f} {s['cal_score_recalibrated']:<11.4f}"
        )
    return "\n".join(lines)


def make_plots(rows: list[dict[str, Any]], out: Path) -> list[Path]:
    """One PNG per function: best-so-far regret (best_t - f*) vs BO step, mean +- 95% CI over repetitions."""
    paths = []
    for fn in dict.fromkeys(r["function"] for r in rows):
        fstar = _objective(fn).optimal_value
        curves = {}
        for method in dict.fromkeys(r["method"] for r in rows if r["function"] == fn):
            reps = [[max(float(b) - fstar, 1e-12) for b in r["best_so_far"].split(";")]
                    for r in rows if r["function"] == fn and r["method"] == method]
            curves[method] = (list(range(len(reps[0]))), reps)
        paths.append(plot_curves(curves, out / f"calibration_{fn}.png", xlabel="BO step", ylabel="best-so-far regret",
                                 title=f"{fn}: calibrated BO (mean +- 95% CI over repetitions)"))
    return paths


# ------------------------------------------------------------------------------------ noisy Ackley (paper 002)
#: noisy-Ackley methods: calibrator name and options (locbo.md §1.8 V-C column, §1.9 baselines)
LOCBO_PAPER = {"alpha": 0.2, "eta0": 5e-3, "decay": 0.05, "lambda_reg": 4e-3, "kappa": 4.0}
ACKLEY_METHODS: dict[str, tuple[str, dict[str, Any]]] = {
    "bo": ("none", {}),
    "ocbo": ("online", {}),
    "locbo-k0": ("locbo", {**LOCBO_PAPER, "kappa": 0.0, "lengthscale": 0.25}),
    "locbo-inf": ("locbo", {**LOCBO_PAPER, "lengthscale": math.inf}),
    "locbo": ("locbo", {**LOCBO_PAPER, "lengthscale": 0.25}),
    "conformal": ("conformal", {"alpha": 0.2, "num_labels": 32, "ratio_steps": 32}),
}
ACKLEY_DEFAULT = ("bo", "ocbo", "locbo-k0", "locbo-inf", "locbo")
#: paper 002 §V-C: n_init, T, seeds (noisy setting), alpha
ACKLEY_PROTOCOL = {"n_init": 5, "steps": 50, "seeds": 7, "alpha": 0.2}
ACKLEY_QUICK = {"seeds": 2, "steps": 3, "restarts": 2, "raw": 32}


def _noise_seed(seed: int, i: int) -> int:
    """Evaluation seed of the i-th observation of run `seed` (the noise also depends on the point itself)."""
    return zlib.crc32(f"noisy-ackley:{seed}:{i}".encode()) & 0x7FFFFFFF


def run_noisy_ackley(method: str, seed: int, steps: int, restarts: int, raw: int, n_init: int = 5,
                     noise_scale: float = 1.0) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One LOCBO-protocol run (locbo.md §3.2); returns the run's row and one row per step (0 = initial design).

    The initial design (seeded by `seed`) and the noise of the i-th observation (seeded by (seed, i, x)) are
    the same for every method. The calibrator sees BO queries only, each scored against the forecast of the
    model that proposed it (fitted on D_{t-1}, checklist item 5), before the model is refitted.
    """
    from objectives.functions import NoisyAckley
    from orchestrator.acquisition.calibrated import AcquisitionProposer
    from orchestrator.calibration import attach, build_calibrator
    from orchestrator.models import build_model

    obj = NoisyAckley(noise_scale=noise_scale)
    lo, hi = obj.bounds[:, 0], obj.bounds[:, 1]
    cal_name, cal_opts = ACKLEY_METHODS[method]
    alpha = float(cal_opts.get("alpha", ACKLEY_PROTOCOL["alpha"]))

    def observe(Z: torch.Tensor, start: int) -> torch.Tensor:
        xs = lo + Z.numpy() * (hi - lo)
        return torch.tensor([obj.evaluate({"x0": float(x[0]), "x1": float(x[1])}, _noise_seed(seed, start + i))
                             for i, x in enumerate(xs)], dtype=torch.float64)

    def true_f(Z: torch.Tensor) -> np.ndarray:
        return obj.f(lo + Z.numpy() * (hi - lo))

    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n_init, 2, generator=g, dtype=torch.float64)  # uniform initial design (paper; A10)
    Y = observe(X, 0)
    cal = build_calibrator(cal_name, **cal_opts)
    prop = attach(cal, AcquisitionProposer("ei", num_restarts=restarts, raw_samples=raw, maxiter=100))
    model = build_model("exact-gp")
    fstar = obj.optimal_value

    def regret() -> tuple[float, float]:
        i = int(torch.argmax(Y))  # t* = argmax of the noisy observations (eq. 41)
        return float(fstar - true_f(X[i : i + 1])[0]), float(fstar - true_f(X).max())

    r0, o0 = regret()
    step_rows = [{"method": method, "seed": seed, "step": 0, "n_obs": n_init, "regret": r0, "oracle_regret": o0,
                  "x0": float("nan"), "x1": float("nan"), "y": float("nan"), "f": float("nan"),
                  "covered": float("nan")}]
    misses = 0
    t0 = time.perf_counter()
    for t in range(1, steps + 1):
        model.fit(X, Y)
        x = prop.propose(model, 1, X_observed=X, seed=seed * 10_000 + t)
        y = observe(x, n_init + t - 1)
        fc = model.forecast(x)
        # coverage of the (1 - alpha) set the method uses: LOCBO's lambda_t(x) set, else the central interval
        # of the (recalibrated) predictive
        if cal_name == "locbo":
            covered = bool(cal.covers(fc, y, x)[0])
        else:
            u = float(cal.recalibrate(fc).cdf(y)[0])
            covered = alpha / 2 <= u <= 1 - alpha / 2
        misses += not covered
        cal.update(fc, y, X=x)
        X, Y = torch.cat([X, x]), torch.cat([Y, y])
        r, o = regret()
        xo = lo + x[0].numpy() * (hi - lo)
        step_rows.append({"method": method, "seed": seed, "step": t, "n_obs": n_init + t, "regret": r,
                          "oracle_regret": o, "x0": float(xo[0]), "x1": float(xo[1]), "y": float(y[0]),
                          "f": float(true_f(x)[0]), "covered": float(covered)})
    run = {"method": method, "seed": seed, "steps": steps, "n_init": n_init, "noise_scale": noise_scale,
           "calibrator": cal_name, "calibrator_options": json.dumps(cal_opts), "final_regret": step_rows[-1]["regret"],
           "final_oracle_regret": step_rows[-1]["oracle_regret"],
           "mean_regret": float(np.mean([r["regret"] for r in step_rows[1:]])) if steps else r0,
           "miscoverage": misses / steps if steps else float("nan"), "alpha": alpha,
           "seconds": time.perf_counter() - t0}
    return run, step_rows


def summarise_noisy_ackley(runs: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Per method: final and step-averaged simple regret (mean +- 95% CI over seeds), miscoverage; LOCBO paired."""
    summary, paired = [], []
    methods = list(dict.fromkeys(r["method"] for r in runs))
    by = {m: {r["seed"]: r for r in runs if r["method"] == m} for m in methods}
    for m in methods:
        fin, half, n = mean_ci([r["final_regret"] for r in by[m].values()])
        avg, ahalf, _ = mean_ci([r["mean_regret"] for r in by[m].values()])
        mis, mhalf, _ = mean_ci([r["miscoverage"] for r in by[m].values()])
        summary.append({"method": m, "seeds": n, "steps": max(r["steps"] for r in by[m].values()),
                        "final_regret": fin, "final_ci95": half,
                        "final_median": float(np.median([r["final_regret"] for r in by[m].values()])),
                        "mean_regret": avg, "mean_ci95": ahalf, "miscoverage": mis, "miscoverage_ci95": mhalf,
                        "alpha": by[m][next(iter(by[m]))]["alpha"],
                        "seconds": float(np.mean([r["seconds"] for r in by[m].values()]))})
    for a in [m for m in methods if m == "locbo"] or methods[:1]:
        for b in methods:
            if b == a:
                continue
            c = paired_comparison({s: r["final_regret"] for s, r in by[a].items()},
                                  {s: r["final_regret"] for s, r in by[b].items()})
            ca = paired_comparison({s: r["mean_regret"] for s, r in by[a].items()},
                                   {s: r["mean_regret"] for s, r in by[b].items()})
            paired.append({"method": a, "versus": b, "n": c["n"], "mean_diff": c["mean_diff"], "ci": c["ci"],
                           "wins": c["wins"], "p_wilcoxon": c["p_wilcoxon"],
                           "significant": bool(not math.isnan(c["ci"]) and abs(c["mean_diff"]) > c["ci"]),
                           "avg_mean_diff": ca["mean_diff"], "avg_ci": ca["ci"], "avg_wins": ca["wins"],
                           "avg_significant": bool(not math.isnan(ca["ci"]) and abs(ca["mean_diff"]) > ca["ci"])})
    return summary, paired


def _worker_init(threads: int) -> None:
    torch.set_num_threads(threads)
    warnings.filterwarnings("ignore")


def main_noisy_ackley(a: argparse.Namespace) -> int:
    """The `--noisy-ackley` experiment: runs, tables, plot, printed summary."""
    methods = a.methods or list(ACKLEY_DEFAULT)
    unknown = [m for m in methods if m not in ACKLEY_METHODS]
    if unknown:
        raise SystemExit(f"--methods: {unknown} are not noisy-Ackley methods; choose from {list(ACKLEY_METHODS)}")
    seeds = ACKLEY_QUICK["seeds"] if a.quick else (a.reps if a.reps is not None else ACKLEY_PROTOCOL["seeds"])
    steps = ACKLEY_QUICK["steps"] if a.quick else (a.steps if a.steps is not None else ACKLEY_PROTOCOL["steps"])
    restarts = ACKLEY_QUICK["restarts"] if a.quick else a.restarts
    raw = ACKLEY_QUICK["raw"] if a.quick else a.raw_samples
    if seeds < 1 or steps < 1 or restarts < 1 or raw < 1:
        raise SystemExit(f"--reps, --steps, --restarts and --raw-samples must be >= 1; got {seeds}, {steps}, {restarts}, {raw}")
    if not (math.isfinite(a.ackley_noise) and a.ackley_noise >= 0):
        raise SystemExit(f"--ackley-noise must be a finite number >= 0; got {a.ackley_noise}")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"[noisy-ackley] methods {methods}; seeds 0..{seeds - 1}; T = {steps}; n_init = {ACKLEY_PROTOCOL['n_init']}; "
          f"noise scale {a.ackley_noise:g}; optimize_acqf {restarts} restarts x {raw} raw samples", flush=True)
    t_start = time.perf_counter()
    jobs = [(m, seed, steps, restarts, raw, ACKLEY_PROTOCOL["n_init"], a.ackley_noise)
            for seed in range(seeds) for m in methods]
    results: list[tuple[dict[str, Any], list[dict[str, Any]]]] = []

    def report(run: dict[str, Any]) -> None:
        print(f"[noisy-ackley] {run['method']:<10} seed {run['seed']}: final regret {run['final_regret']:.4f}, "
              f"miscoverage {run['miscoverage']:.2f} ({run['seconds']:.1f} s)", flush=True)

    if a.workers == 1:
        for job in jobs:
            results.append(run_noisy_ackley(*job))
            report(results[-1][0])
    else:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor, as_completed

        with ProcessPoolExecutor(a.workers, mp_context=mp.get_context("spawn"), initializer=_worker_init,
                                 initargs=(a.threads,)) as pool:
            futures = [pool.submit(run_noisy_ackley, *job) for job in jobs]
            for fut in as_completed(futures):
                results.append(fut.result())
                report(results[-1][0])
    order = {m: i for i, m in enumerate(methods)}
    results.sort(key=lambda r: (r[0]["seed"], order[r[0]["method"]]))
    runs = [r for r, _ in results]
    step_rows = [row for _, st in results for row in st]
    write_table(step_rows, out / "noisy_ackley_steps")
    write_table(runs, out / "noisy_ackley_runs")
    summary, paired = summarise_noisy_ackley(runs)
    write_table(summary, out / "noisy_ackley_summary")
    if paired:
        write_table(paired, out / "noisy_ackley_paired")
    curves = {m: (list(range(steps + 1)),
                  [[max(r["regret"], 1e-12) for r in step_rows if r["method"] == m and r["seed"] == s]
                   for s in range(seeds)]) for m in methods}
    plot = plot_curves(curves, out / "noisy_ackley.png", xlabel="BO step", ylabel="simple regret (eq. 41)",
                       title=f"Noisy Ackley (paper 002 V-C), mean +- 95% CI over {seeds} seeds")
    print(f"\nNoisy Ackley (locbo.md §3.2): simple regret max f - f(x_t*), t* = argmax of noisy y; mean and 95% CI "
          f"half-width over seeds; mean_regret = averaged over steps 1..T; miscoverage of the (1 - alpha) set:")
    print(format_rows(summary, ["method", "seeds", "steps", "final_regret", "final_ci95", "final_median",
                                "mean_regret", "mean_ci95", "miscoverage", "alpha", "seconds"]))
    if paired:
        print("\nPaired over seeds (method - versus; negative = method better; significant = 95% CI excludes 0):")
        print(format_rows(paired, ["method", "versus", "n", "mean_diff", "ci", "wins", "p_wilcoxon", "significant",
                                   "avg_mean_diff", "avg_ci", "avg_wins", "avg_significant"]))
    print(f"\n[noisy-ackley] wrote {out} ({len(step_rows)} step rows, plot {plot.name}) in "
          f"{time.perf_counter() - t_start:.1f} s")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--noisy-ackley", action="store_true",
                   help="paper 002's noisy-Ackley experiment (LOCBO) instead of paper 000's functions")
    p.add_argument("--functions", nargs="+", default=None, choices=sorted(FUNCTIONS))
    p.add_argument("--methods", nargs="+", default=None,
                   help=f"paper 000: {list(METHODS)} (default all); noisy Ackley: {list(ACKLEY_METHODS)} "
                        f"(default {list(ACKLEY_DEFAULT)})")
    p.add_argument("--reps", type=int, default=None, help="repetitions / seeds (default 5; noisy Ackley 7)")
    p.add_argument("--steps", type=int, default=None, help="BO steps (default 25; noisy Ackley 50)")
    p.add_argument("--restarts", type=int, default=8)
    p.add_argument("--raw-samples", type=int, default=256)
    p.add_argument("--ackley-noise", type=float, default=1.0, help="noise scale of the noisy Ackley (0: Fig. 5a)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (per process)")
    p.add_argument("--workers", type=int, default=1, help="noisy Ackley: parallel processes (one run each)")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: Forrester, 2 repetitions, 8 steps (noisy Ackley: 2 seeds, 3 steps), light optimizer")
    p.add_argument("--out", default="results/calibration")
    a = p.parse_args(argv)
    if a.threads < 1 or a.workers < 1:
        p.error(f"--threads and --workers must be >= 1; got {a.threads}, {a.workers}")
    torch.set_num_threads(a.threads)
    warnings.filterwarnings("ignore")
    if a.noisy_ackley:
        return main_noisy_ackley(a)
    methods = a.methods or list(METHODS)
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        p.error(f"--methods: {unknown} are not calibrators of this experiment; choose from {list(METHODS)}")
    fns = a.functions or (["forrester"] if a.quick else list(FUNCTIONS))
    reps, steps = (2, 8) if a.quick else (a.reps if a.reps is not None else 5, a.steps if a.steps is not None else 25)
    restarts, raw = (2, 32) if a.quick else (a.restarts, a.raw_samples)
    if reps < 1 or steps < 1:
        p.error(f"--reps and --steps must be >= 1; got {reps}, {steps}")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for fn in fns:
        for seed in range(reps):
            for method in methods:
                r = run_one(fn, method, seed, steps, restarts, raw)
                rows.append(r)
                print(f"{fn:<14} {method:<11} seed {seed}: min {r['minimum']:.4f} ({r['seconds']:.1f} s)", flush=True)
    write_table(rows, out / "runs")
    summary = summarise(rows)
    write_table(summary, out / "summary")
    table = format_table(summary)
    (out / "table.txt").write_text(table + "\n")
    make_plots(rows, out)
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
