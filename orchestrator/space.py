"""Search space: float, log-float, int (with step) and categorical parameters <-> the unit cube.

Inside the models every point lives in `[0, 1]^d` (ARCHITECTURE.md, "Conventions"); this module is
the one place where user parameters are converted. Each parameter takes one dimension:
float/int map affinely (or in log space), a choice among k values maps to k equal bins of [0, 1].
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from objectives.base import is_choice, is_json_data  # is_choice: a bool matches only a bool
from objectives.options import MAX_DIM
from orchestrator.checks import check_bool, is_int, is_number
from orchestrator.errors import SpaceError

__all__ = ["FloatParam", "IntParam", "ChoiceParam", "Parameter", "SearchSpace"]


@dataclass(frozen=True)
class FloatParam:
    name: str
    low: float
    high: float
    log: bool = False

    def __post_init__(self) -> None:
        _check_bounds(self.name, self.low, self.high, self.log)

    def to_unit(self, v: Any) -> float:
        v = _number(self.name, v)
        if self.log:  # the tolerance is relative to each bound: on a log scale 0 is infinitely far from low
            if not (self.low * (1 - 1e-9) <= v <= self.high * (1 + 1e-9)):
                raise SpaceError(f"parameter {self.name!r}={v!r} is outside [{self.low}, {self.high}]")
            v = min(max(v, self.low), self.high)
            return (math.log(v) - math.log(self.low)) / (math.log(self.high) - math.log(self.low))
        v = _check_in(self.name, v, self.low, self.high)
        return (v - self.low) / (self.high - self.low)

    def from_unit(self, u: float) -> float:
        u = min(max(float(u), 0.0), 1.0)
        if self.log:  # exp(log(.)) may land a few ulps outside the bounds: keep the value inside them
            v = math.exp(math.log(self.low) + u * (math.log(self.high) - math.log(self.low)))
            return float(min(max(v, self.low), self.high))
        return float(self.low + u * (self.high - self.low))

    def describe(self) -> dict[str, Any]:
        return {"type": "float", "low": self.low, "high": self.high, "log": self.log}


@dataclass(frozen=True)
class IntParam:
    name: str
    low: int
    high: int
    step: int = 1
    log: bool = False

    def __post_init__(self) -> None:
        for key in ("low", "high", "step"):
            v = getattr(self, key)
            if not is_int(v) and not (isinstance(v, float) and v.is_integer()):
                raise SpaceError(f"parameter {self.name!r}: {key} must be an integer; got {v!r}")
        _check_bounds(self.name, self.low, self.high, self.log)
        if max(abs(int(self.low)), abs(int(self.high))) > _MAX_EXACT_INT:  # values pass through float64
            raise SpaceError(
                f"parameter {self.name!r}: an int parameter's bounds must lie within +-2**53 "
                f"({_MAX_EXACT_INT}), where float64 holds every integer; got low={self.low}, high={self.high}"
            )
        if self.step < 1:  # before the division below (step 0 would be a ZeroDivisionError)
            raise SpaceError(f"parameter {self.name!r}: step must be >= 1; got {self.step}")
        if self.size > _MAX_EXACT_INT // 2:  # cells of 1/size in [0, 1]
            raise SpaceError(f"parameter {self.name!r}: an int parameter may hold at most 2**52 values (each "
                             f"is a cell of the float64 unit interval); got low={self.low}, "
                             f"high={self.high}, step={self.step}")
        if (self.high - self.low) % self.step:
            raise SpaceError(
                f"parameter {self.name!r}: high - low ({self.high} - {self.low}) must be a multiple of step "
                f"{self.step}"
            )
        if self.log and self.step != 1:
            raise SpaceError(f"parameter {self.name!r}: a log int parameter must have step 1; got "
                             f"{self.step}")
        if self.log and int(self.high) > _MAX_LOG_INT:
            raise SpaceError(f"parameter {self.name!r}: a log int parameter's high must be at most 2**44 "
                             f"({_MAX_LOG_INT}): above that, neighbouring values lie closer together in the "
                             "unit interval than float64 tells apart (they do not map back to themselves); "
                             f"got high={self.high}")

    @property
    def values(self) -> np.ndarray:
        return np.arange(int(self.low), int(self.high) + 1, int(self.step))

    @property
    def size(self) -> int:
        """How many values the grid holds (without building it: a range may hold billions)."""
        return (int(self.high) - int(self.low)) // int(self.step) + 1

    def _log_bounds(self) -> tuple[float, float]:
        """The log-scale ends of a log int's unit interval: each value owns [v - 0.5, v + 0.5] (low's cell
        starts at low itself when low <= 0.5)."""
        return math.log(self.low - 0.5 if self.low > 0.5 else self.low), math.log(self.high + 0.5)

    def to_unit(self, v: Any) -> float:
        x = _check_in(self.name, _number(self.name, v), self.low, self.high, rel_tol=0.0)
        if x != round(x) or (round(x) - self.low) % self.step:
            raise SpaceError(f"parameter {self.name!r}={v!r} is not on the grid "
                             f"{self.low}:{self.high}:{self.step}")
        if self.log:
            lo, hi = self._log_bounds()
            return (math.log(x) - lo) / (hi - lo)
        k = self.size
        return (((x - self.low) / self.step) + 0.5) / k

    def from_unit(self, u: float) -> int:
        u = min(max(float(u), 0.0), 1.0)
        if self.log:
            lo, hi = self._log_bounds()
            return int(min(max(round(math.exp(lo + u * (hi - lo))), self.low), self.high))
        k = self.size
        i = min(int(u * k), k - 1)
        return int(self.low + i * self.step)

    def cell_index(self, u: np.ndarray) -> np.ndarray:
        """The grid index (0 .. size - 1) that `from_unit` rounds each unit coordinate of `u` to, vectorized:
        what tells two points' values apart exactly (adjacent values of a log int near 1e5 lie under 1e-6
        apart in the unit interval). A log int's index goes through NumPy's `exp`, `from_unit`'s through
        `math.exp`; they could differ by an ulp, which matters only at a cell's very edge, and `ask` applies
        this to snapped points, which lie at cell centres."""
        u = np.clip(np.asarray(u, dtype=np.float64), 0.0, 1.0)
        if self.log:
            lo, hi = self._log_bounds()
            values = np.clip(np.round(np.exp(lo + u * (hi - lo))), self.low, self.high)
            return values.astype(np.int64) - int(self.low)
        return _bin_index(u, self.size)

    def describe(self) -> dict[str, Any]:
        return {
            "type": "int",
            "low": int(self.low),
            "high": int(self.high),
            "step": int(self.step),
            "log": self.log,
        }


def _plain_choice(value: Any) -> Any:
    """NumPy scalars as plain Python values, inside lists and dicts too (a trial's params go into JSON, the
    log and weights-only checkpoints)."""
    if isinstance(value, np.generic):
        return value.item()
    if type(value) is list:
        return [_plain_choice(v) for v in value]
    if type(value) is dict:
        return {k: _plain_choice(v) for k, v in value.items()}
    return value


def check_loggable(space: SearchSpace) -> None:
    """Raise `SpaceError` naming the parameter when a choice would not come back the same from a run's log and
    config.yaml (JSON and YAML): a run proposes from the space it reads back, and a resume maps logged params
    onto it. The library (`AskTellOptimizer`) keeps no log and takes any choice values."""
    for p in space.params:
        if isinstance(p, ChoiceParam):
            for c in p.choices:
                if not is_json_data(c):  # a tuple comes back a list
                    hint = f"; write the tuple {c!r} as the list {list(c)!r}" if isinstance(c, tuple) else ""
                    raise SpaceError(f"parameter {p.name!r}: choice {c!r:.80} would not come back the same "
                                     "from the run's log: a run's choices are None, bools, numbers, "
                                     f"strings, or lists and string-keyed dicts of them{hint}")


def _bin_index(u: np.ndarray, k: int) -> np.ndarray:
    """Which of `k` equal bins of [0, 1] each coordinate of `u` falls in (clipped to the interval), as int64:
    the vectorized `min(int(u * k), k - 1)` of the linear int's and the choice's `from_unit`."""
    return np.minimum((np.clip(np.asarray(u, dtype=np.float64), 0.0, 1.0) * k).astype(np.int64), k - 1)


@dataclass(frozen=True)
class ChoiceParam:
    name: str
    choices: tuple[Any, ...]

    def __post_init__(self) -> None:
        # its order changes with PYTHONHASHSEED: so would the space
        if isinstance(self.choices, (set, frozenset)):
            raise SpaceError(f"parameter {self.name!r}: choices must be a list or tuple; got a "
                             f"{type(self.choices).__name__}")
        # numpy scalars as plain Python values: a trial's params go into JSON, the log and weights-only
        # checkpoints
        object.__setattr__(self, "choices", tuple(_plain_choice(c) for c in self.choices))
        if len(self.choices) < 1:
            raise SpaceError(f"parameter {self.name!r}: choices must not be empty")
        # by `to_unit`'s test: of 1 and 1.0 only the first could ever be chosen by a unit coordinate's bin
        if any(is_choice(a, self.choices[i + 1:]) for i, a in enumerate(self.choices)):
            raise SpaceError(f"parameter {self.name!r}: duplicate choices in {list(self.choices)}")

    def to_unit(self, v: Any) -> float:
        for i, c in enumerate(self.choices):
            if is_choice(v, (c,)):
                return (i + 0.5) / len(self.choices)
        raise SpaceError(f"parameter {self.name!r}={v!r} is not one of {list(self.choices)}")

    def from_unit(self, u: float) -> Any:
        k = len(self.choices)
        return self.choices[min(int(min(max(float(u), 0.0), 1.0) * k), k - 1)]

    def cell_index(self, u: np.ndarray) -> np.ndarray:
        """The index of the choice `from_unit` gives for each unit coordinate of `u`, vectorized."""
        return _bin_index(u, len(self.choices))

    def describe(self) -> dict[str, Any]:
        return {"type": "choice", "choices": list(self.choices)}


Parameter = FloatParam | IntParam | ChoiceParam

#: the keys a parameter spec of each type may have, and those it must have
SPEC_KEYS: dict[str, frozenset[str]] = {
    "float": frozenset({"type", "low", "high", "log"}),
    "int": frozenset({"type", "low", "high", "step", "log"}),
    "choice": frozenset({"type", "choices"}),
}
REQUIRED_KEYS: dict[str, frozenset[str]] = {
    "float": frozenset({"low", "high"}), "int": frozenset({"low", "high"}), "choice": frozenset({"choices"}),
}


def _number(name: str, v: Any) -> float:
    if not is_number(v):
        raise SpaceError(f"parameter {name!r} must be a number; got {v!r}")
    x = float(v)
    if not math.isfinite(x):
        raise SpaceError(f"parameter {name!r} must be finite; got {v!r}")
    return x


#: the largest integer up to which float64 (the unit cube's type) holds every integer exactly
_MAX_EXACT_INT = 2**53
#: the largest `high` of a log int parameter: up to it every value maps to the unit interval and back to
#: itself (checked to 2**47; 2**48 is the first power of two where neighbouring values start to merge)
_MAX_LOG_INT = 2**44


def _check_bounds(name: str, low: Any, high: Any, log: bool) -> None:
    for key, v in (("low", low), ("high", high)):
        if not is_number(v) or not math.isfinite(v):
            raise SpaceError(f"parameter {name!r}: {key} must be a finite number; got {v!r}")
    if not low < high:
        raise SpaceError(f"parameter {name!r}: low must be < high; got low={low}, high={high}")
    if not math.isfinite(float(high) - float(low)):  # e.g. -1e308 .. 1e308: every point would map to +-inf
        raise SpaceError(f"parameter {name!r}: high - low must be a finite float64; got low={low}, "
                         f"high={high}")
    if log and low <= 0:
        raise SpaceError(f"parameter {name!r}: a log parameter needs low > 0; got low={low}")


def _check_in(name: str, v: float, low: float, high: float, rel_tol: float = 1e-9) -> float:
    """`v` clamped into [low, high]; a value further out than `rel_tol` of the bounds' magnitude raises."""
    tol = rel_tol * max(abs(low), abs(high))
    if not (low - tol <= v <= high + tol):
        raise SpaceError(f"parameter {name!r}={v!r} is outside [{low}, {high}]")
    return min(max(v, low), high)


def _check_dim(n: int) -> None:
    if n > MAX_DIM:
        raise SpaceError(f"search space has {n} parameters; at most {MAX_DIM} (objectives.options.MAX_DIM)")


class SearchSpace:
    """An ordered set of named parameters with a bijection (up to rounding) onto `[0, 1]^d`.

    Args:
        params: the parameters, in order; names must be unique and non-empty.
    """

    def __init__(self, params: Sequence[Parameter]) -> None:
        params = list(params)
        if not params:
            raise SpaceError("search space is empty: give at least one parameter")
        _check_dim(len(params))
        names = [p.name for p in params]
        for n in names:
            if not isinstance(n, str) or not n:
                raise SpaceError(f"parameter names must be non-empty strings; got {n!r}")
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise SpaceError(f"duplicate parameter name(s) {dup}")
        self.params: list[Parameter] = params
        self.names: list[str] = names

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_description(cls, description: Mapping[str, Mapping[str, Any]]) -> SearchSpace:
        """Build from a plain description ``{name: {"type": ..., ...}}`` (objectives/base.py)."""
        if not isinstance(description, Mapping):
            raise SpaceError("space must be a mapping of parameter name to spec; got "
                             f"{type(description).__name__}")
        _check_dim(len(description))  # before building a parameter of each
        params: list[Parameter] = []
        for name, spec in description.items():
            if not isinstance(spec, Mapping):
                raise SpaceError(f"parameter {name!r}: spec must be a mapping; got {spec!r}")
            kind = spec.get("type", "float")
            if not isinstance(kind, str) or kind not in SPEC_KEYS:
                raise SpaceError(f"parameter {name!r}: type must be one of {sorted(SPEC_KEYS)}; got {kind!r}")
            unknown = set(spec) - SPEC_KEYS[kind]
            if unknown:
                raise SpaceError(
                    f"parameter {name!r}: unknown key(s) {sorted(unknown)} for type {kind!r}; allowed "
                    f"{sorted(SPEC_KEYS[kind])}"
                )
            log = check_bool(f"parameter {name!r}: log", spec.get("log", False), error=SpaceError)
            try:
                if kind == "float":
                    params.append(FloatParam(name, spec["low"], spec["high"], bool(log)))
                elif kind == "int":
                    params.append(IntParam(name, spec["low"], spec["high"], spec.get("step", 1), bool(log)))
                else:
                    choices = spec["choices"]
                    if (isinstance(choices, (str, bytes, Mapping, set, frozenset))
                            # a set's order changes with PYTHONHASHSEED
                            or not isinstance(choices, Iterable)):
                        raise SpaceError(f"parameter {name!r}: choices must be a list; got {choices!r}")
                    params.append(ChoiceParam(name, tuple(choices)))
            except KeyError as exc:
                raise SpaceError(f"parameter {name!r}: missing key {exc.args[0]!r}") from None
        return cls(params)

    def describe(self) -> dict[str, dict[str, Any]]:
        return {p.name: p.describe() for p in self.params}

    @property
    def dim(self) -> int:
        return len(self.params)

    def __len__(self) -> int:
        return self.dim

    def __repr__(self) -> str:
        return f"SearchSpace({self.params!r})"

    # ------------------------------------------------------------------ conversion
    def to_unit(self, points: Sequence[Mapping[str, Any]], **tkwargs: Any) -> Tensor:
        """`n` parameter dicts -> `n x d` tensor in the unit cube. Errors name the row and parameter."""
        rows = []
        for i, point in enumerate(points):
            if not isinstance(point, Mapping):
                raise SpaceError(f"point {i} must be a mapping of parameter name to value; got {point!r}")
            missing = [n for n in self.names if n not in point]
            unknown = [k for k in point if k not in self.names]
            if missing or unknown:
                raise SpaceError(f"point {i}: missing {missing}, unknown {unknown}; expected {self.names}")
            try:
                rows.append([p.to_unit(point[p.name]) for p in self.params])
            except SpaceError as exc:
                raise SpaceError(f"point {i}: {exc}") from None
        tkwargs.setdefault("dtype", torch.float64)
        return torch.tensor(rows, **tkwargs).reshape(len(rows), self.dim)

    def from_unit(self, X: Tensor | np.ndarray) -> list[dict[str, Any]]:
        """`n x d` unit-cube points -> `n` parameter dicts (values rounded onto each parameter's grid)."""
        arr = X.detach().cpu().numpy() if isinstance(X, Tensor) else np.asarray(X, dtype=float)
        if arr.ndim != 2 or arr.shape[1] != self.dim:
            raise SpaceError(f"expected an `n x {self.dim}` array; got shape {tuple(arr.shape)}")
        if not np.isfinite(arr).all():
            bad = int(np.argwhere(~np.isfinite(arr))[0, 0])
            raise SpaceError(f"row {bad} of the unit-cube points is not finite: {arr[bad].tolist()}")
        return [{p.name: p.from_unit(u) for p, u in zip(self.params, row)} for row in arr]

    @property
    def has_grid(self) -> bool:
        """Whether some parameter takes discrete values (int or choice), so that `snap` rounds."""
        return any(not isinstance(p, FloatParam) for p in self.params)

    def snap(self, X: Tensor) -> Tensor:
        """Round unit-cube points onto the representable grid (int steps, choices); floats unchanged."""
        return self.to_unit(self.from_unit(X), dtype=X.dtype, device=X.device)

    def validate(self, point: Mapping[str, Any]) -> None:
        """Raise `SpaceError` naming the parameter if `point` is not in the space."""
        self.to_unit([point])

    # ------------------------------------------------------------------ designs
    def sobol(self, n: int, seed: int | None = None, **tkwargs: Any) -> Tensor:
        """`n x d` scrambled Sobol points in the unit cube, snapped to the grid of discrete parameters."""
        if n < 0:
            raise SpaceError(f"n must be >= 0; got {n}")
        tkwargs.setdefault("dtype", torch.float64)
        if n == 0:  # SobolEngine.draw(0) raises
            return torch.empty(0, self.dim, **tkwargs)
        engine = torch.quasirandom.SobolEngine(self.dim, scramble=True, seed=seed)
        X = engine.draw(n, dtype=torch.float64).to(**tkwargs)
        return self.snap(X)

    def bounds(self, **tkwargs: Any) -> Tensor:
        """`2 x d` bounds of the unit cube (BoTorch convention)."""
        tkwargs.setdefault("dtype", torch.float64)
        return torch.stack([torch.zeros(self.dim, **tkwargs), torch.ones(self.dim, **tkwargs)])
