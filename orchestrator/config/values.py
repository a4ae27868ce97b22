"""The checks of the config table's values (README "Configuration"): each takes (dotted key, raw value) and
returns the normalized value or raises `ConfigError` naming the key and the accepted values.

Numbers, booleans, choices and free-form options go through `orchestrator.checks`; the checks of names, run
directories, component types and the search space's overrides are the config's own. Run names are single safe
path components and `run_dir` may hold no `..` component, so a config cannot write outside the folder it
names.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from orchestrator.checks import (
    check_bool,
    check_choice,
    check_float,
    check_int,
    plain_data,
    refuse,
    show,
    suggest,
)
from orchestrator.device import check_device
from orchestrator.errors import ConfigError, SpaceError
from orchestrator.threads import check_threads

#: most nodes a free-form `options` mapping may hold (guards against YAML alias bombs)
_MAX_NODES = 100_000

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
_IMPORT_PATH_RE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")
_SCHEME_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://(.*)$")

# Each check takes (dotted key, raw value) and returns the normalized value or raises ConfigError.
Check = Callable[[str, Any], Any]


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _fail(key: str, must: str, v: Any) -> ConfigError:
    return refuse(f"`{key}`", must, v)


def _int(lo: int, hi: int | None = None) -> Check:
    def check(key: str, v: Any) -> int:
        return check_int(f"`{key}`", v, lo, hi)

    return check


def _float(lo: float, hi: float, lo_open: bool, hi_open: bool) -> Check:
    def check(key: str, v: Any) -> float:
        return check_float(f"`{key}`", v, lo, hi, lo_open=lo_open, hi_open=hi_open)

    return check


def _optional(inner: Check, must_none: str = "null") -> Check:
    def check(key: str, v: Any) -> Any:
        return None if v is None else inner(key, v)

    return check


def _choice(values: tuple[Any, ...], allow_none: bool = False) -> Check:
    def check(key: str, v: Any) -> Any:
        return check_choice(f"`{key}`", v, values, optional=allow_none)

    return check


def _component(static: tuple[str, ...], module: str, attr: str) -> Check:
    """A type name: one of `static` (README "Configuration"), or any name registered in `module.attr`.

    The package registry is imported only when the name is not in `static`, so the common case stays light
    and parts added later by their authors (e.g. baseline proposers) are accepted without editing this table.
    """

    def check(key: str, v: Any) -> str:
        if isinstance(v, str) and v in static:
            return v
        names = list(static)
        try:
            import importlib

            registry = getattr(importlib.import_module(module), attr)
            names += [n for n in registry if n not in names]
        except Exception:  # noqa: BLE001 -- a registry that cannot load: only the static names are valid
            pass
        return check_choice(f"`{key}`", v, names)

    return check


def _bool(key: str, v: Any) -> bool:
    return check_bool(f"`{key}`", v)


def _device(key: str, v: Any) -> str:
    """The model stack's device: "cpu", "cuda", "cuda:N" or "auto" (orchestrator/device.py)."""
    return check_device(v, f"`{key}`")


def _threads(key: str, v: Any) -> str | int:
    """torch's intra-op threads of the model's fits and proposals: "auto" or an integer
    (orchestrator/threads.py)."""
    return check_threads(f"`{key}`", v)


def _refuse_plain(key: str, problem: str, v: Any) -> ConfigError:
    """The `plain_data` refusal of a config's free-form data."""
    if problem == "size":
        return ConfigError(f"`{key}` holds more than {_MAX_NODES} values; options must be small plain data")
    if problem == "key":
        return ConfigError(f"`{key}` keys must be strings; got {show(v)}")
    return ConfigError(
        f"`{key}` must be plain data (strings, numbers, booleans, null, lists, mappings); got a "
        f"{type(v).__name__}"
    )


def _plain(key: str, v: Any, budget: list[int]) -> Any:
    """Check that `v` is plain YAML data (what config.yaml and the event log can hold); return a copy."""
    return plain_data(v, key, _refuse_plain, budget=budget)


def _options(key: str, v: Any) -> Mapping[str, Any]:
    if v is None:
        v = {}
    if not isinstance(v, Mapping):
        raise _fail(key, "a mapping of option names to values", v)
    return MappingProxyType(_plain(key, v, [_MAX_NODES]))


def _name(key: str, v: Any) -> str:
    must = "a name of 1-100 letters, digits, '_', '.', '-' starting with a letter or digit (no '/', no '..')"
    if not isinstance(v, str) or not _NAME_RE.match(v):
        raise _fail(key, must, v)
    return v


def _objective_name(key: str, v: Any) -> str:
    from objectives.registry import BUILTIN_OBJECTIVES  # light: the registry imports no objective module

    if isinstance(v, str) and (v in BUILTIN_OBJECTIVES or _IMPORT_PATH_RE.match(v)):
        return v
    builtins = sorted(BUILTIN_OBJECTIVES)
    raise ConfigError(
        f"`{key}` must be a built-in objective ({', '.join(builtins)}) or a user objective "
        f"'package.module:name'; got {show(v)}{suggest(v, builtins)}"
    )


def check_run_dir(key: str, v: Any) -> str:
    """Validate a run directory: a local path or a filesystem URI with no `..` component.

    Raises:
        ConfigError: naming `key`.
    """
    must = "a local path or a filesystem URI (e.g. s3://bucket/runs/x) without '..' components"
    if not isinstance(v, str) or not v.strip() or any(c in v for c in "\x00\n\r"):
        raise _fail(key, must, v)
    m = _SCHEME_RE.match(v)
    path = m.group(2) if m else v
    parts = re.split(r"[/\\]", path)
    if ".." in parts or not path.strip("/\\ "):  # `s3://` alone names no folder
        raise _fail(key, must, v)
    return v


def _expand_home(run_dir: str) -> str:
    """A local run directory's leading `~` expanded as a shell would (it made a folder named `~`)."""
    return run_dir if _SCHEME_RE.match(run_dir) else os.path.expanduser(run_dir)


def _space(key: str, v: Any) -> Mapping[str, Any]:
    from orchestrator.space import REQUIRED_KEYS, SPEC_KEYS

    if v is None:
        v = {}
    if not isinstance(v, Mapping):
        raise _fail(key, "a mapping of parameter name to spec (e.g. {x: {type: float, low: 0, high: 1}})", v)
    out = {}
    for name, spec in v.items():
        if not isinstance(name, str) or not name:
            raise ConfigError(f"`{key}` parameter names must be non-empty strings; got {show(name)}")
        sub = f"{key}.{name}"
        if not isinstance(spec, Mapping):
            raise _fail(sub, "a parameter spec mapping (type, low, high, ... or choices)", spec)
        spec = _plain(sub, spec, [_MAX_NODES])
        kind = spec.get("type")
        required = REQUIRED_KEYS.get(kind) if isinstance(kind, str) else None
        if required is None or not required <= set(spec):
            # a partial override (the objective's spec fills the rest, `build_space`): its key names now
            known = frozenset().union(*SPEC_KEYS.values())
            unknown = set(spec) - known
            if unknown or (kind is not None and required is None):
                raise ConfigError(
                    f"`{sub}`: " + (f"unknown key(s) {sorted(unknown)}; allowed {sorted(known)}" if unknown
                                    else f"type must be one of {sorted(SPEC_KEYS)}; got {kind!r}"))
        else:
            _check_param_spec(sub, name, spec)
        out[name] = spec
    return MappingProxyType(out)


def _check_param_spec(key: str, name: str, spec: Mapping[str, Any]) -> None:
    """Raise `ConfigError` naming `key` if `spec` is not a complete, valid parameter spec."""
    from orchestrator.space import SearchSpace

    try:
        SearchSpace.from_description({name: spec})
    except SpaceError as exc:
        raise ConfigError(f"`{key}`: {_one_line(str(exc))}") from None
    except (TypeError, ValueError, OverflowError) as exc:  # e.g. comparisons of odd YAML values
        raise ConfigError(f"`{key}` is not a valid parameter spec: {_one_line(str(exc))}") from None
