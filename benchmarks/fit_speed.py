"""Cold-fit time of the quantile SVGP at small n, against BoTorch's `SingleTaskGP` + `fit_gpytorch_mll`.

On the same data (GLD problem draws, one noisy outcome per uniform point in [0, 1]^d), each repetition times a
cold fit of qbatch's default quantile model (`orchestrator.models.build_model("quantile", tau=0.1)`) and a
cold fit of BoTorch's exact GP with its defaults, one after the other in this process on one thread, and
prints the ratio qbatch / BoTorch per (d, n) (median over repetitions). Target: at most 2 at every n <= 100.

Usage:
    python benchmarks/fit_speed.py --quick                   # CI smoke run (seconds)
    python benchmarks/fit_speed.py --reps 5 --also lbfgs --out benchmarks/results/quality/fit_speed
Results in --out: fit_speed.csv (every repetition) and summary.csv (median times and ratio per d and n).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks._common import code_version, format_table, limited_threads, write_table  # noqa: E402

TARGET = 2.0
QUICK = {"dims": [2], "ns": [20], "reps": 1}


def time_pair(d: int, n: int, rep: int, also: Sequence[str] = ()) -> dict[str, Any]:
    """One repetition: both cold fits on the same data (and qbatch's with each `optimizer` in `also`)."""
    import numpy as np
    import torch
    from botorch.fit import fit_gpytorch_mll
    from botorch.models import SingleTaskGP
    from gpytorch.mlls import ExactMarginalLogLikelihood

    from objectives.gld import GLDProblem
    from orchestrator.models import build_model

    prob = GLDProblem(dim=d, problem=rep)
    rng = np.random.default_rng([d, n, rep])
    X = torch.as_tensor(rng.random((n, d)))
    Y = torch.as_tensor(prob.sample_unit(X.numpy(), rng)[0])
    t0 = time.perf_counter()
    gp = SingleTaskGP(X, Y.unsqueeze(-1))
    fit_gpytorch_mll(ExactMarginalLogLikelihood(gp.likelihood, gp))
    t_botorch = time.perf_counter() - t0
    model = build_model("quantile", tau=0.1)
    t0 = time.perf_counter()
    info = model.fit(X, Y)
    t_qbatch = time.perf_counter() - t0
    row = {"d": d, "n": n, "rep": rep, "botorch_s": t_botorch, "qbatch_s": t_qbatch,
           "ratio": t_qbatch / t_botorch, "qbatch_iterations": info["iterations"],
           "qbatch_loss": info["loss"], "num_inducing": info["num_inducing"], "code": code_version()}
    for optimizer in also:
        other = build_model("quantile", tau=0.1, optimizer=optimizer)
        t0 = time.perf_counter()
        other_info = other.fit(X, Y)
        row[f"{optimizer}_s"] = time.perf_counter() - t0
        row[f"{optimizer}_loss"] = other_info["loss"]
    return row


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="CI smoke run: d = 2, n = 20, one repetition")
    ap.add_argument("--dims", nargs="+", type=int, default=[2, 6])
    ap.add_argument("--ns", nargs="+", type=int, default=[20, 50, 100])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--also", nargs="*", default=[], help="other `optimizer` options to time beside the "
                    "default (a screen: their times and final losses are added to fit_speed.csv)")
    ap.add_argument("--out", default=str(REPO / "results" / "fit_speed"))
    args = ap.parse_args(argv)
    dims, ns, reps = (
        (QUICK["dims"], QUICK["ns"], QUICK["reps"]) if args.quick else (args.dims, args.ns, args.reps)
    )
    rows = []
    with limited_threads(1), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        time_pair(2, 10, 0)  # first calls pay for imports and kernels' lazy set-up: not timed
        for d in dims:
            for n in ns:
                for rep in range(reps):
                    rows.append(time_pair(d, n, rep, args.also))
    summary = []
    for d in dims:
        for n in ns:
            sel = [r for r in rows if r["d"] == d and r["n"] == n]
            row = {"d": d, "n": n, "reps": len(sel),
                   "botorch_s": statistics.median(r["botorch_s"] for r in sel),
                   "qbatch_s": statistics.median(r["qbatch_s"] for r in sel),
                   "ratio": statistics.median(r["ratio"] for r in sel), "target": TARGET}
            for optimizer in args.also:  # the screened optimizers: median time and ratio to BoTorch
                row[f"{optimizer}_s"] = statistics.median(r[f"{optimizer}_s"] for r in sel)
                row[f"{optimizer}_ratio"] = statistics.median(
                    r[f"{optimizer}_s"] / r["botorch_s"] for r in sel
                )
            summary.append(row)
    for s in summary:
        s["met"] = bool(s["ratio"] <= TARGET)
    out = Path(args.out)
    write_table(rows, out / "fit_speed", parquet=False)
    write_table(summary, out / "summary", parquet=False)
    print(format_table(summary))
    worst = max(s["ratio"] for s in summary)
    print(f"[fit_speed] worst median ratio qbatch / BoTorch: {worst:.2f} (target <= {TARGET})")
    return {"rows": rows, "summary": summary, "worst": worst}


if __name__ == "__main__":
    main()
