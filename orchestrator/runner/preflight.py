"""The checks before a run starts: arguments, config, objective, space, and the cluster's room for one
evaluation.

ARCHITECTURE.md "The path of one evaluation", step 1: the config is validated, the objective built and the
search space checked *before* Ray starts or a run directory is made, so a bad one is a `ConfigError` naming
the key and never a run directory that blocks the rerun. A resume checks that the run's log still maps to its
stored space. Local run directories and the objective's path options are made absolute here: the actor and the
workers run in other working directories.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from orchestrator.actor import default_max_concurrent
from orchestrator.errors import ConfigError
from workers.records import cap

#: `actor_options` keys `run_experiment` / `resume_experiment` pass on to `CentralActor`
ACTOR_OPTIONS = ("queue_low", "refit_interval_s", "isolate", "max_refit_failures")
#: longest message of an objective a config error quotes (head and tail kept)
MAX_QUOTED_CHARS = 600


def _check_run_args(
    max_concurrent: Any, num_cpus: Any, actor_options: Mapping[str, Any] | None
) -> dict[str, Any]:
    """Check the keyword arguments of `run_experiment` / `resume_experiment` before Ray starts or the run
    directory is made (a bad one would fail in the actor, leaving a run dir that blocks a rerun)."""
    for key, v in (("max_concurrent", max_concurrent), ("num_cpus", num_cpus)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ConfigError(f"`{key}` must be None or an integer >= 1; got {v!r}")
    opts = dict(actor_options or {})
    unknown = sorted(set(opts) - set(ACTOR_OPTIONS))
    if unknown:
        raise ConfigError(f"unknown `actor_options` {unknown}; valid: {list(ACTOR_OPTIONS)}")
    if opts.get("isolate", "process") not in ("process", "thread"):
        raise ConfigError(f"`actor_options.isolate` must be 'process' or 'thread'; got {opts['isolate']!r}")
    q = opts.get("queue_low")
    if q is not None and (isinstance(q, bool) or not isinstance(q, int) or q < 0):
        raise ConfigError(f"`actor_options.queue_low` must be None or an integer >= 0; got {q!r}")
    r = opts.get("refit_interval_s", 0.5)
    if isinstance(r, bool) or not isinstance(r, (int, float)) or not 0 <= r < float("inf"):
        raise ConfigError(f"`actor_options.refit_interval_s` must be a finite number >= 0; got {r!r}")
    m = opts.get("max_refit_failures", 5)
    if isinstance(m, bool) or not isinstance(m, int) or m < 1:  # the actor's own check, before Ray starts
        raise ConfigError(f"`actor_options.max_refit_failures` must be an integer >= 1; got {m!r}")
    return opts


def _with_absolute_paths(cfg: Any, objective: Any) -> Any:
    """`cfg` with the objective's path options (`Objective.path_options`, e.g. the laser's `csv_path`) made
    absolute against the current directory, `~` expanded: the run stores this config, and the actor, the
    workers and `qbatch resume` rebuild the objective from it wherever they run."""
    import dataclasses
    from types import MappingProxyType

    options = dict(cfg.objective.options)
    for key in getattr(objective, "path_options", ()):
        if isinstance(options.get(key), (str, os.PathLike)):
            options[key] = os.path.abspath(os.path.expanduser(os.fspath(options[key])))
    if options == dict(cfg.objective.options):
        return cfg
    return dataclasses.replace(
        cfg, objective=dataclasses.replace(cfg.objective, options=MappingProxyType(options))
    )


def _absolute(run_dir: str) -> str:
    """Local run directories are made absolute (the actor's worker process has another working directory), a
    leading `~` expanded as a shell would (not a folder named `~` in the working directory)."""
    return run_dir if "://" in run_dir else os.path.abspath(os.path.expanduser(run_dir))


def _check_objective(cfg: Any, by_value: Any = None) -> Any:
    """Build the objective, the (overridden) space, the model and the proposer before Ray starts; errors name
    the config key. The stand-in of a callable (`CALLABLE_OBJECTIVE`, what `qbatch.optimize` stores) is
    refused without `by_value`, the callable itself, which a config cannot hold."""
    from objectives.registry import inspect_objective
    from workers.by_value import CALLABLE_OBJECTIVE

    if cfg.objective.name == CALLABLE_OBJECTIVE and by_value is None:
        raise ConfigError(
            f"`objective.name` {CALLABLE_OBJECTIVE!r} is the stand-in of a Python callable given to "
            "qbatch.optimize, which a config cannot hold: run it, or resume its run, with "
            "qbatch.optimize(fn, space, ..., run_dir=RUN_DIR, resume=True)")
    module, sep, attr = str(cfg.objective.name).partition(":")
    if sep and module == "__main__":  # the driver imports it; the central actor and the workers never can
        raise ConfigError(
            f"`objective.name` {cfg.objective.name!r} is defined in __main__ (a script or notebook), which "
            f"the central actor and the evaluation workers cannot import: put it in a module file (e.g. "
            f"my_objective.py beside the script) and name it 'my_objective:{attr}'")
    try:
        objective = inspect_objective(cfg.objective.name, dict(cfg.objective.options))
    except ValueError as exc:  # chained: a library user sees the objective's own traceback
        # cut: an objective's message echoes the bad value, which may be megabytes long
        raise ConfigError("`objective`: "
                          f"{_cut(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)}") from exc
    except Exception as exc:  # an option the objective does not check (a type, a size), or its own bug
        msg = str(exc).splitlines()[0] if str(exc) else ""
        options = dict(cfg.objective.options)
        what = (f"`objective.options` of {cfg.objective.name!r} ({options}) were refused" if options else
                # not "options refused"
                f"`objective` {cfg.objective.name!r} failed to build (no options given)")
        raise ConfigError(f"{what}: {type(exc).__name__}: {msg}"[:600]) from exc
    if sep:  # a user objective: the central actor and every worker build it again, and must get this space
        _check_same_space(cfg, objective)
    cfg.build_space(objective.space)
    cfg.resolve_direction(objective.direction)
    # build the model and the proposer once here: a bad option of either is a ConfigError naming it now,
    # not an actor that fails to start (or a refit that fails) after Ray is up and the run directory exists
    from orchestrator.ask_tell import AskTellOptimizer

    AskTellOptimizer.from_config(cfg, objective)  # its constructor checks the model, proposer and calibrator
    return objective


def _check_same_space(cfg: Any, objective: Any) -> None:
    """Build the user objective a second time and raise `ConfigError` naming the first parameter whose
    declared space differs: a constructor that draws its space at random gives the central actor another
    space than the one the run pinned, which surfaced as an error about a `space.<name>` the user never
    wrote."""
    from objectives.registry import inspect_objective

    try:
        again = inspect_objective(cfg.objective.name, dict(cfg.objective.options))
    except Exception:  # noqa: BLE001 - it built once: a second failure is the actor's to report
        return
    first, second = dict(objective.space), dict(again.space)
    for name in sorted(set(first) | set(second), key=str):
        a, b = first.get(name), second.get(name)
        if a != b:
            raise ConfigError(
                f"`objective` {cfg.objective.name!r} declares a different search space each time it is built "
                f"(parameter {name!r}: {_cut(repr(a), 120)}, then {_cut(repr(b), 120)}); the central actor "
                "and the workers build it again, so its space must not change between builds (draw it from a "
                "fixed seed)")


def _cut(text: str, limit: int = MAX_QUOTED_CHARS) -> str:
    """`text` on one line, its middle cut (and the cut counted) when it is longer than `limit`."""
    return cap(" ".join(text.split()), limit, head=limit * 2 // 3, sep=" ")


def _check_log_matches_space(events: Any, space: Any) -> None:
    """Raise `ConfigError` naming the parameter when a logged proposal's unit coordinates no longer map to its
    logged parameters under `space`: the space was edited in config.yaml since the run began, and a resume
    would train the model on relabelled points."""
    import math

    from objectives.base import is_choice
    from orchestrator.store import _plain  # the log's JSON form of a value

    for ev in events:
        if ev.kind != "proposed" or not ev.params or not ev.x:
            continue
        if sorted(ev.params) != sorted(space.names) or len(ev.x) != space.dim:
            raise ConfigError(f"`space`: the run's logged trials have the parameters {sorted(ev.params)}, "
                              f"this space has {sorted(space.names)}; the space of a started run cannot "
                              "change")
        for p, u in zip(space.params, ev.x):
            logged, now = ev.params[p.name], _plain(p.from_unit(float(u)), p.name)
            if isinstance(now, float) and isinstance(logged, (int, float)) and not isinstance(logged, bool):
                same = math.isclose(logged, now, rel_tol=1e-9, abs_tol=1e-12)
            else:  # an int or a choice: the same value (a bool matches only a bool)
                same = is_choice(logged, (now,))
            if not same:
                raise ConfigError(
                    f"`space.{p.name}` no longer matches the run's log: trial {ev.trial_id} was logged with "
                    f"{p.name}={logged!r} at unit coordinate {float(u):.6g}, which this space reads as "
                    f"{now!r}; the space of a started run cannot change (start a new run for a new space)")


def _check_feasible(resources: Any) -> None:
    """Raise `QbatchError` (one line, naming the request) when no alive node can run one evaluation.

    The central actor makes the same check when it is built, but there it surfaces as a Ray traceback and
    comes after the run directory is created, which then blocks a rerun with the same `run_dir`. It runs
    inside the run's `ray_session`, which gives the run's share of Ray back whatever this raises (a Ctrl-C,
    `ray.nodes()` failing).
    """
    default_max_concurrent(resources)
