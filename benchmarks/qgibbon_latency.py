"""Latency of one q = 100 batch: Q-GIBBON (qbatch) beside BoTorch's GIBBON built by sequential greedy.

quantile-expectile-bo.md §3.4 claims the cached greedy (no re-conditioning, chol(C_PP) grown by a row per
step) scales to B = 100. This script times one batch of each, with equal restarts and raw samples:

- qbatch: `QGibbon` on a fitted `QuantileSVGP` (two latents, asymmetric Laplace), pending set and
  chol(C_PP) cached across the greedy steps;
- BoTorch: `qLowerBoundMaxValueEntropy` (GIBBON, Moss et al. 2021) on a fitted `SingleTaskVariationalGP`,
  q points by `optimize_acqf(..., sequential=True)` (each step re-evaluates the posterior of X ∪ X_pending).

Both use the same data (a noisy Hartmann-3 with skewed, input-dependent noise), the same candidate-set /
grid size for the max values, the same number of inducing points, restarts and raw samples. Model fitting
is not timed; the two methods are timed alternately `--repeats` times and the best time of each is kept
(the machine may be shared). Prints both times and the ratio (target: qbatch <= 0.5 × BoTorch) and writes one
CSV row per method to `--out` (default results/qgibbon_latency/latency.csv).

Usage:
    python benchmarks/qgibbon_latency.py            # q = 100, d = 3, n = 150
    python benchmarks/qgibbon_latency.py --quick    # q = 10, small sizes (CI smoke run)
"""

from __future__ import annotations

import argparse
import csv
import platform
import sys
import time
import warnings
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from orchestrator.acquisition.qgibbon import QGibbon  # noqa: E402
from orchestrator.models.quantile_svgp import QuantileSVGP  # noqa: E402

FIELDS = [
    "method",
    "q",
    "d",
    "n",
    "num_inducing",
    "num_restarts",
    "raw_samples",
    "grid_size",
    "maxiter",
    "repeats",
    "seconds",
    "all_seconds",
    "ms_per_point",
    "ratio_to_botorch",
    "threads",
    "device",
    "torch",
    "botorch",
]


def make_data(n: int, d: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Noisy Hartmann (maximize −H) with right-skewed noise whose scale grows along x_0."""
    from botorch.test_functions import Hartmann

    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, d, generator=g, dtype=torch.float64)
    f = -Hartmann(dim=d)(X) if d in (3, 4, 6) else -((X - 0.3) ** 2).sum(-1)
    noise = torch.empty(n, dtype=torch.float64).exponential_(generator=g) - 1.0
    return X, f + 0.3 * (0.5 + X[:, 0]) * noise


def fit_qbatch(X, Y, args):
    model = QuantileSVGP(
        tau=args.tau, num_inducing=args.num_inducing, max_steps=args.fit_steps, seed=args.seed
    )
    model.fit(X, Y)
    return model


def time_qgibbon(model, X, args) -> float:
    prop = QGibbon(grid_size=args.grid_size, raw_samples=args.raw_samples, num_restarts=args.num_restarts,
                   maxiter=args.maxiter)
    t0 = time.perf_counter()
    B = prop.propose(model, args.q, X_observed=X, seed=args.seed)
    seconds = time.perf_counter() - t0
    assert B.shape == (args.q, X.shape[-1])
    return seconds


def fit_botorch(X, Y, args):
    from botorch.fit import fit_gpytorch_mll
    from botorch.models import SingleTaskVariationalGP
    from botorch.models.transforms import Standardize
    from gpytorch.mlls import VariationalELBO

    torch.manual_seed(args.seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = SingleTaskVariationalGP(X, Y.unsqueeze(-1), inducing_points=args.num_inducing,
                                        outcome_transform=Standardize(m=1))
        mll = VariationalELBO(model.likelihood, model.model, num_data=X.shape[0])
        fit_gpytorch_mll(mll, optimizer_kwargs={"options": {"maxiter": args.fit_steps}})
    return model


def time_botorch(model, X, args) -> float:
    from botorch.acquisition.max_value_entropy_search import qLowerBoundMaxValueEntropy
    from botorch.optim import optimize_acqf

    torch.manual_seed(args.seed)
    d = X.shape[-1]
    g = torch.Generator().manual_seed(args.seed)
    candidate_set = torch.cat([X, torch.rand(args.grid_size, d, generator=g, dtype=torch.float64)])
    acq = qLowerBoundMaxValueEntropy(model, candidate_set, num_mv_samples=10, train_inputs=X)
    bounds = torch.stack([torch.zeros(d), torch.ones(d)]).to(torch.float64)
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        B, _ = optimize_acqf(
            acq,
            bounds,
            q=args.q,
            num_restarts=args.num_restarts,
            raw_samples=args.raw_samples,
            sequential=True,
            options={"maxiter": args.maxiter},
        )
    seconds = time.perf_counter() - t0
    assert B.shape == (args.q, d)
    return seconds


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="small sizes for a smoke run (q = 10)")
    p.add_argument("--q", type=int, default=None)
    p.add_argument("--d", type=int, default=3)
    p.add_argument("--n", type=int, default=None, help="observations (default 50·d)")
    p.add_argument("--tau", type=float, default=0.75)
    p.add_argument("--num-inducing", type=int, default=50)
    p.add_argument("--num-restarts", type=int, default=None)
    p.add_argument("--raw-samples", type=int, default=None)
    p.add_argument("--grid-size", type=int, default=None, help="random points of the max-value grid (1000·d)")
    p.add_argument("--maxiter", type=int, default=None, help="L-BFGS-B iterations per start (both methods)")
    p.add_argument("--fit-steps", type=int, default=None, help="optimizer steps of each model fit (not "
                                                               "timed)")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    p.add_argument("--repeats", type=int, default=None, help="interleaved timings of each method; the best "
                                                             "is kept")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=REPO / "results" / "qgibbon_latency")
    args = p.parse_args(argv)
    quick = {
        "repeats": 1,
        "q": 10,
        "n": 40,
        "num_restarts": 2,
        "raw_samples": 64,
        "grid_size": 200,
        "maxiter": 20,
        "fit_steps": 30,
    }
    full = {
        "repeats": 2,
        "q": 100,
        "n": 50 * args.d,
        "num_restarts": 10,
        "raw_samples": 512,
        "grid_size": 1000 * args.d,
        "maxiter": 200,
        "fit_steps": 500,
    }
    for key, val in (quick if args.quick else full).items():
        if getattr(args, key) is None:
            setattr(args, key, val)
    if args.quick:
        args.num_inducing = min(args.num_inducing, 16)
    if args.threads is not None:
        torch.set_num_threads(args.threads)

    X, Y = make_data(args.n, args.d, args.seed)
    m_q, m_b = fit_qbatch(X, Y, args), fit_botorch(X, Y, args)
    # interleaved repeats, best time of each (latency under a shared, noisy machine)
    times_q, times_b = [], []
    for r in range(args.repeats):
        times_q.append(time_qgibbon(m_q, X, args))
        print(f"[{r + 1}/{args.repeats}] qbatch Q-GIBBON: {times_q[-1]:.2f} s; BoTorch ...", flush=True)
        times_b.append(time_botorch(m_b, X, args))
        print(f"[{r + 1}/{args.repeats}] BoTorch GIBBON: {times_b[-1]:.2f} s", flush=True)
    t_q, t_b = min(times_q), min(times_b)
    ratio = t_q / t_b
    import botorch

    common = {
        "q": args.q,
        "d": args.d,
        "n": args.n,
        "num_inducing": args.num_inducing,
        "num_restarts": args.num_restarts,
        "raw_samples": args.raw_samples,
        "grid_size": args.grid_size,
        "maxiter": args.maxiter,
        "repeats": args.repeats,
        "threads": torch.get_num_threads(),
        "device": platform.processor() or "cpu",
        "torch": torch.__version__,
        "botorch": botorch.__version__,
    }
    rows = [
        {
            "method": "qbatch.QGibbon",
            "seconds": round(t_q, 4),
            "all_seconds": " ".join(f"{t:.3f}" for t in times_q),
            "ms_per_point": round(1000 * t_q / args.q, 2),
            "ratio_to_botorch": round(ratio, 4),
            **common,
        },
        {
            "method": "botorch.qLowerBoundMaxValueEntropy(sequential)",
            "seconds": round(t_b, 4),
            "all_seconds": " ".join(f"{t:.3f}" for t in times_b),
            "ms_per_point": round(1000 * t_b / args.q, 2),
            "ratio_to_botorch": 1.0,
            **common,
        },
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "latency.csv"
    new = not path.exists()
    with open(path, "a", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=FIELDS)
        if new:
            w.writeheader()
        w.writerows(rows)
    print(f"q = {args.q}, d = {args.d}, n = {args.n}, restarts = {args.num_restarts}, raw = "
          f"{args.raw_samples}, grid = {args.grid_size}, threads = {torch.get_num_threads()}")
    print(f"  qbatch Q-GIBBON           {t_q:9.2f} s  ({1000 * t_q / args.q:.1f} ms/point)")
    print(f"  BoTorch GIBBON sequential {t_b:9.2f} s  ({1000 * t_b / args.q:.1f} ms/point)")
    print(f"  ratio qbatch / BoTorch    {ratio:9.3f}  (target <= 0.5: "
          f"{'met' if ratio <= 0.5 else 'NOT met'})")
    print(f"  wrote {path}")
    return rows


if __name__ == "__main__":
    main()
