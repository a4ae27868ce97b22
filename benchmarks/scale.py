"""Scale of the model in the loop: cold fit, warm refit and a q = 1,000 Thompson batch at n = 10^3 to 10^5.

qbatch's default quantile SVGP (`num_inducing: "auto"`, so m = `auto_num_inducing(n)`: 708 at n = 1,000,
1,000 from n = 2,000 on) with its default Thompson sampler, beside BoTorch's SVGP with pathwise Thompson
sampling at the same n, m and q, on the same data: a 16-D Ackley (botorch.test_functions, negated, on
[-5, 5]^16) with right-skewed noise whose scale grows along x_0. Per library and n, one fresh subprocess
(one torch thread) times

- cold fit on n points: qbatch `build_model("quantile").fit`; BoTorch `SingleTaskVariationalGP` (Matérn-5/2
  ARD, m inducing points) fitted by `fit_gpytorch_mll` on a `VariationalELBO`;
- ask(q): qbatch `ThompsonSampling().propose`; BoTorch q paths from `draw_matheron_paths`, scored at the same
  number of scrambled-Sobol candidates as qbatch's (`default_raw_samples`), the best `default_num_restarts`
  per path refined by `gen_candidates_scipy` (L-BFGS-B on the sum of the paths, the same `maxiter`);
- warm refit after `NEW_POINTS` more results: qbatch `fit` again (warm-started); BoTorch `fit_gpytorch_mll`
  again from its fitted state on the n + `NEW_POINTS` points;

and, before the cold fit, the inducing allocation it starts with on its own (qbatch `allocate_inducing`;
BoTorch the `GreedyVarianceReduction` its SVGP's constructor runs, also where the fit is only probed), and the
subprocess's peak RSS (`resource.getrusage(RUSAGE_SELF).ru_maxrss`), so no configuration's peak hides
another's. Times are the subprocess's CPU seconds (`time.process_time`, one thread): on a shared machine
they do not count the time other processes hold the cores (wall seconds are recorded beside them, `*_wall_s`,
with the load average). A configuration that runs past `--limit-s` is stopped and printed as "not run: <why>".
Targets: qbatch's warm refit + ask grows at most linearly in n from 10^4 to 10^5 (exponent <= 1), its peak
memory at n = 10^5 is at most 4 GB, its times at most 0.5x BoTorch's at every n both finish.

Usage:
    python benchmarks/scale.py --quick      # CI smoke run, in-process, BoTorch's fit at most 30 iterations
    python benchmarks/scale.py --resume --out benchmarks/results/scale
    python benchmarks/scale.py --device cuda --ns 10000 100000 --out benchmarks/results/gpu/scale   # a GPU
Results in --out: runs/<library>_n<n>.json (one per configuration; `--resume` keeps finished ones),
scale.csv (every configuration), summary.csv (ratios and targets per n) and growth.csv (qbatch's exponents).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks._common import code_version, format_table, limited_threads, write_table  # noqa: E402

LIBRARIES = ("qbatch", "botorch")
NEW_POINTS = 100
TAU = 0.8
TARGET_EXPONENT = 1.0
TARGET_PEAK_GB = 4.0
TARGET_RATIO = 0.5
FULL = {"ns": [1000, 10000, 100000], "d": 16, "q": 1000}
QUICK = {"ns": [12, 24], "d": 3, "q": 4, "raw_samples": 128, "maxiter": 20, "botorch_fit_maxiter": 30}
#: stages in the order they run; "allocate" is the inducing allocation each cold fit starts with, timed on its
#: own so that its time and memory are recorded when the fit runs past the limit or is only probed
STAGES = ("allocate", "cold_fit", "ask", "warm_refit")


def make_data(n: int, d: int, seed: int) -> tuple[Any, Any]:
    """`n` uniform points of [0, 1]^d and outcomes -Ackley(x) on [-5, 5]^d plus right-skewed noise
    (centred exponential, scale 0.5 + x_0): one narrow global optimum at the centre among many local ones."""
    import torch
    from botorch.test_functions import Ackley

    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, d, generator=g, dtype=torch.float64)
    f = -Ackley(dim=d).evaluate_true(10.0 * X - 5.0)
    noise = torch.empty(n, dtype=torch.float64).exponential_(generator=g) - 1.0
    return X, f + (0.5 + X[:, 0]) * noise


def peak_rss_mib() -> float:
    """Peak resident memory of this process so far (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def limit_memory(gb: float | None) -> None:
    """Cap this process's address space at `gb` GiB (RLIMIT_AS): an allocation past it fails with torch's
    "can't allocate memory" in this process instead of pushing a shared machine into its OOM killer."""
    if gb:
        cap = int(gb * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))


def search_sizes(d: int, q: int, raw_samples: int | None) -> tuple[int, int]:
    """(candidates, restarts per path) of qbatch's default Thompson sampler, used by both libraries."""
    from orchestrator.acquisition.thompson import default_num_restarts, default_raw_samples

    restarts = default_num_restarts(d, q)
    return (raw_samples or default_raw_samples(d, restarts)), restarts


# ------------------------------------------------------------------------------------------------------------
# the two libraries: each returns {stage: callable} run in order on the same data
# ------------------------------------------------------------------------------------------------------------
def qbatch_stages(X, Y, n: int, q: int, raw: int, restarts: int, maxiter: int, seed: int, info: dict,
                  fit_maxiter: int | None = None):
    from orchestrator.acquisition.thompson import ThompsonSampling
    from orchestrator.models import build_model
    from orchestrator.models.base import use_device

    use_device(X.device)  # the model computes where the data are (`--device`)

    model = build_model("quantile", tau=TAU, seed=seed)
    ts = ThompsonSampling(raw_samples=raw, num_restarts=restarts, maxiter=maxiter)

    def allocate() -> None:  # what the cold fit's first step computes (the model has no fit yet)
        info["m_allocated"] = int(model._inducing_inputs(X[:n]).shape[0])

    def cold() -> None:
        info["m"] = int(model.fit(X[:n], Y[:n])["num_inducing"])

    def ask() -> None:
        info["q_proposed"] = int(ts.propose(model, q, X_observed=X[:n], seed=seed).shape[0])

    def warm() -> None:
        info["m_refit"] = int(model.fit(X, Y)["num_inducing"])

    return {"allocate": allocate, "cold_fit": cold, "ask": ask, "warm_refit": warm}


def botorch_allocate(X, n: int) -> int:
    """What `SingleTaskVariationalGP(X[:n], ..., inducing_points=m)` computes first: its default allocator,
    `GreedyVarianceReduction`, on the model's kernel (the dense `n x n` kernel, `evaluate_kernel()`)."""
    import torch
    from botorch.models.utils.inducing_point_allocators import GreedyVarianceReduction
    from gpytorch.kernels import MaternKernel, ScaleKernel

    from orchestrator.models.allocation import auto_num_inducing

    kernel = ScaleKernel(MaternKernel(nu=2.5, ard_num_dims=X.shape[-1]))
    m = auto_num_inducing(n)
    Z = GreedyVarianceReduction().allocate_inducing_points(X[:n], kernel, m, torch.Size([]))
    return int(Z.shape[0])


def botorch_stages(X, Y, n: int, q: int, raw: int, restarts: int, maxiter: int, seed: int, info: dict,
                   fit_maxiter: int | None = None):
    import torch
    from botorch.fit import fit_gpytorch_mll
    from botorch.generation.gen import gen_candidates_scipy
    from botorch.models.approximate_gp import SingleTaskVariationalGP
    from botorch.sampling.pathwise import draw_matheron_paths
    from gpytorch.kernels import MaternKernel, ScaleKernel
    from gpytorch.mlls import VariationalELBO

    from orchestrator.models.allocation import auto_num_inducing

    m = auto_num_inducing(n)
    info["m"] = info["m_refit"] = m
    # the smoke run caps L-BFGS-B's iterations and attempts; the recorded runs use fit_gpytorch_mll's defaults
    fit_kwargs = ({"optimizer_kwargs": {"options": {"maxiter": fit_maxiter}}, "max_attempts": 1}
                  if fit_maxiter else {})
    state: dict[str, Any] = {}

    def standardized(k: int):
        y = Y[:k]
        return ((y - y.mean()) / y.std()).unsqueeze(-1)

    def allocate() -> None:
        info["m_allocated"] = botorch_allocate(X, n)

    def cold() -> None:
        kernel = ScaleKernel(MaternKernel(nu=2.5, ard_num_dims=X.shape[-1]))
        model = SingleTaskVariationalGP(X[:n], standardized(n), inducing_points=m, covar_module=kernel)
        model = model.to(dtype=torch.float64, device=X.device)
        fit_gpytorch_mll(VariationalELBO(model.likelihood, model.model, num_data=n), **fit_kwargs)
        state["model"] = model

    def ask() -> None:
        model = state["model"]
        model.eval()
        torch.manual_seed(seed)
        paths = draw_matheron_paths(model, sample_shape=torch.Size([q]))
        cands = torch.quasirandom.SobolEngine(X.shape[-1], scramble=True, seed=seed).draw(raw).to(X)
        with torch.no_grad():  # scores `q x raw`, in chunks of candidates
            chunk = max(1, 2**22 // q)
            scores = torch.cat([paths(cands[i:i + chunk]) for i in range(0, raw, chunk)], dim=-1)
        starts = cands[scores.topk(restarts, dim=-1).indices]  # `q x restarts x d`
        # path b at its own points: X of shape `restarts x q x d` -> paths(`q x restarts x d`)
        # -> `q x restarts`
        Xs, _ = gen_candidates_scipy(
            starts.transpose(0, 1).contiguous(), lambda Z: paths(Z.transpose(0, 1)).sum(0),
            lower_bounds=0.0, upper_bounds=1.0, options={"maxiter": maxiter})
        info["q_proposed"] = int(Xs.shape[1])

    def warm() -> None:
        model = state["model"]
        model.train()
        model.model.train_inputs = (X,)
        model.model.train_targets = standardized(X.shape[0]).squeeze(-1)
        fit_gpytorch_mll(VariationalELBO(model.likelihood, model.model, num_data=X.shape[0]), **fit_kwargs)

    return {"allocate": allocate, "cold_fit": cold, "ask": ask, "warm_refit": warm}


def botorch_step_probe(X, Y, n: int, steps: int = 1) -> float:
    """CPU seconds of one full-batch ELBO evaluation with its gradient of BoTorch's SVGP at n (mean of
    `steps`): `fit_gpytorch_mll` fits an SVGP on more than 1,024 observations with full-batch Adam, one such
    step each."""
    import torch
    from botorch.models.approximate_gp import SingleTaskVariationalGP
    from gpytorch.kernels import MaternKernel, ScaleKernel
    from gpytorch.mlls import VariationalELBO

    from orchestrator.models.allocation import auto_num_inducing

    y = ((Y[:n] - Y[:n].mean()) / Y[:n].std()).unsqueeze(-1)
    kernel = ScaleKernel(MaternKernel(nu=2.5, ard_num_dims=X.shape[-1]))
    model = SingleTaskVariationalGP(X[:n], y, inducing_points=auto_num_inducing(n), covar_module=kernel)
    model = model.to(torch.float64)
    model.train()
    mll = VariationalELBO(model.likelihood, model.model, num_data=n)
    c0 = time.process_time()
    for _ in range(steps):
        loss = -mll(model.model(X[:n]), y.squeeze(-1))
        loss.backward()
    return (time.process_time() - c0) / steps


def run_stage(row: dict[str, Any], path: Path, name: str, stage: Callable[[], None],
              info: dict[str, Any]) -> None:
    """Time `stage` (CPU and wall seconds, peak RSS after it) into `row`; the result file says which stage
    runs, so a stopped run names it."""
    row["running"] = name
    path.write_text(json.dumps(row))
    t0, c0 = time.perf_counter(), time.process_time()
    stage()
    if row.get("device", "cpu") != "cpu":  # a GPU's time is not this process's CPU time: wall seconds
        import torch

        torch.cuda.synchronize()
        row[f"{name}_s"] = time.perf_counter() - t0
    else:
        row[f"{name}_s"] = time.process_time() - c0
    row[f"{name}_wall_s"] = time.perf_counter() - t0
    row[f"{name}_peak_mib"] = peak_rss_mib()
    row.update(info)


def child(spec: dict[str, Any]) -> None:
    """Run one configuration, writing its result file after every stage (a stopped run keeps what it did)."""
    limit_memory(spec.get("max_memory_gb"))
    path = Path(spec["path"])
    row = {k: spec[k] for k in ("library", "n", "d", "q")} | {"device": spec.get("device", "cpu")}
    row.update({"raw_samples": spec["raw"], "restarts": spec["restarts"], "maxiter": spec["maxiter"],
                "new_points": NEW_POINTS, "code": code_version()})
    with limited_threads(1), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        X, Y = make_data(spec["n"] + NEW_POINTS, spec["d"], spec["seed"])
        X, Y = X.to(row["device"]), Y.to(row["device"])
        if spec.get("probe"):
            row["baseline_mib"] = peak_rss_mib()
            found: dict[str, Any] = {}
            run_stage(row, path, "allocate", lambda: found.update(m_allocated=botorch_allocate(X, spec["n"])),
                      found)
            row["running"] = "probe"
            path.write_text(json.dumps(row))
            step = row["elbo_step_s"] = botorch_step_probe(X, Y, spec["n"])
            row.pop("running")
            row["peak_mib"] = peak_rss_mib()
            row["status"] = (f"not run: n > --botorch-max-n; one full-batch ELBO step (value and gradient) "
                             f"takes {step:.1f} s here and fit_gpytorch_mll's Adam above 1,024 observations "
                             f"takes up to 10,000 of them (cold fit up to {step * 10000 / 3600:.0f} h)")
            path.write_text(json.dumps(row))
            return
        build = qbatch_stages if spec["library"] == "qbatch" else botorch_stages
        info: dict[str, Any] = {}
        stages = build(X, Y, spec["n"], spec["q"], spec["raw"], spec["restarts"], spec["maxiter"],
                       spec["seed"], info, spec.get("botorch_fit_maxiter"))
        row["baseline_mib"] = peak_rss_mib()
        row["load_avg_1min"] = os.getloadavg()[0]
        for name in STAGES:
            run_stage(row, path, name, stages[name], info)
        row.pop("running")
        row["peak_mib"] = peak_rss_mib()
        row["status"] = "ok"
        path.write_text(json.dumps(row))


def run_config(spec: dict[str, Any], limit_s: float, script: Path | None = None) -> dict[str, Any]:
    """`child(spec)` of `script` (default: this file) in a fresh interpreter, stopped after `limit_s`
    seconds."""
    path = Path(spec["path"])
    cmd = [sys.executable, str(Path(script or __file__).resolve()), "--child", json.dumps(spec)]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=limit_s)
        failed = proc.returncode != 0
        last = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "no message"
        why = f"exit {proc.returncode}: {last}"
    except subprocess.TimeoutExpired:
        failed, why = True, None
    row = json.loads(path.read_text()) if path.is_file() else dict(spec)
    if failed:
        stage = row.get("running", "setup")
        row["status"] = (f"not run: {stage} did not finish within the {limit_s:.0f} s limit" if why is None
                         else f"not run: {stage} failed ({why})")
        row["wall_s"] = time.perf_counter() - t0
        path.write_text(json.dumps(row))
    return row


def loop_s(r: dict[str, Any]) -> float:
    """Warm refit + ask(q): one iteration of the loop once the model exists."""
    return r.get("warm_refit_s", math.nan) + r.get("ask_s", math.nan)


def summarize(rows: Sequence[dict[str, Any]], ns: Sequence[int]) -> list[dict[str, Any]]:
    from orchestrator.models.allocation import auto_num_inducing

    by = {(r["library"], r["n"]): r for r in rows}
    out = []
    for n in ns:
        qb, bt = by.get(("qbatch", n), {}), by.get(("botorch", n), {})
        s = {"n": n, "m": qb.get("m", bt.get("m", auto_num_inducing(n))),
             "qbatch_status": qb.get("status", "missing"), "botorch_status": bt.get("status", "missing")}
        for lib, r in (("qbatch", qb), ("botorch", bt)):
            for stage in STAGES:
                s[f"{lib}_{stage}_s"] = r.get(f"{stage}_s", math.nan)
            s[f"{lib}_loop_s"] = loop_s(r)
            s[f"{lib}_peak_mib"] = r.get("peak_mib", math.nan) if r.get("status") == "ok" else math.nan
        both = s["qbatch_status"] == "ok" and s["botorch_status"] == "ok"
        for key in ("cold_fit", "ask", "warm_refit", "loop"):
            s[f"ratio_{key}"] = s[f"qbatch_{key}_s"] / s[f"botorch_{key}_s"] if both else math.nan
        # the allocation is timed on both sides whenever it finished, probed configurations included
        for lib, r in (("qbatch", qb), ("botorch", bt)):
            s[f"{lib}_allocate_mib"] = r.get("allocate_peak_mib", math.nan) - r.get("baseline_mib", math.nan)
        s["ratio_allocate"] = s["qbatch_allocate_s"] / s["botorch_allocate_s"]
        s["ratio_met"] = (bool(max(s["ratio_cold_fit"], s["ratio_loop"]) <= TARGET_RATIO) if both
                          else None)
        out.append(s)
    return out


def growth_exponents(summary: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """log(loop time ratio) / log(n ratio) of qbatch between consecutive n that both finished."""
    ok = [s for s in summary if s["qbatch_status"] == "ok"]
    return [{"n_from": a["n"], "n_to": b["n"], "exponent": math.log(b["qbatch_loop_s"] / a["qbatch_loop_s"])
             / math.log(b["n"] / a["n"])} for a, b in zip(ok, ok[1:])]


def report(rows: Sequence[dict[str, Any]], ns: Sequence[int], out: Path) -> dict[str, Any]:
    summary = summarize(rows, ns)
    exps = growth_exponents(summary)
    write_table(list(rows), out / "scale", parquet=False)
    write_table(summary, out / "summary", parquet=False)
    write_table(exps, out / "growth", parquet=False)
    cols = ["library", "n", "m", "allocate_s", "allocate_peak_mib", "cold_fit_s", "ask_s", "warm_refit_s",
            "peak_mib", "status"]
    print(format_table([{c: r.get(c, math.nan) for c in cols} for r in rows], cols))
    print()
    print(format_table(summary, ["n", "m", "qbatch_loop_s", "botorch_loop_s", "ratio_cold_fit", "ratio_ask",
                                 "ratio_warm_refit", "ratio_loop", "ratio_met"]))
    for s in summary:
        for lib in LIBRARIES:
            if s[f"{lib}_status"] != "ok":
                print(f"[scale] {lib} n={s['n']}: {s[f'{lib}_status']}")
    for s in summary:
        if math.isfinite(s["qbatch_allocate_s"]):
            botorch = (f"BoTorch {s['botorch_allocate_s']:.2f} s and {s['botorch_allocate_mib']:.0f} MiB "
                       f"(time ratio {s['ratio_allocate']:.3f})" if math.isfinite(s["botorch_allocate_s"])
                       else "BoTorch's did not finish (its status above)")
            print(f"[scale] n={s['n']}: inducing allocation, qbatch {s['qbatch_allocate_s']:.2f} s and "
                  f"{s['qbatch_allocate_mib']:.0f} MiB above its start, {botorch}")
    for e in exps:
        print(f"[scale] qbatch warm refit + ask({rows[0]['q']}) from n={e['n_from']} to n={e['n_to']}: "
              f"exponent {e['exponent']:.2f} (target <= {TARGET_EXPONENT:g} from 10^4 to 10^5)")
    top = max((s for s in summary if s["qbatch_status"] == "ok"), key=lambda s: s["n"], default=None)
    if top is not None:
        gb = top["qbatch_peak_mib"] / 1024
        print(f"[scale] qbatch peak memory at n={top['n']}: {gb:.2f} GB (target <= {TARGET_PEAK_GB:g} GB at "
              f"n = 10^5)")
    for s in summary:
        if s["ratio_met"] is not None:
            verdict = "met" if s["ratio_met"] else "MISSED"
            print(f"[scale] n={s['n']}: qbatch / BoTorch cold fit {s['ratio_cold_fit']:.3f}, warm refit + "
                  f"ask {s['ratio_loop']:.3f} (target <= {TARGET_RATIO:g}: {verdict})")
    return {"rows": list(rows), "summary": summary, "exponents": exps}


def add_run_options(ap: argparse.ArgumentParser, unit: str, limit_s: float, out: str) -> None:
    """The options of a benchmark that runs each `unit` in its own subprocess (`run_config`): its time limit
    and memory cap, the seed, `--resume`, `--out` (default results/`out`), `--report` and the child's
    `--child` (this benchmark and benchmarks/memory_model.py)."""
    ap.add_argument("--limit-s", type=float, default=limit_s, help=f"wall-clock limit of one {unit}")
    ap.add_argument("--max-memory-gb", type=float, default=16.0,
                    help=f"address-space cap of each {unit}'s subprocess (RLIMIT_AS; 0: none)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--resume", action="store_true", help=f"keep the {unit}s whose result file exists")
    ap.add_argument("--out", default=str(REPO / "results" / out))
    ap.add_argument("--report", action="store_true",
                    help="run nothing: rebuild the tables from the result files")
    ap.add_argument("--child", help=argparse.SUPPRESS)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="CI smoke run: d = 3, q = 4, n = 12 and 24 (BoTorch probed above 12)")
    ap.add_argument("--ns", nargs="+", type=int, default=FULL["ns"])
    ap.add_argument("--libraries", nargs="+", choices=LIBRARIES, default=list(LIBRARIES))
    ap.add_argument("--d", type=int, default=FULL["d"])
    ap.add_argument("--q", type=int, default=FULL["q"])
    ap.add_argument("--raw-samples", type=int, default=None, help="candidates (default: qbatch's rule)")
    ap.add_argument("--maxiter", type=int, default=200, help="L-BFGS-B iterations (qbatch's default)")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                    help="where both libraries compute (cuda: stage times are wall seconds, synchronized)")
    ap.add_argument("--botorch-max-n", type=int, default=1000,
                    help="largest n BoTorch's side is run at; above it one ELBO step is timed instead")
    add_run_options(ap, "configuration", 900.0, "scale")
    args = ap.parse_args(argv)
    if args.child:
        child(json.loads(args.child))
        return {}
    if args.quick:
        args.ns, args.d, args.q = QUICK["ns"], QUICK["d"], QUICK["q"]
        args.raw_samples, args.maxiter = QUICK["raw_samples"], QUICK["maxiter"]
        args.botorch_max_n = QUICK["ns"][0]
    raw, restarts = search_sizes(args.d, args.q, args.raw_samples)
    out = Path(args.out)
    (out / "runs").mkdir(parents=True, exist_ok=True)
    rows = []
    for n in args.ns:
        for lib in args.libraries:
            path = out / "runs" / f"{lib}_n{n}.json"
            if args.report:
                missing = {"library": lib, "n": n, "d": args.d, "q": args.q,
                           "status": "not run: no result file"}
                rows.append(json.loads(path.read_text()) if path.is_file() else missing)
                rows[-1].setdefault("status", f"not run: stopped in {rows[-1].get('running', 'setup')}")
                continue
            if args.resume and path.is_file() and "status" in json.loads(path.read_text()):
                rows.append(json.loads(path.read_text()))
                print(f"[scale] {lib} n={n}: kept {path.name} ({rows[-1]['status']})", flush=True)
                continue
            spec = {"library": lib, "n": n, "d": args.d, "q": args.q, "raw": raw, "restarts": restarts,
                    "maxiter": args.maxiter, "seed": args.seed, "path": str(path), "device": args.device,
                    "probe": lib == "botorch" and n > args.botorch_max_n, "max_memory_gb": args.max_memory_gb,
                    "botorch_fit_maxiter": QUICK["botorch_fit_maxiter"] if args.quick else None}
            if args.quick:  # in this process: the smoke run skips the interpreter start-ups (and the RSS cap)
                spec["max_memory_gb"] = 0
                child(spec)
                rows.append(json.loads(path.read_text()))
            else:
                rows.append(run_config(spec, args.limit_s))
            r = rows[-1]
            print(f"[scale] {lib} n={n} m={r.get('m')}: {r.get('status')}; allocate "
                  f"{r.get('allocate_s', math.nan):.1f} s, cold {r.get('cold_fit_s', math.nan):.1f} s, ask "
                  f"{r.get('ask_s', math.nan):.1f} s, warm {r.get('warm_refit_s', math.nan):.1f} s, peak "
                  f"{r.get('peak_mib', math.nan):.0f} MiB", flush=True)
    return report(rows, args.ns, out)


if __name__ == "__main__":
    main()
