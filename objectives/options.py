"""Checks of objective options: each names the option and the value it refused.

The built-in objectives call these in their constructors, so a bad entry of `objective.options` is one
`ObjectiveError` before any run starts (the brief: "bad input gets a clear error, naming the key or value"),
in one format across objectives: ``option 'key' must be ...; got value``. Nothing is coerced: ``"no"`` is
not a boolean, ``True`` is not a number and ``2.0`` is not an integer (YAML and JSON give the right types).
User objectives may use them too.
"""

from __future__ import annotations

import math
import numbers
import os
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from objectives.base import ObjectiveError, is_bool, is_choice

__all__ = [
    "MAX_DIM",
    "check_bool",
    "check_bounds",
    "check_choice",
    "check_float",
    "check_int",
    "check_path",
    "check_range",
    "check_str",
]

#: the most parameters a search space may have (a built-in objective's `dim` option, any objective's space): the
#: proposers' candidate sets grow with the dimension (max(5000, 1000 d) Sobol points for Thompson sampling, spec
#: §2); without the bound dim 10^8 passes every check and runs out of memory 72 s later, in the objective's constructor
MAX_DIM = 1000


def _refuse(key: str, what: str, value: Any) -> ObjectiveError:
    return ObjectiveError(f"option {key!r} must be {what}; got {value!r}")


def _describe(kind: str, low: Any, high: Any, low_open: bool, high_open: bool) -> str:
    if low is not None and high is not None:
        return f"{kind} in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    if low is not None:
        return f"{kind} {'>' if low_open else '>='} {low:g}"
    if high is not None:
        return f"{kind} {'<' if high_open else '<='} {high:g}"
    return kind


def check_int(key: str, value: Any, low: int | None = None, high: int | None = None, *, optional: bool = False) -> int | None:
    """`value` as an int in [low, high] (either end may be None); None passes when `optional`."""
    if value is None and optional:
        return None
    what = _describe("an integer", low, high, False, False)
    if optional:
        what = "None or " + what
    if is_bool(value) or not isinstance(value, (int, np.integer)):
        raise _refuse(key, what, value)
    if (low is not None and value < low) or (high is not None and value > high):
        raise _refuse(key, what, value)
    return int(value)


def check_float(
    key: str,
    value: Any,
    low: float | None = None,
    high: float | None = None,
    *,
    low_open: bool = False,
    high_open: bool = False,
    optional: bool = False,
) -> float | None:
    """`value` as a finite float within the given ends (open or closed); None passes when `optional`."""
    if value is None and optional:
        return None
    what = _describe("a finite number", low, high, low_open, high_open)
    if optional:
        what = "None or " + what
    if is_bool(value) or not isinstance(value, numbers.Real):
        raise _refuse(key, what, value)
    v = float(value)
    if not math.isfinite(v):
        raise _refuse(key, what, value)
    if low is not None and (v < low or (low_open and v == low)):
        raise _refuse(key, what, value)
    if high is not None and (v > high or (high_open and v == high)):
        raise _refuse(key, what, value)
    return v


def check_bool(key: str, value: Any) -> bool:
    """`value` as a bool: true or false only (a string such as "no" is refused, not read as True)."""
    if not is_bool(value):
        raise _refuse(key, "true or false", value)
    return bool(value)


def check_str(key: str, value: Any) -> str:
    """`value` as a non-empty string."""
    if not isinstance(value, str) or not value:
        raise _refuse(key, "a non-empty string", value)
    return value


def check_choice(key: str, value: Any, choices: Iterable[Any]) -> Any:
    """`value`, which must be one of `choices`."""
    choices = list(choices)
    if not is_choice(value, choices):
        raise _refuse(key, f"one of {choices}", value)
    return value


def check_path(key: str, value: Any, *, kind: str | None = None, optional: bool = True) -> Path | None:
    """`value` as a `Path` (a string or path-like); with `kind` "file" or "dir", it must exist as one."""
    if value is None and optional:
        return None
    if not isinstance(value, (str, os.PathLike)) or not os.fspath(value):
        raise _refuse(key, ("None or " if optional else "") + "a path", value)
    path = Path(value).expanduser()
    if kind == "file" and not path.is_file():
        raise ObjectiveError(f"option {key!r}={os.fspath(value)!r} is not a file")
    if kind == "dir" and not path.is_dir():
        raise ObjectiveError(f"option {key!r}={os.fspath(value)!r} is not a folder")
    return path


def check_range(key: str, value: Any) -> tuple[float, float]:
    """`value` as a pair (low, high) of finite numbers with low < high."""
    what = "a pair (low, high) of finite numbers with low < high"
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) and not isinstance(value, np.ndarray):
        raise _refuse(key, what, value)
    if len(value) != 2:
        raise _refuse(key, what, value)
    lo, hi = value
    for v in (lo, hi):
        if is_bool(v) or not isinstance(v, numbers.Real) or not math.isfinite(float(v)):
            raise _refuse(key, what, value)
    if not float(lo) < float(hi):
        raise _refuse(key, what, value)
    return float(lo), float(hi)


def check_bounds(key: str, value: Any, dim: int) -> tuple[tuple[float, float], ...]:
    """`value` as `dim` pairs (low, high), each checked by `check_range` as ``key[i]``."""
    if isinstance(value, (str, bytes)) or not isinstance(value, (Sequence, np.ndarray)) or len(value) != dim:
        raise _refuse(key, f"{dim} (low, high) pair{'s' if dim != 1 else ''}", value)
    return tuple(check_range(f"{key}[{i}]", b) for i, b in enumerate(value))
