"""Hyperparameter optimization: quantile TS against qLogNEI and random search at equal evaluations.

The HPO tasks of the calibrated-BO papers (calibrated-bo.md §2.3) with qbatch's objectives: `cnn`
(objectives/cnn.py: 6 training hyperparameters -> held-out classification error; default data scikit-learn's
8x8 digits, built in) and `lda` (objectives/lda.py: online LDA (minibatch, kappa, tau0) -> held-out
perplexity on gensim's bundled Lee corpus). Both are minimized and noisy (the seed sets the initial weights
and the data order). Each method is built exactly as the central actor builds it: a config dict validated by
`orchestrator.config.load_config`, the objective by `objectives.registry.load_objective`, the space by
`cfg.build_space`, then `orchestrator.ask_tell.AskTellOptimizer` with the config's model/proposer/tau/seed.
The optimization runs in **synchronous batches in this process**: ask B points, evaluate B, tell B, refit,
repeat (the orchestrator's `synchronous: true` protocol minus Ray; the actor wraps the same optimizer).

Methods (model + proposer): quantile-ts (quantile SVGP of the median + Thompson sampling), quantile-ts-dim
(the same with the dimension-scaled lengthscale prior instead of the spec's), qlognei (exact GP + BoTorch
qLogNEI), random (uniform random search; model-free, never fitted). Run r of every method uses
config seed r, hence the same scrambled-Sobol initial design and the same per-trial evaluation seeds (trial
ids "0-0", ... are shared), so the initial design is evaluated once per (task, seed) and its values are
reused by the other methods (an evaluation cache keyed by objective, parameters and seed: a speed-up only,
the CNN is bit-for-bit deterministic on the CPU for a fixed seed and thread count).

Metric: best found objective (the lowest observed error / perplexity, failures excluded) after each
synchronous batch, vs the number of evaluations, as the papers' "minimum found" (calibrated-bo.md §2.5).
Columns `best_params`/`best_seed` name the evaluation that produced it (re-running the objective there
with that seed reproduces the value). Columns `recommended`/`predicted` add the model's recommendation (spec
§1.7, `AskTellOptimizer.best()`) of the latest fit; the model is not refitted after the last batch (the metric
does not need it), so at the final checkpoint that is the fit the last batch was proposed from.
Reported: mean +- 95% Student-t CI over seeds at the end, and the same for the average of the best-so-far
curve over the batch checkpoints after the initial design (an area-under-the-curve companion); paired
comparisons over seeds (mean difference with its 95% CI, wins, Wilcoxon p) for every pair of methods.

Usage:
    python benchmarks/hpo.py --quick                            # CI smoke run (< 30 s, both tasks)
    python benchmarks/hpo.py --tasks cnn lda --seeds 5 --initial 10 --budget 50 --batch 5
    python benchmarks/hpo.py --tasks cnn --cnn-epochs 6 --seeds 0-9 --workers 4 --resume
Results in --out (default results/hpo/): runs/*.csv (one per task x method x seed, written as they finish;
--resume skips those present with the same protocol), hpo.csv + hpo.parquet (every checkpoint),
summary.csv/.parquet, paired.csv/ .parquet, hpo_<task>.png (best found vs evaluations, mean +- 95% CI over
seeds).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import sys
import time
import traceback
import warnings
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks._common import (  # noqa: E402
    MODELS,
    PROPOSERS,
    Method,
    build_optimizer,
    code_mix_note,
    code_version,
    config_tag,
    format_table,
    mean_ci,
    merge_options,
    paired_comparison,
    parse_index_list,
    plot_curves,
    preflight,
    read_table,
    write_table,
)

MODE = "synchronous batches, in-process AskTellOptimizer built from a validated config (the orchestrator's " \
       "synchronous protocol without Ray)"


METHODS: dict[str, Method] = {
    "quantile-ts": Method("quantile", "thompson"),
    # the same with the dimension-scaled lengthscale prior (orchestrator/models/svgp.py `lengthscale_prior`):
    # with 10-50 points in 6-D the spec's prior (mode 0.074) holds the fit at lengthscales that generalize
    # nothing
    "quantile-ts-dim": Method("quantile", "thompson", model_options={"lengthscale_prior": "dim-scaled"}),
    "qlognei": Method("exact-gp", "qlognei"),
    # random search never fits; its config still names a model (the schema requires one)
    "random": Method("exact-gp", "random"),
}
#: label of each task's value
VALUE_NAMES = {"cnn": "test error", "lda": "held-out perplexity"}
#: default objective options of the full mode (--cnn-epochs / --lda-max-passes override)
FULL_OBJECTIVES: dict[str, dict[str, Any]] = {
    "cnn": {"name": "cnn", "options": {"dataset": "digits", "epochs": 6}},
    "lda": {"name": "lda", "options": {"corpus": "lee"}},
}
QUICK: dict[str, Any] = {
    "tasks": ["cnn", "lda"],
    "seeds": [0, 1],
    "initial": 3,
    "budget": 5,
    "batch": 2,
    "methods": list(METHODS),
    # smoke only: one epoch of one conv block / two passes, and a narrowed space (config `space` overrides) of
    # cheap settings
    "objectives": {
        "cnn": {"name": "cnn", "options": {"dataset": "digits", "epochs": 1, "conv_layers": 1},
                "space": {"batch_size": {"type": "int", "low": 256, "high": 512, "step": 32},
                          "conv_channels": {"type": "int", "low": 128, "high": 160, "step": 16},
                          "fc_units": {"type": "int", "low": 256, "high": 320, "step": 16}}},
        "lda": {"name": "lda", "options": {"corpus": "lee", "max_passes": 2, "num_topics": 5},
                "space": {"minibatch": {"type": "int", "low": 16, "high": 128, "step": 1, "log": True}}},
    },
    "model_options": {"quantile": {"max_steps": 150, "warm_max_steps": 30, "num_inducing": 8}},
    "proposer_options": {"thompson": {"raw_samples": 128, "num_restarts": 2, "num_features": 256},
                         "qlognei": {"raw_samples": 64, "num_restarts": 2, "maxiter": 50}},
}


@dataclass(frozen=True)
class Protocol:
    """One HPO protocol: initial design size, evaluation budget, synchronous batch size, tau of quantile
    TS."""

    initial: int
    budget: int
    batch: int
    tau: float = 0.5

    def checkpoints(self) -> list[int]:
        """Evaluation counts after each synchronous batch (initial design included)."""
        ends, n = [self.initial], self.initial
        while n < self.budget:
            n = min(self.budget, n + self.batch)
            ends.append(n)
        return ends


# ---------------------------------------------------------------------------------------------------- runs
#: evaluation cache: (objective key, params, seed) -> (value or None, error)
_EVALS: dict[str, tuple[Any, str]] = {}


def method_config(name: str, task: str, proto: Protocol, seed: int, objective: Mapping[str, Any],
                  model_options: Mapping[str, Any], proposer_options: Mapping[str, Any]) -> dict[str, Any]:
    """The experiment config (orchestrator/config/) of one method run."""
    m = METHODS[name]
    cfg = {
        "name": f"hpo-{task}-{name}",
        "objective": {"name": objective["name"], "options": dict(objective.get("options", {}))},
        "tau": proto.tau,
        "model": {"type": m.model, "options": {**m.model_options, **model_options.get(m.model, {})}},
        "proposer": {
            "type": m.proposer,
            "options": {**m.proposer_options, **proposer_options.get(m.proposer, {})},
        },
        "batch_size": proto.batch,
        "initial_design": proto.initial,
        "budget": proto.budget,
        "synchronous": True,
        "seed": int(seed),
    }
    if objective.get("space"):
        cfg["space"] = {k: dict(v) for k, v in objective["space"].items()}
    return cfg


def evaluate_cached(objective: Any, key: str, params: Mapping[str, Any], seed: int) -> tuple[Any, str, bool]:
    """(value or None, error message, whether it came from the cache) of one evaluation.

    An exception becomes a failed trial (its type and message), as in the orchestrator's workers.
    """
    ck = json.dumps([key, {k: params[k] for k in sorted(params)}, int(seed)], default=str)
    if ck in _EVALS:
        v, err = _EVALS[ck]
        return v, err, True
    try:
        result = objective.evaluate(params, int(seed))
        v, err = float(getattr(result, "value", result)), ""
    except Exception as exc:  # noqa: BLE001 (objective code is user code)
        v, err = None, f"{type(exc).__name__}: {exc}"
    _EVALS[ck] = (v, err)
    return v, err, False


def optimize(name: str, task: str, proto: Protocol, seed: int, objective: Mapping[str, Any],
             model_options: Mapping[str, Any], proposer_options: Mapping[str, Any]) -> list[dict]:
    """One synchronous BO run; one row per batch: best found so far, recommendation, timings."""
    cfg, obj, opt, key = build_optimizer(
        method_config(name, task, proto, seed, objective, model_options, proposer_options))
    sign = 1.0 if opt.direction == "minimize" else -1.0  # best found = lowest value in the objective's sense
    n = failures = cached = 0
    fit_s = propose_s = eval_s = 0.0
    best, best_params, best_seed = math.inf, "{}", -1
    rows: list[dict] = []

    def evaluate(trials: Sequence[Any]) -> None:
        nonlocal n, failures, cached, eval_s, best, best_params, best_seed
        t0 = time.perf_counter()
        for t in trials:
            v, err, hit = evaluate_cached(obj, key, t.params, t.seed)
            cached += hit
            status = opt.tell(t.trial_id, None, error=err) if err else opt.tell(t.trial_id, v)
            if status == "completed" and sign * v < best:
                best, best_params, best_seed = sign * v, json.dumps(t.params), int(t.seed)
            failures += status == "failed"
            n += 1
        eval_s += time.perf_counter() - t0

    def fit() -> None:
        nonlocal fit_s
        if opt.needs_model() and opt.num_completed >= 2:
            t0 = time.perf_counter()
            opt.fit()
            fit_s += time.perf_counter() - t0

    def record() -> None:
        rec, pred = ("{}", math.nan)
        if opt.model is not None:
            params, predicted = opt.best()
            rec, pred = json.dumps(params), float(predicted)
        rows.append(
            {
                "task": task,
                "method": name,
                "seed": seed,
                "n_evals": n,
                "best_value": sign * best if math.isfinite(best) else math.nan,
                "best_params": best_params,
                "best_seed": best_seed,
                "recommended": rec,
                "predicted": pred,
                "failures": failures,
                "cached_evals": cached,
                "fit_s": fit_s,
                "propose_s": propose_s,
                "eval_s": eval_s,
            }
        )

    t_start = time.perf_counter()
    evaluate(opt.ask(cfg.initial_design))
    fit()
    record()
    while n < cfg.budget:
        t0 = time.perf_counter()
        trials = opt.ask(min(cfg.batch_size, cfg.budget - n), fit=False)
        propose_s += time.perf_counter() - t0
        evaluate(trials)
        if n < cfg.budget:  # the metric is the best observed value: no fit after the last batch
            fit()
        record()
    for r in rows:
        r["run_s"] = time.perf_counter() - t_start
    return rows


def run_one(
    name: str,
    task: str,
    proto: Protocol,
    seed: int,
    objective: Mapping[str, Any],
    model_options: Mapping[str, Any],
    proposer_options: Mapping[str, Any],
    threads: int = 1,
) -> list[dict]:
    """One (task, method, seed) run with its protocol columns; a failing run becomes one row with `error`."""
    import torch

    torch.set_num_threads(threads)
    warnings.filterwarnings("ignore", category=UserWarning)
    warnings.filterwarnings("ignore", category=RuntimeWarning)
    base = {"initial": proto.initial, "budget": proto.budget, "batch": proto.batch, "tau": proto.tau,
            "objective": json.dumps(objective, sort_keys=True), "mode": MODE}
    t0 = time.perf_counter()
    try:
        rows = optimize(name, task, proto, seed, objective, model_options, proposer_options)
        err = ""
    except Exception as exc:  # one failing run must not lose the others
        traceback.print_exc()
        err = f"{type(exc).__name__}: {exc}"
        rows = [{"task": task, "method": name, "seed": seed, "n_evals": 0, "best_value": math.nan}]
    rows = [{**r, **base, "error": err} for r in rows]
    print(f"[hpo] {task} {name} seed {seed}: best {rows[-1]['best_value']:.5g} after {rows[-1]['n_evals']} "
          f"evals ({time.perf_counter() - t0:.1f} s: fit {rows[-1].get('fit_s', 0):.1f}, propose "
          f"{rows[-1].get('propose_s', 0):.1f}, evaluate {rows[-1].get('eval_s', 0):.1f}) {err}", flush=True)
    return rows


def run_seed(
    task: str,
    seed: int,
    methods: Sequence[str],
    proto: Protocol,
    objective: Mapping[str, Any],
    model_options: Mapping[str, Any],
    proposer_options: Mapping[str, Any],
    threads: int = 1,
) -> list[list[dict]]:
    """Every method on one (task, seed) in one process (they share the initial design's evaluations)."""
    return [
        run_one(m, task, proto, seed, objective, model_options, proposer_options, threads) for m in methods
    ]


# --------------------------------------------------------------------------------------------------- analysis
def _final(rows: Sequence[dict], task: str, method: str) -> dict[int, float]:
    last: dict[int, dict] = {}
    for r in rows:
        if r["task"] == task and r["method"] == method and not r.get("error"):
            if r["seed"] not in last or r["n_evals"] > last[r["seed"]]["n_evals"]:
                last[r["seed"]] = r
    return {s: r["best_value"] for s, r in last.items() if not math.isnan(r["best_value"])}


def _curve_average(rows: Sequence[dict], task: str, method: str) -> dict[int, float]:
    """Per seed: the best found averaged over the checkpoints after the initial design (an AUC)."""
    per: dict[int, list[tuple[int, float]]] = {}
    for r in rows:
        if r["task"] == task and r["method"] == method and not r.get("error"):
            per.setdefault(r["seed"], []).append((r["n_evals"], r["best_value"]))
    out = {}
    for s, pts in per.items():
        pts.sort()
        after = [v for _, v in pts[1:]] or [pts[0][1]]
        out[s] = sum(after) / len(after)
    return out


def summarize(rows: Sequence[dict]) -> tuple[list[dict], list[dict]]:
    """Summary (mean +- 95% CI over seeds of the final best and of the curve average) and paired
    comparisons."""
    summary, paired = [], []
    for task in dict.fromkeys(r["task"] for r in rows):
        methods = [m for m in METHODS if any(r["task"] == task and r["method"] == m for r in rows)]
        finals = {m: _final(rows, task, m) for m in methods}
        avgs = {m: _curve_average(rows, task, m) for m in methods}
        for m in methods:
            if not finals[m]:
                continue
            mean, half, k = mean_ci(list(finals[m].values()))
            a_mean, a_half, _ = mean_ci(list(avgs[m].values()))
            sel = [r for r in rows if r["task"] == task and r["method"] == m and not r.get("error")]
            n_evals = max(r["n_evals"] for r in sel)
            last = [r for r in sel if r["n_evals"] == n_evals]
            summary.append(
                {
                    "task": task,
                    "method": m,
                    "n_evals": n_evals,
                    "seeds": k,
                    "best_mean": mean,
                    "best_ci95": half,
                    "best_min": min(finals[m].values()),
                    "best_max": max(finals[m].values()),
                    "curve_avg_mean": a_mean,
                    "curve_avg_ci95": a_half,
                    "failures": sum(r["failures"] for r in last),
                    "run_s_mean": mean_ci([r["run_s"] for r in last])[0],
                }
            )
        for a, b in combinations(methods, 2):
            if finals[a] and finals[b]:
                c = paired_comparison(finals[a], finals[b])
                ca = paired_comparison(avgs[a], avgs[b])
                paired.append(
                    {
                        "task": task,
                        "method": a,
                        "versus": b,
                        "n": c["n"],
                        "mean_diff": c["mean_diff"],
                        "ci": c["ci"],
                        "wins": c["wins"],
                        "ties": c["ties"],
                        "p_wilcoxon": c["p_wilcoxon"],
                        "significant": bool(not math.isnan(c["ci"]) and abs(c["mean_diff"]) > c["ci"]),
                        "avg_mean_diff": ca["mean_diff"],
                        "avg_ci": ca["ci"],
                        "avg_wins": ca["wins"],
                    }
                )
    return summary, paired


def make_plots(rows: Sequence[dict], out: Path) -> list[Path]:
    """One PNG per task: best found vs evaluations, mean +- 95% CI over seeds, one curve per method."""
    paths = []
    for task in dict.fromkeys(r["task"] for r in rows):
        curves = {}
        for m in METHODS:
            runs: dict[int, dict[int, float]] = {}
            for r in rows:
                if r["task"] == task and r["method"] == m and not r.get("error"):
                    runs.setdefault(r["seed"], {})[r["n_evals"]] = r["best_value"]
            if not runs:
                continue
            xs = sorted({n for pts in runs.values() for n in pts})
            reps = [[pts[x] for x in xs] for pts in runs.values() if all(x in pts for x in xs)]
            if reps:
                curves[m] = (xs, reps)
        if curves:
            paths.append(plot_curves(curves, out / f"hpo_{task}.png", logy=False,
                                     ylabel=f"best {VALUE_NAMES.get(task, 'value')} found",
                                     title=f"HPO {task}: best found vs evaluations (mean +- 95% CI over "
                                           "seeds)"))
    return paths


# ---------------------------------------------------------------------------------------------------- CLI
def _parse_seeds(spec: str) -> list[int]:
    return parse_index_list(spec, "--seeds", example=5)

def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="CI smoke run: both tasks, 2 seeds, 5 evaluations, "
                                                         "cheap settings")
    ap.add_argument("--tasks", nargs="+", choices=sorted(FULL_OBJECTIVES), help="tasks (default: cnn lda)")
    ap.add_argument("--methods", nargs="+", choices=list(METHODS), help="methods (default: all)")
    ap.add_argument("--seeds", default="5", help="count (5 = seeds 0..4), range 0-4, or list 1,4,7")
    ap.add_argument("--initial", type=int, default=10, help="initial Sobol design (10)")
    ap.add_argument("--budget", type=int, default=50, help="total evaluations per run (50, the papers' CNN "
                                                           "budget)")
    ap.add_argument("--batch", type=int, default=5, help="synchronous batch size (5)")
    ap.add_argument("--tau", type=float, default=0.5, help="quantile level of quantile TS (0.5: the median)")
    ap.add_argument("--cnn-epochs", type=int, help="CNN training epochs (objective default 6)")
    ap.add_argument("--lda-max-passes", type=int, help="online-LDA passes at most (objective default 20)")
    ap.add_argument("--model-options", type=json.loads, default={},
                    help='JSON: model name -> options, e.g. {"quantile": {"num_inducing": 32}}')
    ap.add_argument("--proposer-options", type=json.loads, default={},
                    help='JSON: proposer name -> options, e.g. {"qlognei": {"num_restarts": 4}}')
    ap.add_argument("--workers", type=int, default=1, help="parallel processes (one (task, seed) each)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per process")
    ap.add_argument("--resume", action="store_true",
                    help="skip runs whose file in OUT/runs holds this protocol's rows (others are run again)")
    ap.add_argument("--out", default=str(REPO / "results" / "hpo"), help="output directory")
    args = ap.parse_args(argv)
    if args.workers < 1 or args.threads < 1:
        ap.error("--workers and --threads must be >= 1")
    args.model_options = merge_options(QUICK["model_options"] if args.quick else {}, args.model_options,
                                       "--model-options", MODELS)
    args.proposer_options = merge_options(
        QUICK["proposer_options"] if args.quick else {},
        args.proposer_options,
        "--proposer-options",
        PROPOSERS,
    )
    if args.quick:
        args.tasks = args.tasks or QUICK["tasks"]
        args.seeds = QUICK["seeds"]
        args.initial, args.budget, args.batch = QUICK["initial"], QUICK["budget"], QUICK["batch"]
        args.methods = args.methods or QUICK["methods"]
        args.objectives = {t: QUICK["objectives"][t] for t in args.tasks}
    else:
        args.tasks = args.tasks or list(FULL_OBJECTIVES)
        args.seeds = _parse_seeds(args.seeds)
        args.methods = args.methods or list(METHODS)
        args.objectives = {t: json.loads(json.dumps(FULL_OBJECTIVES[t])) for t in args.tasks}
        if args.cnn_epochs is not None and "cnn" in args.objectives:
            args.objectives["cnn"]["options"]["epochs"] = args.cnn_epochs
        if args.lda_max_passes is not None and "lda" in args.objectives:
            args.objectives["lda"]["options"]["max_passes"] = args.lda_max_passes
    if not (1 <= args.initial <= args.budget) or args.batch < 1:
        ap.error(f"need 1 <= --initial ({args.initial}) <= --budget ({args.budget}) and --batch >= 1")
    if args.initial < 2:
        ap.error("--initial must be >= 2 (a model fit needs two results)")
    if not 0 < args.tau < 1:
        ap.error(f"--tau must be in (0, 1); got {args.tau}")
    return args


def settings_tag(method: str, task: str, args: argparse.Namespace, options: bool = True) -> str:
    """Hash of the model and proposer options a run of `method` on `task` uses (`--model-options`,
    `--proposer-options` over the method's own; `options=False`: the method's own only, which every run file
    written before rows recorded it used)."""
    cfg = method_config(method, task, Protocol(args.initial, args.budget, args.batch, args.tau), 0,
                        args.objectives[task], args.model_options if options else {},
                        args.proposer_options if options else {})
    return config_tag([cfg["model"], cfg["proposer"]])


def recorded(path: Path, args: argparse.Namespace) -> list[dict]:
    """The rows of run file `path` that belong to this invocation: a selected (task, method, seed), run under
    this protocol (initial, budget, batch, tau; a failed run's row counts under any), with these objective
    options and these model and proposer options (`settings_tag`). `--resume` skips a run only when its file
    has such rows: a file of other settings is run again (and replaced), not skipped and then left out of the
    tables."""
    if not path.exists():
        return []
    wanted = {(t, m, s) for t in args.tasks for m in args.methods for s in args.seeds}
    rows = []
    for r in read_table(path):
        r = {**r, "seed": int(r["seed"]), "n_evals": int(r["n_evals"])}
        for k in ("initial", "budget", "batch", "failures", "cached_evals", "best_seed"):
            r[k] = int(float(r[k])) if r.get(k) not in (None, "") else 0
        for k in ("best_value", "predicted", "fit_s", "propose_s", "eval_s", "run_s", "tau"):
            r[k] = float(r[k]) if r.get(k) not in (None, "") else math.nan
        r["error"] = r.get("error") or ""
        # the level too (else `--resume --tau 0.5` takes runs at tau 0.9 for done and tabulates them)
        same = (r["initial"], r["budget"], r["batch"], r["tau"]) == (
            args.initial,
            args.budget,
            args.batch,
            args.tau,
        ) or r["error"]
        if (r["task"], r["method"], r["seed"]) in wanted and same \
                and r.get("objective") == json.dumps(args.objectives[r["task"]], sort_keys=True) \
                and (r.get("settings") or settings_tag(r["method"], r["task"], args, options=False)) \
                == settings_tag(r["method"], r["task"], args):
            rows.append(r)
    return rows


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    out = Path(args.out)
    (out / "runs").mkdir(parents=True, exist_ok=True)
    proto = Protocol(args.initial, args.budget, args.batch, args.tau)
    print(f"[hpo] {MODE}; tasks {args.tasks}; methods {args.methods}; seeds {args.seeds}; initial "
          f"{args.initial}, budget {args.budget}, batch {args.batch}; objectives "
          f"{json.dumps(args.objectives)}", flush=True)
    t_start = time.perf_counter()
    preflight({f"{task} {m}": functools.partial(build_optimizer, method_config(
        m, task, proto, 0, args.objectives[task], args.model_options, args.proposer_options))
        for task in args.tasks for m in args.methods}, "hpo")

    def path_of(task: str, m: str, s: int) -> Path:
        return out / "runs" / f"{task}-{m}-s{s}"

    jobs = []
    for task in args.tasks:
        for s in args.seeds:
            todo = [
                m
                for m in args.methods
                if not (args.resume and recorded(path_of(task, m, s).with_suffix(".csv"), args))
            ]
            if todo:
                jobs.append((task, s, todo))
    job_args = (proto,)
    extra = (args.model_options, args.proposer_options, args.threads)

    def save(result: list[list[dict]]) -> None:
        for rows in result:
            r0 = rows[0]
            tag = settings_tag(r0["method"], r0["task"], args)
            write_table([{**r, "settings": tag, "code": code_version()} for r in rows],
                        path_of(r0["task"], r0["method"], r0["seed"]), parquet=False)

    if args.workers == 1:
        for task, s, todo in jobs:  # one process: each run is saved as soon as it ends
            for m in todo:
                save([run_one(m, task, proto, s, args.objectives[task], *extra)])
    else:
        import multiprocessing as mp

        with ProcessPoolExecutor(args.workers, mp_context=mp.get_context("spawn")) as pool:
            futures = [pool.submit(run_seed, task, s, todo, *job_args, args.objectives[task], *extra)
                       for task, s, todo in jobs]
            for fut in as_completed(futures):
                save(fut.result())

    rows = [r for path in sorted((out / "runs").glob("*.csv")) for r in recorded(path, args)]
    rows.sort(
        key=lambda r: (args.tasks.index(r["task"]), list(METHODS).index(r["method"]), r["seed"], r["n_evals"])
    )
    if note := code_mix_note(rows):
        print(f"[hpo] {note}", flush=True)
    write_table(rows, out / "hpo")
    summary, paired = summarize(rows)
    if summary:
        write_table(summary, out / "summary")
    if paired:
        write_table(paired, out / "paired")
    plots = make_plots(rows, out)

    print(f"\n[hpo] {MODE}")
    print("\nBest found (lowest observed error / perplexity) at the end, mean and 95% CI half-width over "
          "seeds; curve_avg = best found averaged over the checkpoints after the initial design:")
    print(format_table(summary, ["task", "method", "n_evals", "seeds", "best_mean", "best_ci95", "best_min",
                                 "best_max", "curve_avg_mean", "curve_avg_ci95", "failures", "run_s_mean"]))
    if paired:
        print("\nPaired over seeds (method - versus; negative = method better; significant = 95% CI excludes "
              "0):")
        print(
            format_table(
                paired,
                [
                    "task",
                    "method",
                    "versus",
                    "n",
                    "mean_diff",
                    "ci",
                    "wins",
                    "ties",
                    "p_wilcoxon",
                    "significant",
                    "avg_mean_diff",
                    "avg_ci",
                    "avg_wins",
                ],
            )
        )
    errors = [r for r in rows if r["error"]]
    if errors:
        print(f"\n{len(errors)} failed runs: " + "; ".join(f"{r['task']} {r['method']} seed {r['seed']}: "
                                                           f"{r['error']}"
                                                      for r in errors))
    print(f"\n[hpo] wrote {out} ({len(rows)} rows, {len(plots)} plots) in "
          f"{time.perf_counter() - t_start:.1f} s")
    return {"rows": rows, "summary": summary, "paired": paired, "plots": plots}


if __name__ == "__main__":
    main()
