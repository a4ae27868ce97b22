"""The answer a run gives: recommendation regret against the best point evaluated, on problems with known
quantiles.

Each method runs qbatch's library loop (`AskTellOptimizer`) in synchronous batches on noisy problems whose
tau-quantile is exact, as a new user would run it (library defaults: initial design max(2 d + 2, 5)):

- `skewed-3d`: `objectives.skewed.SkewedNoiseProblem`, skewed input-dependent noise whose mean-optimal and
  10%-optimal settings differ (qbatch's own problem);
- `gld-2d`, `gld-6d`: GLD problems (objectives.gld, paper 003 §4.3), problem number = seed;
- `quickstart`: the README's quickstart (examples/quickstart.yaml: the synthetic 16-D laser, tau 0.1, 25
  initial Sobol points, batches of 25, 175 evaluations), in the library loop without the 1 s measurements.

Per run it records the regret q* - q_tau(x) of the recommendation (`best()` after a last fit), of the best
point evaluated (the largest exact quantile among the evaluated inputs), the problem's range (max - min of the
exact quantile over the space: the gap target allows 1% of it), and of every recommendation rule of
`orchestrator.recommend` applied to the same final model, plus whether the model warned that it learned no
lengthscale. Methods: quantile-ts (qbatch's default model and proposer, the last 10% of the budget
re-evaluating the best observed points as a run's default `reevaluation` does), exact-ts (exact GP +
Thompson), qlognei (exact GP + BoTorch's qLogNEI), sobol (a Sobol search; its answer is its best observed
value's point).

Usage:
    python benchmarks/quality.py --quick                      # CI smoke run (~1 minute)
    python benchmarks/quality.py --workers 2 --out benchmarks/results/quality/loop
    python benchmarks/quality.py --problems skewed-3d --methods quantile-ts qlognei --seeds 0-4
    python benchmarks/quality.py --summary                   # rebuild benchmarks/results/quality/summary.csv
Results in --out: runs/<problem>-<method>-<seed>.json (one per run, written as it finishes; --resume skips
them) and, for model-based methods, runs/<...>.npz (the observed unit inputs X, the outcomes y as the
optimizer holds them, their exact quantiles q, and q_star), runs.csv (one row per run), summary.csv (mean +-
95% CI per problem x method) and paired.csv (quantile TS against each other method, paired over seeds).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks._common import (  # noqa: E402
    ask_batch,
    code_version,
    format_table,
    limited_threads,
    mean_ci,
    paired_comparison,
    parse_index_list,
    write_table,
)

#: problem name -> (dimension, budget, batch size, initial design; None: the library's default)
PROBLEMS: dict[str, tuple[int, int, int, int | None]] = {
    "skewed-3d": (3, 80, 10, None), "gld-2d": (2, 60, 10, None), "gld-6d": (6, 120, 10, None),
    "quickstart": (16, 175, 25, 25),
}
#: method -> (model, proposer, model options, proposer options)
METHODS: dict[str, tuple[str, str, dict, dict]] = {
    "quantile-ts": ("quantile", "thompson", {}, {}),
    "quantile-ts-noreeval": ("quantile", "thompson", {}, {}),
    "quantile-ts-m128": ("quantile", "thompson", {"num_inducing": 128, "inducing_placement": "kmeans",
                                                  "lengthscale_prior": "spec", "optimizer": "adam"}, {}),
    "quantile-ts-const": ("quantile", "thompson", {"noise_scale": "constant"}, {}),
    "quantile-ts-gp-scale": ("quantile", "thompson", {"noise_scale": "gp"}, {}),
    "quantile-ts-short": ("quantile", "thompson", {"max_steps": 200, "warm_max_steps": 50}, {}),
    "quantile-ts-const-short": ("quantile", "thompson", {"noise_scale": "constant", "max_steps": 200,
                                                         "warm_max_steps": 50}, {}),
    "quantile-ts-local": ("quantile", "thompson", {}, {"local_fraction": 0.25}),
    "quantile-ts-local50": ("quantile", "thompson", {}, {"local_fraction": 0.5}),
    "quantile-ts-local-reeval": ("quantile", "thompson", {}, {"local_fraction": 0.25}),
    "quantile-ts-local10-reeval": ("quantile", "thompson", {}, {"local_fraction": 0.1}),
    "quantile-ts-restarts": ("quantile", "thompson", {}, {}),
    "quantile-ts-reeval": ("quantile", "thompson", {}, {}),
    "quantile-ts-reeval1": ("quantile", "thompson", {}, {}),
    "quantile-ts-reeval20": ("quantile", "thompson", {}, {}),
    "quantile-ts-rec-model": ("quantile", "thompson", {"recommendation_scale": "model"}, {}),
    "quantile-ts-repeat-model": ("quantile", "thompson", {}, {}),
    "het-ts": ("heteroscedastic", "thompson", {}, {}),
    "exact-ts": ("exact-gp", "thompson", {}, {}),
    "qlognei": ("exact-gp", "qlognei", {}, {"sequential": False}),
    "sobol": ("exact-gp", "sobol", {}, {}),
}
#: methods whose every refit also fits from scratch and keeps the lower loss
#: (`AskTellOptimizer.refit_restarts`)
RESTARTING = {"quantile-ts-restarts"}
#: methods whose re-evaluations take the recommendation rule's order alone (`AskTellOptimizer.repeat_order`
#: "model"; the default "mixed" alternates it with the best observed outcome's)
MODEL_REPEAT_ORDER = {"quantile-ts-repeat-model"}
#: method -> (fraction, repeats): methods that spend that fraction of the budget, at its end, re-evaluating
#: their best observed points, that many more times each (`AskTellOptimizer.ask_repeats`), as a run's default
#: `reevaluation` (0.1, 1) does; quantile-ts-noreeval, quantile-ts-local and quantile-ts-local50 search to the
#: end
REEVALUATING = {"quantile-ts": (0.1, 1), "quantile-ts-rec-model": (0.1, 1), "quantile-ts-reeval": (0.1, 2),
                "quantile-ts-repeat-model": (0.1, 1), "quantile-ts-reeval1": (0.1, 1), "het-ts": (0.1, 1),
                "quantile-ts-local-reeval": (0.1, 1), "quantile-ts-local10-reeval": (0.1, 1),
                "quantile-ts-reeval20": (0.2, 1)}
#: the methods of the protocol; the others are screened variants of the quantile model and het-ts (the
#: heteroscedastic SVGP with Thompson sampling and the default's re-evaluation)
DEFAULT_METHODS = ["quantile-ts", "exact-ts", "qlognei", "sobol"]
TAU = 0.1
QUICK: dict[str, Any] = {"problems": ["skewed-3d"], "methods": ["quantile-ts", "sobol"], "seeds": [0],
                         "budget": 24, "batch": 6}


def make_problem(name: str, seed: int) -> Any:
    if name == "quickstart":
        from objectives.laser import LaserSimulator

        return LaserSimulator()
    if name.startswith("skewed"):
        from objectives.skewed import SkewedNoiseProblem

        return SkewedNoiseProblem(dim=PROBLEMS[name][0])
    from objectives.gld import GLDProblem

    return GLDProblem(dim=PROBLEMS[name][0], problem=seed)


def quantile_range(prob: Any, seed: int, tau: float = TAU) -> float:
    """The benchmark's range for problem `prob` (`make_problem`'s, run with `seed`; or a GLD problem of
    benchmarks/gld.py): max - min of the exact tau-quantile over the search space (the minimum by the same
    multi-start L-BFGS-B as the problem's optimum), the unit of the recommendation gap's 1% allowance."""
    import numpy as np

    from objectives.functions import maximize_on_box

    d = len(prob.space)
    _, q_max = prob.optimum(tau)
    _, neg_min = maximize_on_box(lambda X: -prob.quantile_unit(X, tau), np.zeros(d), np.ones(d), n_raw=5000,
                                 n_starts=20, seed=seed)
    return float(q_max + neg_min)


def _quantiles(prob: Any, points: Sequence[dict]) -> Any:
    import numpy as np

    return np.asarray([prob.quantile(p, TAU) for p in points], dtype=np.float64)


def run_one(problem_name: str, method: str, seed: int, budget: int, batch: int, threads: int,
            initial: int | None = None) -> dict[str, Any]:
    """One run of `method` on `problem_name` with `seed`; returns its row."""
    from orchestrator.ask_tell import AskTellOptimizer
    from orchestrator.ask_tell.repeats import repeat_share
    from orchestrator.errors import ModelWarning
    from orchestrator.recommend import RULES, recommend_index

    with limited_threads(threads), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ModelWarning)
        warnings.simplefilter("ignore", UserWarning)
        warnings.simplefilter("ignore", RuntimeWarning)
        prob = make_problem(problem_name, seed)
        model, proposer, m_opts, p_opts = METHODS[method]
        if proposer == "sobol":
            p_opts = {**p_opts, "seed": seed}
        opt = AskTellOptimizer(prob.space, model=model, tau=TAU, proposer=proposer, seed=seed,
                               initial_design=initial, model_options=m_opts, proposer_options=p_opts)
        opt.refit_restarts = method in RESTARTING
        if method in MODEL_REPEAT_ORDER:
            opt.repeat_order = "model"
        t0 = time.perf_counter()
        evaluated: list[dict] = []
        n = 0
        fraction, repeats = REEVALUATING.get(method, (0.0, 1))
        final = repeat_share(budget, fraction)
        while n < budget:
            trials = ask_batch(opt, n, budget, batch, final, repeats)
            for t in trials:
                opt.tell(t.trial_id, prob.evaluate(t.params, t.seed))
                evaluated.append(dict(t.params))
            n += len(trials)
        opt.fit()
        params, predicted = opt.best()
        seconds = time.perf_counter() - t0
        q_eval = _quantiles(prob, evaluated)
        _, q_opt = prob.optimum(TAU)
        q_star = max(q_opt, float(q_eval.max()))
        q_rec = float(_quantiles(prob, [params])[0])
        row: dict[str, Any] = {
            "problem": problem_name,
            "method": method,
            "seed": seed,
            "tau": TAU,
            "budget": budget,
            "batch": batch,
            "q_star": q_star,
            "regret_rec": q_star - q_rec,
            "regret_best_evaluated": q_star - float(q_eval.max()),
            "predicted": float(predicted),
            "seconds": seconds,
            "q_range": quantile_range(prob, seed) if problem_name != "quickstart" else float("nan"),
            "lengthscale_warning": any("learned no lengthscale" in str(w.message) for w in caught),
        }
        if method == "sobol":  # a search's answer is its best observed value's point
            bo = opt.best_observed()
            row["regret_best_observed"] = q_star - float(_quantiles(prob, [bo[0]])[0])
        elif opt.model is not None:
            Xo, yo = opt.observations()
            points = opt.space.from_unit(Xo)
            for rule in RULES:
                row[f"regret_{rule}"] = q_star - float(
                    _quantiles(prob, [points[recommend_index(opt.recommender, Xo, rule)]])[0]
                )
            # the run's data, for screening recommendation rules and final fits without re-running the search
            row["_data"] = {"X": Xo.numpy(), "y": yo.numpy(), "q": _quantiles(prob, points), "q_star": q_star}
        row["code"] = code_version()
    return row


def summarize(rows: Sequence[dict]) -> tuple[list[dict], list[dict]]:
    summary, paired = [], []
    keys = sorted({(r["problem"], r["method"]) for r in rows})
    for problem, method in keys:
        sel = [r for r in rows if r["problem"] == problem and r["method"] == method]
        out: dict[str, Any] = {"problem": problem, "method": method, "runs": len(sel)}
        for col in ("regret_rec", "regret_best_evaluated"):
            m, h, _ = mean_ci([float(r[col]) for r in sel])
            out[col], out[col + "_ci"] = m, h
        out["warnings"] = sum(bool(r["lengthscale_warning"]) for r in sel)
        summary.append(out)
    for problem in sorted({r["problem"] for r in rows}):
        base = {
            r["seed"]: float(r["regret_rec"])
            for r in rows
            if r["problem"] == problem and r["method"] == "quantile-ts"
        }
        for method in sorted({r["method"] for r in rows if r["problem"] == problem} - {"quantile-ts"}):
            other = {
                r["seed"]: float(r["regret_rec"])
                for r in rows
                if r["problem"] == problem and r["method"] == method
            }
            if base and other:
                c = paired_comparison(base, other)
                paired.append({"problem": problem, "a": "quantile-ts", "b": method, **c})
    return summary, paired


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--quick", action="store_true", help="CI smoke run: skewed-3d, 2 methods, one seed, 24 evaluations"
    )
    ap.add_argument("--problems", nargs="+", choices=sorted(PROBLEMS), help="problems (default: all)")
    ap.add_argument(
        "--methods",
        nargs="+",
        choices=sorted(METHODS),
        help="methods (default: quantile-ts exact-ts qlognei sobol)",
    )
    ap.add_argument("--seeds", default="0-4", help="range 0-4, count 5, or list 0,2")
    ap.add_argument("--workers", type=int, default=1, help="parallel processes")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per process")
    ap.add_argument("--resume", action="store_true", help="skip the runs whose files are in OUT/runs")
    ap.add_argument(
        "--summary",
        action="store_true",
        help=(
            "run nothing: rebuild benchmarks/results/quality/summary.csv, one row per target, from the "
            "recorded tables (benchmarks/_quality_summary.py)"
        ),
    )
    ap.add_argument("--out", default=str(REPO / "results" / "quality"), help="output directory")
    args = ap.parse_args(argv)
    if args.workers < 1 or args.threads < 1:
        ap.error("--workers and --threads must be >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.summary:
        from benchmarks import _quality_summary

        return {"summary_rows": _quality_summary.main()}
    problems = args.problems or (
        QUICK["problems"] if args.quick else [p for p in PROBLEMS if p != "quickstart"]
    )
    methods = args.methods or (QUICK["methods"] if args.quick else DEFAULT_METHODS)
    seeds = QUICK["seeds"] if args.quick else parse_index_list(args.seeds, "--seeds", 5)
    out = Path(args.out)
    runs = out / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    jobs = []
    for p in problems:
        _, budget, batch, initial = PROBLEMS[p]
        if args.quick:
            budget, batch = QUICK["budget"], QUICK["batch"]
        for m in methods:
            for s in seeds:
                path = runs / f"{p}-{m}-{s}.json"
                if not (args.resume and path.exists()):
                    jobs.append((path, (p, m, s, budget, batch, args.threads, initial)))
    print(f"[quality] {len(jobs)} runs to do in {out}", flush=True)
    def record(path: Path, row: dict[str, Any]) -> None:
        data = row.pop("_data", None)
        if data is not None:
            import numpy as np

            np.savez_compressed(path.with_suffix(".npz"), **data)
        path.write_text(json.dumps(row, indent=1))
        print(f"[quality] {path.stem}: regret {row['regret_rec']:.4f} (best evaluated "
              f"{row['regret_best_evaluated']:.4f}), {row['seconds']:.0f} s", flush=True)

    if args.workers == 1:
        for path, job in jobs:
            record(path, run_one(*job))
    else:
        with ProcessPoolExecutor(args.workers) as pool:
            futures = {pool.submit(run_one, *job): path for path, job in jobs}
            for fut, path in futures.items():
                record(path, fut.result())
    selected = {(p, m, s) for p in problems for m in methods for s in seeds}
    rows = [json.loads(f.read_text()) for f in sorted(runs.glob("*.json"))]
    rows = [r for r in rows if (r["problem"], r["method"], r["seed"]) in selected]
    summary, paired = summarize(rows)
    write_table(rows, out / "runs", parquet=False)
    write_table(summary, out / "summary_loop", parquet=False)
    if paired:
        write_table(paired, out / "paired", parquet=False)
    print(format_table(summary))
    if paired:
        print(format_table(paired, ["problem", "a", "b", "n", "mean_diff", "ci", "wins", "p_wilcoxon"]))
    return {"rows": rows, "summary": summary, "paired": paired}


if __name__ == "__main__":
    main()
