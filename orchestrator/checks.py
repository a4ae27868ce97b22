"""Type and range checks of option values: one function per kind of value, each error naming the option and the
value it refused (STYLE.md §4.6, as Ray's `_common/ray_option_utils.py` checks task options).

Every message reads ``<name> must be <what>; got <value>``: `name` is the option as its owner writes it
("`batch_size`", "qgibbon.grid_size", "q"), `what` the accepted values (worded from the bounds unless the owner
words it), and the value is shown on one line, cut at 80 characters. A bool is not a number here (Python counts
True as 1), and NumPy scalars count as the Python values they hold; each check returns the Python value. The
error type is the owner's: `ConfigError` (the default) for config and model options, `InputDataError` for
arguments, `SpaceError` for parameter specs, `StoreError` for events. `plain_data` is the one walker of nested
plain data (config options and the event log's JSON fields).
"""

from __future__ import annotations

import difflib
import math
from typing import Any, Callable, Iterable, Mapping

import numpy as np

from objectives.base import is_bool
from orchestrator.errors import ConfigError

__all__ = [
    "check_bool", "check_choice", "check_float", "check_int", "is_bool", "is_int", "is_number", "plain_data",
    "refuse", "show", "suggest",
]

#: the longest shown value: a longer repr is cut, so a message stays one line
SHOW_CHARS = 80


def show(value: Any) -> str:
    """A short one-line repr of a refused value."""
    text = repr(value)
    return text if len(text) <= SHOW_CHARS else text[:SHOW_CHARS - 3] + "..."


def refuse(name: str, must: str, value: Any, error: type[Exception] = ConfigError) -> Exception:
    """The error "`name` must be `must`; got `value`" of type `error` (returned, for the caller to raise)."""
    return error(f"{name} must be {must}; got {show(value)}")


def is_int(value: Any) -> bool:
    """Whether `value` is an integer, Python's or NumPy's, and not a bool."""
    return not is_bool(value) and isinstance(value, (int, np.integer))


def is_number(value: Any) -> bool:
    """Whether `value` is an integer or a float, Python's or NumPy's, and not a bool."""
    return not is_bool(value) and isinstance(value, (int, float, np.integer, np.floating))


def _interval(kind: str, lo: Any, hi: Any, lo_open: bool, hi_open: bool, fmt: str) -> str:
    """`kind` with its bounds in words: "an integer in [1, 4096]", "a number > 0", "an integer >= 1"."""
    has_lo = lo is not None and lo != -math.inf
    has_hi = hi is not None and hi != math.inf
    if has_lo and has_hi:
        return f"{kind} in {'(' if lo_open else '['}{lo:{fmt}}, {hi:{fmt}}{')' if hi_open else ']'}"
    if has_lo:
        return f"{kind} {'>' if lo_open else '>='} {lo:{fmt}}"
    if has_hi:
        return f"{kind} {'<' if hi_open else '<='} {hi:{fmt}}"
    return kind


def check_bool(name: str, value: Any, *, error: type[Exception] = ConfigError) -> bool:
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
    error: type[Exception] = ConfigError,
) -> int | None:
    """`value` as an int in [lo, hi] (either end may be None; [lo, hi) with `hi_open`); None passes when `optional`.

    `must` words the accepted values in the message; by default the bounds do ("an integer in [1, 4096]").
    A float is refused even when whole (2.0), and so is a bool.
    """
    if value is None and optional:
        return None
    if must is None:
        must = _interval("an integer", lo, hi, False, hi_open, "")
    if not is_int(value):
        raise refuse(name, must, value, error)
    v = int(value)
    if (lo is not None and v < lo) or (hi is not None and (v >= hi if hi_open else v > hi)):
        raise refuse(name, must, v, error)
    return v


def check_float(
    name: str,
    value: Any,
    lo: float = -math.inf,
    hi: float = math.inf,
    *,
    lo_open: bool = False,
    hi_open: bool = False,
    optional: bool = False,
    must: str | None = None,
    error: type[Exception] = ConfigError,
) -> float | None:
    """`value` as a finite float within `lo` and `hi` (each end closed unless `lo_open` / `hi_open`); None passes
    when `optional`. An integer is accepted (and returned as a float) unless it is beyond the float range.

    `must` words the accepted values in the message; by default the bounds do ("a number in (0, 1]", "a number
    > 0").
    """
    if value is None and optional:
        return None
    if must is None:
        must = _interval("a number", lo, hi, lo_open, hi_open, "g")
    if not is_number(value):
        raise refuse(name, must, value, error)
    try:
        x = float(value)
    except OverflowError:  # an integer beyond the float range
        raise refuse(name, must, value, error) from None
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


def check_choice(
    name: str,
    value: Any,
    values: Iterable[Any],
    *,
    optional: bool = False,
    must: str | None = None,
    error: type[Exception] = ConfigError,
) -> Any:
    """`value`, a string among `values`; None passes when `optional`. The message lists them ("one of 'a', 'b',
    null") unless `must` words them, and names the closest one where a misspelt string is close to one."""
    values = tuple(values)
    if value is None and optional:
        return None
    if not isinstance(value, str) or value not in values:
        if must is None:
            must = "one of " + ", ".join(repr(v) for v in values) + (", null" if optional else "")
        raise error(f"{name} must be {must}; got {show(value)}{suggest(value, values)}")
    return value


#: a refusal of `plain_data`: (where, what is wrong, the value) -> the error to raise. What is wrong is one of
#: "size" (more values than the budget), "key" (a mapping key that is not a string; the value is the key) and
#: "type" (a value that is not plain data)
Refusal = Callable[[str, str, Any], Exception]


def _dotted(where: str, key: str) -> str:
    return f"{where}.{key}"


def plain_data(
    value: Any,
    where: str,
    refusal: Refusal,
    *,
    arrays: bool = False,
    child: Callable[[str, str], str] = _dotted,
    budget: list[int] | None = None,
) -> Any:
    """`value` as plain data (None, bool, str, int, float, and lists and string-keyed dicts of them): a copy with
    NumPy numbers and booleans as Python ones, tuples as lists and mappings as dicts.

    Args:
        value: the data.
        where: its name in messages; an item's is ``child(where, key)`` in a mapping, ``where[i]`` in a list.
        refusal: builds the error for what is not plain data (`Refusal`).
        arrays: also take NumPy scalars of any kind (`.item()`), NumPy arrays and torch tensors (`.tolist()`).
        child: the name of a mapping's item, by default ``where.key``.
        budget: a one-item list holding how many values may still be visited; each value takes one (a guard
            against YAML alias bombs). None: no limit.
    """
    if budget is not None:
        budget[0] -= 1
        if budget[0] < 0:
            raise refusal(where, "size", value)
    if value is None or isinstance(value, (bool, str, int, float)):
        return value
    if isinstance(value, (np.integer, np.floating, np.bool_)) or (arrays and isinstance(value, np.generic)):
        return value.item()
    if arrays and (isinstance(value, np.ndarray)
                   or (type(value).__module__.startswith("torch") and hasattr(value, "tolist"))):
        return value.tolist()
    if isinstance(value, Mapping):
        out = {}
        for k, item in value.items():
            if not isinstance(k, str):
                raise refusal(where, "key", k)
            out[k] = plain_data(item, child(where, k), refusal, arrays=arrays, child=child, budget=budget)
        return out
    if isinstance(value, (list, tuple)):
        return [plain_data(item, f"{where}[{i}]", refusal, arrays=arrays, child=child, budget=budget)
                for i, item in enumerate(value)]
    raise refusal(where, "type", value)
