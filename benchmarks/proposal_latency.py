"""Proposal latency: one Thompson-sampling batch and one warm refit, qbatch beside BoTorch, on the same data.

Sources: quantile-expectile-bo.md §2 for the sampler, §1.4-1.6 for the model. Per setting
(n observations, d dims, m inducing points, q batch size) it times, in one process and on one data set:

(a) **batch proposal** — qbatch: `ThompsonSampling.propose` on a fitted `QuantileSVGP` (q Matheron paths
    from its `sparse_parts`, one shared candidate set, one batched L-BFGS-B); BoTorch: the idiomatic
    pathwise Thompson sampling on a `SingleTaskVariationalGP` with the same m (Matérn-5/2 ARD):
    `PathwiseThompsonSampling` (q paths from `draw_matheron_paths`) maximized by `optimize_acqf(q=q)`.
    Equal raw samples N (each path is scored at N random points in both), restarts R (qbatch: R starts per
    path; BoTorch: R restarts, each a q-batch), L-BFGS-B iterations and random features (BoTorch's default
    1024 for both).
(b) **warm refit after 100 new points** — qbatch: `QuantileSVGP.fit` on n + 100 points, warm-started from its
    fit on n (k-means Z refresh, q(u) projection, early-stopped minibatch Adam); BoTorch: 100 full-batch Adam
    steps (`fit_gpytorch_mll_torch`) of its already fitted SVGP on the n + 100 points.

Each call is timed with `time.perf_counter` and its peak memory is the peak process RSS above the RSS at
the start of the call (psutil, sampled every 2 ms in a thread; torch's CPU allocations are invisible to
tracemalloc). Model fits that only set the stage are not timed. Printed targets: proposal ratio ≤ 0.5,
warm-refit ratio ≤ 0.1 at n = 20000, m = 512, and peak memory growing at most linearly in n.

Usage:
    python benchmarks/proposal_latency.py                       # the full grid (slow: hours on 2 cores)
    python benchmarks/proposal_latency.py --settings 2000:8:128:100 20000:16:512:1000
    python benchmarks/proposal_latency.py --quick               # one tiny setting (CI smoke run)
Results: `<out>/proposal_latency.csv` and `.parquet` (default out: results/proposal_latency/).
"""

from __future__ import annotations

import argparse
import csv
import gc
import itertools
import platform
import sys
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import psutil
import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from orchestrator.acquisition.thompson import ThompsonSampling, default_num_restarts, default_raw_samples  # noqa: E402
from orchestrator.models import build_model  # noqa: E402

#: the issue's grid: n x d x m x q
GRID = [(n, d, m, q) for n, d, m, q in itertools.product((2000, 20000), (8, 16), (128, 512), (100, 1000))]
#: the CI smoke setting
QUICK = (300, 2, 16, 4)
#: targets printed beside the ratios
TARGET_PROPOSAL = 0.5
TARGET_REFIT = 0.1
NEW_POINTS = 100
FIELDS = ["n", "d", "m", "q", "task", "library", "seconds", "peak_mib", "ratio_qbatch_to_botorch", "target",
          "raw_samples", "num_restarts", "maxiter", "num_features", "threads", "machine", "torch", "botorch"]


@dataclass(frozen=True)
class Setting:
    n: int
    d: int
    m: int
    q: int

    @classmethod
    def parse(cls, text: str) -> Setting:
        try:
            n, d, m, q = (int(v) for v in text.split(":"))
        except ValueError:
            raise SystemExit(f"--settings entries must be n:d:m:q integers; got {text!r}") from None
        if min(n, d, m, q) < 1:
            raise SystemExit(f"--settings entries must be positive; got {text!r}")
        return cls(n, d, m, q)


def make_data(n: int, d: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Uniform inputs in [0, 1]^d; a smooth multimodal mean plus right-skewed noise growing along x_0."""
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, d, generator=g, dtype=torch.float64)
    f = torch.sin(3 * torch.pi * X).mean(-1) - ((X - 0.3) ** 2).sum(-1)
    noise = torch.empty(n, dtype=torch.float64).exponential_(generator=g) - 1.0
    return X, f + 0.3 * (0.5 + X[:, 0]) * noise


class PeakRSS:
    """Peak resident memory (MiB) above the value at entry, sampled in a background thread."""

    def __init__(self, interval: float = 0.002) -> None:
        self.interval = interval
        self.proc = psutil.Process()
        self.peak_mib = 0.0

    def _watch(self) -> None:
        while not self._stop.is_set():
            self._peak = max(self._peak, self.proc.memory_info().rss)
            self._stop.wait(self.interval)

    def __enter__(self) -> PeakRSS:
        gc.collect()
        self._start = self._peak = self.proc.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self._peak = max(self._peak, self.proc.memory_info().rss)
        self.peak_mib = (self._peak - self._start) / 2**20


def timed(fn: Callable[[], Any]) -> tuple[Any, float, float]:
    """(result, seconds, peak MiB above the start) of one call."""
    with PeakRSS() as mem:
        t0 = time.perf_counter()
        out = fn()
        seconds = time.perf_counter() - t0
    return out, seconds, mem.peak_mib


# ------------------------------------------------------------------------------------------------------------
# BoTorch side
# ------------------------------------------------------------------------------------------------------------
def botorch_svgp(X: torch.Tensor, Y: torch.Tensor, m: int):
    """BoTorch's SingleTaskVariationalGP with m inducing points and a Matérn-5/2 ARD kernel (standardized
    Y)."""
    from botorch.models.approximate_gp import SingleTaskVariationalGP
    from gpytorch.kernels import MaternKernel, ScaleKernel

    Ys = ((Y - Y.mean()) / Y.std()).unsqueeze(-1)
    kernel = ScaleKernel(MaternKernel(nu=2.5, ard_num_dims=X.shape[-1]))
    return SingleTaskVariationalGP(X, Ys, inducing_points=m, covar_module=kernel).to(torch.float64)


def botorch_adam_steps(model, X: torch.Tensor, Y: torch.Tensor, steps: int) -> None:
    """`steps` full-batch Adam steps (lr 0.01) of the variational ELBO on (X, Y), BoTorch's torch fitter."""
    from botorch.optim.fit import fit_gpytorch_mll_torch
    from gpytorch.mlls import VariationalELBO

    Ys = ((Y - Y.mean()) / Y.std()).unsqueeze(-1)
    model.model.train_inputs = (X,)
    model.model.train_targets = Ys.squeeze(-1)
    model.train()
    mll = VariationalELBO(model.likelihood, model.model, num_data=X.shape[0])
    fit_gpytorch_mll_torch(mll, step_limit=steps, stopping_criterion=None,
                           optimizer=partial(torch.optim.Adam, lr=0.01))
    model.eval()


def botorch_thompson(model, q: int, d: int, raw_samples: int, restarts: int, maxiter: int) -> torch.Tensor:
    """Pathwise TS the BoTorch way: q Matheron paths, their sum maximized by optimize_acqf over q-batches."""
    from botorch.acquisition.thompson_sampling import PathwiseThompsonSampling
    from botorch.optim import optimize_acqf

    acq = PathwiseThompsonSampling(model)  # draws q paths (draw_matheron_paths) at its first q-batch call
    bounds = torch.stack([torch.zeros(d), torch.ones(d)]).to(torch.float64)
    # raw scoring of N q-batches in memory-bounded chunks (~64 MiB of features per chunk)
    init_batch = max(1, 2**23 // (q * 1024))
    X, _ = optimize_acqf(
        acq,
        bounds=bounds,
        q=q,
        num_restarts=restarts,
        raw_samples=raw_samples,
        options={"maxiter": maxiter, "init_batch_limit": init_batch, "batch_limit": restarts},
    )
    return X


# ------------------------------------------------------------------------------------------------------------
def run_setting(s: Setting, args: argparse.Namespace) -> list[dict[str, Any]]:
    X_all, Y_all = make_data(s.n + NEW_POINTS, s.d, seed=args.seed)
    X, Y = X_all[: s.n], Y_all[: s.n]
    restarts = args.restarts or default_num_restarts(s.d, s.q)
    raw = args.raw_samples or default_raw_samples(s.d, restarts)
    common = {"n": s.n, "d": s.d, "m": s.m, "q": s.q, "raw_samples": raw, "num_restarts": restarts,
              "maxiter": args.maxiter, "num_features": args.num_features, "threads": torch.get_num_threads(),
              "machine": f"{platform.machine()} {psutil.cpu_count()} cpus", "torch": torch.__version__}
    import botorch

    common["botorch"] = botorch.__version__

    # stage: both models fitted on the first n points (not timed)
    qb = build_model("quantile", tau=args.tau, num_inducing=s.m, max_steps=args.cold_steps, seed=args.seed)
    qb.fit(X, Y)
    bt = botorch_svgp(X, Y, s.m)
    botorch_adam_steps(bt, X, Y, args.fit_steps)

    rows = []
    if "thompson" in args.tasks:
        rows.extend(_time_thompson(s, args, qb, bt, X, raw, restarts, common))
    if "refit" in args.tasks:
        rows.extend(_time_refit(args, qb, bt, X_all, Y_all, common))
    return rows


def _time_thompson(
    s: Setting, args, qb, bt, X, raw: int, restarts: int, common: dict
) -> list[dict[str, Any]]:
    rows = []
    ts = ThompsonSampling(
        num_features=args.num_features, raw_samples=raw, num_restarts=restarts, maxiter=args.maxiter
    )
    _, t_q, mem_q = timed(lambda: ts.propose(qb, s.q, X_observed=X, seed=args.seed))
    _, t_b, mem_b = timed(lambda: botorch_thompson(bt, s.q, s.d, raw, restarts, args.maxiter))
    rows.append({**common, "task": "thompson_batch", "library": "qbatch", "seconds": t_q, "peak_mib": mem_q,
                 "ratio_qbatch_to_botorch": t_q / t_b, "target": TARGET_PROPOSAL})
    rows.append({**common, "task": "thompson_batch", "library": "botorch", "seconds": t_b, "peak_mib": mem_b,
                 "ratio_qbatch_to_botorch": float("nan"), "target": float("nan")})
    return rows


def _time_refit(args, qb, bt, X_all, Y_all, common: dict) -> list[dict[str, Any]]:
    rows = []
    _, t_q, mem_q = timed(lambda: qb.fit(X_all, Y_all))
    _, t_b, mem_b = timed(lambda: botorch_adam_steps(bt, X_all, Y_all, args.fit_steps))
    rows.append({**common, "task": f"warm_refit_+{NEW_POINTS}", "library": "qbatch", "seconds": t_q,
                 "peak_mib": mem_q, "ratio_qbatch_to_botorch": t_q / t_b, "target": TARGET_REFIT})
    rows.append({**common, "task": f"warm_refit_+{NEW_POINTS}", "library": "botorch", "seconds": t_b,
                 "peak_mib": mem_b, "ratio_qbatch_to_botorch": float("nan"), "target": float("nan")})
    return rows


def print_table(rows: list[dict[str, Any]], memory_growth: bool = True) -> None:
    head = (
        f"{'n':>6} {'d':>3} {'m':>4} {'q':>5}  {'task':<16} {'qbatch s':>9} {'botorch s':>9} {'ratio':>7} "
        f"{'target':>7} {'qb MiB':>8} {'bt MiB':>8}"
    )
    print(head)
    print("-" * len(head))
    for qb, bt in zip(rows[0::2], rows[1::2]):
        target = qb["target"]
        if qb["task"].startswith("warm") and not (qb["n"] == 20000 and qb["m"] == 512):
            target_txt = "-"
        else:
            target_txt = f"<={target:g}" + (" ok" if qb["ratio_qbatch_to_botorch"] <= target else " MISS")
        print(f"{qb['n']:>6} {qb['d']:>3} {qb['m']:>4} {qb['q']:>5}  {qb['task']:<16} {qb['seconds']:>9.3f} "
              f"{bt['seconds']:>9.3f} {qb['ratio_qbatch_to_botorch']:>7.3f} {target_txt:>7} "
              f"{qb['peak_mib']:>8.1f} {bt['peak_mib']:>8.1f}", flush=True)
    if not memory_growth:
        return
    # memory vs n: peak at the largest n over the smallest n, for settings that differ only in n
    by_key: dict[tuple, dict[int, float]] = {}
    for r in rows:
        if r["library"] == "qbatch":
            by_key.setdefault((r["task"], r["d"], r["m"], r["q"]), {})[r["n"]] = r["peak_mib"]
    for (task, d, m, q), peaks in sorted(by_key.items()):
        if len(peaks) > 1:
            lo, hi = min(peaks), max(peaks)
            growth = peaks[hi] / max(peaks[lo], 1e-9)
            print(f"qbatch peak memory, {task} d={d} m={m} q={q}: x{growth:.2f} for n x{hi / lo:g} "
                  f"(target: at most linear, <= x{hi / lo:g})")


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="one tiny setting n:d:m:q = "
                                                        f"{':'.join(map(str, QUICK))} (CI smoke)")
    p.add_argument("--settings", nargs="+", metavar="N:D:M:Q", help="settings to run (default: the full "
                                                                    "grid)")
    p.add_argument("--out", type=Path, default=REPO / "results" / "proposal_latency", help="output folder")
    p.add_argument("--raw-samples", type=int, default=None, help="random candidates per path (default "
                                                                 "max(5000, 1000 d))")
    p.add_argument("--restarts", type=int, default=None, help="L-BFGS-B starts per path (default: qbatch's "
                                                              "rule)")
    p.add_argument("--maxiter", type=int, default=200, help="L-BFGS-B iterations")
    p.add_argument("--num-features", type=int, default=1024,
                   help="qbatch's random Fourier features (BoTorch's PathwiseThompsonSampling always uses "
                        "its default 1024)")
    p.add_argument("--fit-steps", type=int, default=100, help="BoTorch full-batch Adam steps per fit")
    p.add_argument("--cold-steps", type=int, default=500, help="qbatch cold-fit step cap (stage only, not "
                                                               "timed)")
    p.add_argument("--tasks", nargs="+", choices=("thompson", "refit"), default=["thompson", "refit"],
                   help="which timings to run (default both)")
    p.add_argument("--tau", type=float, default=0.8)
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's "
                                                             "choice)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.quick:
        settings = [Setting(*QUICK)]
        args.raw_samples = args.raw_samples or 128
        args.restarts = args.restarts or 2
        args.maxiter = min(args.maxiter, 15)
        args.fit_steps = min(args.fit_steps, 10)
        args.cold_steps = min(args.cold_steps, 50)
    elif args.settings:
        settings = [Setting.parse(t) for t in args.settings]
    else:
        settings = [Setting(*g) for g in GRID]

    rows: list[dict[str, Any]] = []
    args.out.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # BoTorch input-scaling and optimizer warnings would flood the table
        for s in settings:
            print(f"running n={s.n} d={s.d} m={s.m} q={s.q} ...", flush=True)
            new = run_setting(s, args)
            rows.extend(new)
            print_table(new, memory_growth=False)
            write_results(rows, args.out)  # after every setting, so a long run that is stopped keeps its rows
    print("\nall settings:")
    print_table(rows)
    print(f"\nwrote {args.out / 'proposal_latency.csv'} and .parquet")
    return rows


def write_results(rows: list[dict[str, Any]], out: Path) -> None:
    """`out`/proposal_latency.csv and .parquet with one row per (setting, task, library)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    with open(out / "proposal_latency.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    pq.write_table(pa.Table.from_pylist(rows), out / "proposal_latency.parquet")


if __name__ == "__main__":
    main()
