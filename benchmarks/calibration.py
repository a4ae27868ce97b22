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

    python benchmarks/calibration.py --quick                # Forrester, 2 repetitions, 8 steps
    python benchmarks/calibration.py --reps 5 --steps 25     # the papers' protocol on every function

Writes one CSV row per (function, method, repetition) and the summary table to `--out` (default
results/calibration/). GLD quantile problems with Thompson batches are not part of this script yet.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--functions", nargs="+", default=None, choices=sorted(FUNCTIONS))
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--steps", type=int, default=25)
    p.add_argument("--restarts", type=int, default=8)
    p.add_argument("--raw-samples", type=int, default=256)
    p.add_argument("--quick", action="store_true", help="Forrester only, 2 repetitions, 8 steps, light optimizer")
    p.add_argument("--out", default="results/calibration")
    a = p.parse_args(argv)
    fns = a.functions or (["forrester"] if a.quick else list(FUNCTIONS))
    reps, steps = (2, 8) if a.quick else (a.reps, a.steps)
    restarts, raw = (2, 32) if a.quick else (a.restarts, a.raw_samples)
    if reps < 1 or steps < 1:
        p.error(f"--reps and --steps must be >= 1; got {reps}, {steps}")
    warnings.filterwarnings("ignore")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for fn in fns:
        for seed in range(reps):
            for method in a.methods:
                r = run_one(fn, method, seed, steps, restarts, raw)
                rows.append(r)
                print(f"{fn:<14} {method:<11} seed {seed}: min {r['minimum']:.4f} ({r['seconds']:.1f} s)", flush=True)
    with open(out / "runs.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    summary = summarise(rows)
    with open(out / "summary.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(summary[0]))
        w.writeheader()
        w.writerows(summary)
    table = format_table(summary)
    (out / "table.txt").write_text(table + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
