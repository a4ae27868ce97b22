"""qbatch's option checks: those of `objectives.checks` (the one checker) raising `ConfigError` unless the
caller names another error type, and `plain_data`, the one walker of nested plain data (config options and the
event log's JSON fields).

Every message reads ``<name> must be <what>; got <value>``: `name` is the option as its owner writes it
("`batch_size`", "qgibbon.grid_size", "q"), `what` the accepted values (worded from the bounds unless the
owner words it), and the value is shown on one line, cut at 80 characters (`objectives.checks`). The error
type is the owner's: `ConfigError` (the default) for config and model options, `InputDataError` for arguments,
`SpaceError` for parameter specs, `StoreError` for events.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import numpy as np

from objectives import checks as _checks
from objectives.checks import is_bool, is_int, is_number, show, suggest
from orchestrator.errors import ConfigError

__all__ = [
    "check_bool", "check_choice", "check_float", "check_int", "is_bool", "is_int", "is_number", "plain_data",
    "refuse", "show", "suggest",
]

_Check = TypeVar("_Check", bound=Callable[..., Any])


def _config_error_by_default(check: _Check) -> _Check:
    """`check` of `objectives.checks` raising `ConfigError` where the caller gives no `error`."""
    @functools.wraps(check)
    def bound(*args: Any, error: type[Exception] = ConfigError, **kwargs: Any) -> Any:
        return check(*args, error=error, **kwargs)

    return bound  # type: ignore[return-value]


check_bool = _config_error_by_default(_checks.check_bool)
check_int = _config_error_by_default(_checks.check_int)
check_float = _config_error_by_default(_checks.check_float)
check_choice = _config_error_by_default(_checks.check_choice)


def refuse(name: str, must: str, value: Any, error: type[Exception] = ConfigError) -> Exception:
    """The error "`name` must be `must`; got `value`" of type `error` (returned, for the caller to raise)."""
    return _checks.refuse(name, must, value, error)


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
    """`value` as plain data (None, bool, str, int, float, and lists and string-keyed dicts of them): a copy
    with NumPy numbers and booleans as Python ones, tuples as lists and mappings as dicts.

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
