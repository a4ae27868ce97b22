"""How well does each surrogate recover a GLD problem's tau-quantile from the same data? (a GLD follow-up)

The GLD benchmark (benchmarks/gld.py) compares whole optimization loops; there HetGP with Thompson sampling
ties or beats the quantile SVGP. This benchmark isolates the model: on each GLD problem (objectives/gld.py,
paper 003 §4.3) it draws `n` uniform points in [0, 1]^d with one noisy outcome each, fits every model on the
same data (built by `orchestrator.models.build_model` with their default options, as the optimizer builds
them) and scores its estimate of q_tau(x) against the exact GLD quantile on 3,000 uniform test points:

- the quantile SVGP (`quantile`, asymmetric-Laplace likelihood: f is the tau-quantile, spec §1.1);
- HetGP (`heteroscedastic`: Gaussian with input-dependent variance; plug-in quantile mu + Phi^-1(tau) sigma,
  spec §1.7), the baseline that beats it in the loop;
- the exact GP (`exact-gp`: homoscedastic Gaussian; the same plug-in quantile);
- `quantile-dim`: the quantile SVGP with the dimension-scaled lengthscale prior instead of the spec's.

Metrics per (problem, tau, n, model): `rmse` of the estimate (original units), `corr` (Pearson, estimate vs
exact), and `regret`: q* minus the exact quantile at the test point the model ranks highest (what a
recommendation from this model would lose). Paired over problems (quantile SVGP minus each other model;
Wilcoxon p) in paired.csv.

Usage:
    python benchmarks/gld_fit.py --quick                       # CI smoke run (~20 s)
    python benchmarks/gld_fit.py --taus 0.75 0.95 --n 150 750 --problems 10 --workers 2
Results in --out (default results/gld_fit/): fits.csv/.parquet (every fit), summary.csv/.parquet (mean +-
95% CI over problems), paired.csv/.parquet.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from itertools import product
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks._common import format_table, mean_ci, paired_comparison, parse_index_list, write_table  # noqa: E402

#: benchmarked model -> (qbatch model name, options); "quantile" first: the others are compared with it
MODELS: dict[str, tuple[str, dict]] = {
    "quantile": ("quantile", {}),
    "quantile-dim": ("quantile", {"lengthscale_prior": "dim-scaled"}),
    "heteroscedastic": ("heteroscedastic", {}),
    "exact-gp": ("exact-gp", {}),
}
N_TEST = 3000
QUICK: dict[str, Any] = {
    "dim": 3, "taus": [0.75], "n": [40], "problems": "2",
    "model_options": {"quantile": {"max_steps": 100, "num_inducing": 16},
                      "heteroscedastic": {"max_steps": 100, "num_inducing": 16}},
}


def fit_one(dim: int, problem: int, tau: float, n: int, models: Sequence[str],
            model_options: dict[str, dict], threads: int) -> list[dict[str, Any]]:
    """Fit every model to one GLD problem's data (seeded by problem and n) and score it."""
    import numpy as np
    import torch

    from objectives.gld import GLDProblem
    from orchestrator.models import build_model

    torch.set_num_threads(threads)
    prob = GLDProblem(dim=dim, problem=problem)
    rng = np.random.default_rng([problem, dim, n, 0xF17])
    X = rng.random((n, dim))
    y = prob.sample_unit(X, rng)[0]
    Xt = rng.random((N_TEST, dim))
    q_true = prob.quantile_unit(Xt, tau)
    _, q_star = prob.optimum(tau)
    rows = []
    for name in models:
        kind, options = MODELS[name]
        opts = {"tau": tau, **options, **model_options.get(kind, {})}
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = build_model(kind, **opts)
            model.fit(torch.as_tensor(X), torch.as_tensor(y))
            with torch.no_grad():
                mu = model.objective_mean(torch.as_tensor(Xt)).numpy()
        loc, scale = model.outcome_transform
        est = loc + scale * mu
        rows.append({
            "dim": dim, "problem": problem, "tau": tau, "n": n, "model": name,
            "rmse": float(np.sqrt(np.mean((est - q_true) ** 2))),
            "corr": float(np.corrcoef(est, q_true)[0, 1]),
            "regret": float(q_star - q_true[int(np.argmax(est))]),
            "q_sd": float(np.std(q_true)), "seconds": time.perf_counter() - t0,
        })
    return rows


def summarize(rows: Sequence[dict]) -> tuple[list[dict], list[dict]]:
    """Mean +- 95% CI per (tau, n, model), and the quantile SVGP paired against each other model."""
    summary, paired = [], []
    settings = sorted({(r["dim"], r["tau"], r["n"]) for r in rows})
    for dim, tau, n in settings:
        sel = [r for r in rows if (r["dim"], r["tau"], r["n"]) == (dim, tau, n)]
        models = [m for m in MODELS if any(r["model"] == m for r in sel)]
        for m in models:
            row: dict[str, Any] = {"dim": dim, "tau": tau, "n": n, "model": m}
            for metric in ("rmse", "corr", "regret"):
                mean, half, k = mean_ci([r[metric] for r in sel if r["model"] == m])
                row[metric], row[f"{metric}_ci"], row["problems"] = mean, half, k
            summary.append(row)
        by = {m: {r["problem"]: r for r in sel if r["model"] == m} for m in models}
        for other in models:
            if other == "quantile" or "quantile" not in by:
                continue
            for metric in ("rmse", "regret"):
                cmp = paired_comparison({p: r[metric] for p, r in by["quantile"].items()},
                                        {p: r[metric] for p, r in by[other].items()})
                cmp["pairs"] = cmp.pop("n")
                paired.append({"dim": dim, "tau": tau, "n": n, "metric": metric, "vs": other, **cmp})
    return summary, paired


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="CI smoke run: 2 problems, n = 40, short fits")
    ap.add_argument("--dim", type=int, help="GLD dimension (3)")
    ap.add_argument("--taus", type=float, nargs="+", help="quantile levels (0.75 0.95)")
    ap.add_argument("--n", type=int, nargs="+", help="observations per fit (150 750: the loop's start and "
                                                     "end)")
    ap.add_argument("--problems", help="count (10 = problems 0..9), range 0-9, or list 1,4,7")
    ap.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    ap.add_argument("--workers", type=int, default=1, help="parallel processes (one problem x setting each)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per process")
    ap.add_argument("--out", default=str(REPO / "results" / "gld_fit"), help="output directory")
    args = ap.parse_args(argv)
    defaults = QUICK if args.quick else {"dim": 3, "taus": [0.75, 0.95], "n": [150, 750], "problems": "10",
                                         "model_options": {}}
    for key in ("dim", "taus", "n", "problems"):
        if getattr(args, key) is None:
            setattr(args, key, defaults[key])
    args.model_options = defaults["model_options"]
    for tau in args.taus:
        if not 0 < tau < 1:
            raise SystemExit(f"--taus: each level must be in (0, 1); got {tau}")
    if any(n < 10 for n in args.n):
        raise SystemExit(f"--n: at least 10 observations per fit; got {args.n}")
    args.problem_list = parse_index_list(args.problems, "--problems")
    return args


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    jobs = [(args.dim, p, tau, n, args.models, args.model_options, args.threads)
            for tau, n, p in product(args.taus, args.n, args.problem_list)]
    print(f"[gld_fit] d = {args.dim}, taus {args.taus}, n {args.n}, problems {args.problem_list}, models "
          f"{args.models}: {len(jobs)} data sets, {N_TEST} test points each", flush=True)
    rows: list[dict] = []
    if args.workers > 1:
        with ProcessPoolExecutor(args.workers) as pool:
            for part in pool.map(fit_one, *zip(*jobs)):
                rows += part
    else:
        for job in jobs:
            rows += fit_one(*job)
    out = Path(args.out)
    write_table(rows, out / "fits")
    summary, paired = summarize(rows)
    write_table(summary, out / "summary")
    if paired:
        write_table(paired, out / "paired")
    print("\nEstimate of q_tau against the exact GLD quantile, mean (95% CI half-width) over problems:")
    print(
        format_table(
            summary, ["tau", "n", "model", "rmse", "rmse_ci", "corr", "regret", "regret_ci", "problems"]
        )
    )
    if paired:
        print("\nPaired over problems, quantile SVGP minus the other model (negative = quantile SVGP "
              "better):")
        print(
            format_table(
                paired, ["tau", "n", "metric", "vs", "mean_diff", "ci", "wins", "pairs", "p_wilcoxon"]
            )
        )
    print(f"\nResults in {out}")
    return {"rows": rows, "summary": summary, "paired": paired, "out": out}


if __name__ == "__main__":
    main()
