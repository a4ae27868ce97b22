"""Checks of a calibrator's options: one option's value when the calibrator is built (`check_option`), and a
saved state's options against the calibrator it is restored into (`check_same_options`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from orchestrator.checks import is_number
from orchestrator.errors import ConfigError, QbatchError

__all__ = ["check_option", "check_same_options"]


def check_option(key: str, value: Any, ok: Callable[[float], bool], allow_inf: bool = False) -> float:
    """`calibrator.options.<key>` as a float: a number (not a bool, not a string; finite unless `allow_inf`)
    for which `ok` holds, else one `ConfigError` naming the key and the value. `ok` runs only on numbers, so
    a string never reaches a comparison."""
    if (not is_number(value) or math.isnan(value)
            or (math.isinf(value) and not allow_inf) or not ok(value)):
        raise ConfigError(f"`calibrator.options.{key}` is out of range; got {value!r}")
    return float(value)


def check_same_options(what: str, current: dict[str, Any], stored: dict[str, Any], keys: Sequence[str],
                       names: dict[str, str] | None = None) -> None:
    """`QbatchError` naming the option keys whose values differ between `current` and `stored` states (by
    their config names, `names`, where they differ from the state's keys)."""
    def same(a: Any, b: Any) -> bool:
        if torch.is_tensor(a) or torch.is_tensor(b):
            a, b = torch.as_tensor(a), torch.as_tensor(b)
            return a.shape == b.shape and bool(torch.equal(a.to(torch.float64), b.to(torch.float64)))
        return a == b

    differ = [k for k in keys if k in stored and not same(current[k], stored[k])]
    if differ:
        name = (names or {}).get
        raise QbatchError(f"{what}: the state was saved with other options {[name(k, k) for k in differ]} "
                          f"({', '.join(f'{name(k, k)}={stored[k]!r}' for k in differ)}); build it with "
                          f"those options to restore it")
