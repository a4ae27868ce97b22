"""The validated experiment (README "Configuration"): `ExperimentConfig` and its sections, frozen dataclasses
that `load_config` builds and `to_dict()` turns back into the plain dict that config.yaml holds.

`ExperimentConfig` also resolves what the config leaves to the run: the run directory, the direction, and the
search space, the objective's own with the config's overrides applied (each override may only narrow it).
"""

from __future__ import annotations

import datetime as _dt
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from orchestrator.checks import show
from orchestrator.config.values import _check_param_spec, _expand_home, _one_line, check_run_dir
from orchestrator.device import DEFAULT_DEVICE
from orchestrator.errors import ConfigError, SpaceError
from orchestrator.recommend import DEFAULT_RULE


@dataclass(frozen=True)
class ObjectiveConfig:
    """Which black box: a built-in name or ``package.module:name``, and its factory's keyword options."""

    name: str
    options: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True)
class ComponentConfig:
    """A pluggable part (model, proposer, calibrator): its registered type and keyword options."""

    type: str
    options: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True)
class FailureGuardConfig:
    """Stop the run when the failure rate exceeds `max_failure_rate` after `min_trials` finished trials."""

    max_failure_rate: float = 0.5
    min_trials: int = 10


@dataclass(frozen=True)
class ReevaluationConfig:
    """Spend the last `fraction` of the budget re-evaluating the best observed points, each `repeats` more
    times (`AskTellOptimizer.ask_repeats`); 0 spends none. The defaults measure best
    (benchmarks/results/quality/screen_reeval; the candidates' order: screen_reeval_order)."""

    fraction: float = 0.1
    repeats: int = 1


@dataclass(frozen=True)
class ExperimentConfig:
    """A validated experiment (README "Configuration"). Build it with `load_config`; `to_dict()`
    round-trips."""

    name: str
    objective: ObjectiveConfig
    space: Mapping[str, Any]
    direction: str | None
    tau: float
    model: ComponentConfig
    proposer: ComponentConfig
    calibrator: ComponentConfig
    batch_size: int
    initial_design: int
    budget: int
    max_concurrent: int | None
    synchronous: bool
    timeout_s: float
    max_retries: int
    failure_guard: FailureGuardConfig
    seed: int
    run_dir: str | None
    recommendation: str = DEFAULT_RULE
    #: torch's intra-op threads of the model's fits and proposals (orchestrator/threads.py)
    threads: str | int = "auto"
    #: the device of the model's fits and proposals: "cpu", "cuda", "cuda:N", "auto" (orchestrator/device.py)
    device: str = DEFAULT_DEVICE
    #: the budget's end spent on re-evaluations of the best observed points (orchestrator/ask_tell/repeats.py)
    reevaluation: ReevaluationConfig = ReevaluationConfig()

    def to_dict(self) -> dict[str, Any]:
        """Plain nested dict of every key (defaults filled in), in table order; `load_config` inverts it."""
        return _to_plain(
            {
                "name": self.name,
                "objective": {"name": self.objective.name, "options": self.objective.options},
                "space": self.space,
                "direction": self.direction,
                "tau": self.tau,
                "model": {"type": self.model.type, "options": self.model.options},
                "proposer": {"type": self.proposer.type, "options": self.proposer.options},
                "calibrator": {"type": self.calibrator.type, "options": self.calibrator.options},
                "batch_size": self.batch_size,
                "initial_design": self.initial_design,
                "budget": self.budget,
                "max_concurrent": self.max_concurrent,
                "synchronous": self.synchronous,
                "timeout_s": self.timeout_s,
                "max_retries": self.max_retries,
                "failure_guard": {
                    "max_failure_rate": self.failure_guard.max_failure_rate,
                    "min_trials": self.failure_guard.min_trials,
                },
                "seed": self.seed,
                "run_dir": self.run_dir,
            }
            # the default rule, threads and device are left out, so a saved config.yaml keeps
            # ARCHITECTURE.md's key set
            | ({} if self.recommendation == DEFAULT_RULE else {"recommendation": self.recommendation})
            | ({} if self.threads == "auto" else {"threads": self.threads})
            | ({} if self.device == DEFAULT_DEVICE else {"device": self.device})
            | ({} if self.reevaluation == ReevaluationConfig() else {"reevaluation": {
                "fraction": self.reevaluation.fraction, "repeats": self.reevaluation.repeats}})
        )

    def resolve_run_dir(self, override: str | None = None, now: float | None = None) -> str:
        """The run directory: `override` (e.g. ``--run-dir``), else `run_dir`, else
        ``runs/<name>-<timestamp>``.

        Raises:
            ConfigError: `override` is not a valid run directory (named as ``--run-dir``).
        """
        if override is not None:
            return _expand_home(check_run_dir("--run-dir", override))
        if self.run_dir is not None:
            return _expand_home(self.run_dir)
        stamp = _dt.datetime.fromtimestamp(time.time() if now is None else now).strftime("%Y%m%d-%H%M%S")
        return os.path.join("runs", f"{self.name}-{stamp}")

    def resolve_direction(self, objective_direction: str) -> str:
        """`direction` if set, else the objective's own ("maximize" | "minimize")."""
        return self.direction if self.direction is not None else objective_direction

    def build_space(self, objective_space: Mapping[str, Mapping[str, Any]]) -> Any:
        """The objective's space with this config's overrides applied, as a `SearchSpace`.

        An override may replace a parameter by a narrower one that the objective still accepts: numeric
        bounds inside the objective's, no fractional values for an integer parameter, choices a subset. An
        override of the same type (or without `type`) changes only the keys it gives: `{low, high}` keeps the
        objective's `log` and `step`; another type replaces the parameter.

        Raises:
            ConfigError: naming `space.<param>` when an override names no parameter of the objective or
                leaves its range.
        """
        from orchestrator.space import SearchSpace, check_loggable

        merged = {k: dict(v) for k, v in objective_space.items()}
        for name, spec in self.space.items():
            key = f"space.{name}"
            if name not in merged:
                raise ConfigError(
                    f"`{key}` is not a parameter of objective {self.objective.name!r}; its parameters are: "
                    f"{', '.join(merged)}"
                )
            old, new = merged[name], dict(spec)
            if new.get("type", old.get("type", "float")) == old.get("type", "float"):
                # an override of the same type keeps what it does not restate (log, step)
                new = {**old, **new}
            _check_param_spec(key, name, new)
            _check_narrowing(key, new, old)
            merged[name] = new
        def build(description: dict[str, Any], where: str) -> Any:
            try:
                space = SearchSpace.from_description(description)
                # a run reads its space back from config.yaml and its params from the log
                check_loggable(space)
            except SpaceError as exc:
                raise ConfigError(f"{where}: {_one_line(str(exc))}") from None
            return space

        # the parameters the config leaves alone first: an error there is the objective's, not the config's
        own = {k: v for k, v in merged.items() if k not in self.space}
        if own:
            build(own, "the objective's space")
        return build(merged, "`space`")


def _check_narrowing(key: str, new: dict[str, Any], old: Mapping[str, Any]) -> None:
    from objectives.base import is_choice  # the objective's own test of a choice: a bool matches only a bool

    old_type, new_type = old.get("type", "float"), new.get("type", "float")
    if old_type == "choice":
        extra = (
            [c for c in new.get("choices", []) if not is_choice(c, old["choices"])]
            if new_type == "choice"
            else None
        )
        if new_type != "choice" or extra:
            raise ConfigError(f"`{key}` must be a choice among a subset of {list(old['choices'])}; got "
                              f"{show(new)}")
        return
    lo, hi = old["low"], old["high"]
    if new_type == "choice":
        values = new.get("choices", [])
    else:
        values = [new["low"], new["high"]]
    for v in values:
        numeric = isinstance(v, (int, float)) and not isinstance(v, bool)
        if not numeric or not (lo <= v <= hi) or (old_type == "int" and float(v) != round(float(v))):
            kind = "integers" if old_type == "int" else "numbers"
            raise ConfigError(f"`{key}` must stay within the objective's range: {kind} in [{lo}, {hi}]; got "
                              f"{show(new)}")
    if old_type == "int" and new_type == "float":
        raise ConfigError(f"`{key}` must be an int or choice parameter (the objective's is an integer); got "
                          f"{show(new)}")
    step = old.get("step", 1)
    if old_type == "int" and step != 1:  # the objective accepts only its own grid: every value must be on it
        off_grid = [v for v in values if (round(float(v)) - lo) % step]
        new_step = new.get("step", 1) if new_type == "int" else step
        if off_grid or (isinstance(new_step, int) and not isinstance(new_step, bool) and new_step % step):
            raise ConfigError(f"`{key}` must stay on the objective's grid {lo}:{hi}:{step} (values on it, a "
                              f"step that is a multiple of {step}); got {show(new)}")


def _to_plain(v: Any) -> Any:
    if isinstance(v, Mapping):
        return {k: _to_plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_to_plain(x) for x in v]
    return v
