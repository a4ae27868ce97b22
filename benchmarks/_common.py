"""Shared helpers of the benchmark scripts: confidence intervals, paired comparisons, tables and files.

Used by the reproduction benchmarks (benchmarks/gld.py and the others): Student-t confidence
intervals of a mean over repetitions (problems, runs, seeds), paired differences between two methods over
the same repetitions, a plain-text table printer, writers for CSV + Parquet (pyarrow) tables and PNG
plots (matplotlib, Agg backend) of a curve's mean with its confidence band, and the checkpointed run
(`BatchRun` + `drive`): a synchronous BO run saved after every batch, so a long run pauses at a time limit
and a later `--resume` continues it exactly, and the job runner (`Job` + `run_jobs`) that runs many such runs
in one process or a pool and writes each result file as its run finishes.
"""

from __future__ import annotations

import csv
import functools
import json
import math
import os
import time
import traceback
import warnings
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from orchestrator.acquisition import PROPOSERS as _PROPOSER_REGISTRY
from orchestrator.models import MODELS as _MODEL_REGISTRY

__all__ = [
    "mean_ci",
    "paired_comparison",
    "format_table",
    "write_table",
    "read_table",
    "plot_curves",
    "Method",
    "replicate_seed",
    "config_tag",
    "code_version",
    "code_mix_note",
    "BatchRun",
    "OWN_MODELS",
    "ask_batch",
    "next_batch_size",
    "reevaluation_of",
    "reevaluation_section",
    "restarts_every_refit",
    "run_settings",
    "drive",
    "save_checkpoint",
    "checkpoint_evaluations",
    "Job",
    "run_jobs",
    "limited_threads",
    "drive_guarded",
    "preflight",
]


@dataclass(frozen=True)
class Method:
    """A benchmarked method: qbatch model and proposer names with their options."""

    model: str
    proposer: str
    model_options: dict = field(default_factory=dict)
    proposer_options: dict = field(default_factory=dict)
    #: GPR-EI (spec §4.4): each batch is one point evaluated `batch` times (the GLD and lander benchmarks
    #: replicate the initial design points too; the laser's initial data are measured settings, not
    #: replicated)
    replicate: bool = False


@functools.cache
def code_version() -> str:
    """The code a result comes from: the repository's git commit (`+dirty` when tracked files differ from it;
    "unknown" outside a git checkout) and the torch, gpytorch, botorch, numpy and scipy versions (a run's
    trajectory depends on all five: the same commit under another numpy and scipy takes other steps).
    Result rows record it (column `code`), so a table that mixes runs of several versions says so
    (`code_mix_note`)."""
    import subprocess

    import botorch
    import gpytorch
    import numpy
    import scipy
    import torch

    repo = str(Path(__file__).resolve().parents[1])
    try:
        sha = subprocess.run(
            ["git", "-C", repo, "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(["git", "-C", repo, "diff", "--quiet", "HEAD", "--"], capture_output=True,
                               timeout=30).returncode != 0
        commit = sha + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        commit = "unknown"
    return (f"{commit} torch {torch.__version__} gpytorch {gpytorch.__version__} "
            f"botorch {botorch.__version__} numpy {numpy.__version__} scipy {scipy.__version__}")


def code_mix_note(rows: Iterable[Mapping[str, Any]]) -> str:
    """"" when `rows` come from one code version (`code_version`); else one line naming each version with its
    row count (rows written before the column count as "unrecorded")."""
    counts: dict[str, int] = {}
    for r in rows:
        v = r.get("code") or "unrecorded"
        counts[v] = counts.get(v, 0) + 1
    if len(counts) < 2:
        return ""
    return (f"the table mixes results of {len(counts)} code versions (column `code`): "
            + "; ".join(f"{v}: {n} rows" for v, n in sorted(counts.items())))


def config_tag(payload: Any) -> str:
    """A short stable hash of a JSON-able value (names result files, or tags rows, after the settings they ran
    with)."""
    return f"{zlib.crc32(json.dumps(payload, sort_keys=True, default=str).encode()) & 0xFFFFFFFF:08x}"


def replicate_seed(seed: int, r: int) -> int:
    """Evaluation seed of replicate `r` >= 1 of a trial whose own seed is `seed`."""
    return zlib.crc32(f"{seed}:rep{r}".encode()) & 0x7FFFFFFF


def mean_ci(values: Sequence[float], level: float = 0.95) -> tuple[float, float, int]:
    """Mean and half-width of its Student-t confidence interval.

    Args:
        values: the repetitions (NaNs are dropped).
        level: confidence level in (0, 1).

    Returns:
        (mean, half_width, n); half_width is NaN with fewer than 2 values, the mean NaN with none.
    """
    from scipy.stats import t

    x = np.asarray([v for v in values if v is not None and not math.isnan(v)], dtype=np.float64)
    n = int(x.size)
    if n == 0:
        return float("nan"), float("nan"), 0
    if n == 1:
        return float(x[0]), float("nan"), 1
    half = float(t.ppf(0.5 + level / 2, n - 1) * x.std(ddof=1) / math.sqrt(n))
    return float(x.mean()), half, n


def paired_comparison(
    a: Mapping[Any, float], b: Mapping[Any, float], level: float = 0.95
) -> dict[str, float]:
    """Compare method A with method B over the repetitions both have (lower is better, e.g. regret).

    Args:
        a, b: repetition key (e.g. problem number) -> value; a pair with a NaN on either side is left out.
        level: confidence level of the interval of the mean difference.

    Returns:
        {"n": paired repetitions, "mean_diff": mean of a - b, "ci": its half-width, "wins": fraction with
        a < b, "ties": fraction with a == b, "p_sign": two-sided sign-test p-value (ties dropped),
        "p_wilcoxon": Wilcoxon signed-rank p-value (NaN when undefined)}.
    """
    from scipy.stats import binomtest, wilcoxon

    keys = sorted(set(a) & set(b))
    diff = np.asarray([a[k] - b[k] for k in keys], dtype=np.float64)
    # a repetition missing in either arm leaves every statistic (Wilcoxon gave NaN)
    diff = diff[~np.isnan(diff)]
    mean, half, n = mean_ci(diff.tolist(), level)
    wins = int((diff < 0).sum())
    losses = int((diff > 0).sum())
    p_sign = float(binomtest(wins, wins + losses).pvalue) if wins + losses else float("nan")
    try:
        p_w = float(wilcoxon(diff).pvalue) if n >= 2 and np.any(diff != 0) else float("nan")
    except ValueError:
        p_w = float("nan")
    return {
        "n": n,
        "mean_diff": mean,
        "ci": half,
        "wins": wins / n if n else float("nan"),
        "ties": (n - wins - losses) / n if n else float("nan"),
        "p_sign": p_sign,
        "p_wilcoxon": p_w,
    }


def _fmt(v: Any, digits: int) -> str:
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        return f"{v:.{digits}g}"
    return str(v)


def format_table(
    rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None, digits: int = 4
) -> str:
    """A fixed-width plain-text table of `rows` (dicts), columns in the given order (default: the first
    row's)."""
    if not rows:
        return "(no rows)"
    columns = list(columns or rows[0].keys())
    cells = [[_fmt(r.get(c, ""), digits) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)


def write_table(rows: Sequence[Mapping[str, Any]], path_stem: str | Path, parquet: bool = True) -> list[Path]:
    """Write `rows` (dicts with the same keys) to `<stem>.csv` and, with `parquet`, `<stem>.parquet`.

    Returns:
        The paths written.
    """
    stem = Path(path_stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    # the suffixes are appended (not `with_suffix`): stems such as "d3-tau0.75-b10" contain dots
    columns: list[str] = []
    for r in rows:
        columns += [k for k in r if k not in columns]
    out = [stem.parent / f"{stem.name}.csv"]
    with open(out[0], "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    if parquet:
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pa.Table.from_pylist([{c: r.get(c) for c in columns} for r in rows])
        out.append(stem.parent / f"{stem.name}.parquet")
        pq.write_table(table, out[1])
    return out


def read_table(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a Parquet or CSV table written by `write_table` (CSV values stay strings)."""
    path = Path(path)
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def plot_curves(
    curves: Mapping[str, tuple[Sequence[float], Sequence[Sequence[float]]]],
    path: str | Path,
    title: str = "",
    xlabel: str = "evaluations",
    ylabel: str = "simple regret",
    logy: bool = True,
    level: float = 0.95,
) -> Path:
    """Plot each curve's mean over repetitions with its confidence band and save a PNG.

    Args:
        curves: label -> (x values `k`, repetitions: a list of `k`-long value lists).
        path: the PNG file.
        title, xlabel, ylabel: labels.
        logy: logarithmic y axis (non-positive means are clipped to the smallest positive value).
        level: confidence level of the band.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for label, (xs, reps) in curves.items():
        stats = [mean_ci([r[i] for r in reps if i < len(r)], level) for i in range(len(xs))]
        mean = np.array([s[0] for s in stats])
        half = np.nan_to_num(np.array([s[1] for s in stats]))
        line = ax.plot(xs, mean, label=f"{label} (n={len(reps)})")[0]
        lo, hi = mean - half, mean + half
        if logy:
            floor = np.nanmin(np.where(mean > 0, mean, np.inf)) if np.any(mean > 0) else 1e-12
            lo = np.maximum(lo, floor * 1e-2)
        ax.fill_between(xs, lo, hi, color=line.get_color(), alpha=0.2)
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def as_float_rows(rows: Iterable[Mapping[str, Any]], keys: Sequence[str]) -> list[dict[str, Any]]:
    """Copy `rows` converting the named keys to float (for tables read back from CSV)."""
    return [{**r, **{k: float(r[k]) for k in keys if k in r}} for r in rows]


def parse_index_list(spec: str, flag: str, example: int = 10) -> list[int]:
    """`--runs` / `--seeds` / `--problems`: a count (10 = 0..9), a range (0-9) or a list (1,4,7); indices
    >= 0.

    Raises SystemExit with one line naming `flag` for anything else.
    """
    spec = str(spec)
    try:
        if "-" in spec:
            a, b = spec.split("-")
            out = list(range(int(a), int(b) + 1))
        elif "," in spec:
            out = [int(p) for p in spec.split(",")]
        else:
            out = list(range(int(spec)))
    except ValueError:
        raise SystemExit(f"{flag}: a count ({example}), a range (0-{example - 1}) or a list (1,4,7); got "
                         f"{spec!r}") from None
    if not out or min(out) < 0:
        raise SystemExit(f"{flag}: {spec!r} selects nothing (a count >= 1, or indices >= 0; index 0 alone is "
                         "0-0)")
    return out


#: objectives built in this process, by (name, options): deterministic, so runs may share one
_OBJECTIVES: dict[str, Any] = {}


#: the names `--model-options` / `--proposer-options` may key (the orchestrator's registries)
MODELS = tuple(_MODEL_REGISTRY)
PROPOSERS = tuple(_PROPOSER_REGISTRY)


def merge_options(
    quick: Mapping[str, Mapping[str, Any]], given: Any, flag: str, known: Sequence[str]
) -> dict[str, dict[str, Any]]:
    """`given` (name -> options, from a JSON flag) over `quick`, per name. A non-mapping, or a name that is
    not in `known` (a misspelled model is otherwise ignored without a word), is one clear error naming
    `flag`."""
    if not isinstance(given, Mapping) or not all(isinstance(v, Mapping) for v in given.values()):
        raise SystemExit(f'{flag}: a JSON object of name -> options, e.g. {{"quantile": {{"num_inducing": '
                         f"64}}}}; got {given!r}")
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise SystemExit(f"{flag}: unknown name(s) {unknown}; valid: {sorted(known)}")
    return {k: {**quick.get(k, {}), **given.get(k, {})} for k in {*quick, *given}}


def build_optimizer(raw_config: Mapping[str, Any]) -> tuple[Any, Any, Any, str]:
    """(config, objective, optimizer, objective key) built as `orchestrator.actor.CentralActor` builds them:
    the config validated by `load_config`, the objective by `load_objective`, then
    `AskTellOptimizer.from_config`. The objective is built once per process for a given (name, options)
    (the laser simulator fits GPs) and reused by later runs; `key` names it.

    Raises:
        ConfigError: the config is invalid (one line naming the key).
    """
    from objectives.registry import load_objective
    from orchestrator.ask_tell import AskTellOptimizer
    from orchestrator.config import load_config

    cfg = load_config(dict(raw_config))
    key = json.dumps([cfg.objective.name, dict(cfg.objective.options)], sort_keys=True, default=str)
    if key not in _OBJECTIVES:
        _OBJECTIVES[key] = load_objective(cfg.objective.name, dict(cfg.objective.options))
    objective = _OBJECTIVES[key]
    return cfg, objective, AskTellOptimizer.from_config(cfg, objective), key


def preflight(builds: Mapping[str, Callable[[], Any]], tag: str) -> None:
    """Build every method once before any run starts: `builds` maps a label (the method) to a function that
    builds its optimizer as a run would. A bad option (a `QbatchError` such as ConfigError, or an
    `ObjectiveError`) ends the benchmark here with one line naming the method and the key, before any
    evaluation; without this check every run of the grid would fail on its own and be recorded as an error
    row, and the command would still exit 0.

    Raises:
        SystemExit: with that line, for the first method that does not build.
    """
    from objectives.base import ObjectiveError
    from orchestrator.errors import QbatchError

    for label, build in builds.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            try:
                build()
            except (QbatchError, ObjectiveError) as exc:
                raise SystemExit(f"[{tag}] {label}: {exc}") from None


# ------------------------------------------------------------------------------------------ checkpointed runs
class BatchRun:
    """One synchronous BO run that can be checkpointed between batches (subclasses: the benchmarks).

    `start()` evaluates the initial design and fits; `step()` asks, evaluates and tells one batch and refits;
    `done` says the budget is spent; `get_state()`/`set_state()` (plain values and tensors: the optimizer's
    state, `n`, `times` and the subclass's `records_state()`) carry everything the next step needs, so a run
    continued from a checkpoint equals an uninterrupted one. `key` identifies the settings: a checkpoint of
    other settings is never continued. `times` holds cumulative seconds
    (`drive` adds each step's wall-clock `run_s` and CPU `cpu_s`; they are part of the state).
    """

    key: str = ""
    times: dict[str, float]
    n: int
    opt: Any  # an AskTellOptimizer (its get_state/set_state carry the model and proposer)

    def start(self) -> None:
        raise NotImplementedError

    def step(self) -> None:
        raise NotImplementedError

    @property
    def done(self) -> bool:
        raise NotImplementedError

    def get_state(self) -> dict[str, Any]:
        """The optimizer's state (`self.opt`), the evaluation count `n`, `times` and the subclass's own
        records."""
        return {"opt": self.opt.get_state(), "n": self.n, "times": dict(self.times), **self.records_state()}

    def set_state(self, state: Mapping[str, Any]) -> None:
        self.opt.set_state(state["opt"])
        self.n = int(state["n"])
        self.times = {k: float(v) for k, v in state["times"].items()}
        self.set_records_state(state)

    def records_state(self) -> dict[str, Any]:
        """What the subclass records besides the optimizer (plain values, copied)."""
        raise NotImplementedError

    def set_records_state(self, state: Mapping[str, Any]) -> None:
        raise NotImplementedError


#: qbatch's own models: their runs spend a run's default `reevaluation` (the budget's end re-evaluates the
#: best observed points); the baselines' runs search to the end, as the papers' and BoTorch's loops do
OWN_MODELS = ("quantile", "expectile")


def reevaluation_of(method: Method) -> tuple[float, int]:
    """(fraction, repeats) of the budget's end that `method` spends re-evaluating its best observed points:
    the defaults of `orchestrator.config.ReevaluationConfig` for qbatch's own models, (0, 1) for the
    baselines."""
    from orchestrator.config.experiment import ReevaluationConfig

    if method.model not in OWN_MODELS:
        return 0.0, 1
    default = ReevaluationConfig()
    return default.fraction, default.repeats


def restarts_every_refit(method: Method) -> bool:
    """Whether a benchmark loop refits `method` warm-started and from scratch after every batch (keeping the
    lower loss, `AskTellOptimizer.fit(restart=True)`): the baselines do, as BoTorch's loops refit from the
    model's default start each iteration. qbatch's own models refit as a run does (orchestrator/actor/
    planner.py): warm-started after each batch, and with the restart only at the end of the budget."""
    return method.model not in OWN_MODELS


def reevaluation_section(method: Method) -> dict[str, Any]:
    """The `reevaluation` section of a benchmark run's experiment config (`reevaluation_of`)."""
    fraction, repeats = reevaluation_of(method)
    return {"fraction": fraction, "repeats": repeats}


def run_settings(raw_config: Mapping[str, Any]) -> dict[str, Any]:
    """What a benchmark run's result-file tag hashes: its experiment config, less a `reevaluation` section
    that spends nothing, so a run that searches to the end keeps the tag (and the recorded runs) it had
    before configs held the section."""
    section = raw_config.get("reevaluation")
    if isinstance(section, Mapping) and not section.get("fraction"):
        return {k: v for k, v in raw_config.items() if k != "reevaluation"}
    return dict(raw_config)


def _repeating(n: int, budget: int, final: int) -> bool:
    """Whether a loop that has spent `n` of `budget` evaluations is in the last `final`, the repeats."""
    return 0 < final and budget - n <= final


def next_batch_size(n: int, budget: int, batch: int, final: int = 0) -> int:
    """Size of the next batch of a synchronous loop that has spent `n` of `budget` evaluations and keeps the
    last `final` for re-evaluations (`ask_batch`): a search batch stops where they begin; 0 when the budget is
    spent."""
    left = budget - n
    if left <= 0:
        return 0
    return min(batch, left if _repeating(n, budget, final) else left - final)


def ask_batch(opt: Any, n: int, budget: int, batch: int, final: int = 0, repeats: int = 1,
              fit: bool = True) -> list[Any]:
    """The next batch of a synchronous loop that has spent `n` of `budget` evaluations, split as a run's
    `reevaluation` section splits it (orchestrator/planner.py): `opt.ask` searches until `final` evaluations
    are left, then `opt.ask_repeats` re-evaluates the best observed points `repeats` more times each
    (`next_batch_size` of them per batch); `final` = 0 searches to the end (the baselines, the papers)."""
    q = next_batch_size(n, budget, batch, final)
    if q == 0:
        return []
    if _repeating(n, budget, final):
        return opt.ask_repeats(q, repeats, fit=fit)
    return opt.ask(q, fit=fit)


def save_checkpoint(path: Path, state: Mapping[str, Any]) -> None:
    """Write `state` with `torch.save` atomically (a killed process leaves the previous checkpoint intact)."""
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save(dict(state), tmp)
    os.replace(tmp, path)


def checkpoint_evaluations(path: Path) -> int | None:
    """How many evaluations the run saved at `path` has made (None: no checkpoint, or an unreadable one)."""
    import torch

    if not path.exists():
        return None
    try:
        return int(torch.load(path, weights_only=True)["run"]["n"])
    except Exception:  # a corrupt checkpoint is started over by `drive`; it reports nothing here
        return None


def checkpoint_codes(path: Path) -> list[str]:
    """The code versions (`code_version`) of the sessions that advanced the run saved at `path`, oldest first;
    a checkpoint from before they were recorded starts with "unrecorded" ([] without a readable
    checkpoint)."""
    import torch

    if not path.exists():
        return []
    try:
        return [str(c) for c in torch.load(path, weights_only=True).get("codes", ["unrecorded"])]
    except Exception:
        return []


def drive(run: BatchRun, checkpoint: Path | None, deadline: float | None = None,
          stop_after: int | None = None) -> tuple[str, float]:
    """Run `run` to its end, or pause at a checkpoint; returns (status, seconds spent in this call).

    Continues from `checkpoint` when it holds a state with the run's key. Saves a checkpoint after the start
    and after every batch. Pauses (status "paused") before a batch once `deadline` (time.time()) has passed
    or `stop_after` start/batch steps were made in this call; at least one step is made per call.
    Status "done" when the budget is spent (the checkpoint is then removed by the caller).
    """
    import torch

    t0 = time.perf_counter()
    steps = 0
    state = None

    def timed(fn: Callable[[], None]) -> None:
        """Run one step, adding its wall-clock and CPU seconds to the run's `run_s` and `cpu_s`."""
        w, c = time.perf_counter(), time.process_time()
        fn()
        run.times["run_s"] = run.times.get("run_s", 0.0) + time.perf_counter() - w
        run.times["cpu_s"] = run.times.get("cpu_s", 0.0) + time.process_time() - c

    if checkpoint is not None and checkpoint.exists():
        try:
            state = torch.load(checkpoint, weights_only=True)
        except Exception as exc:  # a corrupt checkpoint is started over, not fatal
            print(f"[bench] ignoring unreadable checkpoint {checkpoint}: {exc}", flush=True)
        if state is not None and state.get("key") != run.key:
            print(f"[bench] checkpoint {checkpoint.name} is for other settings: starting over", flush=True)
            state = None
    # the code of every session that advances the run, so its result rows can say which code made them
    codes = [str(c) for c in state.get("codes", ["unrecorded"])] if state is not None else []
    if not codes or codes[-1] != code_version():
        codes.append(code_version())
    if state is not None:
        run.set_state(state["run"])
    else:
        timed(run.start)
        steps += 1
        if checkpoint is not None:
            save_checkpoint(checkpoint, {"key": run.key, "run": run.get_state(), "codes": codes})
    while not run.done:
        if steps and (
            (deadline is not None and time.time() > deadline) or (stop_after and steps >= stop_after)
        ):
            return "paused", time.perf_counter() - t0
        timed(run.step)
        steps += 1
        if checkpoint is not None:
            save_checkpoint(checkpoint, {"key": run.key, "run": run.get_state(), "codes": codes})
    return "done", time.perf_counter() - t0


# ---------------------------------------------------------------------------------------------------- jobs
def limited_threads(threads: int) -> Any:
    """Torch and BLAS/OpenMP thread pools limited to `threads` (one run per process, `--workers`
    processes)."""
    import torch
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(threads)
    return threadpool_limits(threads)


def checkpoint_path(stem: Path) -> Path:
    """The mid-run checkpoint of the run whose result file is `stem`.csv (removed when the run finishes)."""
    return stem.with_name(stem.name + ".ckpt.pt")


def drive_guarded(make_run: Callable[[], BatchRun], checkpoint: Path | None, deadline: float | None,
                  stop_after: int | None, threads: int, label: str) -> tuple[str, BatchRun | None, str]:
    """Build a run and `drive` it with `threads` threads, UserWarning and RuntimeWarning silenced.

    Returns (status, run, error): an exception (building or running) gives ("done", None, "Type: message"), so
    one failing run of a grid does not lose the others; a pause is printed with `label`.
    """
    with limited_threads(threads), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        warnings.simplefilter("ignore", RuntimeWarning)
        try:
            run = make_run()
            status, _ = drive(run, checkpoint, deadline, stop_after)
        except Exception as exc:  # one failing run must not lose the others
            traceback.print_exc()
            return "done", None, f"{type(exc).__name__}: {exc}"
    if status != "done":
        print(f"{label}: paused at {run.n} evaluations", flush=True)
    return status, run, ""


@dataclass
class Job:
    """One run to do: `fn(*args, checkpoint=..., deadline=...)` returning (status, rows), written to
    `<stem>.csv`.

    `fn` returns ("done", rows), ("paused", []) or ("skipped", []) (see `drive`). `finished_rule`, when given,
    decides whether the run is already finished (GLD counts a method finished by any result file of its
    problem that holds the final checkpoint); by default a run is finished when its result file exists without
    an error.
    """

    stem: Path
    fn: Callable[..., tuple[str, list[dict]]]
    args: tuple
    finished_rule: Callable[[], bool] | None = None

    @property
    def csv(self) -> Path:
        return self.stem.with_name(self.stem.name + ".csv")

    @property
    def checkpoint(self) -> Path:
        return checkpoint_path(self.stem)

    def finished(self) -> bool:
        """Whether the run need not be run again (`finished_rule`, else: a result file without an error
        row)."""
        if self.finished_rule is not None:
            return self.finished_rule()
        return self.csv.exists() and not any(r.get("error") for r in read_table(self.csv))


def run_jobs(
    jobs: Sequence[Job], workers: int, resume: bool, deadline: float | None, tag: str
) -> dict[str, int]:
    """Run the jobs (in order; `workers` processes), writing each result file as its run finishes.

    Without `resume` every job starts over (its checkpoint is deleted); with it, finished jobs are skipped
    and checkpointed ones continue. Returns the count of jobs per status ("done", "paused", "skipped",
    "finished before").
    """
    todo = []
    counts = {"done": 0, "paused": 0, "skipped": 0, "finished before": 0}
    for job in jobs:
        if resume and job.finished():
            counts["finished before"] += 1
            continue
        if not resume:
            job.checkpoint.unlink(missing_ok=True)
        todo.append(job)
    print(f"[{tag}] {len(todo)} runs to do ({counts['finished before']} finished before)", flush=True)

    def record(job: Job, status: str, rows: list[dict]) -> None:
        counts[status] += 1
        if status == "done":
            # a run continued from a checkpoint names the code of each session that advanced it
            code = " then ".join(checkpoint_codes(job.checkpoint) or [code_version()])
            write_table([{**r, "code": code} for r in rows], job.stem, parquet=False)
            job.checkpoint.unlink(missing_ok=True)

    if workers == 1:
        for job in todo:
            record(job, *job.fn(*job.args, checkpoint=job.checkpoint, deadline=deadline))
    elif todo:
        import multiprocessing as mp

        # children inherit the environment: one BLAS/OpenMP thread each unless the caller chose otherwise
        for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ.setdefault(var, "1")
        with ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as pool:
            futures = {pool.submit(job.fn, *job.args, checkpoint=job.checkpoint, deadline=deadline): job
                       for job in todo}
            for fut in as_completed(futures):
                record(futures[fut], *fut.result())
    print(f"[{tag}] runs: " + ", ".join(f"{v} {k}" for k, v in counts.items() if v), flush=True)
    return counts
