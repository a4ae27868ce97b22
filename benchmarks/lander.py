"""Lunar lander: maximize the 10% and 2% reward quantiles of the 6-gain heuristic controller (paper 003 §4.2).

Reproduces quantile-expectile-bo.md §4.2 / Table 1 with qbatch's objective `lunar-lander`
(objectives/lunar_lander.py: one LunarLander-v3 episode per evaluation, 6 gains in [0, 1.2]^6). Each method
is built exactly as the central actor builds it: a config dict validated by `orchestrator.config.load_config`,
the objective by `objectives.registry.load_objective`, the space by `cfg.build_space`, then
`orchestrator.ask_tell.AskTellOptimizer` with the config's model/proposer/tau/seed. The optimization runs in
**synchronous batches in this process**: ask B points, fly B episodes, tell B results, refit, repeat (the
orchestrator's `synchronous: true` protocol, the paper's, minus Ray: the actor wraps the same optimizer).

Methods (model + proposer): quantile-ts (quantile SVGP + Thompson sampling), gpr-ei (gpr-replicates + gpr-ei:
each batch is ONE point flown B times; initial design round(n0/B) Sobol points x B replicates, spec §4.4),
hetgp-ts (heteroscedastic SVGP + Thompson sampling on the plug-in quantile), qlognei (exact GP of the mean +
BoTorch qLogNEI; optional, not in the paper's table).

qbatch's own models (quantile, expectile) run as a run with the defaults does (`_common.ask_batch`): the
budget's last `reevaluation` share (10%) re-evaluates their best observed points, and they refit warm after
each batch, with the restart from scratch at the budget's end only. The baselines search to the end and refit
warm and from scratch after every batch, as BoTorch's loops do (`_common.restarts_every_refit`).

Protocol (spec §4.2): tau in {0.1, 0.02} (separate optimizations), 300 initial, 1500 total, batch 25 (A12:
blank in the paper, 25 in the pubcode's analysis), 10 runs. Run r of every method uses config seed r.
Recommendation (spec §1.7) = `AskTellOptimizer.best()` after each fit: the observed input with the highest
posterior mean of the target. Its TRUE quantile is estimated by flying `--episodes` fresh episodes (default
200; the paper used 100, too few for a 2% quantile) with the recommended gains, on held-out seeds 2^31 + i
(trial seeds are crc32 values < 2^31, so never the same episodes), the same seeds for every recommendation
(common random numbers), and taking the empirical tau-quantile (`LunarLander.empirical_quantile`, numpy's
linear rule). This is done for the recommendations in force at the checkpoints (every `--eval-every`
evaluations from the initial design, default 150, plus 750 and the end), as the run reaches them; every
recommendation is estimated once (cached by its gains).

Long runs: each run saves a checkpoint (optimizer state, rows, timings; `OUT/runs/<run>.ckpt.pt`) after every
batch and its result file `OUT/runs/<run>.csv` as soon as it finishes. `--resume` skips finished runs and
continues checkpointed ones from their last batch (bit-identical to an uninterrupted run: every random stream
is seeded from the config seed, the model's generator state is in the checkpoint). `--time-limit S` starts no
new batch after S seconds (runs in flight pause at a checkpoint, runs not started are left), then writes the
tables from the finished runs: a command limit of 9 minutes is met with `--time-limit 420 --resume`, repeated.

Usage:
    python benchmarks/lander.py --quick                                  # CI smoke run (~15 s)
    python benchmarks/lander.py --workers 16 --resume --time-limit 420  # full: 3 methods x 2 taus x 10 runs
    python benchmarks/lander.py --methods quantile-ts gpr-ei --taus 0.1 --runs 0-4 --workers 2
    python benchmarks/lander.py --taus 0.1 --damping benchmarks/results/lander_*  # where recorded runs ended
    python benchmarks/lander.py --taus 0.1 --methods quantile-ts --runs 4 \\
        --inspect benchmarks/results/lander_head
Results in --out (default results/lander/): runs/*.csv (one per method x tau x run, named with the protocol
and a hash of the method's settings), lander.csv + lander.parquet (every checkpoint of the finished runs),
table1.csv/.parquet (mean (std) over runs at 750 and 1500 evaluations, shaped like the paper's Table 1, with
the paper's figures beside), summary.csv/.parquet (mean, std, 95% CI at the end, with the issue's target),
lander_tau<tau>.png (true quantile of the recommendation vs evaluations, mean +- 95% CI over runs); with
--cross-levels, levels.csv (each final recommendation at other reward levels); with --cross-env ENV_ID,
envs.csv (each final recommendation flown in ENV_ID too, e.g. gym:LunarLander-v2, the paper's environment);
with --inspect DIR, inspect.csv only (runs re-run to their end, their final models asked about the final
recommendations recorded in DIR: is a failed run's model unsure there, or sure and wrong?).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import sys
import time
from collections.abc import Callable, Mapping, Sequence
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
    code_mix_note,
    config_tag,
    drive_guarded,
    format_table,
    mean_ci,
    merge_options,
    next_batch_size,
    paired_comparison,
    parse_index_list,
    plot_curves,
    preflight,
    read_table,
    reevaluation_section,
    replicate_seed,
    restarts_every_refit,
    run_jobs,
    run_settings,
    write_table,
)
from benchmarks._common import build_optimizer as build_shared  # noqa: E402
from orchestrator.ask_tell.repeats import repeat_share  # noqa: E402

MODE = "synchronous batches, in-process AskTellOptimizer built from a validated config (the orchestrator's " \
       "synchronous protocol without Ray)"
#: held-out episode seeds for the true quantile: trial seeds are < 2^31 (orchestrator.ask_tell.trial_seed)
EVAL_SEED0 = 2**31
#: the paper's Table 1 (spec §4.2): (tau, method) -> {n_evals: (mean, std)}
PAPER_TABLE1: dict[tuple[float, str], dict[int, tuple[float, float]]] = {
    (0.1, "gpr-ei"): {750: (94.6, 106.1), 1500: (159.5, 110.9)},
    (0.1, "hetgp-ts"): {750: (-38.7, 17.5), 1500: (-18.7, 4.2)},
    (0.1, "quantile-ts"): {750: (204.3, 53.8), 1500: (255.2, 8.0)},
    (0.02, "gpr-ei"): {750: (141.8, 82.9), 1500: (187.4, 80.6)},
    (0.02, "hetgp-ts"): {750: (-35.1, 31.9), 1500: (-19.2, 25.2)},
    (0.02, "quantile-ts"): {750: (193.8, 56.4), 1500: (238.9, 14.6)},
}
#: the acceptance target: 10%-quantile reward of quantile TS at 1500 evaluations
TARGET = {"tau": 0.1, "method": "quantile-ts", "min_reward": 240.0}
#: the paper's protocol (spec §4.2); the target is judged only on runs of this protocol
FULL: dict[str, Any] = {"taus": [0.1, 0.02], "initial": 300, "budget": 1500, "batch": 25, "runs": "10",
                        "episodes": 200, "eval_every": 150}


METHODS: dict[str, Method] = {
    "quantile-ts": Method("quantile", "thompson"),
    "gpr-ei": Method("gpr-replicates", "gpr-ei", replicate=True),
    "hetgp-ts": Method("heteroscedastic", "thompson"),
    "qlognei": Method("exact-gp", "qlognei"),
}
DEFAULT_METHODS = ("quantile-ts", "gpr-ei", "hetgp-ts")
#: smoke-run settings; options given on the command line override these
QUICK: dict[str, Any] = {
    "taus": [0.1],
    "initial": 20,
    "budget": 40,
    "batch": 10,
    "runs": "2",
    "methods": ["quantile-ts", "gpr-ei"],
    "episodes": 20,
    "eval_every": 10,
    # smoke only: short SVGP training and a cheap Thompson search so the run stays well under 30 s
    "model_options": {
        "quantile": {"max_steps": 150, "warm_max_steps": 30, "num_inducing": 16},
        "heteroscedastic": {"max_steps": 150, "warm_max_steps": 30, "num_inducing": 16},
    },
    "proposer_options": {"thompson": {"raw_samples": 256, "num_restarts": 2, "num_features": 256}},
}


@dataclass(frozen=True)
class Protocol:
    """One optimization protocol: quantile level, design size, budget, batch size."""

    tau: float
    initial: int
    budget: int
    batch: int

    def checkpoints(self, eval_every: int) -> list[int]:
        """Evaluation counts at which the recommendation's true quantile is estimated."""
        pts = set(range(self.initial, self.budget + 1, eval_every)) | {self.initial, self.budget}
        pts |= {n for n in (750,) if self.initial <= n <= self.budget}
        return sorted(pts)


# --------------------------------------------------------------------------------------------------- building
def build_optimizer(raw_config: Mapping[str, Any]) -> tuple[Any, Any, Any]:
    """(config, objective, optimizer) built exactly as the central actor builds them
    (`_common.build_optimizer`; the objective is built once per process for a given (name, options))."""
    cfg, objective, opt, _ = build_shared(raw_config)
    return cfg, objective, opt


def lander_objective(options: Mapping[str, Any] | None) -> dict[str, Any]:
    """The objective config of every run (the runs, their result-file tags and the preflight build the
    same)."""
    return {"name": "lunar-lander", "options": dict(options or {})}


def method_config(
    name: str, proto: Protocol, run: int, objective: Mapping[str, Any], model_options: Mapping[str, Any],
    proposer_options: Mapping[str, Any],
) -> dict[str, Any]:
    """The experiment config (orchestrator/config/) of one method run."""
    m = METHODS[name]
    n0 = max(2, round(proto.initial / proto.batch)) if m.replicate else proto.initial
    return {
        "name": f"{objective['name']}-{name}",
        "objective": dict(objective),
        "tau": proto.tau,
        "model": {"type": m.model, "options": {**m.model_options, **model_options.get(m.model, {})}},
        "proposer": {
            "type": m.proposer,
            "options": {**m.proposer_options, **proposer_options.get(m.proposer, {})},
        },
        "batch_size": proto.batch,
        "initial_design": n0,
        "budget": proto.budget,
        "synchronous": True,
        "seed": int(run),
        "reevaluation": reevaluation_section(m),
    }


# ---------------------------------------------------------------------------------------------------- runs
class LanderRun(BatchRun):
    """One method, one tau, one run of the lunar lander protocol (see the module docstring)."""

    def __init__(self, name: str, proto: Protocol, run: int, episodes: int, eval_every: int,
                 model_options: Mapping[str, Any], proposer_options: Mapping[str, Any],
                 objective_options: Mapping[str, Any] | None = None) -> None:
        self.name, self.proto, self.run, self.episodes = name, proto, run, episodes
        self.replicate = METHODS[name].replicate
        raw = method_config(name, proto, run, lander_objective(objective_options),
                            model_options, proposer_options)
        self.key = json.dumps([raw, episodes, eval_every], sort_keys=True, default=str)
        self.cfg, self.obj, self.opt = build_optimizer(raw)
        self.final = repeat_share(self.cfg.budget, self.cfg.reevaluation.fraction)
        self.restart_always = restarts_every_refit(METHODS[name])
        self.checkpoints = proto.checkpoints(eval_every)
        self.n = 0
        self.batches: list[dict] = []  # one per fit: the recommendation and the checkpoints it covers
        self.q_cache: dict[str, float] = {}
        self.times = {
            "fit_s": 0.0,
            "propose_s": 0.0,
            "eval_s": 0.0,
            "quantile_s": 0.0,
            "run_s": 0.0,
            "cpu_s": 0.0,
        }

    # --- evaluation
    def _fly(self, params: Mapping[str, Any], seed: int) -> tuple[Any, str | None]:
        """One episode's reward, or (None, the error): a failing evaluation is a failed trial."""
        try:
            return getattr(self.obj.evaluate(params, seed), "value", None), None
        except Exception as exc:
            return None, f"{type(exc).__name__}: {exc}"

    def _evaluate(self, trials: Sequence[Any], reps: int = 1) -> None:
        t0 = time.perf_counter()
        for t in trials:
            y, error = self._fly(t.params, t.seed)
            self.opt.tell(t.trial_id, y, error=error)
            for r in range(1, reps):  # GPR-EI's initial design: the same point flown `reps` times (spec §4.4)
                self.opt.tell_point(t.params, self._fly(t.params, replicate_seed(t.seed, r))[0])
        self.n += len(trials) * reps
        self.times["eval_s"] += time.perf_counter() - t0

    def _fit_and_record(self) -> None:
        t0 = time.perf_counter()
        self.opt.fit(restart=self.restart_always or self.done)
        self.times["fit_s"] += time.perf_counter() - t0
        params, predicted = self.opt.best()
        # the checkpoints this recommendation is in force at: up to the next batch's end (or the budget)
        size = next_batch_size(self.n, self.cfg.budget, self.cfg.batch_size, self.final)
        nxt = self.n + size if size else self.n + 1
        covers = [c for c in self.checkpoints if self.n <= c < nxt]
        key = json.dumps(params, sort_keys=True)
        if covers and key not in self.q_cache:
            t0 = time.perf_counter()
            self.q_cache[key] = self.obj.empirical_quantile(params, self.proto.tau, self.episodes, EVAL_SEED0)
            self.times["quantile_s"] += time.perf_counter() - t0
        self.batches.append(
            {
                "batch_end": self.n,
                "params": key,
                "predicted": float(predicted),
                "covers": covers,
                "q_true": self.q_cache.get(key, float("nan")),
                "fit_s": self.times["fit_s"],
                "propose_s": self.times["propose_s"],
                "eval_s": self.times["eval_s"],
                "failures": self.opt.num_failed,
            }
        )

    # --- BatchRun
    def start(self) -> None:
        # GPR-EI (spec §4.4): round(n0 / B) Sobol points, each flown B times; the others: n0 Sobol points
        self._evaluate(self.opt.ask(self.cfg.initial_design), self.cfg.batch_size if self.replicate else 1)
        self._fit_and_record()

    def step(self) -> None:
        t0 = time.perf_counter()
        # GPR-EI's proposer repeats its one EI point q times (distinct trials, distinct episode seeds)
        trials = ask_batch(self.opt, self.n, self.cfg.budget, self.cfg.batch_size, self.final,
                           self.cfg.reevaluation.repeats, fit=False)
        self.times["propose_s"] += time.perf_counter() - t0
        self._evaluate(trials)
        self._fit_and_record()

    @property
    def done(self) -> bool:
        return self.n >= self.cfg.budget

    def records_state(self) -> dict[str, Any]:
        return {"batches": [dict(b) for b in self.batches], "q_cache": dict(self.q_cache)}

    def set_records_state(self, state: Mapping[str, Any]) -> None:
        self.batches = [dict(b) for b in state["batches"]]
        self.q_cache = {str(k): float(v) for k, v in state["q_cache"].items()}

    def rows(self, base: Mapping[str, Any]) -> list[dict]:
        """One row per checkpoint reached: the recommendation in force and its true quantile."""
        rows = []
        for b in self.batches:
            for c in b["covers"]:
                rows.append({**base, "n_evals": c, "batch_end": b["batch_end"], "params": b["params"],
                             "predicted": b["predicted"], "q_true": b["q_true"], "fit_s": b["fit_s"],
                             "propose_s": b["propose_s"], "eval_s": b["eval_s"], "failures": b["failures"],
                             "error": ""})
        if rows:
            rows[-1].update(
                run_s=self.times["run_s"], cpu_s=self.times["cpu_s"], quantile_s=self.times["quantile_s"]
            )
        return rows


def run_one(
    name: str, proto: Protocol, run: int, episodes: int, eval_every: int, model_options: Mapping[str, Any],
    proposer_options: Mapping[str, Any], threads: int = 1, objective_options: Mapping[str, Any] | None = None,
    checkpoint: Path | None = None, deadline: float | None = None, stop_after: int | None = None,
) -> tuple[str, list[dict]]:
    """One method, one tau, one run: ("done", a row per checkpoint), ("paused", []) or ("skipped", []).

    "skipped": `deadline` had passed before the run started. A run that raises gives ("done", one row with
    the error); `--resume` runs it again.
    """
    if deadline is not None and time.time() > deadline:
        return "skipped", []
    base = {"method": name, "tau": proto.tau, "run": run, "batch": proto.batch, "initial": proto.initial,
            "budget": proto.budget, "episodes": episodes, "mode": MODE}
    status, lander, error = drive_guarded(
        lambda: LanderRun(
            name, proto, run, episodes, eval_every, model_options, proposer_options, objective_options
        ),
        checkpoint,
        deadline,
        stop_after,
        threads,
        f"[lander] {name} tau={proto.tau:g} run {run}",
    )
    if error:
        return "done", [{**base, "n_evals": 0, "params": "{}", "q_true": float("nan"), "error": error}]
    if status != "done":
        return status, []
    rows = lander.rows(base)
    t = lander.times
    print(f"[lander] {name} tau={proto.tau:g} run {run}: final q_true {rows[-1]['q_true']:.1f} "
          f"({t['run_s']:.0f} s, CPU {t['cpu_s']:.0f} s: "
          f"fit {t['fit_s']:.0f}, propose {t['propose_s']:.0f}, episodes {t['eval_s']:.0f}, true quantiles "
          f"{t['quantile_s']:.0f})", flush=True)
    return status, rows


# --------------------------------------------------------------------------------------------------- analysis
def _std(vals: Sequence[float]) -> float:
    import numpy as np

    return float(np.std(vals, ddof=1)) if len(vals) > 1 else float("nan")


def is_full(args: argparse.Namespace) -> bool:
    """Whether the protocol is the paper's (the issue's targets are judged on such runs only)."""
    return (args.initial, args.budget, args.batch) == (FULL["initial"], FULL["budget"], FULL["batch"])


def table1(rows: Sequence[dict], checkpoints: Sequence[int]) -> list[dict]:
    """Paper 003 Table 1 shape: per (tau, method), mean (std) over runs of the true quantile at
    `checkpoints`."""
    out = []
    for tau in sorted({r["tau"] for r in rows}, reverse=True):
        for m in METHODS:
            sel = [r for r in rows if r["tau"] == tau and r["method"] == m and not r["error"]]
            if not sel:
                continue
            row: dict[str, Any] = {
                "level": f"{tau * 100:g}%",
                "method": m,
                "runs": len({r["run"] for r in sel}),
            }
            for c in checkpoints:
                vals = [r["q_true"] for r in sel if r["n_evals"] == c]
                if vals:
                    row[f"{c} obs"] = f"{mean_ci(vals)[0]:.1f} ({_std(vals):.1f})"
            for c, (pm, ps) in PAPER_TABLE1.get((tau, m), {}).items():
                row[f"paper {c}"] = f"{pm} ({ps})"
            out.append(row)
    return out


def summarize(rows: Sequence[dict], full: bool) -> list[dict]:
    """Mean +- 95% CI over runs of the final true quantile, per (tau, method), with the target check."""
    out = []
    for tau in sorted({r["tau"] for r in rows}, reverse=True):
        for m in METHODS:
            sel = [r for r in rows if r["tau"] == tau and r["method"] == m and not r["error"]]
            if not sel:
                continue
            last = max(r["n_evals"] for r in sel)
            fin = [r for r in sel if r["n_evals"] == last]
            vals = [r["q_true"] for r in fin]
            mean, half, k = mean_ci(vals)
            row = {
                "tau": tau,
                "method": m,
                "n_evals": last,
                "runs": k,
                "q_true_mean": mean,
                "q_true_std": _std(vals),
                "q_true_ci95": half,
                "q_true_min": min(vals),
                "q_true_max": max(vals),
                "run_s_mean": mean_ci([r["run_s"] for r in fin])[0],
                "cpu_s_mean": mean_ci([r["cpu_s"] for r in fin])[0],
            }
            if full and tau == TARGET["tau"] and m == TARGET["method"]:
                row["target"] = (f">= {TARGET['min_reward']:g}: "
                                 f"{'met' if mean >= TARGET['min_reward'] else 'MISSED'}")
            out.append(row)
    return out


def paired_with(rows: Sequence[dict], base_dir: Path, checkpoints: Sequence[int]) -> list[dict]:
    """This run's true quantiles against another recorded run folder's, paired by (level, method, run number)
    at each checkpoint: mean difference (this - other; higher reward is better) with its 95% CI, the runs
    ahead, and the Wilcoxon p. How a variant (other options) compares with the default on the same seeds."""
    base: dict[tuple, float] = {}
    for f in sorted((base_dir / "runs").glob("*.csv")):
        for r in read_table(f):
            if not r.get("error"):
                base[(float(r["tau"]), r["method"], int(float(r["n_evals"])), int(r["run"]))] = float(
                    r["q_true"]
                )
    out = []
    for tau in sorted({r["tau"] for r in rows}, reverse=True):
        for m in METHODS:
            for c in checkpoints:
                mine = {r["run"]: r["q_true"] for r in rows
                        if r["tau"] == tau and r["method"] == m and r["n_evals"] == c and not r["error"]}
                theirs = {k[3]: v for k, v in base.items() if k[:3] == (tau, m, c)}
                if not mine or not theirs:
                    continue
                pc = paired_comparison(mine, theirs)
                out.append(
                    {
                        "tau": tau,
                        "method": m,
                        "n_evals": c,
                        "runs": pc["n"],
                        "mean_diff": pc["mean_diff"],
                        "ci95": pc["ci"],
                        "ahead": round((1 - pc["wins"] - pc["ties"]) * pc["n"]),
                        "p_wilcoxon": pc["p_wilcoxon"],
                    }
                )
    return out


def curves_by_method(
    rows: Sequence[dict], methods: Sequence[str], key: str, select: Callable[[dict], bool]
) -> dict:
    """label -> (x values, per-run value lists) for `plot_curves`: runs that reached every x only."""
    curves = {}
    for m in methods:
        runs: dict[int, dict[int, float]] = {}
        for r in rows:
            if r["method"] == m and not r["error"] and select(r):
                runs.setdefault(r["run"], {})[r["n_evals"]] = r[key]
        xs = sorted({n for pts in runs.values() for n in pts})
        reps = [[pts[x] for x in xs] for pts in runs.values() if all(x in pts for x in xs)]
        if reps:
            curves[m] = (xs, reps)
    return curves


def final_recommendations(rows: Sequence[dict]) -> list[dict]:
    """The last checkpoint of every finished run (no error), ordered by tau (descending), method and run."""
    final: dict[tuple, dict] = {}
    for r in rows:
        k = (r["tau"], r["method"], r["run"])
        if not r["error"] and (k not in final or r["n_evals"] > final[k]["n_evals"]):
            final[k] = r
    return [final[k] for k in sorted(final, key=lambda k: (-k[0], k[1], k[2]))]


def recorded_final_recommendations(folder: Path, tau: float, method: str) -> list[dict]:
    """`final_recommendations` of `method`'s runs at level `tau` in a recorded folder's lander.csv (CSV values
    are
    strings: tau, run and n_evals converted, the rest as read)."""
    rows = [
        {
            **r,
            "tau": float(r["tau"]),
            "run": int(r["run"]),
            "n_evals": int(r["n_evals"]),
            "error": r["error"] or "",
        }
        for r in read_table(Path(folder) / "lander.csv")
    ]
    return [r for r in final_recommendations(rows) if r["tau"] == tau and r["method"] == method]


def held_out_rewards(obj: Any, params: str, episodes: int, cache: dict) -> Any:
    """Rewards of `episodes` episodes of the recommendation `params` (its JSON) on the held-out seeds
    EVAL_SEED0 + i, memoized in `cache` by (environment, params, episodes): `--cross-levels` and `--cross-env`
    share one cache, so our own environment's episodes are flown once."""
    key = (obj.env_id, params, int(episodes))
    if key not in cache:
        cache[key] = obj.episode_rewards(json.loads(params), episodes, EVAL_SEED0)
    return cache[key]


def cross_levels(rows: Sequence[dict], levels: Sequence[float], episodes: int,
                 objective_options: Mapping[str, Any], cache: dict | None = None) -> list[dict]:
    """Each finished run's FINAL recommendation scored at every level in `levels` (not only the one it was
    optimized for): `episodes` fresh episodes on the held-out seeds EVAL_SEED0 + i (the same ones as the
    run's own estimate, so the entry at the run's level equals its q_true), their empirical quantiles, mean
    reward and fraction of episodes below 0 reward. Answers "does the good region at one level exist for the
    other?": e.g. whether the 2% runs miss controllers that the 10% runs find."""
    import numpy as np

    from objectives.lunar_lander import LunarLander

    obj = LunarLander(**dict(objective_options))
    cache = {} if cache is None else cache
    out = []
    for r in final_recommendations(rows):
        rewards = held_out_rewards(obj, r["params"], episodes, cache)
        row = {"tau": r["tau"], "method": r["method"], "run": r["run"], "n_evals": r["n_evals"],
               "episodes": int(episodes)}
        row.update({f"q{lv * 100:g}": float(np.quantile(rewards, lv)) for lv in levels})
        row.update({"mean_reward": float(rewards.mean()), "p_below_0": float(np.mean(rewards < 0))})
        out.append(row)
    return out


def cross_env(rows: Sequence[dict], env_id: str, episodes: int, objective_options: Mapping[str, Any],
              cache: dict | None = None) -> list[dict]:
    """Each finished run's FINAL recommendation flown in the runs' environment and in `env_id` (e.g.
    "gym:LunarLander-v2", the paper's, from the legacy gym package) on the same held-out seeds EVAL_SEED0 + i:
    the run's reward quantile, the mean reward and the crash fraction in each, the share of seeds whose two
    rewards agree to 1e-6, and a two-sample Kolmogorov-Smirnov p-value. Answers "would the paper's
    environment have scored our recommendations differently?"."""
    import numpy as np
    from scipy.stats import ks_2samp

    from objectives.lunar_lander import LunarLander

    ours = LunarLander(**dict(objective_options))
    other = LunarLander(**{**dict(objective_options), "env_id": env_id})
    cache = {} if cache is None else cache
    out = []
    for r in final_recommendations(rows):
        a = held_out_rewards(ours, r["params"], episodes, cache)
        b = other.episode_rewards(json.loads(r["params"]), episodes, EVAL_SEED0)  # always flown: never cached
        row = {"tau": r["tau"], "method": r["method"], "run": r["run"], "episodes": int(episodes),
               "env": ours.env_id, "other_env": env_id}
        for name, x in (("env", a), ("other", b)):
            row.update({f"q_{name}": float(np.quantile(x, r["tau"])), f"mean_{name}": float(x.mean()),
                        f"p_below_0_{name}": float(np.mean(x < 0))})
        row.update({"same_seed_equal": float(np.mean(np.abs(a - b) <= 1e-6)),
                    "ks_p": float(ks_2samp(a, b, method="asymp").pvalue)})
        out.append(row)
    return out


#: `--damping` bands of a final recommendation's true quantile: a poor region, in between, the good region
DAMPING_BANDS: tuple[tuple[str, float, float], ...] = (("< 50", -math.inf, 50.0), ("50 to 200", 50.0, 200.0),
                                                       (">= 200", 200.0, math.inf))


def damping(
    folders: Sequence[Path], tau: float = 0.1, method: str = "quantile-ts"
) -> tuple[list[dict], list[dict]]:
    """Where the final recommendations of recorded runs lie: per run (every folder's `lander.csv`, `method` at
    level `tau`), its true quantile and its gains, with the angle atan2(vertical_speed_gain, hover_gain) in
    degrees (w3 against w2: the damping against the position gain of the controller's altitude loop,
    hover_todo = (target
    - y) w2 - vy w3; 45 where they are equal, 90 with no position gain); and per band of the true quantile
    (`DAMPING_BANDS`), how many runs and the range and median of the angle. Answers "are the failed runs
    scattered, or stuck in one place?"."""
    import numpy as np

    runs = []
    for folder in folders:
        for r in recorded_final_recommendations(folder, tau, method):
            gains = json.loads(r["params"])
            runs.append(
                {
                    "folder": Path(folder).name,
                    "run": r["run"],
                    "n_evals": r["n_evals"],
                    "q_true": float(r["q_true"]),
                    **gains,
                    "damping_deg": math.degrees(
                        math.atan2(gains["vertical_speed_gain"], gains["hover_gain"])
                    ),
                }
            )
    bands = []
    for name, lo, hi in DAMPING_BANDS:
        angle = np.array([r["damping_deg"] for r in runs if lo <= r["q_true"] < hi])
        hover = np.array([r["hover_gain"] for r in runs if lo <= r["q_true"] < hi])
        bands.append({"q_true": name, "runs": len(angle),
                      **({"damping_deg_min": angle.min(), "damping_deg_median": float(np.median(angle)),
                          "damping_deg_max": angle.max(), "hover_gain_median": float(np.median(hover))}
                         if len(angle) else {})})
    return runs, bands


#: `--inspect`: how many of a run's observations nearest to a controller are listed (distances and rewards)
INSPECT_NEAREST = 5
#: `--inspect`: methods whose model's target is its latent f (so f's posterior SD is the prediction's)
INSPECTABLE = ("quantile-ts",)


def inspect_runs(
    folder: Path,
    runs: Sequence[int],
    method: str,
    proto: Protocol,
    episodes: int,
    eval_every: int,
    model_options: Mapping[str, Any],
    proposer_options: Mapping[str, Any],
    objective_options: Mapping[str, Any],
    threads: int = 1,
) -> list[dict]:
    """Re-run each of `runs` (`method`, level `proto.tau`) to its end, in this process and without a
    checkpoint (runs are reproducible from their config and seed, so this is the recorded run when the
    settings match), and
    ask its final recommender (the model `best()` came from) about controllers whose true quantile is known:
    its own final recommendation and the final recommendations of `method`'s runs at that level in `folder`
    (its lander.csv). Per (run, controller): the model's predicted quantile (the recommendation rule's
    value, user units) and the posterior SD of f there, the true quantile as recorded, z = (true -
    predicted) / SD, and the max-norm distance (unit cube) to the run's nearest observations with their
    rewards. Answers "is a failed run's model unsure about the controllers the other runs found, or sure and
    wrong?". One row per (run, controller), the run's fitted lengthscales of f and outputscale in every
    row."""
    import torch

    ref = recorded_final_recommendations(folder, proto.tau, method)
    out = []
    for run in runs:
        # no checkpoint: the run goes to its end in this call (which calls the lambda, so `run` is this one)
        _, lander, error = drive_guarded(
            lambda: LanderRun(method, proto, run, episodes, eval_every, model_options,  # noqa: B023
                              proposer_options, objective_options),
            None, None, None, threads, f"[lander] --inspect run {run}")
        if error:
            raise RuntimeError(f"--inspect: run {run} failed: {error}")
        X, Y = lander.opt.observations()
        # the model the recommendation came from (a constant-scale refit for the quantile model)
        model, space = lander.opt.recommender, lander.opt.space
        loc, scale = model.outcome_transform
        sign = lander.opt.sign
        own = lander.batches[-1]
        asked = [("own", run, own["q_true"], own["params"])] + [
            (folder.name, r["run"], float(r["q_true"]), r["params"]) for r in ref
        ]
        U = space.to_unit([json.loads(p) for _, _, _, p in asked], dtype=X.dtype)
        with torch.no_grad():
            mean = sign * (loc + scale * model.objective_mean(U).reshape(-1))
            _, var = model.posterior_f(U, full_cov=False)
            sd = abs(scale) * var.reshape(-1).clamp_min(0).sqrt()
            dist = (U.unsqueeze(1) - X.unsqueeze(0)).abs().amax(-1)  # controllers x observations, max-norm
        hyper = model.model
        ls = [float(v) for v in hyper.lengthscale[0].detach().reshape(-1)]
        for i, (source, source_run, q_true, params) in enumerate(asked):
            near = dist[i].argsort()[:INSPECT_NEAREST]
            out.append(
                {
                    "run": run,
                    "final_q_true": own["q_true"],
                    "source": source,
                    "source_run": source_run,
                    "params": params,
                    "q_true": q_true,
                    "predicted": float(mean[i]),
                    "f_sd": float(sd[i]),
                    "z": (q_true - float(mean[i])) / float(sd[i]) if float(sd[i]) > 0 else float("nan"),
                    "nearest_dist_min": float(dist[i, near[0]]),
                    "nearest_dist_max": float(dist[i, near[-1]]),
                    "nearest_rewards": json.dumps([round(sign * float(Y[j]), 1) for j in near]),
                    "lengthscales_f": json.dumps([round(v, 3) for v in ls]),
                    "outputscale_f": float(hyper.outputscale[0].detach()),
                }
            )
    return out


def make_plots(rows: Sequence[dict], out: Path) -> list[Path]:
    """One PNG per tau: true quantile of the recommendation vs evaluations, mean +- 95% CI over runs."""
    paths = []
    for tau in sorted({r["tau"] for r in rows}):
        curves = curves_by_method(rows, list(METHODS), "q_true", lambda r: r["tau"] == tau)  # noqa: B023
        if curves:
            paths.append(plot_curves(
                curves, out / f"lander_tau{tau:g}.png", logy=False,
                ylabel=f"{tau * 100:g}% reward quantile of x_hat",
                title=f"Lunar lander, {tau * 100:g}% quantile (mean +- 95% CI over runs)"))
    return paths


# ---------------------------------------------------------------------------------------------------- CLI
def parse_runs(spec: str) -> list[int]:
    """`--runs`: a count (10 = runs 0..9), a range (0-9) or a list (1,4,7)."""
    return parse_index_list(spec, "--runs")

def add_common_args(ap: argparse.ArgumentParser, out: str) -> None:
    """The options both benchmarks share: runs, options, parallelism, resume and time limit."""
    ap.add_argument("--runs", "--seeds", dest="runs",
                    help="count (10 = runs 0..9), range 0-9, or list 1,4,7; run r uses config seed r "
                         "(default 10)")
    ap.add_argument("--model-options", type=json.loads, default={},
                    help='JSON: model name -> options, e.g. {"quantile": {"num_inducing": 64}}')
    ap.add_argument("--proposer-options", type=json.loads, default={},
                    help='JSON: proposer name -> options, e.g. {"thompson": {"num_features": 500}}')
    ap.add_argument("--workers", type=int, default=1, help="parallel processes (one run each)")
    ap.add_argument("--threads", type=int, default=1, help="torch/BLAS threads per process")
    ap.add_argument("--resume", action="store_true",
                    help="skip finished runs in OUT/runs and continue checkpointed ones")
    ap.add_argument("--time-limit", type=float,
                    help="seconds after which no new batch starts (runs pause at a checkpoint; use with "
                         "--resume)")
    ap.add_argument("--out", default=out, help="output directory")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="CI smoke run: tau 0.1, 2 runs, quantile-ts and gpr-ei, 20 + 2 x 10 evaluations, "
                         "20 episodes per true quantile, short fits (options given explicitly still apply)")
    ap.add_argument("--methods", nargs="+", choices=sorted(METHODS),
                    help=f"methods (default: {' '.join(DEFAULT_METHODS)})")
    ap.add_argument("--taus", nargs="+", type=float, help="quantile levels (default: 0.1 0.02)")
    ap.add_argument("--initial", type=int, help="initial design size (300)")
    ap.add_argument("--budget", type=int, help="total evaluations (1500)")
    ap.add_argument("--batch", type=int, help="batch size (25, spec A12)")
    ap.add_argument("--episodes", type=int, help="fresh episodes per true-quantile estimate (200)")
    ap.add_argument("--eval-every", type=int, help="true-quantile checkpoints every N evaluations (150)")
    ap.add_argument("--objective-options", type=json.loads, default={},
                    help='JSON: LunarLander options, e.g. {"timeout_penalty": -100} (the pubcode\'s sign, '
                         'A11)')
    ap.add_argument("--cross-levels", nargs="+", type=float, metavar="LEVEL",
                    help="also score every finished run's final recommendation at these reward quantile "
                         "levels (--episodes fresh episodes; OUT/levels.csv), e.g. 0.02 0.1")
    ap.add_argument("--cross-env", metavar="ENV_ID",
                    help="also fly every finished run's final recommendation in this environment on the same "
                         "episodes (OUT/envs.csv), e.g. gym:LunarLander-v2 (the paper's; pip install "
                         "gym==0.26.2)")
    ap.add_argument("--damping", nargs="+", metavar="DIR",
                    help="run nothing: tabulate where the final recommendations of the quantile-ts runs at "
                         "the first --taus level in these recorded folders (those with a lander.csv) lie "
                         "(the angle of (hover_gain, vertical_speed_gain) by band of their true quantile; "
                         "OUT/damping.csv, OUT/damping_runs.csv)")
    ap.add_argument("--inspect", metavar="DIR",
                    help="re-run each of --runs (the first --methods and --taus) to its end without writing "
                         "run files, and ask the model its final recommendation came from about it and "
                         "those of the runs in DIR (predicted quantile, posterior SD of f, true quantile; "
                         "OUT/inspect.csv)")
    ap.add_argument("--paired-with", metavar="DIR",
                    help="also compare every finished run with the same method, level and run number in "
                         "another run folder (e.g. benchmarks/results/lander_full), at 750 evaluations and "
                         "at the budget (OUT/paired_with.csv)")
    add_common_args(ap, str(REPO / "results" / "lander"))
    args = ap.parse_args(argv)
    if args.paired_with is not None and not (Path(args.paired_with) / "runs").is_dir():
        ap.error(f"--paired-with {args.paired_with!r}: no runs/ folder there")
    if args.inspect is not None and not (Path(args.inspect) / "lander.csv").is_file():
        ap.error(f"--inspect {args.inspect!r}: no lander.csv there")
    if args.damping and not any((Path(d) / "lander.csv").is_file() for d in args.damping):
        ap.error(f"--damping: no lander.csv in any of {args.damping}")
    defaults = QUICK if args.quick else {**FULL, "methods": list(DEFAULT_METHODS)}
    for k in ("taus", "initial", "budget", "batch", "runs", "episodes", "eval_every", "methods"):
        if getattr(args, k) is None:
            setattr(args, k, defaults[k])
    if args.inspect is not None and args.methods[0] not in INSPECTABLE:
        ap.error(f"--inspect: the first --methods must be one of {list(INSPECTABLE)} (a model whose target "
                 f"is its latent f); got {args.methods[0]!r}")
    quick_opts = (QUICK["model_options"], QUICK["proposer_options"]) if args.quick else ({}, {})
    args.model_options = merge_options(quick_opts[0], args.model_options, "--model-options", MODELS)
    args.proposer_options = merge_options(
        quick_opts[1], args.proposer_options, "--proposer-options", PROPOSERS
    )
    if not isinstance(args.objective_options, dict):
        ap.error(f'--objective-options: a JSON object, e.g. {{"timeout_penalty": -100}}; got '
                 f'{args.objective_options!r}')
    args.runs = parse_runs(str(args.runs))
    if args.workers < 1 or args.threads < 1 or args.episodes < 2 or args.eval_every < 1:
        ap.error("--workers, --threads, --eval-every must be >= 1 and --episodes >= 2")
    for t in [*args.taus, *(args.cross_levels or [])]:
        if not 0 < t < 1:
            ap.error(f"--taus, --cross-levels: each level must be in (0, 1); got {t}")
    if args.cross_env is not None:
        from objectives.base import ObjectiveError
        from objectives.lunar_lander import LunarLander

        try:  # fail before any run starts, naming the flag
            LunarLander(**{**args.objective_options, "env_id": args.cross_env}).make_env()
        except (ObjectiveError, TypeError) as exc:
            ap.error(f"--cross-env {args.cross_env!r}: {exc}")
    if not 1 <= args.initial <= args.budget or args.batch < 1:
        ap.error(f"need 1 <= --initial ({args.initial}) <= --budget ({args.budget}) and --batch >= 1")
    if args.time_limit is not None and args.time_limit < 0:
        ap.error(f"--time-limit must be >= 0 seconds; got {args.time_limit}")
    return args


def _as_types(r: dict, ints: Sequence[str], floats: Sequence[str]) -> dict:
    """A row read back from CSV with its numeric columns converted (missing -> 0 / NaN)."""
    r = dict(r)
    for k in ints:
        r[k] = int(float(r[k])) if r.get(k) not in (None, "") else 0
    for k in floats:
        r[k] = float(r[k]) if r.get(k) not in (None, "") else float("nan")
    r["error"] = r.get("error") or ""
    return r


def make_jobs(args: argparse.Namespace) -> list[Job]:
    """The runs `args` ask for, run-major (a time limit leaves the same runs finished for every method and
    tau).

    Result files are named with the protocol and a hash of the method's settings, so runs of other settings
    in the same OUT are never mixed in or resumed.
    """
    jobs = []
    for r in args.runs:
        for tau in args.taus:
            p = Protocol(tau, args.initial, args.budget, args.batch)
            for m in args.methods:
                objective = lander_objective(args.objective_options)
                settings = method_config(m, p, 0, objective, args.model_options, args.proposer_options)
                tag = config_tag([run_settings(settings), args.episodes, args.eval_every])
                stem = (
                    Path(args.out)
                    / "runs"
                    / f"{m}-tau{tau:g}-n{args.initial}-{args.budget}-b{args.batch}-{tag}-r{r}"
                )
                jobs.append(Job(stem, run_one, (m, p, r, args.episodes, args.eval_every, args.model_options,
                                                args.proposer_options, args.threads, args.objective_options)))
    return jobs


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    out = Path(args.out)
    if args.damping:
        folders = [Path(f) for f in args.damping if (Path(f) / "lander.csv").is_file()]
        if skipped := [f for f in args.damping if Path(f) not in folders]:
            print(f"[lander] --damping: no lander.csv in {skipped}, left out", flush=True)
        runs, bands = damping(folders, args.taus[0])
        if runs:
            write_table(runs, out / "damping_runs")
            write_table(bands, out / "damping")
        print(f"[lander] final recommendations of quantile-ts at the {args.taus[0] * 100:g}% level in "
              f"{len(folders)} folders ({len(runs)} runs): atan2(vertical_speed_gain, hover_gain) in degrees "
              f"(45: equal gains) by true quantile")
        print(format_table(bands))
        return {"damping_runs": runs, "damping": bands}
    if args.inspect is not None:
        method, proto = args.methods[0], Protocol(args.taus[0], args.initial, args.budget, args.batch)
        rows = inspect_runs(Path(args.inspect), args.runs, method, proto, args.episodes, args.eval_every,
                            args.model_options, args.proposer_options, args.objective_options, args.threads)
        write_table(rows, out / "inspect")
        print(f"[lander] {method} at the {proto.tau * 100:g}% level, runs {args.runs} re-run to "
              f"{args.budget} evaluations; their final models at their own final recommendation and at those "
              f"of {args.inspect} (f_sd: posterior SD of f; z = (q_true - predicted) / f_sd; nearest: "
              f"max-norm distance in the unit cube to the run's {INSPECT_NEAREST} nearest observations):")
        print(
            format_table(
                rows,
                [
                    "run",
                    "final_q_true",
                    "source",
                    "source_run",
                    "q_true",
                    "predicted",
                    "f_sd",
                    "z",
                    "nearest_dist_min",
                    "nearest_dist_max",
                    "nearest_rewards",
                ],
            )
        )
        for run in args.runs:
            r = next(r for r in rows if r["run"] == run)
            print(f"[lander] run {run}: lengthscales of f {r['lengthscales_f']}, outputscale "
                  f"{r['outputscale_f']:.3f}")
        return {"inspect": rows}
    (out / "runs").mkdir(parents=True, exist_ok=True)
    deadline = None if args.time_limit is None else time.time() + args.time_limit
    print(f"[lander] {MODE}; methods {args.methods}; taus {args.taus}; runs {args.runs}; initial "
          f"{args.initial}, budget {args.budget}, batch {args.batch}; true quantile from {args.episodes} "
          f"fresh episodes (seeds {EVAL_SEED0}+i)", flush=True)
    t_start = time.perf_counter()
    objective = lander_objective(args.objective_options)
    preflight({f"{m} tau {tau:g}": functools.partial(
        build_optimizer, method_config(m, Protocol(tau, args.initial, args.budget, args.batch), 0, objective,
                                       args.model_options, args.proposer_options))
        for tau in args.taus for m in args.methods}, "lander")
    jobs = make_jobs(args)
    counts = run_jobs(jobs, args.workers, args.resume, deadline, "lander")

    rows = []
    for job in jobs:
        if job.csv.exists():
            for r in read_table(job.csv):
                r = _as_types(
                    {**r, "tau": float(r["tau"]), "run": int(r["run"])},
                    ("n_evals", "batch_end", "batch", "initial", "budget", "episodes", "failures"),
                    ("q_true", "predicted", "fit_s", "propose_s", "eval_s", "run_s", "cpu_s", "quantile_s"),
                )
                rows.append(r)
    rows.sort(key=lambda r: (-r["tau"], list(METHODS).index(r["method"]), r["run"], r["n_evals"]))
    if note := code_mix_note(rows):
        print(f"[lander] {note}", flush=True)
    missing = len(jobs) - len({(r["method"], r["tau"], r["run"]) for r in rows})
    t1, summary, plots = [], [], []
    if rows:
        write_table(rows, out / "lander")
        half = [c for c in (750,) if args.initial <= c < args.budget]
        t1 = table1(rows, half + [args.budget])
        summary = summarize(rows, is_full(args))
        if t1:
            write_table(t1, out / "table1")
        if summary:
            write_table(summary, out / "summary")
        plots = make_plots(rows, out)

    print(f"\n[lander] {MODE}")
    print(f"\nTable 1 shape: true {'/'.join(f'{t * 100:g}%' for t in args.taus)} reward quantile of the "
          f"recommended controller, mean (std) over runs ({args.episodes} fresh episodes per estimate):")
    print(format_table(t1))
    print("\nFinal true quantile (mean, std, 95% CI half-width over runs):")
    print(
        format_table(
            summary,
            [
                "tau",
                "method",
                "n_evals",
                "runs",
                "q_true_mean",
                "q_true_std",
                "q_true_ci95",
                "q_true_min",
                "q_true_max",
                "run_s_mean",
                "cpu_s_mean",
            ]
            + (["target"] if any("target" in s for s in summary) else []),
        )
    )
    # the optional re-scorings of the final recommendations: (result key and table stem, asked?, scorer,
    # title)
    extras: dict[str, list[dict]] = {}
    held_out: dict = {}  # our environment's held-out episodes, flown once for both scorings
    checkpoints = [c for c in (750,) if args.initial <= c < args.budget] + [args.budget]
    for stem, asked, score, title in (
        ("paired_with", args.paired_with,
         lambda: paired_with(rows, Path(args.paired_with), checkpoints),
         f"True quantiles against {args.paired_with}, paired by run (mean_diff = this - other, with its 95% "
         "CI; ahead = runs where this is higher; Wilcoxon p)"),
        ("levels", args.cross_levels,
         lambda: cross_levels(rows, args.cross_levels, args.episodes, args.objective_options, held_out),
         f"Final recommendations at every level (true reward quantiles over {args.episodes} fresh episodes; "
         "p_below_0 = fraction of episodes with negative reward)"),
        ("envs", args.cross_env,
         lambda: cross_env(rows, args.cross_env, args.episodes, args.objective_options, held_out),
         f"Final recommendations in two environments ({args.episodes} episodes on the same seeds; q = the "
         "run's reward quantile; same_seed_equal = share of seeds with equal rewards)"),
    ):
        extras[stem] = score() if asked and rows else []
        if extras[stem]:
            write_table(extras[stem], out / stem)
            print(f"\n{title}:")
            print(format_table(extras[stem]))
    errors = [r for r in rows if r["error"]]
    if errors:
        print(f"\n{len(errors)} failed runs: " + "; ".join(f"{r['method']} tau={r['tau']:g} run {r['run']}: "
                                                      f"{r['error']}" for r in errors))
    if missing:
        print(f"\n[lander] {missing} of {len(jobs)} runs not finished ({counts['paused']} paused at a "
              f"checkpoint, {counts['skipped']} not started): run again with --resume")
    print(f"\n[lander] wrote {out} ({len(rows)} rows, {len(plots)} plots) in "
          f"{time.perf_counter() - t_start:.1f} s")
    return {
        "rows": rows,
        "table1": t1,
        "summary": summary,
        "plots": plots,
        "missing": missing,
        "counts": counts,
        **extras,
    }


if __name__ == "__main__":
    main()
