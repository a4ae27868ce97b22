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
(LOCBO's lambda_t(x) set; the central interval of the recalibrated predictive for the others). OCBO-L
(localized recalibrator) and CBO (conformal; `--methods conformal` adds qbatch's conformal EI) are not in the
default set.

    python benchmarks/calibration.py --quick                # Forrester, 2 repetitions, 8 steps
    python benchmarks/calibration.py --reps 5 --steps 25     # the papers' protocol on every function
    python benchmarks/calibration.py --noisy-ackley --quick  # LOCBO smoke run: 2 seeds, 3 steps
    python benchmarks/calibration.py --noisy-ackley          # paper 002's protocol: 7 seeds, 50 steps

Writes one row per (function, method, repetition) (runs.csv/.parquet), the summary table (summary.csv/
.parquet, table.txt) and one PNG per function (best-so-far regret vs step, mean +- 95% CI over repetitions)
to `--out` (default results/calibration/). The noisy-Ackley run writes noisy_ackley_steps.csv/.parquet (one
row per method x seed x step), noisy_ackley_runs.csv/.parquet, noisy_ackley_summary.csv/.parquet,
noisy_ackley_paired.csv/.parquet (LOCBO vs the others, paired over seeds) and noisy_ackley.png.

GLD quantile problems with Thompson batches (`--gld`): the quantile SVGP (model "quantile") with
Thompson sampling (proposer "thompson") maximises the tau-quantile of GLD problems (objectives.gld) through
`orchestrator.ask_tell.AskTellOptimizer` in synchronous batches (as benchmarks/gld.py: ask B, evaluate B, tell
B, refit, recommend with `best()`; simple regret q* - q_tau(x_hat) from the exact GLD quantile, q* the
L-BFGS-B optimum raised to the best exact quantile evaluated by any calibrator on the problem). Calibrators
none, online and locbo. Thompson sampling samples f, so a calibrator reaches its proposals only through the
spread factor of orchestrator/calibration/spread.py (the path mu + s(x)(path - mu)): `online` brings the
global s_t, `locbo` the local s_t(x) (their default `spread` modes); the online level map R_t and LOCBO's
threshold lambda_t(x) do not change the proposals (offline-cv would also act only through s_t and is left out;
conformal works only inside the calibrated EI/UCB and is refused with Thompson sampling). Per problem the
initial Sobol design (seeded by the problem) and the first fit are computed once and shared by every
calibrator, and the proposer's seeds are the same, so the runs are paired (the first Thompson batch is
identical: s = 1 before any result). Each proposed point's y is scored against the forecast recorded when its
batch was proposed, with the calibrator's state at proposal time: the model's forecast ("model"), through the
level map R_t ("recal", the identity for none and locbo) and with var_f scaled by s_t(x)^2 ("spread", what
Thompson sampling used); reported are the coverage of the central 50/80/90% intervals and paper 000's
calibration score (per run, then averaged over problems). Defaults d = 3, tau = 0.75, batch 10, initial 50 d,
10 problems, and a REDUCED budget of 350 evaluations (paper 003: 250 d = 750) so that the default run takes
~14 minutes on one core; `--problems`, `--budget`, `--initial`, `--batch`, `--tau`, `--dim` change them.
`--gld --quick`: 2 problems, 20 + 2 x 10 evaluations, a short SVGP training (~10 s). Writes gld_checkpoints
(one row per calibrator x problem x batch, with the recommendation and its regret), gld_points (one row per
proposed point: y, s(x), the recorded forecast, PITs), gld_runs (one row per calibrator x problem),
gld_summary (one row per calibrator: regret mean and 95% CI, paired difference against none with its CI, wins
and Wilcoxon p, coverages and scores), each as .csv and .parquet, gld_table.txt and gld_calibration.png
(regret vs evaluations, mean +- 95% CI over problems).

    python benchmarks/calibration.py --gld --quick  # smoke run (~10 s)
    python benchmarks/calibration.py --gld          # d 3, tau 0.75, batch 10, 10 problems, budget 350
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import warnings
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks._common import format_table as format_rows  # noqa: E402
from benchmarks._common import mean_ci, paired_comparison, plot_curves, write_table  # noqa: E402

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
METHODS = ("none", "none-ei", "online", "offline-cv", "locbo", "conformal")


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
    # LOCBO defines EI only, conformal EI and UCB: they run EI where the paper's acquisition is another, and
    # `none-ei` (no calibration, EI everywhere) is their baseline there (`summarise` compares within one
    # acquisition; against `none` their gains would be in part PI -> EI)
    if method in ("locbo", "none-ei"):
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
    cal = build_calibrator("none" if method == "none-ei" else method, **opts)
    if method == "offline-cv":
        cal.fit(X, Y)
    prop = attach(cal, AcquisitionProposer(acq, num_restarts=restarts, raw_samples=raw, maxiter=100))
    model = build_model("exact-gp")
    u_raw, u_cal, best = [], [], [float(-Y.max())]
    t0 = time.perf_counter()
    for t in range(steps):
        model.fit(X, Y)
        prop.observed_y = Y  # LOCBO's incumbent: the best observation (locbo.md §1.6), as in a run
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


#: minima closer than this, relative to none's, tie in "fraction beats none"
TIE_RTOL = 1e-4


def summarise(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Table-1 rows: per (function, method) mean minimum (SE), fraction beating no calibration under the same
    acquisition (`none`, or `none-ei` where the method runs EI in place of the paper's acquisition; no figure
    when neither ran it), mean AUC, scores."""
    out = []
    for fn in dict.fromkeys(r["function"] for r in rows):
        baselines = {(r["acquisition"], r["seed"]): r for r in rows
                     if r["function"] == fn and r["method"] in ("none", "none-ei")}
        for method in dict.fromkeys(r["method"] for r in rows if r["function"] == fn):
            rs = [r for r in rows if r["function"] == fn and r["method"] == method]
            mins = np.array([r["minimum"] for r in rs])
            wins = []
            for r in rs:
                b = baselines.get((r["acquisition"], r["seed"]))
                if b is None or method in ("none", "none-ei"):
                    continue
                # the same minimum to 4 significant digits is a tie (runs at a global minimum differ by the
                # optimizer's last digits), broken by the steps taken to reach it
                tol = TIE_RTOL * abs(b["minimum"]) + 1e-12
                better = r["minimum"] < b["minimum"] - tol or (
                    abs(r["minimum"] - b["minimum"]) <= tol and r["steps_to_minimum"] < b["steps_to_minimum"]
                )
                wins.append(float(better))
            out.append({
                "function": fn, "method": method, "acquisition": rs[0]["acquisition"], "reps": len(rs),
                "minimum": float(mins.mean()),
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
    head = (f"{'Objective':<14} {'Method':<12} {'Acq.':<5} {'Minimum Found (↓)':<20} "
            f"{'Frac. beats none (↑)':<21} {'AUC (↓)':<8} {'Cal. model':<11} {'Cal. recal.':<11}")
    lines = [head, "-" * len(head)]
    for s in summary:
        frac = "—" if math.isnan(s["fraction_beats_none"]) else f"{s['fraction_beats_none']:.2f}"
        se = "" if math.isnan(s["se"]) else f" ({s['se']:.3f})"
        lines.append(
            f"{s['function']:<14} {s['method']:<12} {s.get('acquisition', ''):<5} {s['minimum']:.3f}{se:<12} "
            f"{frac:<21} {s['auc']:<8.4f} {s['cal_score_model']:<11.4f} {s['cal_score_recalibrated']:<11.4f}"
        )
    lines.append("Frac. beats none: against no calibration under the same acquisition (none, or none-ei "
                 "where a method runs EI in place of the function's own).")
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
        paths.append(
            plot_curves(
                curves,
                out / f"calibration_{fn}.png",
                xlabel="BO step",
                ylabel="best-so-far regret",
                title=f"{fn}: calibrated BO (mean +- 95% CI over repetitions)",
            )
        )
    return paths


# ----------------------------------------------------------------------------------- noisy Ackley (paper 002)
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
    """One LOCBO-protocol run (locbo.md §3.2); returns the run's row and one row per step (0 = initial
    design).

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
        return torch.tensor(
            [
                obj.evaluate({"x0": float(x[0]), "x1": float(x[1])}, _noise_seed(seed, start + i))
                for i, x in enumerate(xs)
            ],
            dtype=torch.float64,
        )

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
    step_rows = [
        {
            "method": method,
            "seed": seed,
            "step": 0,
            "n_obs": n_init,
            "regret": r0,
            "oracle_regret": o0,
            "x0": float("nan"),
            "x1": float("nan"),
            "y": float("nan"),
            "f": float("nan"),
            "covered": float("nan"),
        }
    ]
    misses = 0
    t0 = time.perf_counter()
    for t in range(1, steps + 1):
        model.fit(X, Y)
        prop.observed_y = Y  # LOCBO's incumbent: the best noisy observation (locbo.md §1.6), as in a run
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
    run = {
        "method": method,
        "seed": seed,
        "steps": steps,
        "n_init": n_init,
        "noise_scale": noise_scale,
        "calibrator": cal_name,
        "calibrator_options": json.dumps(cal_opts),
        "final_regret": step_rows[-1]["regret"],
        "final_oracle_regret": step_rows[-1]["oracle_regret"],
        "mean_regret": float(np.mean([r["regret"] for r in step_rows[1:]])) if steps else r0,
        "miscoverage": misses / steps if steps else float("nan"),
        "alpha": alpha,
        "seconds": time.perf_counter() - t0,
    }
    return run, step_rows


def summarise_noisy_ackley(runs: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Per method: final and step-averaged simple regret (mean +- 95% CI over seeds), miscoverage; LOCBO
    paired."""
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
            paired.append(
                {
                    "method": a,
                    "versus": b,
                    "n": c["n"],
                    "mean_diff": c["mean_diff"],
                    "ci": c["ci"],
                    "wins": c["wins"],
                    "p_wilcoxon": c["p_wilcoxon"],
                    "significant": bool(not math.isnan(c["ci"]) and abs(c["mean_diff"]) > c["ci"]),
                    "avg_mean_diff": ca["mean_diff"],
                    "avg_ci": ca["ci"],
                    "avg_wins": ca["wins"],
                    "avg_significant": bool(not math.isnan(ca["ci"]) and abs(ca["mean_diff"]) > ca["ci"]),
                }
            )
    return summary, paired


# ------------------------------------------------------------------- GLD quantile problems (Thompson batches)
#: GLD calibrators: config name and options. Thompson sampling on the quantile SVGP samples f, not y, so a
#: level map cannot reach it: a calibrator acts on the proposals only through its spread factor s_t / s_t(x)
#: (orchestrator.calibration.spread, wired by `attach`): `online` carries the global s_t (its default spread),
#: `locbo` the local s_t(x) (its default); LOCBO's own threshold lambda_t(x) and the online level map R_t do
#: not change which points Thompson sampling proposes, they only recalibrate the reported forecast
GLD_METHODS: dict[str, tuple[str, dict[str, Any]]] = {
    "none": ("none", {}),
    "online": ("online", {}),
    "locbo": ("locbo", {}),
}
#: default setting: paper 003's d = 3, tau = 0.75, batch 10, initial 50 d, but a budget of 350 evaluations
#: (150 Sobol + 20 Thompson batches; the paper's 250 d = 750 would take ~3x longer): ~14 minutes for 10
#: problems on one core
GLD_DEFAULT = {"dim": 3, "tau": 0.75, "batch": 10, "problems": 10, "budget": 350}
#: smoke run: 2 problems, 20 Sobol points, two Thompson batches of 10, a short SVGP training
GLD_QUICK = {"dim": 3, "tau": 0.75, "batch": 10, "problems": 2, "initial": 20, "budget": 40,
             "model_options": {"max_steps": 150, "warm_max_steps": 20, "num_inducing": 16}}
#: forecasts scored per proposed point: the model's, the calibrator's level map R_t applied to it (identity
#: for none and locbo), and the model's with var_f scaled by s_t(x)^2 (the spread Thompson sampling used)
GLD_FORECASTS = ("model", "recal", "spread")
GLD_MODE = ("synchronous batches, in-process AskTellOptimizer (the orchestrator's synchronous protocol "
            "without Ray)")


def _gld_first_fit(
    problem: Any, tau: float, n0: int, problem_id: int, model_options: dict
) -> tuple[dict, list]:
    """Initial Sobol design (seeded by the problem) evaluated and fitted once; its state is shared by every
    calibrator of the problem, so the runs are paired from the same design and first fit."""
    from orchestrator.ask_tell import AskTellOptimizer

    opt = AskTellOptimizer(problem.space, model="quantile", tau=tau, proposer="thompson", calibrator="none",
                           initial_design=n0, seed=problem_id, model_options=model_options)
    trials = opt.ask(n0)
    for t in trials:
        opt.tell(t.trial_id, problem.evaluate(t.params, t.seed))
    opt.fit()
    return opt.get_state(), [t.x.tolist() for t in trials]


def run_gld(
    method: str,
    problem: Any,
    problem_id: int,
    tau: float,
    batch: int,
    n0: int,
    budget: int,
    model_options: dict,
    first: tuple[dict, list],
) -> tuple[list[dict], list[dict], list[list[float]]]:
    """One quantile-SVGP + Thompson run with calibrator `method` on one GLD problem.

    Synchronous batches: ask `batch` points (each carries the forecast recorded when it was proposed),
    evaluate them, score the forecasts against the observed y with the calibrator's state at proposal time (it
    changes only when results are told), tell them and update the calibrator with the batch (one
    `flush_calibration`, as the actor's synchronous runs do), refit, recommend with `best()`.

    Returns:
        checkpoint rows (regret filled in by the caller), one row per proposed point (PITs), every evaluated
        point.
    """
    from orchestrator.ask_tell import AskTellOptimizer
    from orchestrator.calibration.spread import scaled_forecast
    from orchestrator.models.predictive import Forecast

    cal_name, cal_opts = GLD_METHODS[method]
    opt = AskTellOptimizer(
        problem.space,
        model="quantile",
        tau=tau,
        proposer="thompson",
        calibrator=cal_name,
        calibrator_options=cal_opts,
        initial_design=n0,
        seed=problem_id,
        model_options=model_options,
    )
    opt.set_state(first[0])
    evaluated = [list(x) for x in first[1]]
    n, t_start = len(evaluated), time.perf_counter()
    checkpoints: list[dict] = []
    points: list[dict] = []

    def record() -> None:
        params, predicted = opt.best()
        cal = opt.calibrator
        checkpoints.append(
            {
                "method": method,
                "problem": problem_id,
                "n_evals": n,
                "x_rec": json.dumps([params[k] for k in problem.space]),
                "predicted": float(predicted),
                "s_center": float(
                    cal.spread_tracker(torch.full((1, problem.dim), 0.5, dtype=torch.float64))[0]
                )
                if cal is not None and cal.spread_tracker is not None
                else 1.0,
                "elapsed_s": time.perf_counter() - t_start,
            }
        )

    record()
    step = 0
    while n < budget:
        step += 1
        trials = opt.ask(min(batch, budget - n))
        if any(t.forecast is None for t in trials):
            raise RuntimeError(f"batch {step} was not proposed by the model (no forecast recorded)")
        fc = Forecast.from_records([t.forecast for t in trials])
        X = torch.stack([t.x for t in trials]).to(torch.float64)
        y = torch.tensor([problem.evaluate(t.params, t.seed) for t in trials], dtype=torch.float64)
        cal = opt.calibrator  # state as at proposal time: nothing was told since `ask`
        s = cal.spread(X) if cal is not None else torch.ones(len(trials), dtype=torch.float64)
        u = {"model": fc.cdf(y).reshape(-1),
             "recal": (cal.recalibrate(fc).cdf(y) if cal is not None else fc.cdf(y)).reshape(-1),
             "spread": scaled_forecast(fc, s).cdf(y).reshape(-1)}
        for i, t in enumerate(trials):
            points.append(
                {
                    "method": method,
                    "problem": problem_id,
                    "step": step,
                    "n_obs": n,
                    "trial_id": t.trial_id,
                    "x": json.dumps(t.x.tolist()),
                    "y": float(y[i]),
                    "spread": float(s[i]),
                    "forecast": json.dumps(t.forecast),
                    **{f"u_{k}": float(u[k][i].clamp(0.0, 1.0)) for k in GLD_FORECASTS},
                }
            )
        for t, v in zip(trials, y.tolist()):
            opt.tell(t.trial_id, v)
            evaluated.append(t.x.tolist())
        # the calibrator learns the batch as the central actor's synchronous runs have it learn one: in one
        # update (the online recalibrator: one step, the batch's results scored at the levels it was proposed
        # with)
        opt.flush_calibration()
        n += len(trials)
        opt.fit()
        record()
    return checkpoints, points, evaluated


def _gld_run_row(method: str, problem_id: int, checkpoints: list[dict], points: list[dict]) -> dict[str, Any]:
    """One row per (calibrator, problem): final regret, BO-average regret, coverage and score per forecast."""
    from orchestrator.calibration import calibration_score, interval_coverage

    cps = sorted(checkpoints, key=lambda r: r["n_evals"])
    row: dict[str, Any] = {
        "method": method,
        "problem": problem_id,
        "n_evals": cps[-1]["n_evals"],
        "final_regret": cps[-1]["regret"],
        "bo_avg_regret": float(np.mean([c["regret"] for c in cps[1:]] or [cps[0]["regret"]])),
        "n_pits": len(points),
        "final_s_center": cps[-1]["s_center"],
        "seconds": cps[-1]["elapsed_s"],
    }
    for k in GLD_FORECASTS:
        u = torch.tensor([p[f"u_{k}"] for p in points], dtype=torch.float64)
        cov = interval_coverage(u)
        for c, v in cov.items():
            row[f"cov{int(round(100 * c))}_{k}"] = v
        row[f"cal_score_{k}"] = calibration_score(u) if len(points) else float("nan")
    return row


def summarise_gld(runs: list[dict[str, Any]], methods: Sequence[str]) -> list[dict[str, Any]]:
    """One summary row per calibrator: final regret mean and 95% CI over problems, paired difference against
    `none` (mean, CI, wins, Wilcoxon p), and the per-run coverages and calibration scores averaged over
    problems."""
    by = {m: {r["problem"]: r for r in runs if r["method"] == m} for m in methods}
    out = []
    for m in methods:
        rs = list(by[m].values())
        if not rs:
            continue
        mean, half, n = mean_ci([r["final_regret"] for r in rs])
        avg, avg_half, _ = mean_ci([r["bo_avg_regret"] for r in rs])
        row: dict[str, Any] = {"method": m, "problems": n, "n_evals": max(r["n_evals"] for r in rs),
                               "regret_mean": mean, "regret_ci95": half,
                               "regret_median": float(np.median([r["final_regret"] for r in rs])),
                               "bo_avg_regret_mean": avg, "bo_avg_regret_ci95": avg_half}
        if m != "none" and by.get("none"):
            c = paired_comparison({p: r["final_regret"] for p, r in by[m].items()},
                                  {p: r["final_regret"] for p, r in by["none"].items()})
            ca = paired_comparison({p: r["bo_avg_regret"] for p, r in by[m].items()},
                                   {p: r["bo_avg_regret"] for p, r in by["none"].items()})
            row.update(
                diff_vs_none=c["mean_diff"],
                diff_ci95=c["ci"],
                wins_vs_none=c["wins"],
                ties_vs_none=c["ties"],
                p_wilcoxon=c["p_wilcoxon"],
                significant=bool(not math.isnan(c["ci"]) and abs(c["mean_diff"]) > c["ci"]),
                avg_diff_vs_none=ca["mean_diff"],
                avg_diff_ci95=ca["ci"],
                avg_p_wilcoxon=ca["p_wilcoxon"],
            )
        else:
            row.update(diff_vs_none=float("nan"), diff_ci95=float("nan"), wins_vs_none=float("nan"),
                       ties_vs_none=float("nan"), p_wilcoxon=float("nan"), significant=False,
                       avg_diff_vs_none=float("nan"), avg_diff_ci95=float("nan"), avg_p_wilcoxon=float("nan"))
        for k in GLD_FORECASTS:
            for c in ("cov50", "cov80", "cov90", "cal_score"):
                row[f"{c}_{k}"] = float(np.mean([r[f"{c}_{k}"] for r in rs]))
        row["final_s_center"] = float(np.mean([r["final_s_center"] for r in rs]))
        row["seconds"] = float(np.mean([r["seconds"] for r in rs]))
        out.append(row)
    return out


def format_gld_table(summary: list[dict[str, Any]], label: str) -> str:
    """Paper 000's Table 1 layout (objective, method, metric (SE-like spread), fraction beating none), with
    the final simple regret (mean +- 95% CI half-width), the paired difference against none and its Wilcoxon
    p, and paper 000's calibration score of the model's forecast and of the calibrated ones (recal: level map
    R_t;
    spread: var_f x s_t(x)^2, what Thompson sampling used)."""
    head = (f"{'Objective':<20} {'Method':<8} {'Final regret (↓)':<20} {'Frac. beats none (↑)':<21} "
            f"{'Δ vs none (95% CI)':<22} {'Wilcoxon p':<11} {'Cal. model':<11} {'Cal. recal.':<12} "
            f"{'Cal. spread':<11}")
    lines = [head, "-" * len(head)]
    for s in summary:
        ci = "" if math.isnan(s["regret_ci95"]) else f" ± {s['regret_ci95']:.3f}"
        frac = "—" if math.isnan(s["wins_vs_none"]) else f"{s['wins_vs_none']:.2f}"
        diff = "—" if math.isnan(s["diff_vs_none"]) else (
            f"{s['diff_vs_none']:+.3f}" + ("" if math.isnan(s["diff_ci95"]) else f" ± {s['diff_ci95']:.3f}"))
        p = "—" if math.isnan(s["p_wilcoxon"]) else f"{s['p_wilcoxon']:.3f}"
        lines.append(f"{label:<20} {s['method']:<8} {s['regret_mean']:.3f}{ci:<14} {frac:<21} {diff:<22} "
                     f"{p:<11} {s['cal_score_model']:<11.4f} {s['cal_score_recal']:<12.4f} "
                     f"{s['cal_score_spread']:<11.4f}")
    return "\n".join(lines)


def _write_gld(out: Path, label: str, methods: Sequence[str], checkpoints: list[dict], points: list[dict],
               runs: list[dict], setting: dict[str, Any], final: bool) -> list[dict[str, Any]]:
    """Write every table and the plot (after each problem, so an interrupted run keeps what it finished);
    print the two tables when `final`."""
    summary = summarise_gld(runs, methods)
    for s in summary:
        s.update(objective=label, **setting)
    write_table(checkpoints, out / "gld_checkpoints")
    write_table(points, out / "gld_points")
    write_table(runs, out / "gld_runs")
    write_table(summary, out / "gld_summary")
    table = format_gld_table(summary, label)
    cov_cols = (
        ["method", "problems"]
        + [f"cov{c}_{k}" for k in GLD_FORECASTS for c in (50, 80, 90)]
        + ["final_s_center"]
    )
    cov_table = format_rows(summary, cov_cols, digits=3)
    (out / "gld_table.txt").write_text(table + "\n\n" + cov_table + "\n")
    evals = sorted({c["n_evals"] for c in checkpoints})
    problems = sorted({r["problem"] for r in runs})
    curves = {}
    for m in methods:
        reps = []
        for pid in problems:
            d = {c["n_evals"]: c["regret"] for c in checkpoints if c["method"] == m and c["problem"] == pid}
            reps.append([max(d[e], 1e-12) for e in evals])
        curves[m] = (evals, reps)
    plot_curves(curves, out / "gld_calibration.png", xlabel="evaluations", ylabel="simple regret q* - "
                                                                                  "q_tau(x_hat)",
                title=f"{label}: quantile TS, mean +- 95% CI, {len(problems)} problems")
    if final:
        print(f"\nGLD quantile problems, quantile SVGP + Thompson batches ({label}, initial "
              f"{setting['initial']}, budget {setting['budget']}, {len(problems)} problems): final simple "
              "regret mean ± 95% CI half-width; Frac. beats none = paired wins (ties count as losses); Δ = "
              "paired mean difference (negative = calibrator better); calibration score of paper 000 (0 = "
              f"calibrated) of the one-step-ahead forecasts at the proposed points, averaged over problems:")
        print(table)
        print("\nOne-step-ahead coverage of the central 50/80/90% predictive intervals of y at the proposed "
              "points (model = the model's forecast; recal = through the calibrator's level map R_t; spread "
              "= var_f x s_t(x)^2; final_s_center = s_t(x) at the cube's centre after the last batch):")
        print(cov_table)
        print("\nPaired BO-average regret (per problem, mean over the checkpoints after the initial design), "
              "vs none:")
        print(format_rows(summary, ["method", "bo_avg_regret_mean", "bo_avg_regret_ci95", "avg_diff_vs_none",
                                    "avg_diff_ci95", "avg_p_wilcoxon", "seconds"]))
    return summary


def main_gld(a: argparse.Namespace) -> int:
    """The `--gld` experiment: quantile SVGP + Thompson batches on GLD problems, each calibrator against
    none."""
    from objectives.gld import GLDProblem

    methods = a.methods or list(GLD_METHODS)
    unknown = [m for m in methods if m not in GLD_METHODS]
    if unknown:
        raise SystemExit(f"--methods: {unknown} are not GLD calibrators; choose from {list(GLD_METHODS)}")
    if "none" not in methods:
        methods = ["none"] + methods  # every comparison is against the uncalibrated run
    q = GLD_QUICK if a.quick else GLD_DEFAULT
    dim = q["dim"] if a.quick or a.dim is None else a.dim
    tau = q["tau"] if a.quick or a.tau is None else a.tau
    batch = q["batch"] if a.quick or a.batch is None else a.batch
    problems = list(range(q["problems"])) if a.quick or a.problems is None else _gld_problems(a.problems)
    initial = q.get("initial", 50 * dim) if a.quick or a.initial is None else a.initial
    budget = q["budget"] if a.quick or a.budget is None else a.budget
    model_options = dict(q.get("model_options", {})) if a.quick else {}
    if dim < 1 or batch < 1 or initial < 2 or not (0 < tau < 1) or not problems:
        raise SystemExit("--gld needs --dim >= 1, --batch >= 1, --initial >= 2, --tau in (0, 1) and a "
                         f"problem; got {dim}, {batch}, {initial}, {tau}, {problems}")
    if budget <= initial:
        raise SystemExit(f"--budget ({budget}) must exceed --initial ({initial}): no Thompson batch would "
                         "run")
    label = f"gld-d{dim}-tau{tau:g}-b{batch}"
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"[gld-calibration] {GLD_MODE}; quantile SVGP + Thompson; calibrators {methods}; {label}; problems "
          f"{problems}; initial {initial}, budget "
          f"{budget}{' (quick: short SVGP training)' if a.quick else ''}",
          flush=True)
    t_all = time.perf_counter()
    setting = dict(d=dim, tau=tau, batch=batch, initial=initial, budget=budget)
    checkpoints: list[dict] = []
    points: list[dict] = []
    runs: list[dict] = []
    for pid in problems:
        problem = GLDProblem(dim=dim, problem=pid)
        _, q_opt = problem.optimum(tau)
        t0 = time.perf_counter()
        first = _gld_first_fit(problem, tau, initial, pid, model_options)
        print(f"[gld-calibration] problem {pid}: initial design and first fit {time.perf_counter() - t0:.1f} "
              "s", flush=True)
        per: dict[str, tuple[list[dict], list[dict]]] = {}
        evaluated_all = [x for x in first[1]]
        for m in methods:
            cps, pts, ev = run_gld(m, problem, pid, tau, batch, initial, budget, model_options, first)
            per[m] = (cps, pts)
            evaluated_all += ev[len(first[1]):]
        q_eval = float(problem.quantile_unit(np.asarray(evaluated_all), tau).max())
        q_star = max(q_opt, q_eval)
        for m in methods:
            cps, pts = per[m]
            for c in cps:
                c["q_rec"] = float(problem.quantile_unit(np.asarray([json.loads(c["x_rec"])]), tau)[0])
                c["q_star"], c["q_star_lbfgs"] = q_star, q_opt
                c["regret"] = q_star - c["q_rec"]
                c.update(d=dim, tau=tau, batch=batch)
            checkpoints += cps
            points += pts
            runs.append(_gld_run_row(m, pid, cps, pts))
            r = runs[-1]
            print(f"[gld-calibration] problem {pid} {m:<7}: final regret {r['final_regret']:.4f}, cov80 "
                  f"model {r['cov80_model']:.2f} / spread {r['cov80_spread']:.2f}, s(centre) "
                  f"{r['final_s_center']:.2f} ({r['seconds']:.1f} s)", flush=True)
        if pid != problems[-1]:
            _write_gld(out, label, methods, checkpoints, points, runs, setting, final=False)
    _write_gld(out, label, methods, checkpoints, points, runs, setting, final=True)
    print(f"\n[gld-calibration] wrote {out} ({len(runs)} runs, {len(points)} scored points) in "
          f"{time.perf_counter() - t_all:.1f} s")
    return 0


def _gld_problems(spec: str) -> list[int]:
    """--problems: a count (10 = problems 0..9), a range (0-9) or a list (1,4,7)."""
    try:
        if "-" in spec:
            lo, hi = spec.split("-")
            return list(range(int(lo), int(hi) + 1))
        if "," in spec:
            return [int(p) for p in spec.split(",")]
        return list(range(int(spec)))
    except ValueError:
        raise SystemExit(f"--problems: a count (10), a range (0-9) or a list (1,4,7); got {spec!r}") from None


def _worker_init(threads: int) -> None:
    torch.set_num_threads(threads)
    warnings.filterwarnings("ignore")


def main_noisy_ackley(a: argparse.Namespace) -> int:
    """The `--noisy-ackley` experiment: runs, tables, plot, printed summary."""
    methods = a.methods or list(ACKLEY_DEFAULT)
    unknown = [m for m in methods if m not in ACKLEY_METHODS]
    if unknown:
        raise SystemExit(f"--methods: {unknown} are not noisy-Ackley methods; choose from "
                         f"{list(ACKLEY_METHODS)}")
    seeds = ACKLEY_QUICK["seeds"] if a.quick else (a.reps if a.reps is not None else ACKLEY_PROTOCOL["seeds"])
    steps = (
        ACKLEY_QUICK["steps"] if a.quick else (a.steps if a.steps is not None else ACKLEY_PROTOCOL["steps"])
    )
    restarts = ACKLEY_QUICK["restarts"] if a.quick else a.restarts
    raw = ACKLEY_QUICK["raw"] if a.quick else a.raw_samples
    if seeds < 1 or steps < 1 or restarts < 1 or raw < 1:
        raise SystemExit(f"--reps, --steps, --restarts and --raw-samples must be >= 1; got {seeds}, {steps}, "
                         f"{restarts}, {raw}")
    if not (math.isfinite(a.ackley_noise) and a.ackley_noise >= 0):
        raise SystemExit(f"--ackley-noise must be a finite number >= 0; got {a.ackley_noise}")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"[noisy-ackley] methods {methods}; seeds 0..{seeds - 1}; T = {steps}; n_init = "
          f"{ACKLEY_PROTOCOL['n_init']}; noise scale {a.ackley_noise:g}; optimize_acqf {restarts} restarts x "
          f"{raw} raw samples", flush=True)
    t_start = time.perf_counter()
    jobs = [(m, seed, steps, restarts, raw, ACKLEY_PROTOCOL["n_init"], a.ackley_noise)
            for seed in range(seeds) for m in methods]
    results: list[tuple[dict[str, Any], list[dict[str, Any]]]] = []

    def report(run: dict[str, Any]) -> None:
        print(f"[noisy-ackley] {run['method']:<10} seed {run['seed']}: final regret "
              f"{run['final_regret']:.4f}, miscoverage {run['miscoverage']:.2f} ({run['seconds']:.1f} "
              "s)", flush=True)

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
    print("\nNoisy Ackley (locbo.md §3.2): simple regret max f - f(x_t*), t* = argmax of noisy y; mean and "
          "95% CI half-width over seeds; mean_regret = averaged over steps 1..T; miscoverage of the (1 - "
          "alpha) set:")
    print(format_rows(summary, ["method", "seeds", "steps", "final_regret", "final_ci95", "final_median",
                                "mean_regret", "mean_ci95", "miscoverage", "alpha", "seconds"]))
    if paired:
        print("\nPaired over seeds (method - versus; negative = method better; significant = 95% CI excludes "
              "0):")
        print(
            format_rows(
                paired,
                [
                    "method",
                    "versus",
                    "n",
                    "mean_diff",
                    "ci",
                    "wins",
                    "p_wilcoxon",
                    "significant",
                    "avg_mean_diff",
                    "avg_ci",
                    "avg_wins",
                    "avg_significant",
                ],
            )
        )
    print(f"\n[noisy-ackley] wrote {out} ({len(step_rows)} step rows, plot {plot.name}) in "
          f"{time.perf_counter() - t_start:.1f} s")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--noisy-ackley", action="store_true",
                   help="paper 002's noisy-Ackley experiment (LOCBO) instead of paper 000's functions")
    p.add_argument("--gld", action="store_true",
                   help="GLD quantile problems: quantile SVGP + Thompson batches, calibrators "
                        "none/online/locbo")
    p.add_argument("--problems", default=None, help="--gld: count (10), range (0-9) or list (1,4,7); default "
                                                    "10")
    p.add_argument("--budget", type=int, default=None, help="--gld: total evaluations per run (default 350)")
    p.add_argument("--initial", type=int, default=None, help="--gld: initial Sobol design (default 50 d)")
    p.add_argument("--batch", type=int, default=None, help="--gld: Thompson batch size (default 10)")
    p.add_argument("--tau", type=float, default=None, help="--gld: quantile level (default 0.75)")
    p.add_argument("--dim", type=int, default=None, help="--gld: dimension d (default 3)")
    p.add_argument("--functions", nargs="+", default=None, choices=sorted(FUNCTIONS))
    p.add_argument("--methods", nargs="+", default=None,
                   help=f"paper 000: {list(METHODS)} (default all); noisy Ackley: {list(ACKLEY_METHODS)} "
                        f"(default {list(ACKLEY_DEFAULT)})")
    p.add_argument("--reps", type=int, default=None, help="repetitions / seeds (default 5; noisy Ackley 7)")
    p.add_argument("--steps", type=int, default=None, help="BO steps (default 25; noisy Ackley 50)")
    p.add_argument("--restarts", type=int, default=8)
    p.add_argument("--raw-samples", type=int, default=256)
    p.add_argument("--ackley-noise", type=float, default=1.0, help="noise scale of the noisy Ackley (0: Fig. "
                                                                   "5a)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (per process)")
    p.add_argument("--workers", type=int, default=1, help="noisy Ackley: parallel processes (one run each)")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: Forrester, 2 repetitions, 8 steps (noisy Ackley: 2 seeds, 3 steps), "
                        "light optimizer")
    p.add_argument("--out", default="results/calibration")
    a = p.parse_args(argv)
    if a.threads < 1 or a.workers < 1:
        p.error(f"--threads and --workers must be >= 1; got {a.threads}, {a.workers}")
    torch.set_num_threads(a.threads)
    warnings.filterwarnings("ignore")
    if a.noisy_ackley and a.gld:
        p.error("--noisy-ackley and --gld are separate experiments; pick one")
    if a.noisy_ackley:
        return main_noisy_ackley(a)
    if a.gld:
        return main_gld(a)
    methods = a.methods or list(METHODS)
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        p.error(f"--methods: {unknown} are not calibrators of this experiment; choose from {list(METHODS)}")
    fns = a.functions or (["forrester"] if a.quick else list(FUNCTIONS))
    reps, steps = (
        (2, 8) if a.quick else (a.reps if a.reps is not None else 5, a.steps if a.steps is not None else 25)
    )
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
                print(f"{fn:<14} {method:<11} seed {seed}: min {r['minimum']:.4f} ({r['seconds']:.1f} "
                      "s)", flush=True)
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
