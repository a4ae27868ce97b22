"""GLD quantile optimization: quantile TS and Q-GIBBON against the baselines (paper 003 §4.3, spec §4.1/§4.4).

Each method optimizes the tau-quantile of GLD problems (objectives.gld.GLDProblem; the outcome's law is a
Generalised Lambda distribution whose four parameters are GP draws) through qbatch's library API,
`orchestrator.ask_tell.AskTellOptimizer`, in **synchronous batches**: ask B points, evaluate all B
(GLDProblem.evaluate, in this process), tell all B, refit, repeat. That is the orchestrator's
`synchronous: true` protocol (the papers'), minus Ray: the central actor wraps the same AskTellOptimizer.
After each batch the recommendation is spec §1.7's, `AskTellOptimizer.best()` after a fit: the observed
input with the largest posterior mean of the target (the quantile SVGP's f, HetGP's plug-in quantile, the
replicate GP's quantile). For Sobol and random search the recommendation uses an exact GP of the outcome
(model "exact-gp") fitted on their points: the argmax of its posterior MEAN over the observed inputs,
a smoothed "best observed" (the raw best observation of a noisy function is mostly noise).
Simple regret = q* - q_tau(x_hat) with the exact GLD quantile; q* is the multi-start L-BFGS-B optimum of
`GLDProblem.optimum`, raised to the best exact quantile of any point evaluated by any method on that problem
if one beats it (recorded in column `q_star`).

Methods (model + proposer): quantile-ts (quantile + thompson), qgibbon (quantile + qgibbon, repulsion
"paper" = w 1), qgibbon-rescaled (repulsion 1/(k-1)^2), gpr-ei (gpr-replicates + gpr-ei: each batch is ONE
point evaluated B times, initial design round(n0/B) Sobol points x B replicates, spec §4.4), hetgp-ts
(heteroscedastic + thompson on the path quantile), qlognei (exact-gp + BoTorch qLogNEI, the q points optimized
jointly as BoTorch's `optimize_acqf` does by default), sobol, random.
qbatch's own models (quantile, expectile) run as a run with the defaults does (`_common.ask_batch`): the
budget's last `reevaluation` share (10%) re-evaluates their best observed points, and they refit warm after
each batch, with the restart from scratch at the budget's end only. The baselines search to the end and refit
warm and from scratch after every batch, as BoTorch's loops do (`_common.restarts_every_refit`).
All methods of one (setting, problem) share the problem seed, so the model-based methods on the same model
start from the SAME initial design and first fit (each run computes it from the seed).

Settings: d in {3, 6}, tau in {0.75, 0.95}, batch in {10, 50}; initial 50 d, budget 250 d; 10 problems.

Usage:
    python benchmarks/gld.py                                   # full grid (days on 2 cores; use --workers)
    python benchmarks/gld.py --settings 3:0.75:10 --methods quantile-ts qgibbon --problems 10
    python benchmarks/gld.py --settings 3:0.75:10 --budget 300 --problems 0-9   # a reduced budget
    python benchmarks/gld.py --quick                           # CI smoke run (~1 minute)
    python benchmarks/gld.py --tables-only --out results/gld_full  # tables and plots from the files there
    python benchmarks/gld.py --settings 6:0.75:10 --methods qlognei --resume --time-limit 420  # in pieces
Long runs: each run saves a checkpoint (optimizer state, rows, evaluated points, timings;
`OUT/runs/<run>.ckpt.pt`) after every batch, removed when the run finishes. `--resume` continues it
(bit-identical to an uninterrupted run); `--time-limit S` starts no batch after S seconds, so a run longer
than a command or a session (qLogNEI at d = 6) is finished in pieces.
Results in --out (default results/gld/): runs/*.csv (one per setting x problem x method, written as they
finish; --resume skips the methods already finished, so a grid can be filled in over several sessions and
methods added later; q* of a problem is the best over all of its runs), gld.csv + gld.parquet (every
checkpoint), summary.csv (final regret, mean and 95% CI per setting x method), paired.csv (paired over
problems), gld_<setting>.png (regret vs evaluations, mean +- 95% CI). The tables cover the selection
(--settings, --problems, --methods); a selection with no finished run (every run paused, say) leaves the
folder's tables as they were.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import statistics
import sys
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks._common import (  # noqa: E402
    MODELS,
    PROPOSERS,
    BatchRun,
    Job,
    Method,
    ask_batch,
    checkpoint_evaluations,
    code_mix_note,
    config_tag,
    drive_guarded,
    format_table,
    limited_threads,
    mean_ci,
    merge_options,
    paired_comparison,
    parse_index_list,
    plot_curves,
    preflight,
    read_table,
    reevaluation_of,
    replicate_seed,
    restarts_every_refit,
    run_jobs,
    write_table,
)
from benchmarks._quality_summary import gap_bound  # noqa: E402

MODE = ("synchronous batches, in-process AskTellOptimizer (the orchestrator's synchronous protocol without "
        "Ray)")


METHODS: dict[str, Method] = {
    "quantile-ts": Method("quantile", "thompson"),
    "qgibbon": Method("quantile", "qgibbon", proposer_options={"repulsion": "paper"}),
    "qgibbon-rescaled": Method("quantile", "qgibbon", proposer_options={"repulsion": "rescaled"}),
    "gpr-ei": Method("gpr-replicates", "gpr-ei", replicate=True),
    "hetgp-ts": Method("heteroscedastic", "thompson"),
    # BoTorch's default joint optimization of the q points (optimize_acqf(sequential=False)), as its tutorials
    # run it: 2.6x faster than sequential greedy at q = 10 and 10x at q = 50 (d = 6, n = 1000), for a batch
    # value within 0.04 of greedy's in log-EI; the greedy mode made qLogNEI alone cost days on the full grid
    "qlognei": Method("exact-gp", "qlognei", proposer_options={"sequential": False}),
    "sobol": Method("exact-gp", "sobol"),
    "random": Method("exact-gp", "random"),
}
#: the methods of the GLD acceptance target, and the quantile methods they are compared with
QUANTILE_METHODS = ("quantile-ts", "qgibbon", "qgibbon-rescaled")
BASELINES = ("gpr-ei", "hetgp-ts", "qlognei")


def reevaluation(method: str) -> tuple[float, int]:
    """(fraction, repeats) of the budget's end `method` spends re-evaluating its best observed points
    (`_common.reevaluation_of`: a run's default for qbatch's quantile methods, none for the baselines)."""
    return reevaluation_of(METHODS[method])


@functools.cache
def problem_range(d: int, tau: float, problem: int) -> float:
    """max - min of the exact tau-quantile of GLD problem `problem` in `d` dimensions over the unit box
    (`quality.quantile_range`), the unit of the recommendation gap's allowance."""
    from benchmarks.quality import quantile_range
    from objectives.gld import GLDProblem

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return quantile_range(GLDProblem(dim=d, problem=problem), problem, tau)


#: the paper's protocol: an initial design of 50·d, a budget of 250·d evaluations (spec §4.1)
INITIAL_PER_DIM, BUDGET_PER_DIM = 50, 250
FULL_SETTINGS = [(d, tau, b) for d in (3, 6) for tau in (0.75, 0.95) for b in (10, 50)]
QUICK = {
    "settings": [(3, 0.75, 10)],
    "initial": 20,
    "budget": 40,
    "problems": [0, 1],
    "methods": ["quantile-ts", "gpr-ei", "sobol"],
    # smoke only: short SVGP training so the run takes about a minute
    "model_options": {"quantile": {"max_steps": 200, "warm_max_steps": 40, "num_inducing": 16}},
}


@dataclass(frozen=True)
class Setting:
    d: int
    tau: float
    batch: int
    initial: int
    budget: int

    @property
    def label(self) -> str:
        return f"d{self.d}-tau{self.tau:g}-b{self.batch}"


def settings_tag(method: str, initial: int, options: Mapping[str, Any], spends_repeats: bool = True) -> str:
    """Hash of what a run's result depends on beyond its file name (setting label, problem, method) and
    budget: the initial design size and the method's model and proposer options. Every row records it
    (`settings`), and `--resume` and the tables take only the runs made with the settings asked for (a folder
    may hold others).

    `options`: model or proposer name -> options given on the command line (`--model-options`,
    `--proposer-options`; the names of the two registries differ), over the method's own."""
    m = METHODS[method]
    fraction, repeats = reevaluation(method)
    # a method that searches to the end keeps the tag of the runs recorded before re-evaluation existed;
    # `spends_repeats=False` gives a quantile method's tag from then
    extra = {"reevaluation": [fraction, repeats]} if fraction > 0 and spends_repeats else {}
    return config_tag(
        {
            **extra,
            "initial": int(initial),
            "model_options": {**m.model_options, **options.get(m.model, {})},
            "proposer_options": {**m.proposer_options, **options.get(m.proposer, {})},
        }
    )


class GLDRun(BatchRun):
    """One method on one GLD problem in one setting, checkpointable between batches (`_common.drive`).

    `start()` evaluates the initial design and fits; `step()` asks one batch (GPR-EI: one point evaluated B
    times), evaluates it, refits and records the recommendation.
    The state carries the optimizer, the rows, every evaluated point and the cumulative timings, so a run
    continued from a checkpoint equals an uninterrupted one (the GLD outcomes depend only on the trial seeds).
    """

    def __init__(self, name: str, setting: Setting, problem: Any, problem_id: int, options: dict) -> None:
        from orchestrator.ask_tell import AskTellOptimizer
        from orchestrator.ask_tell.repeats import repeat_share

        self.name, self.method, self.setting = name, METHODS[name], setting
        self.problem, self.problem_id = problem, problem_id
        method = self.method
        self.m_opts = {**method.model_options, **options.get(method.model, {})}
        p_opts = {**method.proposer_options, **options.get(method.proposer, {})}
        if method.proposer == "sobol":
            p_opts.setdefault("seed", problem_id)  # one Sobol sequence: initial design and batches
        self.n0 = max(2, round(setting.initial / setting.batch)) if method.replicate else setting.initial
        fraction, self.repeats = reevaluation(name)
        self.restart_always = restarts_every_refit(method)
        self.final = repeat_share(setting.budget, fraction)
        self.opt = AskTellOptimizer(
            problem.space,
            model=method.model,
            tau=setting.tau,
            proposer=method.proposer,
            initial_design=self.n0,
            seed=problem_id,
            model_options=self.m_opts,
            proposer_options=p_opts,
        )
        spend = [self.final, self.repeats] if self.final else []
        self.key = json.dumps(
            [name, setting.label, setting.initial, setting.budget, problem_id, self.m_opts, p_opts, *spend],
            sort_keys=True,
            default=str,
        )
        self.tag = settings_tag(name, setting.initial, options)
        self.n = 0
        self.rows: list[dict] = []
        self.evaluated: list[list[float]] = []
        self.times = {"fit_s": 0.0, "propose_s": 0.0}
        self._step_t0 = time.perf_counter()

    def _evaluate(self, trials: Sequence[Any], reps: int) -> None:
        for t in trials:
            for r in range(reps):
                y = self.problem.evaluate(t.params, t.seed if r == 0 else replicate_seed(t.seed, r))
                if r == 0:
                    self.opt.tell(t.trial_id, y)
                else:
                    self.opt.tell_point(t.params, y)
            self.evaluated.append(t.x.tolist())
        self.n += len(trials) * reps

    def _fit(self) -> None:
        t0 = time.perf_counter()
        self.opt.fit(restart=self.restart_always or self.done)
        self.times["fit_s"] += time.perf_counter() - t0

    def _record(self) -> None:
        params, predicted = self.opt.best()
        s = self.setting
        self.rows.append({
            "method": self.name, "d": s.d, "tau": s.tau, "batch": s.batch, "problem": self.problem_id,
            "initial": s.initial, "settings": self.tag, "n_evals": self.n,
            "x_rec": json.dumps([params[k] for k in self.problem.space]),
            "predicted": float(predicted), "fit_s": self.times["fit_s"], "propose_s": self.times["propose_s"],
            # wall-clock of the run so far, across pauses (`drive` adds each finished step's to run_s)
            "elapsed_s": self.times.get("run_s", 0.0) + time.perf_counter() - self._step_t0,
        })

    def start(self) -> None:
        self._step_t0 = time.perf_counter()
        self._evaluate(self.opt.ask(self.n0), self.setting.batch if self.method.replicate else 1)
        self._fit()
        self._record()

    def step(self) -> None:
        self._step_t0 = time.perf_counter()
        B, left = self.setting.batch, self.setting.budget - self.n
        t0 = time.perf_counter()
        if self.method.replicate:
            trials, reps = self.opt.ask(1), min(B, left)
        else:
            trials, reps = ask_batch(self.opt, self.n, self.setting.budget, B, self.final, self.repeats), 1
        self.times["propose_s"] += time.perf_counter() - t0
        self._evaluate(trials, reps)
        self._fit()
        self._record()

    @property
    def done(self) -> bool:
        return self.n >= self.setting.budget

    def records_state(self) -> dict[str, Any]:
        return {"rows": [dict(r) for r in self.rows], "evaluated": [list(x) for x in self.evaluated]}

    def set_records_state(self, state: dict[str, Any]) -> None:
        # rows of a checkpoint from before rows held their settings: the checkpoint's key matched this run's
        self.rows = [{"initial": self.setting.initial, "settings": self.tag, **r} for r in state["rows"]]
        self.evaluated = [list(x) for x in state["evaluated"]]


def run_problem(
    setting: Setting, problem_id: int, method: str, options: dict, threads: int = 1,
    checkpoint: Path | None = None, deadline: float | None = None, stop_after: int | None = None,
) -> tuple[str, list[dict]]:
    """`method` on one GLD problem; returns ("done", checkpoint rows with exact quantiles and regrets), or
    ("paused", []) / ("skipped", []) when `deadline` (time.time()) or `stop_after` steps stopped it first.

    With `checkpoint` the run is saved there after every batch and continued from it (`_common.drive`). A run
    that raises gives ("done", one row with the error). q* here is the L-BFGS optimum raised to the best exact
    quantile of any point the run evaluated; `merge_rows` raises it further to the best over every job that
    ran on the problem.
    """
    import numpy as np

    from objectives.gld import GLDProblem

    if deadline is not None and time.time() > deadline:
        return "skipped", []
    with limited_threads(threads), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        warnings.simplefilter("ignore", RuntimeWarning)
        problem = GLDProblem(dim=setting.d, problem=problem_id)
        _, q_opt = problem.optimum(setting.tau)
    t0 = time.perf_counter()
    label = f"[gld] {setting.label} problem {problem_id} {method}"
    status, run, error = drive_guarded(lambda: GLDRun(method, setting, problem, problem_id, options),
                                       checkpoint, deadline, stop_after, threads, label)
    if status != "done":
        return status, []
    if error:
        rows = [
            {
                "method": method,
                "d": setting.d,
                "tau": setting.tau,
                "batch": setting.batch,
                "problem": problem_id,
                "initial": setting.initial,
                "settings": settings_tag(method, setting.initial, options),
                "n_evals": 0,
                "x_rec": "[]",
                "predicted": float("nan"),
                "fit_s": float("nan"),
                "propose_s": float("nan"),
                "elapsed_s": time.perf_counter() - t0,
                "error": error,
            }
        ]
        evaluated: list[list[float]] = []
    else:
        rows, evaluated = run.rows, run.evaluated
    print(f"{label}: {time.perf_counter() - t0:.1f} s {error}", flush=True)
    q_eval = (
        float(problem.quantile_unit(np.asarray(evaluated), setting.tau).max()) if evaluated else -math.inf
    )
    q_star = max(q_opt, q_eval)
    q_range = problem_range(setting.d, setting.tau, problem_id)
    for row in rows:
        row["q_eval_best"] = q_eval  # the best exact quantile among the points the run evaluated
        row["q_range"] = q_range
        x = json.loads(row["x_rec"])
        row["q_rec"] = float(problem.quantile_unit(np.asarray([x]), setting.tau)[0]) if x else float("nan")
        row["q_star"] = q_star
        row["q_star_lbfgs"] = q_opt
        row["regret"] = q_star - row["q_rec"]
        row.setdefault("error", "")
        row["mode"] = MODE
    return "done", rows


def job_path(runs: Path, setting: Setting, problem: int, method: str) -> Path:
    """Result file of one (setting, problem, method) run (without the .csv suffix)."""
    return runs / f"{setting.label}-p{problem}-{method}"


def _method_done(runs: Path, setting: Setting, problem: int, method: str, options: Mapping[str, Any]) -> bool:
    """Whether `method` finished on (setting, problem): the GLD job's rule for `--resume` (see
    `done_methods`)."""
    return method in done_methods(runs, setting, problem, options)


def done_methods(
    runs: Path, setting: Setting, problem: int, options: Mapping[str, Any] | None = None,
) -> set[str]:
    """Methods that already finished on (setting, problem) without an error, with the settings asked for
    (`setting.initial` and `options`: `settings_tag`), in any result file: one per method (`job_path`), or
    one per problem holding several methods (the layout before per-method jobs)."""
    done = set()
    for path in runs.glob(f"{setting.label}-p{problem}*.csv"):
        stem = path.name[:-len(".csv")]
        if stem != f"{setting.label}-p{problem}" and not stem.startswith(f"{setting.label}-p{problem}-"):
            continue  # e.g. p1 must not match p10
        done |= {
            r["method"]
            for r in read_run_file(path)
            if not r.get("error")
            and r["n_evals"] == setting.budget
            and r["settings"] == settings_tag(r["method"], setting.initial, options or {})
        }
    return done


def read_run_file(path: Path) -> list[dict]:
    """The checkpoint rows of one result file, with their numeric columns parsed from the CSV's strings."""
    rows = []
    for r in read_table(path):
        r = {
            **r,
            "d": int(r["d"]),
            "tau": float(r["tau"]),
            "batch": int(r["batch"]),
            "problem": int(r["problem"]),
            "n_evals": int(r["n_evals"]),
        }
        # written before rows recorded their settings: every such run used the defaults
        if not r.get("settings"):
            r["initial"] = INITIAL_PER_DIM * r["d"]
            r["settings"] = settings_tag(r["method"], r["initial"], {}, spends_repeats=False)
        r["initial"] = int(r["initial"])
        for k in (
            "regret",
            "q_rec",
            "q_star",
            "q_star_lbfgs",
            "predicted",
            "fit_s",
            "propose_s",
            "elapsed_s",
            "q_eval_best",
            "q_range",
        ):
            if k in r and r[k] != "":
                r[k] = float(r[k])
        rows.append(r)
    return rows


def _at_budget(rows: Sequence[dict], budgets: dict[tuple, int]) -> tuple[list[dict], list[str]]:
    """The rows of runs whose last checkpoint is their setting's budget, and the names of the runs left out:
    a run of another budget in the same folder would otherwise be compared as if it were final."""
    last: dict[tuple, int] = {}
    for r in rows:
        k = (r["d"], r["tau"], r["batch"], r["problem"], r["method"])
        last[k] = max(last.get(k, 0), r["n_evals"])
    other = sorted(k for k, n in last.items() if n != budgets[k[:3]] and n > 0)
    drop = set(other)
    keep = [r for r in rows if (r["d"], r["tau"], r["batch"], r["problem"], r["method"]) not in drop]
    return keep, [f"d{d}-tau{t:g}-b{b}-p{p}-{m}" for d, t, b, p, m in other]


def paired_with(rows: Sequence[dict], base_dir: Path, settings: Sequence[Setting]) -> list[dict]:
    """This folder's final recommendations against those of the runs made with the default options (no
    `--model-options` or `--proposer-options`) in another folder `base_dir`, paired by (setting, method,
    problem): how a variant compares with the default on the same problems. The difference of regrets is that
    of the exact quantiles, q_tau(x_hat) there - here (q* cancels; negative = this folder better).

    A run there with the defaults of now is preferred over one recorded before the quantile methods
    re-evaluated (a folder may hold both for one problem, e.g. copied baseline files that also hold old runs),
    whatever order the files are read in."""
    by_label = {(s.d, s.tau, s.batch): s for s in settings}
    base: dict[tuple, tuple[int, float]] = {}  # key -> (rank of its run's tag, q_rec)
    for path in sorted((base_dir / "runs").glob("*.csv")):
        for r in read_run_file(path):
            s = by_label.get((r["d"], r["tau"], r["batch"]))
            if s is None or r.get("error") or r["n_evals"] != s.budget:
                continue
            # the defaults of now rank above those of a run recorded before re-evaluation
            rank = {settings_tag(r["method"], s.initial, {}, spends_repeats=False): 0,
                    settings_tag(r["method"], s.initial, {}): 1}.get(r["settings"])
            key = (r["d"], r["tau"], r["batch"], r["method"], r["problem"])
            if rank is not None and (key not in base or rank >= base[key][0]):
                base[key] = (rank, r["q_rec"])
    out = []
    for (d, tau, batch), s in by_label.items():
        for m in METHODS:
            mine = {r["problem"]: r["q_rec"] for r in rows
                    if (r["d"], r["tau"], r["batch"], r["method"]) == (d, tau, batch, m)
                    and r["n_evals"] == s.budget and not r.get("error")}
            theirs = {k[4]: q for k, (_, q) in base.items() if k[:4] == (d, tau, batch, m)}
            if not mine or not theirs:
                continue
            # regret here - regret there = q_rec there - q_rec here: pass the negated quantiles (lower =
            # better)
            pc = paired_comparison({p: -v for p, v in mine.items()}, {p: -v for p, v in theirs.items()})
            out.append({"d": d, "tau": tau, "batch": batch, "method": m, "problems": pc["n"],
                        "mean_diff": pc["mean_diff"], "ci95": pc["ci"], "better": round(pc["wins"] * pc["n"]),
                        "p_wilcoxon": pc["p_wilcoxon"]})
    return out


def merge_rows(rows: Sequence[dict]) -> list[dict]:
    """Rows of every job, one per (setting, problem, method, checkpoint) (a later file's row replaces an
    earlier one's), with q* of a problem the best over all of its jobs and regret = q* - q_tau(x_hat) against
    it."""
    unique: dict[tuple, dict] = {}
    for r in rows:
        unique[(r["d"], r["tau"], r["batch"], r["problem"], r["method"], r["n_evals"])] = dict(r)
    q_star: dict[tuple, float] = {}
    for r in unique.values():
        k = (r["d"], r["tau"], r["batch"], r["problem"])
        q_star[k] = max(q_star.get(k, -math.inf), r["q_star"])
    for r in unique.values():
        r["q_star"] = q_star[(r["d"], r["tau"], r["batch"], r["problem"])]
        r["regret"] = r["q_star"] - r["q_rec"]
        # the regret of the best point the run evaluated (nan in the runs recorded before it was)
        best = r.get("q_eval_best")
        r["best_regret"] = r["q_star"] - best if isinstance(best, float) else math.nan
        if isinstance(best, float) and not isinstance(r.get("q_range"), float):
            r["q_range"] = problem_range(r["d"], r["tau"], r["problem"])
    return list(unique.values())


# --------------------------------------------------------------------------------------------------- analysis
def final_rows(rows: Sequence[dict]) -> list[dict]:
    """The last checkpoint of every (method, setting, problem) run."""
    last: dict[tuple, dict] = {}
    for r in rows:
        k = (r["method"], r["d"], r["tau"], r["batch"], r["problem"])
        if k not in last or r["n_evals"] >= last[k]["n_evals"]:
            last[k] = r
    return list(last.values())


def _bo_average(rows: Sequence[dict], s: tuple, method: str) -> dict[int, float]:
    """Per problem: the mean regret over the checkpoints after the initial design (a less noisy companion of
    the final regret, whose recommendation can jump between refits)."""
    per: dict[int, list[tuple[int, float]]] = {}
    for r in rows:
        if (r["d"], r["tau"], r["batch"]) == s and r["method"] == method and not r.get("error"):
            per.setdefault(r["problem"], []).append((r["n_evals"], r["regret"]))
    out = {}
    for p, pts in per.items():
        pts.sort()
        after = [v for _, v in pts[1:]] or [pts[0][1]]
        out[p] = sum(after) / len(after)
    return out


def summarize(rows: Sequence[dict]) -> tuple[list[dict], list[dict], list[dict]]:
    """Summary (mean +- 95% CI of the final regret), paired comparisons, and the target's fraction of
    settings."""
    fin = final_rows(rows)
    settings = sorted({(r["d"], r["tau"], r["batch"]) for r in fin})
    methods = [m for m in METHODS if any(r["method"] == m for r in fin)]
    summary, paired, target = [], [], []
    for s in settings:
        by_method = {m: {r["problem"]: r["regret"] for r in fin if (r["d"], r["tau"], r["batch"]) == s
                         and r["method"] == m and not r.get("error") and not math.isnan(r["regret"])}
                     for m in methods}
        for m in methods:
            if not by_method[m]:
                continue
            mean, half, n = mean_ci(list(by_method[m].values()))
            n_evals = max(
                r["n_evals"] for r in fin if (r["d"], r["tau"], r["batch"]) == s and r["method"] == m
            )
            avg_mean, avg_half, _ = mean_ci(list(_bo_average(rows, s, m).values()))
            known = [r for r in fin if (r["d"], r["tau"], r["batch"]) == s and r["method"] == m
                     and not r.get("error") and not math.isnan(r.get("best_regret", math.nan))]
            best = [r["best_regret"] for r in known]
            q_range = sum(r["q_range"] for r in known) / len(known) if known else math.nan
            rec = sum(r["regret"] for r in known) / len(known) if known else math.nan
            gap_target = gap_bound(sum(best) / len(best), q_range) if known else math.nan
            summary.append(
                {
                    "d": s[0],
                    "tau": s[1],
                    "batch": s[2],
                    "method": m,
                    "n_evals": n_evals,
                    "problems": n,
                    "regret_mean": mean,
                    "regret_ci95": half,
                    "regret_median": float(statistics.median(by_method[m].values())) if n else float("nan"),
                    "bo_avg_regret_mean": avg_mean,
                    "bo_avg_regret_ci95": avg_half,
                    # the best evaluated point's regret, over the runs that record it (nan: none does)
                    "best_regret_mean": sum(best) / len(best) if best else math.nan,
                    "best_regret_runs": len(best),
                    # the recommendation gap over those runs: their mean regret against the target
                    "range_mean": q_range,
                    "gap_target": gap_target,
                    "gap_met": bool(rec <= gap_target) if known else None,
                }
            )
        quantile = [m for m in QUANTILE_METHODS if by_method.get(m)]
        others = [m for m in methods if m not in quantile] + [m for m in quantile]
        for a in quantile:
            for b in others:
                if b == a or not by_method.get(b):
                    continue
                c = paired_comparison(by_method[a], by_method[b])
                paired.append({"d": s[0], "tau": s[1], "batch": s[2], "method": a, "versus": b, **c,
                               "beats": bool(c["mean_diff"] < 0)})
        row = {"d": s[0], "tau": s[1], "batch": s[2]}
        if not quantile:
            continue
        # a baseline counts once it has every problem a quantile method has; fewer is "partial", not compared
        problems = set().union(*(by_method[m] for m in quantile))
        present = [b for b in BASELINES if by_method.get(b) and problems <= set(by_method[b])]
        partial = [b for b in BASELINES if by_method.get(b) and b not in present]
        if not present:
            continue  # the target needs a quantile method and at least one of its baselines in full
        for a in quantile:
            row[f"{a}_beats_all"] = all(
                paired_comparison(by_method[a], by_method[b])["mean_diff"] < 0 for b in present
            )
        row["baselines_present"] = ",".join(present)
        row["baselines_partial"] = ",".join(partial)
        row["complete"] = len(present) == len(BASELINES)
        target.append(row)
    return summary, paired, target


def make_plots(rows: Sequence[dict], out: Path) -> list[Path]:
    """One PNG per setting: mean regret vs evaluations with 95% CI bands, one curve per method."""
    paths = []
    settings = sorted({(r["d"], r["tau"], r["batch"]) for r in rows})
    for s in settings:
        curves = {}
        for m in METHODS:
            runs: dict[int, list[tuple[int, float]]] = {}
            for r in rows:
                if (r["d"], r["tau"], r["batch"]) == s and r["method"] == m and not r.get("error"):
                    runs.setdefault(r["problem"], []).append((r["n_evals"], r["regret"]))
            if not runs:
                continue
            xs = sorted({n for pts in runs.values() for n, _ in pts})
            reps = []
            for pts in runs.values():
                d = dict(pts)
                if all(x in d for x in xs):
                    reps.append([max(d[x], 1e-12) for x in xs])
            if reps:
                curves[m] = (xs, reps)
        label = f"d{s[0]}-tau{s[1]:g}-b{s[2]}"
        paths.append(plot_curves(curves, out / f"gld_{label}.png",
                                 title=f"GLD d={s[0]}, tau={s[1]:g}, batch {s[2]} (mean +- 95% CI over "
                                       "problems)"))
    return paths


# ---------------------------------------------------------------------------------------------------- CLI
def _parse_settings(items: Sequence[str]) -> list[tuple[int, float, int]]:
    out = []
    for it in items:
        try:
            d, tau, b = it.split(":")
            out.append((int(d), float(tau), int(b)))
        except ValueError:
            raise SystemExit("--settings: each item must be d:tau:batch, e.g. 3:0.75:10; got "
                             f"{it!r}") from None
        if not (out[-1][0] >= 1 and 0 < out[-1][1] < 1 and out[-1][2] >= 1):
            raise SystemExit(f"--settings: need d >= 1, tau in (0, 1), batch >= 1; got {it!r}")
    return out


def _parse_problems(spec: str) -> list[int]:
    return parse_index_list(spec, "--problems")

def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="CI smoke run: d=3, tau=0.75, 2 problems, 3 "
                                                         "methods, tiny budget")
    ap.add_argument("--methods", nargs="+", choices=sorted(METHODS), help="methods (default: all)")
    ap.add_argument("--settings", nargs="+", help="d:tau:batch items (default: the full 2x2x2 grid)")
    ap.add_argument("--problems", help="count (10 = problems 0..9; the default), range 0-9, or list 1,4,7")
    ap.add_argument("--initial", type=int, help="initial design size (default 50 d)")
    ap.add_argument("--budget", type=int, help="total evaluations (default 250 d)")
    ap.add_argument("--model-options", type=json.loads, default={},
                    help='JSON: model name -> options, e.g. {"quantile": {"num_inducing": 64}}')
    ap.add_argument("--proposer-options", type=json.loads, default={},
                    help='JSON: proposer name -> options, e.g. {"thompson": {"shared_features": false}}')
    ap.add_argument("--options-for", nargs="+", choices=sorted(METHODS), metavar="METHOD",
                    help="the methods that --model-options and --proposer-options apply to (default: every "
                         "method); the others keep their own options, so their recorded runs stay in the "
                         "tables (HetGP-TS shares quantile TS's Thompson proposer)")
    ap.add_argument("--paired-with", metavar="DIR",
                    help="also compare the final regrets with the runs made with the default options in "
                         "another run folder (e.g. benchmarks/results/gld_full), paired by setting, method "
                         "and problem (OUT/paired_with.csv)")
    ap.add_argument("--workers", type=int, default=1, help="parallel processes (one problem each)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per process")
    ap.add_argument("--resume", action="store_true",
                    help="skip the runs whose result files are in OUT/runs and continue checkpointed ones")
    ap.add_argument("--time-limit", type=float,
                    help="seconds: start no batch after this; unfinished runs keep a checkpoint for --resume")
    ap.add_argument("--tables-only", action="store_true",
                    help="run nothing: rebuild the tables and plots from the result files in OUT/runs (the "
                         "selected settings, problems and methods that have files)")
    ap.add_argument("--out", default=str(REPO / "results" / "gld"), help="output directory")
    args = ap.parse_args(argv)
    if args.workers < 1 or args.threads < 1:
        ap.error("--workers and --threads must be >= 1")
    if args.time_limit is not None and args.time_limit < 0:
        ap.error(f"--time-limit must be >= 0 seconds; got {args.time_limit}")
    #: the options every method takes, whatever --options-for says (the quick mode's short training)
    args.base_options = QUICK["model_options"] if args.quick else {}
    args.model_options = merge_options(args.base_options, args.model_options, "--model-options", MODELS)
    args.proposer_options = merge_options({}, args.proposer_options, "--proposer-options", PROPOSERS)
    if args.paired_with is not None and not (Path(args.paired_with) / "runs").is_dir():
        ap.error(f"--paired-with {args.paired_with!r}: no runs/ folder there")
    return args


def method_options(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Each method's options, model or proposer name -> options (the two registries' names differ): the
    given `--model-options` and `--proposer-options` for the methods of `--options-for` (every method without
    it), the quick mode's alone for the others."""
    given = {**args.model_options, **args.proposer_options}
    return {m: given if args.options_for is None or m in args.options_for else dict(args.base_options)
            for m in METHODS}


def _print_paused(paused: list[tuple[str, int, int]]) -> None:
    """List the runs paused at a checkpoint (name, evaluations made, budget), if any."""
    if paused:
        print("\n[gld] runs paused at a checkpoint (--resume continues them): "
              + ", ".join(f"{name} at {n} of {budget}" for name, n, budget in paused))


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    out = Path(args.out)
    (out / "runs").mkdir(parents=True, exist_ok=True)
    # the quick options (or the full grid's), with the ones given explicitly over them
    q = QUICK if args.quick else {"settings": FULL_SETTINGS, "problems": None, "methods": list(METHODS),
                                  "initial": None, "budget": None}
    triples = _parse_settings(args.settings) if args.settings else q["settings"]
    problems = _parse_problems(args.problems) if args.problems else (q["problems"] or _parse_problems("10"))
    methods = list(args.methods) if args.methods else q["methods"]
    initial = args.initial if args.initial is not None else q["initial"]
    budget = args.budget if args.budget is not None else q["budget"]
    opts = method_options(args)
    settings = [Setting(d, tau, b, initial or INITIAL_PER_DIM * d, budget or BUDGET_PER_DIM * d)
                for d, tau, b in triples]
    for s in settings:
        if s.budget < s.initial:
            raise SystemExit(f"--budget ({s.budget}) must be >= --initial ({s.initial}) for {s.label}")
    print(f"[gld] {MODE}; methods {methods}; {len(settings)} settings x {len(problems)} problems", flush=True)
    t_start = time.perf_counter()

    # one job per (setting, problem, method), so a grid can be filled in over several sessions and a method
    # added later; --resume skips the methods a result file already holds (`done_methods`, old layout
    # included)
    runs = out / "runs"
    grid = [Job(job_path(runs, s, p, m), run_problem, (s, p, m, opts[m], args.threads),
                finished_rule=functools.partial(_method_done, runs, s, p, m, opts[m]))
            for s in settings for p in problems for m in methods]
    jobs = [] if args.tables_only else grid
    if jobs:  # the methods' optimizers on the first setting's first problem: a bad option stops here
        from objectives.gld import GLDProblem

        first = GLDProblem(dim=settings[0].d, problem=problems[0])
        preflight(
            {m: functools.partial(GLDRun, m, settings[0], first, problems[0], opts[m]) for m in methods},
            "gld",
        )
    deadline = None if args.time_limit is None else time.time() + args.time_limit
    counts = run_jobs(jobs, args.workers, args.resume, deadline, "gld")
    missing = counts["paused"] + counts["skipped"]
    if missing:
        print(f"[gld] {missing} of {len(jobs) - counts['finished before']} runs not finished "
              f"({counts['paused']} paused at a checkpoint, {counts['skipped']} not started): run again with "
              "--resume", flush=True)
    paused = [
        (job.stem.name, n, job.args[0].budget)
        for job in grid
        if (n := checkpoint_evaluations(job.checkpoint))
    ]

    rows = []
    budgets = {(s.d, s.tau, s.batch): s.budget for s in settings}
    for path in sorted(runs.glob("*.csv"), key=lambda p: p.stat().st_mtime):
        for r in read_run_file(path):
            if (
                (r["d"], r["tau"], r["batch"]) in budgets
                and r["problem"] in problems
                and r["method"] in methods
            ):
                rows.append(r)
    rows, other = _at_budget(rows, budgets)
    tags = {(s.d, s.tau, s.batch, m): settings_tag(m, s.initial, opts[m]) for s in settings for m in methods}
    mine = [r["settings"] == tags[r["d"], r["tau"], r["batch"], r["method"]] for r in rows]
    foreign = sorted({f"d{r['d']}-tau{r['tau']:g}-b{r['batch']}-p{r['problem']}-{r['method']}"
                      for r, ok in zip(rows, mine) if not ok})
    rows = [r for r, ok in zip(rows, mine) if ok]
    if foreign:
        print(f"[gld] left out {len(foreign)} runs made with other settings (initial design or options; "
              f"column `settings`): {', '.join(foreign[:5])}{' ...' if len(foreign) > 5 else ''}", flush=True)
    if other:
        print(f"[gld] left out {len(other)} runs that ended at another budget (the file names do not hold "
              "the budget; use another --out for other budgets): "
              f"{', '.join(other[:5])}{' ...' if len(other) > 5 else ''}",
              flush=True)
    if note := code_mix_note(rows):
        print(f"[gld] {note}", flush=True)
    rows = merge_rows(rows)
    rows.sort(
        key=lambda r: (
            r["d"],
            r["tau"],
            r["batch"],
            list(METHODS).index(r["method"]),
            r["problem"],
            r["n_evals"],
        )
    )
    if not rows:
        # nothing of the selection has finished (say every run paused at its checkpoint): empty tables written
        # here would replace the ones a wider selection wrote into this folder before
        _print_paused(paused)
        print(f"\n[gld] no finished run in the selection: the tables and plots in {out} are left as they "
              f"were ({time.perf_counter() - t_start:.1f} s)")
        return {"rows": [], "summary": [], "paired": [], "target": [], "plots": [], "counts": counts,
                "paired_with": [], "missing": missing, "paused": paused}
    write_table(rows, out / "gld")
    summary, paired, target = summarize(rows)
    write_table(summary, out / "summary")
    if paired:
        write_table(paired, out / "paired")
    if target:
        write_table(target, out / "target")
    pw = paired_with(rows, Path(args.paired_with), settings) if args.paired_with else []
    if pw:
        write_table(pw, out / "paired_with")
    plots = make_plots(rows, out)

    print(f"\n[gld] {MODE}")
    print("\nFinal simple regret q* - q_tau(x_hat) (mean, 95% CI half-width, over problems):")
    print(
        format_table(
            summary,
            [
                "d",
                "tau",
                "batch",
                "method",
                "n_evals",
                "problems",
                "regret_mean",
                "regret_ci95",
                "regret_median",
                "bo_avg_regret_mean",
                "bo_avg_regret_ci95",
            ],
        )
    )
    print("(bo_avg: per problem, the regret averaged over the checkpoints after the initial design)")
    if paired:
        print("\nPaired over problems (method - versus; negative = method better):")
        print(format_table(paired, ["d", "tau", "batch", "method", "versus", "n", "mean_diff", "ci", "wins",
                                    "p_wilcoxon", "beats"]))
    if target:
        print("\nIssue 8 target (quantile method beats GPR-EI, HetGP-TS and qLogNEI, paired mean over "
              "problems):")
        print(format_table(target))
        for m in QUANTILE_METHODS:
            # only settings with every baseline on every problem count: a partial one is no win yet
            flags = [t[f"{m}_beats_all"] for t in target if f"{m}_beats_all" in t and t["complete"]]
            partial = sum(1 for t in target if f"{m}_beats_all" in t and not t["complete"])
            if flags or partial:
                print(f"  {m}: beats every baseline in {sum(flags)}/{len(flags)} complete settings"
                      + (f" ({partial} more with a baseline missing or partial)" if partial else ""))
        either = [
            any(t.get(f"{m}_beats_all", False) for m in QUANTILE_METHODS) for t in target if t["complete"]
        ]
        print(f"  any quantile method, settings with all of {', '.join(BASELINES)} on every problem: "
              f"{sum(either)}/{len(either)} (target: >= 75% of the full grid)")
    if pw:
        print(f"\nFinal regret against the default runs in {args.paired_with}, paired by problem (mean_diff "
              "= this - that, with its 95% CI; better = problems where this is lower; Wilcoxon p):")
        print(format_table(pw))
    _print_paused(paused)
    print(f"\n[gld] wrote {out} ({len(rows)} rows, {len(plots)} plots) in "
          f"{time.perf_counter() - t_start:.1f} s")
    return {
        "rows": rows,
        "summary": summary,
        "paired": paired,
        "target": target,
        "plots": plots,
        "counts": counts,
        "paired_with": pw,
        "missing": missing,
        "paused": paused,
    }


if __name__ == "__main__":
    main()
