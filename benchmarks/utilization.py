"""Worker utilization of qbatch against a plain Ray loop and Ray Tune.

U = busy evaluation time / (slots x span), the span running from the first evaluation's start to the last
one's end; busy time is measured inside each evaluation around the objective call, the same way for every
system. The load is `objectives.timing.SleepObjective`: lognormal evaluation times (default mean 2 s,
CV 0.5) around a cheap analytic value, so a slot is "busy" exactly while an evaluation sleeps.

Systems, all in one run, each repeat on a fresh local Ray:
  qbatch        the central actor with the full quantile SVGP and Thompson batches, streaming (default mode)
  qbatch-sync   the same in the papers' synchronous protocol (propose B, wait for all B, refit)
  plain-ray     model-free: random points as plain Ray tasks, refilled by ray.wait(num_returns=1) - the
                practical limit of this machine
  tune          Ray Tune + OptunaSearch(GPSampler) under ConcurrencyLimiter(slots), reuse_actors=False
  tune-reuse    the same with reuse_actors=True

Slots: Ray starts with `num_cpus = slots` (16) even on a 2-core machine, and each evaluation asks for one
CPU, so exactly `slots` evaluations run at once in every system. The evaluations only sleep, so 16 of them
need no cores; the model, Ray's own processes and Tune's bookkeeping share the real cores.

A single U is one draw of the tail (the slots idling while the last evaluations finish): on this load its
run-to-run spread is a standard deviation of ~0.012 even for a perfect scheduler. `--repeats R` runs every
system R times (seeds seed .. seed+R-1) and compares means; the summary adds the "ideal (simulated)" row, a
zero-overhead greedy scheduler on the same load (`ideal_utilization`), which bounds every system, and every
run gets U_ideal_same_draw, the U a zero-overhead scheduler reaches with that run's own durations in its
start order: U / U_ideal_same_draw ("efficiency") removes the tail's luck from the comparison.

Usage (inside scripts/loopback):
    python benchmarks/utilization.py --out bench-out            # 640 evaluations, Tune with --tune-evals 160
    python benchmarks/utilization.py --quick --out /tmp/u        # 96 evaluations of ~0.5 s, a small model
Writes utilization.csv (one row per system and repeat) and summary.csv (per system: mean U, 95% CI, ratios).
Targets: qbatch U >= 0.9, >= 3x Ray Tune's best, within 0.05 of the plain Ray loop.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks._common import mean_ci, read_table  # noqa: E402
from objectives.timing import SleepObjective  # noqa: E402

SYSTEMS = ("qbatch", "qbatch-sync", "plain-ray", "tune", "tune-reuse")
#: `--quick`'s model and proposer options: the smoke run checks that every system runs and is measured, so
#: qbatch's model is the quantile SVGP and Thompson sampling, small (the default model's final fit alone took
#: 16 s of it)
QUICK_MODEL = {"num_inducing": 16, "max_steps": 60, "warm_max_steps": 20}
QUICK_PROPOSER = {"num_features": 128, "raw_samples": 128, "num_restarts": 1, "maxiter": 20}


def span_utilization(intervals: list[tuple[float, float]], slots: int) -> tuple[float, float, float]:
    """(U, busy seconds, span seconds) of `(start, end)` intervals on `slots` slots."""
    if not intervals:
        return float("nan"), 0.0, 0.0
    busy = float(sum(e - s for s, e in intervals))
    span = max(e for _, e in intervals) - min(s for s, _ in intervals)
    return busy / (slots * span), busy, span


def greedy_utilization(durations: Sequence[float], slots: int) -> float:
    """U of a zero-overhead greedy schedule of `durations` in this order: each starts the instant a slot
    frees."""
    free = np.zeros(slots)
    for d in durations:
        i = int(np.argmin(free))
        free[i] += d
    return float(np.sum(durations) / (slots * free.max())) if len(durations) else float("nan")


def ideal_utilization(
    n: int, slots: int, mean_s: float, cv: float, reps: int = 2000, seed: int = 0
) -> tuple[float, float]:
    """(mean, std) of U for a zero-overhead greedy scheduler on the same load (simulated).

    `n` lognormal evaluation times (mean `mean_s`, coefficient of variation `cv`) start in order on the
    first free of `slots` slots, each the instant a slot frees. What is left below U = 1 is the tail: the
    slots idling while the last evaluations finish. It bounds every real system, and its spread from one
    draw of durations to the next is the noise of a single measured U.
    """
    from objectives.timing import lognormal_params

    mu, sigma = lognormal_params(mean_s, cv)
    rng = np.random.default_rng(seed)
    us = np.array([greedy_utilization(rng.lognormal(mu, sigma, n), slots) for _ in range(reps)])
    return float(us.mean()), float(us.std(ddof=1))


# ----------------------------------------------------------------------------- qbatch
def run_qbatch(args: argparse.Namespace, n: int, synchronous: bool) -> dict[str, Any]:
    from orchestrator.runner import run_experiment
    from orchestrator.store import RunStore

    name = "qbatch-sync" if synchronous else "qbatch"
    run_dir = str(Path(args.out) / f"{name}-run-{args.run_seed}-{int(time.time())}")
    cfg = {
        "name": name,
        "objective": {"name": "sleep", "options": _objective_options(args)},
        "tau": 0.1,
        "model": {"type": "quantile", "options": dict(QUICK_MODEL) if args.quick else {}},
        "proposer": {"type": "thompson", "options": dict(QUICK_PROPOSER) if args.quick else {}},
        "batch_size": args.batch_size,
        "initial_design": args.initial_design,
        "budget": n,
        "max_concurrent": args.slots,
        "synchronous": synchronous,
        "timeout_s": 120,
        "seed": args.run_seed,
        "run_dir": run_dir,
    }
    t0 = time.time()
    summary = run_experiment(cfg, progress=not args.no_progress, out=sys.stderr,
                             actor_options={"queue_low": args.queue_low} if args.queue_low else None)
    wall = time.time() - t0
    events = RunStore.open(run_dir).events()
    done = [e for e in events if e.kind in ("completed", "failed")]
    refits = [e.info["seconds"] for e in events if e.kind == "refit"]
    props = sorted(
        {
            (e.batch_id, e.info["proposal_seconds"])
            for e in events
            if e.kind == "proposed" and e.info.get("source") == "model"
        }
    )
    return {
        "intervals": [(e.started_at, e.ended_at) for e in done],
        "wall_s": wall,
        "failed": sum(e.kind == "failed" for e in done),
        "refits": len(refits),
        "refit_s_median": float(np.median(refits)) if refits else float("nan"),
        "proposal_s_median": float(np.median([p for _, p in props])) if props else float("nan"),
        "best": (summary.get("best_predicted") or summary.get("best_observed") or {}).get("value"),
        "run_dir": run_dir,
    }


# ----------------------------------------------------------------------------- plain Ray loop
def run_plain(args: argparse.Namespace, n: int) -> dict[str, Any]:
    import ray

    obj = SleepObjective(**_objective_options(args))

    @ray.remote(num_cpus=1)
    def evaluate(params: dict, seed: int) -> tuple[float, float, float]:
        t0 = time.time()
        value = obj.evaluate(params, seed).value
        return value, t0, time.time()

    rng = np.random.default_rng(args.run_seed)
    names = list(obj.space)

    def submit(i: int) -> Any:
        return evaluate.remote(
            {k: float(v) for k, v in zip(names, rng.random(len(names)))}, args.run_seed * 100_003 + i
        )

    t0 = time.time()
    inflight = [submit(i) for i in range(min(args.slots, n))]
    submitted = len(inflight)
    out = []
    while inflight:
        ready, inflight = ray.wait(inflight, num_returns=1)
        out.append(ray.get(ready[0]))
        if submitted < n:
            inflight.append(submit(submitted))
            submitted += 1
    return {"intervals": [(s, e) for _, s, e in out], "wall_s": time.time() - t0, "failed": 0,
            "best": max(v for v, _, _ in out)}


# ----------------------------------------------------------------------------- Ray Tune
def run_tune(args: argparse.Namespace, n: int, reuse: bool) -> dict[str, Any]:
    import optuna
    from ray import tune
    from ray.tune.search import ConcurrencyLimiter
    from ray.tune.search.optuna import OptunaSearch

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    obj = SleepObjective(**_objective_options(args))

    def trainable(config: dict) -> None:
        seed = int(time.time_ns() % 2**31)  # Tune hands out no per-trial seed
        t0 = time.time()
        value = obj.evaluate(config, seed).value
        tune.report({"value": value, "eval_start": t0, "eval_end": time.time()})

    space = {k: tune.uniform(0.0, 1.0) for k in obj.space}
    searcher = OptunaSearch(metric="value", mode="max", sampler=optuna.samplers.GPSampler(seed=args.run_seed))
    search_alg = ConcurrencyLimiter(searcher, max_concurrent=args.slots)
    tuner = tune.Tuner(
        tune.with_resources(trainable, {"cpu": 1}),
        param_space=space,
        tune_config=tune.TuneConfig(
            search_alg=search_alg, num_samples=n, reuse_actors=reuse, max_concurrent_trials=args.slots
        ),
        run_config=tune.RunConfig(
            name=f"tune-{'reuse' if reuse else 'fresh'}-{args.run_seed}-{int(time.time())}",
            storage_path=str(Path(args.out).resolve() / "tune"),
            verbose=0,
        ),
    )
    t0 = time.time()
    results = tuner.fit()
    wall = time.time() - t0
    intervals, failed, best = [], 0, -math.inf
    for r in results:
        m = r.metrics or {}
        if r.error is not None or "eval_start" not in m:
            failed += 1
            continue
        intervals.append((m["eval_start"], m["eval_end"]))
        best = max(best, m["value"])
    return {"intervals": intervals, "wall_s": wall, "failed": failed, "best": best}


def _objective_options(args: argparse.Namespace) -> dict[str, Any]:
    return {"dim": args.dim, "mean_s": args.mean, "cv": args.cv, "noise": 0.1, "num_cpus": 1}


# ----------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--slots", type=int, default=16)
    p.add_argument("--evals", type=int, default=None, help="evaluations per qbatch / plain run (default 640; "
                                                           "--quick 96)")
    p.add_argument("--tune-evals", type=int, default=None,
                   help="evaluations for each Ray Tune run (default 160, --quick 48: Tune's U does not grow "
                        "with length, and 640 takes ~20 min)")
    p.add_argument("--mean", type=float, default=2.0, help="mean evaluation time in seconds")
    p.add_argument("--cv", type=float, default=0.5, help="coefficient of variation of evaluation times")
    p.add_argument("--dim", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--initial-design", type=int, default=32)
    p.add_argument("--queue-low", type=int, default=None, help="actor's queue_low (default max(slots, B/2))")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeats", type=int, default=1,
                   help="runs of every system (seeds seed, seed+1, ...): one U is a single draw of the tail "
                        "(see the ideal-scheduler row), so compare means")
    p.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated subset of "
                                                                f"{','.join(SYSTEMS)}")
    p.add_argument("--quick", action="store_true",
                   help="96 evaluations of ~0.5 s (Tune: 48), qbatch with a small model (QUICK_MODEL, "
                        "QUICK_PROPOSER)")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--out", default="bench-out/utilization")
    p.add_argument("--from-csv", metavar="CSV",
                   help="run nothing: summarize a recorded utilization.csv (the per-run rows) into OUT")
    args = p.parse_args(argv)
    if args.quick:
        args.mean, args.batch_size, args.initial_design = 0.5, 32, 16
    if args.evals is None:
        args.evals = 96 if args.quick else 640
    if args.tune_evals is None:
        args.tune_evals = 48 if args.quick else 160
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown:
        p.error(f"unknown system(s) {unknown}; choose from {list(SYSTEMS)}")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    if args.from_csv:
        rows = read_rows(args.from_csv)
        return summarize(rows, [s for s in systems if any(r["system"] == s for r in rows)], args)

    import ray

    if args.repeats < 1:
        p.error("--repeats must be >= 1")
    rows = []

    # start the worker processes and import the evaluation code, so no system pays that start-up inside
    # its span (every system runs on the same warm pool of workers)
    def _warm(i: int) -> int:
        import objectives.timing  # noqa: F401
        import workers.evaluate  # noqa: F401

        time.sleep(1.0)  # hold the slot so every slot gets its own worker
        return i

    for rep in range(args.repeats):
        args.run_seed = args.seed + rep
        # a fresh Ray per repeat: in one long session Ray Tune's U fell from repeat to repeat (0.323, 0.286,
        # 0.213), so later repeats measured what earlier runs left behind rather than the system
        ray.init(address="local", num_cpus=args.slots, include_dashboard=False, log_to_driver=False)
        try:
            for system in systems:
                # again before every system: Tune's trial actors leave fewer idle task workers behind, and a
                # system that had to start workers (two at a time) would pay it in its ramp-up
                ray.get([ray.remote(num_cpus=1)(_warm).remote(i) for i in range(args.slots)])
                n = args.tune_evals if system.startswith("tune") else args.evals
                print(f"[utilization] {system} (repeat {rep}): {n} evaluations, {args.slots} slots ...",
                      file=sys.stderr, flush=True)
                if system == "qbatch":
                    res = run_qbatch(args, n, synchronous=False)
                elif system == "qbatch-sync":
                    res = run_qbatch(args, n, synchronous=True)
                elif system == "plain-ray":
                    res = run_plain(args, n)
                else:
                    res = run_tune(args, n, reuse=(system == "tune-reuse"))
                u, busy, span = span_utilization(res["intervals"], args.slots)
                # the same durations, in the same start order, on a zero-overhead scheduler: what this run's
                # draw of evaluation times allowed (the tail's luck), so U / U_ideal is the system's own share
                order = sorted(res["intervals"])
                u_ideal = greedy_utilization([e - s_ for s_, e in order], args.slots)
                row = {
                    "system": system,
                    "repeat": rep,
                    "evaluations": len(res["intervals"]),
                    "failed": res["failed"],
                    "slots": args.slots,
                    "mean_s": args.mean,
                    "cv": args.cv,
                    "U": u,
                    "U_ideal_same_draw": u_ideal,
                    "efficiency": u / u_ideal,
                    "busy_s": busy,
                    "span_s": span,
                    "wall_s": res["wall_s"],
                    "refits": res.get("refits", ""),
                    "refit_s_median": res.get("refit_s_median", ""),
                    "proposal_s_median": res.get("proposal_s_median", ""),
                    "best": res.get("best", ""),
                }
                rows.append(row)
                print(f"[utilization] {system}: U = {u:.3f} (busy {busy:.0f} s over {span:.0f} s x "
                      f"{args.slots}; ideal for these durations {u_ideal:.3f})", file=sys.stderr, flush=True)
        finally:
            ray.shutdown()

    return summarize(rows, systems, args)


def read_rows(path: str) -> list[dict[str, Any]]:
    """The per-run rows of a recorded utilization.csv, numbers parsed."""
    rows = read_table(path)
    for r in rows:
        for k, v in r.items():
            if k != "system" and v not in ("", None):
                try:
                    r[k] = int(v) if v.lstrip("-").isdigit() else float(v)
                except ValueError:
                    pass
    return rows


def summarize(rows: list[dict[str, Any]], systems: list[str], args: argparse.Namespace) -> int:
    """Per system over the repeats: mean U with its 95% Student-t interval, the ratios of the means; printed
    and written to OUT/summary.csv (and the per-run rows, with their per-repeat ratios, to
    OUT/utilization.csv)."""
    repeats = sorted({r["repeat"] for r in rows})

    def ratios(by: dict[str, float], target: dict[str, Any]) -> None:
        tune_best = max([by[s] for s in ("tune", "tune-reuse") if s in by], default=float("nan"))
        target["U_over_tune_best"] = (
            target["U"] / tune_best if tune_best == tune_best and tune_best > 0 else ""
        )
        target["U_minus_plain"] = target["U"] - by["plain-ray"] if "plain-ray" in by else ""

    for rep in repeats:
        by = {r["system"]: r["U"] for r in rows if r["repeat"] == rep}
        for r in rows:
            if r["repeat"] == rep:
                ratios(by, r)
    path = Path(args.out) / "utilization.csv"
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)

    # per system over the repeats: mean U, its 95% CI, and the ratios of the means
    summary = []
    for system in systems:
        us = np.array([r["U"] for r in rows if r["system"] == system])
        _, half, _ = mean_ci(us.tolist())  # Student-t: 3 repeats have 2 degrees of freedom, not a normal's
        eff = np.array([r["efficiency"] for r in rows if r["system"] == system])
        evals = max(r["evaluations"] for r in rows if r["system"] == system)
        summary.append({"system": system, "runs": len(us), "evaluations": evals, "U": float(us.mean()),
                        "U_ci95": half, "U_min": float(us.min()), "U_max": float(us.max()),
                        "efficiency": float(eff.mean())})
    by = {r["system"]: r["U"] for r in summary}
    for r in summary:
        ratios(by, r)
    # the ideal scheduler gets the load the rows were measured on (a recorded CSV's, not the command line's)
    loads = {(int(r["slots"]), float(r["mean_s"]), float(r["cv"])) for r in rows}
    if len(loads) != 1:
        raise SystemExit(f"[utilization] the rows mix loads (slots, mean_s, cv): {sorted(loads)}; summarize "
                         f"one load at a time")
    (slots, mean_s, cv), = loads
    ideal_n = max(int(r["evaluations"]) + int(r["failed"] or 0) for r in rows)
    ideal_mean, ideal_std = ideal_utilization(ideal_n, slots, mean_s, cv, seed=args.seed)
    summary.append({"system": "ideal (simulated)", "runs": 2000, "evaluations": ideal_n, "U": ideal_mean,
                    "U_ci95": 1.96 * ideal_std / math.sqrt(2000), "U_min": ideal_mean - 1.96 * ideal_std,
                    "U_max": ideal_mean + 1.96 * ideal_std, "efficiency": 1.0, "U_over_tune_best": "",
                    "U_minus_plain": ""})
    spath = Path(args.out) / "summary.csv"
    with open(spath, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(summary[0]))
        w.writeheader()
        w.writerows(summary)

    print(f"\n{'system':<18} {'runs':>5} {'evals':>6} {'U mean':>7} {'± 95%':>7} {'min':>6} {'max':>6} "
          f"{'U/ideal':>8}")
    for r in summary:
        ci = "" if r["U_ci95"] != r["U_ci95"] else f"{r['U_ci95']:.3f}"
        print(f"{r['system']:<18} {r['runs']:>5} {r['evaluations']:>6} {r['U']:>7.3f} {ci:>7} "
              f"{r['U_min']:>6.3f} {r['U_max']:>6.3f} {r['efficiency']:>8.3f}")
    print(f"(ideal: a zero-overhead greedy scheduler on the same load, {ideal_n} evaluations; the band is "
          f"the spread of one run, std {ideal_std:.3f}. U/ideal: each run's U over that of a zero-overhead "
          f"scheduler given the run's own durations in its start order, averaged over runs)")
    if "qbatch" in by:
        q = by["qbatch"]
        print(f"\nqbatch U = {q:.3f} (target >= 0.9)")
        tune_best = max([by[s] for s in ("tune", "tune-reuse") if s in by], default=float("nan"))
        if tune_best == tune_best:
            print(f"qbatch / Ray Tune best = {q / tune_best:.2f}x (target >= 3x)")
        if "plain-ray" in by:
            print(f"plain Ray loop U = {by['plain-ray']:.3f}; qbatch - plain = {q - by['plain-ray']:+.3f} "
                  "(target >= -0.05)")
        if "qbatch-sync" in by:
            print(f"qbatch synchronous U = {by['qbatch-sync']:.3f}; streaming / synchronous = "
                  f"{q / by['qbatch-sync']:.2f}x")
        print(f"qbatch / ideal = {q / ideal_mean:.3f}")
    print(f"CSV: {path} (per run), {spath} (per system)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
