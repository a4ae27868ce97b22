"""The entry points: `run_experiment` (what `qbatch run` calls) and `resume_experiment` (`qbatch resume`).

ARCHITECTURE.md "The path of one evaluation", steps 1 and 6. Each checks its arguments, the config and the
objective before Ray starts (`preflight`), then, inside one `ray_session`, checks that the cluster can run an
evaluation, creates the run directory (a new run) and drives the run to its budget (`drive`), SIGTERM
interrupting it as Ctrl-C does. A local Ray that the run started is shut down when it ends, however it ends.
`qbatch.optimize` (orchestrator/runner/optimize.py) goes through the same two, with its callable by value.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any, TextIO

from orchestrator.errors import ConfigError
from orchestrator.runner.drive import _drive
from orchestrator.runner.preflight import (
    _absolute,
    _check_feasible,
    _check_log_matches_space,
    _check_objective,
    _check_run_args,
    _with_absolute_paths,
)
from orchestrator.runner.session import ray_session
from orchestrator.runner.signals import _sigterm_interrupts


def run_experiment(
    config: str | os.PathLike | Mapping[str, Any] | Any,
    address: str | None = None,
    run_dir: str | None = None,
    *,
    num_cpus: int | None = None,
    max_concurrent: int | None = None,
    progress: bool = True,
    out: TextIO | None = None,
    actor_options: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Run an experiment from a YAML path, a dict or an `ExperimentConfig` to its budget.

    Args:
        config: the experiment config (orchestrator/config.py).
        address: a Ray cluster address ("auto", "ray://...", "host:port"); None starts a local Ray. Where this
            process has initialized Ray already (a notebook's `ray.init`), that Ray is used and left running,
            and an address naming another ("ray://" included) is refused.
        run_dir: overrides the config's `run_dir`.
        num_cpus: CPUs of a local Ray (None: all cores).
        max_concurrent: overrides the config's `max_concurrent`.
        progress: show a live progress bar (best value, evaluations/s, utilization).
        out: where the final lines go (default stdout).
        actor_options: extra keyword arguments of `CentralActor` (`ACTOR_OPTIONS`: queue_low,
            refit_interval_s, isolate, max_refit_failures); checked, with `max_concurrent` and `num_cpus`,
            before Ray starts.

    Returns:
        The actor's final summary (counts, best, utilization, run_dir).

    Raises:
        ConfigError: a bad config, before Ray starts and before a run directory exists.
        RunAbortedError: the failure-rate guard stopped the run.
    """
    return _run(config, address, run_dir, num_cpus=num_cpus, max_concurrent=max_concurrent, progress=progress,
                out=out, actor_options=actor_options)


def _run(
    config: str | os.PathLike | Mapping[str, Any] | Any,
    address: str | None,
    run_dir: str | None,
    *,
    num_cpus: int | None,
    max_concurrent: int | None,
    progress: bool,
    out: TextIO | None,
    actor_options: Mapping[str, Any] | None,
    by_value: Any = None,
) -> dict[str, Any]:
    """`run_experiment`; `by_value`: the `ByValue` objective the workers get in place of the config's `(name,
    options)` (`qbatch.optimize`, whose config names the stand-in `CALLABLE_OBJECTIVE`)."""
    from orchestrator.config import load_config
    from orchestrator.store import RunStore, StoreError

    actor_options = _check_run_args(max_concurrent, num_cpus, actor_options)
    cfg = load_config(config)
    try:
        objective = _check_objective(cfg, by_value)
        cfg = _with_absolute_paths(cfg, objective)
    except ConfigError as exc:  # name the file, as the config's own checks do
        if isinstance(config, (str, os.PathLike)):
            raise ConfigError(f"{os.fspath(config)}: {exc}") from exc.__cause__  # the objective's own error
        raise
    rd = _absolute(cfg.resolve_run_dir(run_dir))
    if RunStore.exists(rd):
        raise ConfigError(f"`run_dir` {rd!r} already holds a run; use `qbatch resume {rd}` or choose another "
                          "run_dir")
    try:
        RunStore.check_new(rd)  # before Ray starts: never write a run among a folder's other files
    except StoreError as exc:
        raise ConfigError(str(exc)) from None
    with ray_session(address, num_cpus):
        _check_feasible(objective.resources)  # before the run directory exists: a rerun is not blocked
        # the direction and the space as resolved (the objective's own where the config leaves them out):
        # `status` and `report` read the direction from the run's config, and cannot always import a user
        # objective to ask it; the space is pinned, so a resume maps the logged points the same way whatever
        # changes in between (the objective's defaults, or how an override is read)
        RunStore.create(rd, {**cfg.to_dict(), "direction": cfg.resolve_direction(objective.direction),
                             "space": cfg.build_space(objective.space).describe()})
        with _sigterm_interrupts():  # SIGTERM interrupts the drive as Ctrl-C does
            return _drive(
                rd,
                cfg,
                objective.resources,
                max_concurrent,
                progress,
                out,
                actor_options,
                new_run=True,
                by_value=by_value,
            )


def resume_experiment(
    run_dir: str,
    address: str | None = None,
    *,
    num_cpus: int | None = None,
    max_concurrent: int | None = None,
    progress: bool = True,
    out: TextIO | None = None,
    actor_options: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Finish an interrupted run: replay its log, re-dispatch unfinished trials, run to the budget.

    Args and Returns as in `run_experiment`; the config is the one stored in `run_dir`.

    Raises:
        RunDirError: (a `UsageError`, before Ray starts) no run at `run_dir`, its config.yaml is not YAML, or
            another process is writing it.
    """
    return _resume(
        run_dir,
        address,
        num_cpus=num_cpus,
        max_concurrent=max_concurrent,
        progress=progress,
        out=out,
        actor_options=actor_options,
    )


def _resume(
    run_dir: str,
    address: str | None,
    *,
    num_cpus: int | None,
    max_concurrent: int | None,
    progress: bool,
    out: TextIO | None,
    actor_options: Mapping[str, Any] | None,
    by_value: Any = None,
) -> dict[str, Any]:
    """`resume_experiment`; `by_value` as in `_run`."""
    from orchestrator.config import load_config
    from orchestrator.store import RunStore

    actor_options = _check_run_args(max_concurrent, num_cpus, actor_options)
    store = RunStore.open(run_dir)
    RunStore.check_writer_free(run_dir)  # before Ray starts; the central actor takes the lock itself
    out = out or sys.stdout
    for line in store.damage:
        print(f"qbatch: damaged log in {run_dir}: {line}", file=out)
    try:
        cfg = load_config(store.config)
    except ConfigError as exc:  # the stored config was edited by hand: say which file holds the bad key
        raise ConfigError(f"{os.path.join(store.run_dir, 'config.yaml')}: {exc}") from None
    try:
        objective = _check_objective(cfg, by_value)
        _check_log_matches_space(store.events(), cfg.build_space(objective.space))
    except ConfigError as exc:
        raise ConfigError(f"{os.path.join(store.run_dir, 'config.yaml')}: {exc}") from exc.__cause__
    with ray_session(address, num_cpus):
        _check_feasible(objective.resources)
        with _sigterm_interrupts():
            return _drive(
                _absolute(run_dir),
                cfg,
                objective.resources,
                max_concurrent,
                progress,
                out,
                actor_options,
                by_value=by_value,
            )
