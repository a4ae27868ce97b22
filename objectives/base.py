"""Objective protocol: what qbatch needs to know about a black box to optimize it.

An objective has a name, a search space given as a plain description (mapped onto the parameter
types of `orchestrator/space.py`), the resources one evaluation needs, and one `evaluate(params, seed)`.
Synthetic objectives also give their exact tau-quantile and optimum so benchmarks can compute true regret
(quantile-expectile-bo.md §4). Like BoTorch test problems, subclasses declare and implement one method.

Space description: an ordered ``dict`` from parameter name to a spec dict, one of
``{"type": "float", "low": a, "high": b, "log": False}``,
``{"type": "int", "low": a, "high": b, "step": 1, "log": False}``,
``{"type": "choice", "choices": [...]}``.
"""

from __future__ import annotations

import math
import numbers
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["EvalResult", "Objective", "ObjectiveError", "Resources", "SyntheticObjective"]


class ObjectiveError(ValueError):
    """Parameters handed to an objective are invalid; the message names the parameter."""


@dataclass(frozen=True)
class Resources:
    """What one evaluation needs from the cluster (Ray task options)."""

    num_cpus: float = 1.0
    num_gpus: float = 0.0
    memory: int | None = None  # bytes
    custom: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        """Refuse what Ray would refuse at every submission (the run would retry it forever, evaluating
        nothing)."""
        for key in ("num_cpus", "num_gpus"):
            _check_quantity(key, getattr(self, key))
        if self.memory is not None:
            _check_quantity("memory", self.memory)
        if not isinstance(self.custom, Mapping):
            raise ObjectiveError("custom resources must be a mapping of name to quantity; got "
                                 f"{self.custom!r}")
        for name, q in self.custom.items():
            if not isinstance(name, str) or not name or name in ("CPU", "GPU"):
                raise ObjectiveError(f"custom resource name {name!r} is not allowed (a non-empty name other "
                                     "than 'CPU' and 'GPU': those are num_cpus and num_gpus)")
            _check_quantity(f"custom resource {name!r}", q)

    def to_ray_options(self) -> dict[str, Any]:
        opts: dict[str, Any] = {"num_cpus": self.num_cpus, "num_gpus": self.num_gpus}
        if self.memory is not None:
            opts["memory"] = int(self.memory)
        if self.custom:
            opts["resources"] = dict(self.custom)
        return opts


def _check_quantity(key: str, q: Any) -> None:
    if isinstance(q, bool) or not isinstance(q, numbers.Real) or not math.isfinite(q) or q < 0:
        raise ObjectiveError(f"{key} must be a finite number >= 0; got {q!r}")


@dataclass
class EvalResult:
    """An evaluation's value plus optional extra metrics (e.g. training time, train loss): name -> a number, a
    string, a bool, None, or small lists/dicts of these (`workers.metrics` says what the log keeps)."""

    value: float
    metrics: dict[str, Any] = field(default_factory=dict)


class Objective(ABC):
    """A black box to maximize (or minimize, per `direction`).

    Subclasses set `name`, `space`, optionally `resources`, `direction`, `noisy`, and implement `evaluate`.
    """

    name: str = "objective"
    #: plain space description (see module docstring); ordered
    space: dict[str, dict[str, Any]] = {}
    resources: Resources = Resources()
    #: "maximize" or "minimize": the natural sense of the returned value
    direction: str = "maximize"
    #: whether repeated evaluations at the same point differ
    noisy: bool = True
    #: options that name files or folders: a run stores them as absolute paths (`~` expanded), so that
    #: `qbatch resume` from another directory, and workers on other nodes, read the same files
    path_options: tuple[str, ...] = ()

    @abstractmethod
    def evaluate(self, params: Mapping[str, Any], seed: int) -> float | EvalResult:
        """Evaluate at `params` (names of `space` to values) with random `seed`."""

    def __call__(self, params: Mapping[str, Any], seed: int = 0) -> float | EvalResult:
        # one rule for every objective (NumPy and torch seeders refuse negatives or 2**64 each in their own
        # words)
        if is_bool(seed) or not isinstance(seed, numbers.Integral) or not 0 <= seed < 2**63:
            raise ObjectiveError(f"seed must be an integer in [0, 2**63); got {seed!r}")
        self.check_params(params)
        return self.evaluate(params, int(seed))

    def check_params(self, params: Mapping[str, Any]) -> None:
        """Raise `ObjectiveError` naming the first missing, unknown or out-of-space parameter."""
        check_params(self.space, params)


class SyntheticObjective(Objective):
    """An objective whose outcome distribution is known exactly at every point."""

    @abstractmethod
    def quantile(self, params: Mapping[str, Any], tau: float) -> float:
        """Exact tau-quantile of the outcome at `params`, in the objective's own sense."""

    @abstractmethod
    def optimum(self, tau: float) -> tuple[dict[str, Any], float]:
        """(params, value) of the best tau-quantile over the space (max, or min if direction is minimize)."""


def is_bool(value: Any) -> bool:
    """Whether `value` is a bool, Python's or NumPy's (both are numbers to `isinstance` checks)."""
    return isinstance(value, (bool, np.bool_))


def is_json_data(value: Any, tuples: bool = False) -> bool:
    """Whether `value` comes back equal, and of the same type, from JSON (and YAML): None, bool, int, float,
    str, and lists and string-keyed dicts of them, of exactly these types (an IntEnum would come back an int,
    a non-string key a string). `tuples`: count tuples as lists (they come back lists)."""
    if value is None or type(value) in (bool, int, float, str):
        return True
    if type(value) is list or (tuples and type(value) is tuple):
        return all(is_json_data(v, tuples) for v in value)
    if type(value) is dict:
        return all(type(k) is str and is_json_data(v, tuples) for k, v in value.items())
    return False


def is_choice(value: Any, choices: Any) -> bool:
    """Whether `value` is one of `choices`: a bool matches only a bool (True == 1 in Python), and a value
    whose == gives no truth value (an array) matches none."""
    try:
        return any(is_bool(c) == is_bool(value) and bool(c == value) for c in choices)
    except (TypeError, ValueError):
        return False


def check_params(space: Mapping[str, Mapping[str, Any]], params: Mapping[str, Any]) -> None:
    """Validate `params` against a plain space description; errors name the parameter."""
    missing = [k for k in space if k not in params]
    if missing:
        raise ObjectiveError(f"missing parameter(s) {missing}; expected {list(space)}")
    unknown = [k for k in params if k not in space]
    if unknown:
        raise ObjectiveError(f"unknown parameter(s) {unknown}; expected {list(space)}")
    for name, spec in space.items():
        v = params[name]
        kind = spec.get("type", "float")
        if kind == "choice":
            if not is_choice(v, spec["choices"]):
                raise ObjectiveError(f"parameter {name!r}={v!r} is not one of {list(spec['choices'])}")
            continue
        # any real number, NumPy's included (np.int64 from a pandas frame, np.float32 from a float32 tensor)
        if is_bool(v) or not isinstance(v, numbers.Real) or not math.isfinite(float(v)):
            raise ObjectiveError(f"parameter {name!r} must be a finite number; got {v!r}")
        lo, hi = spec["low"], spec["high"]
        # float32 (and half) bounds round: np.float32(0.3) is 1.2e-8 above 0.3
        eps = float(np.finfo(v.dtype).eps) if isinstance(v, np.floating) else 1e-9
        tol = max(1e-9, eps) * max(1.0, abs(lo), abs(hi))
        if not (lo - tol <= float(v) <= hi + tol):
            raise ObjectiveError(f"parameter {name!r}={v!r} is outside [{lo}, {hi}]")
        if kind == "int" and float(v) != round(float(v)):
            raise ObjectiveError(f"parameter {name!r}={v!r} must be an integer")
        step = spec.get("step", 1)
        if kind == "int" and (round(float(v)) - lo) % step:
            raise ObjectiveError(
                f"parameter {name!r}={v!r} is not on the grid {lo}, {lo + step}, ..., {hi} (step {step})"
            )
