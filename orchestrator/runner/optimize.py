"""`optimize`: a plain Python callable optimized on Ray, through the run machinery of `run_experiment`.

ARCHITECTURE.md "The path of one evaluation", for a callable: `fn` (a function, a lambda, a callable object,
defined in a module, a notebook or `__main__`) is wrapped in a `CallableObjective` with its space, direction
and resources, and sent to the workers by value (`ByValue`, workers/by_value.py). The run is a run like any
other: a run directory with the durable Parquet log, failures recorded (an `fn` that raises or returns NaN is
a failed trial), the report, and `resume=True` to finish an interrupted run with the same `fn`. Its
config.yaml names the stand-in `CALLABLE_OBJECTIVE`, so `qbatch status` and `qbatch report` read the run;
`qbatch resume` refuses it, since only the process holding `fn` can resume it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TextIO

from objectives.base import ObjectiveError, Resources
from orchestrator.errors import ConfigError
from orchestrator.runner.api import _resume, _run
from workers.by_value import CALLABLE_OBJECTIVE, ByValue, CallableObjective

__all__ = ["OptimizeResult", "Recommendation", "optimize"]


@dataclass(frozen=True)
class Recommendation:
    """The run's answer: the parameters to use, and the value there.

    Attributes:
        params: parameter name -> value, in the space's types.
        value: the model's predicted tau-level at `params` (the observed point with the best posterior mean of
            the target at the final fit) when `predicted`; else, no model having been fit, the best observed
            value.
        predicted: whether `value` is the model's prediction.
    """

    params: dict[str, Any]
    value: float
    predicted: bool = True


@dataclass(frozen=True)
class OptimizeResult:
    """What `optimize` returns.

    Attributes:
        recommendation: the run's answer, or None when no trial completed.
        run_dir: the run directory (config.yaml, the event log, the report).
        summary: the central actor's final summary (counts, utilization, status), as `run_experiment` returns
            it.
    """

    recommendation: Recommendation | None
    run_dir: str
    summary: dict[str, Any] = field(default_factory=dict, repr=False)

    def trials_dataframe(self) -> Any:
        """The run's trials as a pandas DataFrame, one row per trial (`qbatch.read_trials`)."""
        from orchestrator.store.frame import read_trials

        return read_trials(self.run_dir)


def optimize(
    fn: Callable[..., Any],
    space: Mapping[str, Mapping[str, Any]] | Any,
    *,
    budget: int,
    batch_size: int = 100,
    tau: float = 0.5,
    direction: str = "maximize",
    address: str | None = None,
    resources: Resources | Mapping[str, Any] | None = None,
    run_dir: str | None = None,
    resume: bool = False,
    num_cpus: int | None = None,
    progress: bool = True,
    out: TextIO | None = None,
    **config: Any,
) -> OptimizeResult:
    """Optimize the tau-quantile of `fn`'s noisy value over `space` on Ray.

    Args:
        fn: called as ``fn(params)`` with a dict of parameter name -> value, or ``fn(params, seed)`` when it
            takes a second argument (or a keyword-only `seed`). Returns a number or an `EvalResult(value,
            metrics)`. A function, a lambda, or a callable object, also one defined in a notebook or in
            `__main__`: the workers get it by value (cloudpickle). An exception, NaN, inf or None is a failed
            trial, with its reason.
        space: the plain space description, e.g. ``{"lr": {"type": "float", "low": 1e-5, "high": 1e-1, "log":
            True}, "layers": {"type": "int", "low": 1, "high": 8}, "act": {"type": "choice", "choices":
            ["relu", "tanh"]}}``, or a `SearchSpace`.
        budget: evaluations in all.
        batch_size: points per proposal.
        tau: level of the quantile (or expectile) to optimize, in (0, 1).
        direction: "maximize" or "minimize" `fn`'s value.
        address: a Ray cluster address; None starts a local Ray (or uses the one this process initialized).
        resources: what one evaluation needs (`Resources`, or a mapping of its fields); default one CPU.
        run_dir: the run directory (default ``runs/<fn's name>-<time>``).
        resume: with `run_dir` holding a run of this `fn`, finish that run instead of refusing the folder; its
            config must be the one these arguments give.
        num_cpus: CPUs of a local Ray (None: all cores).
        progress: show a live progress bar.
        out: where the final lines go (default stdout).
        **config: any other config key (README "Configuration"): `model`, `proposer`, `calibrator`,
            `initial_design`, `max_concurrent`, `timeout_s`, `max_retries`, `failure_guard`, `seed`,
            `synchronous`, `recommendation`, `name`.

    Returns:
        An `OptimizeResult`: the recommendation, the run directory and `trials_dataframe()`.

    Raises:
        ConfigError: a bad argument or config key, before Ray starts and before a run directory exists.
        RunAbortedError: the failure-rate guard stopped the run (every result is in the log).
    """
    if "objective" in config:
        raise ConfigError("`objective` is `fn` here: optimize(fn, space, ...) takes no `objective` key")
    if resume and run_dir is None:
        raise ConfigError("`resume=True` needs the `run_dir` of the run to finish")
    if hasattr(space, "describe") and hasattr(space, "params"):  # a SearchSpace
        space = space.describe()
    try:
        objective = CallableObjective(space, direction, resources, fn=fn)
        by_value = ByValue.of(objective)
    except ObjectiveError as exc:
        raise ConfigError(str(exc)) from exc
    cfg: dict[str, Any] = {
        "name": _run_name(fn),
        **config,
        "objective": {"name": CALLABLE_OBJECTIVE, "options": objective.options()},
        "direction": direction,
        "tau": tau,
        "budget": budget,
        "batch_size": batch_size,
    }
    if run_dir is not None:
        cfg["run_dir"] = run_dir
    kwargs = {
        "num_cpus": num_cpus,
        "max_concurrent": None,
        "progress": progress,
        "out": out,
        "actor_options": None,
    }
    if run_dir is not None:
        from orchestrator.store import RunStore

        if RunStore.exists(run_dir):
            if not resume:
                raise ConfigError(f"`run_dir` {run_dir!r} already holds a run: pass resume=True to finish it "
                                  "with this fn, or choose another run_dir")
            _check_same_run(RunStore.open(run_dir).config, cfg, run_dir)
            return _result(_resume(run_dir, address, by_value=by_value, **kwargs))
    return _result(_run(cfg, address, None, by_value=by_value, **kwargs))


def _run_name(fn: Any) -> str:
    """A run name (the config's `name` check) from `fn`'s name: ``noisy``, ``lambda``, a class's name."""
    name = getattr(fn, "__name__", None) or type(fn).__name__
    return re.sub(r"[^A-Za-z0-9_.-]", "-", str(name)).strip("._-")[:100] or "optimize"


def _check_same_run(stored: Mapping[str, Any], cfg: Mapping[str, Any], run_dir: str) -> None:
    """Raise `ConfigError` naming the keys where the run at `run_dir` differs from the config these arguments
    give: a resume finishes the run as it was started (its name, run directory and `fn`'s label may
    differ)."""
    from orchestrator.config import load_config

    name = stored.get("objective")
    # a hand-edited config may use the shorthand
    name = name.get("name") if isinstance(name, Mapping) else name
    if name != CALLABLE_OBJECTIVE:
        raise ConfigError(f"`run_dir` {run_dir!r} holds a run of objective {name!r}, not of a callable: "
                          "resume it with `qbatch resume`")

    def plain(c: Any) -> dict[str, Any]:
        d = load_config(c).to_dict()
        # the stored `space` is the resolved one; the objective's is compared
        for key in ("name", "run_dir", "space"):
            d.pop(key, None)
        d["objective"]["options"].pop("label", None)
        return json.loads(json.dumps(d, sort_keys=True, default=list))

    was, now = plain(stored), plain(cfg)
    diff = sorted(k for k in was.keys() | now.keys() if was.get(k) != now.get(k))
    if diff:
        keys = ", ".join("`space` or `resources`" if k == "objective" else f"`{k}`" for k in diff)
        raise ConfigError(f"the run at {run_dir} was started with other {keys} than these arguments give; a "
                          "resume finishes a run as it was started (start a new run for new settings)")


def _result(summary: dict[str, Any]) -> OptimizeResult:
    best, predicted = summary.get("best_predicted"), True
    if best is None:
        best, predicted = summary.get("best_observed"), False
    recommendation = (
        None if best is None else Recommendation(dict(best["params"]), float(best["value"]), predicted)
    )
    return OptimizeResult(recommendation, str(summary["run_dir"]), summary)
