"""The one checker of option values: a type and range check per kind of value, each error naming the option
and the value it refused (STYLE.md §4.6, as Ray's `_common/ray_option_utils.py` checks task options).

Every message reads ``<name> must be <what>; got <value>``: `name` is the option as its owner writes it
("`batch_size`", "qgibbon.grid_size", "option 'dim'"), `what` the accepted values (worded from the bounds
unless the owner words it), and the value is shown on one line, cut at 80 characters. A bool is not a number
here (Python counts True as 1), and NumPy scalars count as the Python values they hold; each check returns the
Python value. Each check raises the error type its owner gives (`error`). This module lives in the lowest
package, which imports no other: `orchestrator.checks` gives it qbatch's `ConfigError` as the default error
and `objectives.options` words it for objective options (`ObjectiveError`).
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable
from typing import Any

import numpy as np

from objectives.base import is_bool

__all__ = [
    "SHOW_CHARS", "check_bool", "check_choice", "check_float", "check_int", "interval", "is_among", "is_bool",
    "is_int", "is_number", "refuse", "show", "suggest",
]

#: the longest shown value: a longer repr is cut, so a message stays one line
SHOW_CHARS = 80


def show(value: Any) -> str:
    """A short one-line repr of a refused value: at most `SHOW_CHARS` characters, a longer one cut with the
    number of characters cut (as `workers.records.cap` notes a cut)."""
    text = repr(value)
    if len(text) <= SHOW_CHARS:
        return text
    kept = SHOW_CHARS
    for _ in range(3):  # the note's length depends on the count it holds: settle both
        kept = SHOW_CHARS - len(f"... [{len(text) - kept} characters cut] ...")
    return f"{text[:kept]}... [{len(text) - kept} characters cut] ..."


def refuse(name: str, must: str, value: Any, error: type[Exception]) -> Exception:
    """The error "`name` must be `must`; got `value`" of type `error` (returned, for the caller to raise)."""
    return error(f"{name} must be {must}; got {show(value)}")


def is_int(value: Any) -> bool:
    """Whether `value` is an integer, Python's or NumPy's, and not a bool."""
    return not is_bool(value) and isinstance(value, (int, np.integer))


def is_number(value: Any) -> bool:
    """Whether `value` is an integer or a float, Python's or NumPy's, and not a bool."""
    return not is_bool(value) and isinstance(value, (int, float, np.integer, np.floating))


def interval(kind: str, lo: Any, hi: Any, lo_open: bool = False, hi_open: bool = False, fmt: str = "") -> str:
    """`kind` with its bounds in words: "an integer in [1, 4096]", "a number > 0", "an integer >= 1" (an end
    that is None or infinite is no bound; `fmt` formats the ends, "g" for numbers)."""
    has_lo = lo is not None and lo != -math.inf
    has_hi = hi is not None and hi != math.inf
    if has_lo and has_hi:
        return f"{kind} in {'(' if lo_open else '['}{lo:{fmt}}, {hi:{fmt}}{')' if hi_open else ']'}"
    if has_lo:
        return f"{kind} {'>' if lo_open else '>='} {lo:{fmt}}"
    if has_hi:
        return f"{kind} {'<' if hi_open else '<='} {hi:{fmt}}"
    return kind


def check_bool(name: str, value: Any, *, error: type[Exception]) -> bool:
    """`value` as a bool: true or false only (1, "yes" and None are refused)."""
    if not is_bool(value):
        raise refuse(name, "true or false", value, error)
    return bool(value)


def check_int(
    name: str,
    value: Any,
    lo: int | None = None,
    hi: int | None = None,
    *,
    hi_open: bool = False,
    optional: bool = False,
    must: str | None = None,
    error: type[Exception],
) -> int | None:
    """`value` as an int in [lo, hi] (either end may be None; [lo, hi) with `hi_open`); None passes when
    `optional`.

    `must` words the accepted values in the message; by default the bounds do ("an integer in [1, 4096]").
    A float is refused even when whole (2.0), and so is a bool.
    """
    if value is None and optional:
        return None
    if must is None:
        must = interval("an integer", lo, hi, False, hi_open, "")
    if not is_int(value):
        raise refuse(name, must, value, error)
    v = int(value)
    if (lo is not None and v < lo) or (hi is not None and (v >= hi if hi_open else v > hi)):
        raise refuse(name, must, v, error)
    return v


def check_float(
    name: str,
    value: Any,
    lo: float | None = None,
    hi: float | None = None,
    *,
    lo_open: bool = False,
    hi_open: bool = False,
    optional: bool = False,
    must: str | None = None,
    error: type[Exception],
) -> float | None:
    """`value` as a finite float within `lo` and `hi` (either end may be None; each end closed unless
    `lo_open` / `hi_open`); None passes when `optional`. An integer is accepted (and returned as a float)
    unless it is beyond the float range.

    `must` words the accepted values in the message; by default the bounds do ("a number in (0, 1]", "a number
    > 0").
    """
    if value is None and optional:
        return None
    if must is None:
        must = interval("a number", lo, hi, lo_open, hi_open, "g")
    if not is_number(value):
        raise refuse(name, must, value, error)
    try:
        x = float(value)
    except OverflowError:  # an integer beyond the float range
        raise refuse(name, must, value, error) from None
    lo = -math.inf if lo is None else lo
    hi = math.inf if hi is None else hi
    ok = math.isfinite(x) and (x > lo if lo_open else x >= lo) and (x < hi if hi_open else x <= hi)
    if not ok:
        raise refuse(name, must, value, error)
    return x


def suggest(value: Any, valid: Iterable[Any]) -> str:
    """" (did you mean 'x'?)" where the string `value` is close to one of `valid`, else ""."""
    if not isinstance(value, str):
        return ""
    close = difflib.get_close_matches(value, [str(v) for v in valid], n=1, cutoff=0.7)
    return f" (did you mean {close[0]!r}?)" if close else ""


def is_among(value: Any, values: Iterable[Any]) -> bool:
    """Whether `value` equals one of `values` of its own kind: a bool matches only a bool (True == 1 in
    Python), a string only a string, and a value whose == gives no truth value (an array) matches none."""
    def same_kind(v: Any) -> bool:
        return is_bool(v) == is_bool(value) and isinstance(v, str) == isinstance(value, str)

    try:
        return any(same_kind(v) and bool(v == value) for v in values)
    except (TypeError, ValueError):
        return False


def check_choice(
    name: str,
    value: Any,
    values: Iterable[Any],
    *,
    optional: bool = False,
    must: str | None = None,
    error: type[Exception],
) -> Any:
    """`value`, one of `values` (`is_among`); None passes when `optional`. The message lists them ("one of
    'a', 'b', null") unless `must` words them, and names the closest one where a misspelt string is close to
    one."""
    values = tuple(values)
    if value is None and optional:
        return None
    if not is_among(value, values):
        if must is None:
            must = "one of " + ", ".join(repr(v) for v in values) + (", null" if optional else "")
        raise error(f"{name} must be {must}; got {show(value)}{suggest(value, values)}")
    return value
