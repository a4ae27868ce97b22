"""Checks of objective options: each names the option and the value it refused.

The built-in objectives call these in their constructors, so a bad entry of `objective.options` is one
`ObjectiveError` before any run starts (the brief: "bad input gets a clear error, naming the key or value"),
in one format across objectives: ``option 'key' must be ...; got value``. Nothing is coerced: ``"no"`` is
not a boolean, ``True`` is not a number and ``2.0`` is not an integer (YAML and JSON give the right types).
User objectives may use them too. The integer, number, boolean and choice checks are those of
`objectives.checks` (the one checker, which the orchestrator's options use too), worded for objective options.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from objectives import checks
from objectives.base import ObjectiveError, is_bool

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

#: the most parameters a search space may have (a built-in objective's `dim` option, any objective's space):
#: the proposers' candidate sets grow with the dimension (max(5000, 1000 d) Sobol points for Thompson
#: sampling, spec §2); without the bound dim 10^8 passes every check and runs out of memory 72 s later, in the
#: objective's constructor
MAX_DIM = 1000


def _option(key: str) -> str:
    return f"option {key!r}"


def _refuse(key: str, what: str, value: Any) -> ObjectiveError:
    return checks.refuse(_option(key), what, value, ObjectiveError)


def _none_or(what: str, optional: bool) -> str:
    return "None or " + what if optional else what


def check_int(key: str, value: Any, low: int | None = None, high: int | None = None, *,
              optional: bool = False) -> int | None:
    """`value` as an int in [low, high] (either end may be None); None passes when `optional`."""
    what = _none_or(checks.interval("an integer", low, high), optional)
    return checks.check_int(
        _option(key), value, low, high, optional=optional, must=what, error=ObjectiveError
    )


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
    what = _none_or(checks.interval("a finite number", low, high, low_open, high_open, "g"), optional)
    return checks.check_float(_option(key), value, low, high, lo_open=low_open, hi_open=high_open,
                              optional=optional, must=what, error=ObjectiveError)


def check_bool(key: str, value: Any) -> bool:
    """`value` as a bool: true or false only (a string such as "no" is refused, not read as True)."""
    return checks.check_bool(_option(key), value, error=ObjectiveError)


def check_str(key: str, value: Any) -> str:
    """`value` as a non-empty string."""
    if not isinstance(value, str) or not value:
        raise _refuse(key, "a non-empty string", value)
    return value


def check_choice(key: str, value: Any, choices: Iterable[Any]) -> Any:
    """`value`, which must be one of `choices` (a bool matches only a bool, a string only a string)."""
    choices = list(choices)
    return checks.check_choice(_option(key), value, choices, must=f"one of {choices}", error=ObjectiveError)


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
    if (
        isinstance(value, (str, bytes))
        or not isinstance(value, Sequence)
        and not isinstance(value, np.ndarray)
    ):
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
