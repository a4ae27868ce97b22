"""Experiment config: YAML -> a frozen, validated `ExperimentConfig` (README "Configuration").

Every key is checked from ONE table (`_TABLE`: dotted key, check, default), as Ray checks task options
(STYLE.md §4.6). A bad config raises `ConfigError` with one line that names the dotted key and the
accepted values or range, e.g. "`batch_size` must be an integer in [1, 4096]; got 0"; an unknown key lists
the valid ones. Validation imports no heavy module and happens before Ray starts and before any run
directory is created. Run names are single safe path components and `run_dir` may hold no `..` component,
so a config cannot write outside the folder it names.
"""

from __future__ import annotations

import datetime as _dt
import difflib
import math
import os
import re
import time
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Mapping

import numpy as np
import yaml

from orchestrator.errors import ConfigError, SpaceError
from orchestrator.recommend import DEFAULT_RULE, RULES
from workers.records import MAX_TIMEOUT_S

__all__ = [
    "CALIBRATOR_TYPES",
    "ComponentConfig",
    "ConfigError",
    "ExperimentConfig",
    "FailureGuardConfig",
    "MODEL_TYPES",
    "ObjectiveConfig",
    "PROPOSER_TYPES",
    "check_run_dir",
    "load_config",
    "load_config_text",
]

MODEL_TYPES = ("quantile", "expectile", "heteroscedastic", "exact-gp", "gpr-replicates")
PROPOSER_TYPES = ("thompson", "qgibbon", "sobol", "random", "qlognei", "gpr-ei", "calibrated")
CALIBRATOR_TYPES = ("none", "online", "online-interval", "offline-cv", "locbo", "conformal")
DIRECTIONS = ("maximize", "minimize")
MAX_BATCH = 4096
MAX_SEED = 2**32 - 1
#: most nodes a free-form `options` mapping may hold (guards against YAML alias bombs)
_MAX_NODES = 100_000
#: largest config file or text read, in bytes: a config is a few kilobytes, and PyYAML parses tens of
#: megabytes for minutes before any key is checked
MAX_CONFIG_BYTES = 1_000_000

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
_IMPORT_PATH_RE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")
_SCHEME_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://(.*)$")
_MISSING = object()


def _show(v: Any) -> str:
    """A short one-line repr of a bad value."""
    text = repr(v)
    return text if len(text) <= 80 else text[:77] + "..."


def _fail(key: str, must: str, v: Any) -> ConfigError:
    return ConfigError(f"`{key}` must be {must}; got {_show(v)}")


# ---------------------------------------------------------------------------------------- checks
# Each check takes (dotted key, raw value) and returns the normalized value or raises ConfigError.
Check = Callable[[str, Any], Any]


def _int(lo: int, hi: int | None = None) -> Check:
    must = f"an integer in [{lo}, {hi}]" if hi is not None else f"an integer >= {lo}"

    def check(key: str, v: Any) -> int:
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
            raise _fail(key, must, v)
        v = int(v)
        if v < lo or (hi is not None and v > hi):
            raise _fail(key, must, v)
        return v

    return check


def _float(lo: float, hi: float, lo_open: bool, hi_open: bool) -> Check:
    left, right = "(" if lo_open else "[", ")" if hi_open else "]"
    must = f"a number in {left}{lo:g}, {hi:g}{right}" if math.isfinite(hi) else f"a number {'>' if lo_open else '>='} {lo:g}"

    def check(key: str, v: Any) -> float:
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
            raise _fail(key, must, v)
        try:
            x = float(v)
        except OverflowError:  # an integer beyond the float range
            raise _fail(key, must, v) from None
        ok = math.isfinite(x) and (x > lo if lo_open else x >= lo) and (x < hi if hi_open else x <= hi)
        if not ok:
            raise _fail(key, must, v)
        return x

    return check


def _optional(inner: Check, must_none: str = "null") -> Check:
    def check(key: str, v: Any) -> Any:
        return None if v is None else inner(key, v)

    return check


def _choice(values: tuple[Any, ...], allow_none: bool = False) -> Check:
    shown = ", ".join(repr(v) for v in values) + (", null" if allow_none else "")
    must = f"one of {shown}"

    def check(key: str, v: Any) -> Any:
        if v is None and allow_none:
            return None
        if not isinstance(v, str) or v not in values:
            hint = _suggest(v, values)
            raise ConfigError(f"`{key}` must be {must}; got {_show(v)}{hint}")
        return v

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
        if isinstance(v, str) and v in names:
            return v
        raise ConfigError(
            f"`{key}` must be one of {', '.join(repr(n) for n in names)}; got {_show(v)}{_suggest(v, names)}"
        )

    return check


def _bool(key: str, v: Any) -> bool:
    if not isinstance(v, (bool, np.bool_)):
        raise _fail(key, "true or false", v)
    return bool(v)


def _plain(key: str, v: Any, budget: list[int]) -> Any:
    """Check that `v` is plain YAML data (what config.yaml and the event log can hold); return a copy."""
    budget[0] -= 1
    if budget[0] < 0:
        raise ConfigError(f"`{key}` holds more than {_MAX_NODES} values; options must be small plain data")
    if v is None or isinstance(v, (bool, str, int)):
        return v
    if isinstance(v, float):
        return v
    if isinstance(v, (np.integer, np.floating, np.bool_)):
        return v.item()
    if isinstance(v, Mapping):
        out = {}
        for k, item in v.items():
            if not isinstance(k, str):
                raise ConfigError(f"`{key}` keys must be strings; got {_show(k)}")
            out[k] = _plain(f"{key}.{k}", item, budget)
        return out
    if isinstance(v, (list, tuple)):
        return [_plain(f"{key}[{i}]", item, budget) for i, item in enumerate(v)]
    raise ConfigError(
        f"`{key}` must be plain data (strings, numbers, booleans, null, lists, mappings); got a {type(v).__name__}"
    )


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
        f"'package.module:name'; got {_show(v)}{_suggest(v, builtins)}"
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
            raise ConfigError(f"`{key}` parameter names must be non-empty strings; got {_show(name)}")
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


# ---------------------------------------------------------------------------------------- the table
@dataclass(frozen=True)
class _Key:
    check: Check
    default: Any = _MISSING  # _MISSING = required


_Section = dict  # name -> _Key | nested section (dict)

_TABLE: dict[str, Any] = {
    "name": _Key(_optional(_name), None),
    "objective": {
        "name": _Key(_objective_name),
        "options": _Key(_options, {}),
    },
    "space": _Key(_space, {}),
    "direction": _Key(_choice(DIRECTIONS, allow_none=True), None),
    "tau": _Key(_float(0.0, 1.0, True, True), 0.5),
    "model": {
        "type": _Key(_component(MODEL_TYPES, "orchestrator.models", "MODELS"), "quantile"),
        "options": _Key(_options, {}),
    },
    "proposer": {
        "type": _Key(_component(PROPOSER_TYPES, "orchestrator.acquisition", "PROPOSERS"), "thompson"),
        "options": _Key(_options, {}),
    },
    "calibrator": {
        "type": _Key(_component(CALIBRATOR_TYPES, "orchestrator.calibration", "CALIBRATORS"), "none"),
        "options": _Key(_options, {}),
    },
    "batch_size": _Key(_int(1, MAX_BATCH), 100),
    "initial_design": _Key(_int(1, 1_000_000), 20),
    "budget": _Key(_int(1, 100_000_000), 200),
    "max_concurrent": _Key(_optional(_int(1, 1_000_000)), None),
    "synchronous": _Key(_bool, False),
    "timeout_s": _Key(_float(0.0, MAX_TIMEOUT_S, True, False), 600.0),
    "max_retries": _Key(_int(0, 100), 1),
    "failure_guard": {
        "max_failure_rate": _Key(_float(0.0, 1.0, True, False), 0.5),
        "min_trials": _Key(_int(1, 100_000_000), 10),
    },
    "seed": _Key(_int(0, MAX_SEED), 0),
    "recommendation": _Key(_choice(tuple(RULES)), DEFAULT_RULE),
    "run_dir": _Key(_optional(check_run_dir), None),
}
#: sections that may be given as a bare string: `model: expectile` means `model: {type: expectile}`
_SHORTHAND = {"objective": "name", "model": "type", "proposer": "type", "calibrator": "type"}


def _suggest(v: Any, valid: Any) -> str:
    if not isinstance(v, str):
        return ""
    close = difflib.get_close_matches(v, [str(x) for x in valid], n=1, cutoff=0.7)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _validate_section(table: Mapping[str, Any], raw: Any, prefix: str) -> dict[str, Any]:
    where = f"`{prefix}`" if prefix else "the config"
    if not isinstance(raw, Mapping):
        raise ConfigError(
            f"{where} must be a mapping with keys {', '.join(table)}; got {_show(raw)}"
            if prefix
            else f"the config must be a YAML mapping of keys to values; got {type(raw).__name__}"
        )
    for k in raw:
        if k not in table:
            dotted = f"{prefix}.{k}" if prefix else str(k)
            level = f"in `{prefix}`" if prefix else "at the top level"
            hint = _suggest(k, table)
            raise ConfigError(f"unknown key `{_one_line(dotted)}`{hint}; valid keys {level}: {', '.join(table)}")
    out: dict[str, Any] = {}
    for k, spec in table.items():
        dotted = f"{prefix}.{k}" if prefix else k
        if isinstance(spec, dict):
            value = raw.get(k, {})
            if value is None:
                value = {}
            if isinstance(value, str) and k in _SHORTHAND:
                value = {_SHORTHAND[k]: value}
            out[k] = _validate_section(spec, value, dotted)
        elif k in raw:
            out[k] = spec.check(dotted, raw[k])
        elif spec.default is _MISSING:
            raise ConfigError(f"`{dotted}` is required")
        else:
            out[k] = spec.check(dotted, spec.default)
    return out


# ---------------------------------------------------------------------------------------- dataclasses
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
class ExperimentConfig:
    """A validated experiment (README "Configuration"). Build it with `load_config`; `to_dict()` round-trips."""

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
            # the default rule is left out, so a saved config.yaml keeps ARCHITECTURE.md's key set
            | ({} if self.recommendation == DEFAULT_RULE else {"recommendation": self.recommendation})
        )

    def resolve_run_dir(self, override: str | None = None, now: float | None = None) -> str:
        """The run directory: `override` (e.g. ``--run-dir``), else `run_dir`, else ``runs/<name>-<timestamp>``.

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

    def build_space(self, objective_space: Mapping[str, Mapping[str, Any]]) -> "Any":
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
                new = {**old, **new}  # an override of the same type keeps what it does not restate (log, step)
            _check_param_spec(key, name, new)
            _check_narrowing(key, new, old)
            merged[name] = new
        def build(description: dict[str, Any], where: str) -> Any:
            try:
                space = SearchSpace.from_description(description)
                check_loggable(space)  # a run reads its space back from config.yaml and its params from the log
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
        extra = [c for c in new.get("choices", []) if not is_choice(c, old["choices"])] if new_type == "choice" else None
        if new_type != "choice" or extra:
            raise ConfigError(f"`{key}` must be a choice among a subset of {list(old['choices'])}; got {_show(new)}")
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
            raise ConfigError(f"`{key}` must stay within the objective's range: {kind} in [{lo}, {hi}]; got {_show(new)}")
    if old_type == "int" and new_type == "float":
        raise ConfigError(f"`{key}` must be an int or choice parameter (the objective's is an integer); got {_show(new)}")
    step = old.get("step", 1)
    if old_type == "int" and step != 1:  # the objective accepts only its own grid: every value must be on it
        off_grid = [v for v in values if (round(float(v)) - lo) % step]
        new_step = new.get("step", 1) if new_type == "int" else step
        if off_grid or (isinstance(new_step, int) and not isinstance(new_step, bool) and new_step % step):
            raise ConfigError(f"`{key}` must stay on the objective's grid {lo}:{hi}:{step} (values on it, a step "
                              f"that is a multiple of {step}); got {_show(new)}")


def _to_plain(v: Any) -> Any:
    if isinstance(v, Mapping):
        return {k: _to_plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_to_plain(x) for x in v]
    return v


# ---------------------------------------------------------------------------------------- loading
class _UniqueKeyLoader(yaml.SafeLoader):
    """A SafeLoader that refuses duplicate keys instead of silently keeping the last one."""


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base`: merged below, its keys may be overridden
            continue
        key = loader.construct_object(key_node, deep=True)
        try:
            dup = key in seen
            seen.add(key)
        except TypeError:  # an unhashable key: let the default constructor report it
            continue
        if dup:
            raise ConfigError(f"duplicate key `{_one_line(str(key))}` at line {key_node.start_mark.line + 1}")
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
# YAML 1.1 (PyYAML) reads `1e-3`, `2E5` and `1.5e3` as strings: it wants a dot and a signed exponent in a
# float. Read them as YAML 1.2 and JSON do, so `lr: 1e-3` is a number (the resolver is added to this loader
# only, not to yaml.SafeLoader); PyYAML's own forms (`1.5e+3`, `.5`) resolve before this one.
_UniqueKeyLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9][0-9_]*)[eE][-+]?[0-9]+$"),
    list("-+.0123456789"),
)
#: an exponent form without a decimal point and with a non-negative exponent (`1e3`, `2E5`) is a whole
#: number as written, read as an int, so `budget: 1e3` is 1000; `1e-3` and `1.5e3` stay floats
_WHOLE_EXPONENT_RE = re.compile(r"^[-+]?[0-9][0-9_]*[eE]\+?[0-9]{1,2}$")


def _construct_float(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> Any:
    text = loader.construct_scalar(node)
    if isinstance(text, str) and _WHOLE_EXPONENT_RE.match(text):
        mantissa, _, exponent = text.replace("_", "").lower().partition("e")
        return int(mantissa) * 10 ** int(exponent)
    return yaml.SafeLoader.construct_yaml_float(loader, node)


_UniqueKeyLoader.add_constructor("tag:yaml.org,2002:float", _construct_float)


def load_config_text(text: str, source: str = "<config>") -> "ExperimentConfig":
    """Parse YAML `text` and validate it; errors are prefixed by `source`.

    Raises:
        ConfigError: one line: invalid YAML (with its line and column), an unknown key or a bad value.
    """
    if len(text) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{source}: the config is {len(text)} characters long; at most {MAX_CONFIG_BYTES} are read "
                          "(is this the right file?)")
    try:
        raw = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 -- a SafeLoader subclass
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = _one_line(exc.problem or exc.context or "unparsable")
        if exc.context and exc.context_mark is not None and exc.context_mark is not mark:
            ctx = exc.context_mark
            problem += f" ({_one_line(exc.context)} at line {ctx.line + 1}, column {ctx.column + 1})"
        raise ConfigError(f"{source}: invalid YAML{where}: {problem}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: invalid YAML: {_one_line(str(exc))[:200]}") from None
    except RecursionError:
        raise ConfigError(f"{source}: invalid YAML: nested too deeply") from None
    if raw is None:
        raise ConfigError(f"{source}: the config is empty; it needs at least `objective.name`")
    return _load_mapping(raw, source)


def _load_mapping(raw: Any, source: str | None) -> ExperimentConfig:
    try:
        v = _validate_section(_TABLE, raw, "")
        if "initial_design" not in raw:  # the default design never exceeds a small budget
            v["initial_design"] = min(v["initial_design"], v["budget"])
        if v["initial_design"] > v["budget"]:
            raise ConfigError(
                f"`initial_design` must be <= `budget` ({v['budget']}); got {v['initial_design']}"
            )
    except ConfigError as exc:
        msg = _one_line(str(exc))
        raise ConfigError(f"{source}: {msg}" if source else msg) from None
    except RecursionError:
        raise ConfigError(f"{source + ': ' if source else ''}the config is nested too deeply") from None
    name = v["name"]
    if name is None:  # from the objective, made to pass `_name` (a saved config is loaded again on resume)
        name = re.sub(r"[^A-Za-z0-9_.-]", "-", v["objective"]["name"]).lstrip("._-")[:100] or "run"
    return ExperimentConfig(
        name=name,
        objective=ObjectiveConfig(**v["objective"]),
        space=v["space"],
        direction=v["direction"],
        tau=v["tau"],
        model=ComponentConfig(**v["model"]),
        proposer=ComponentConfig(**v["proposer"]),
        calibrator=ComponentConfig(**v["calibrator"]),
        batch_size=v["batch_size"],
        initial_design=v["initial_design"],
        budget=v["budget"],
        max_concurrent=v["max_concurrent"],
        synchronous=v["synchronous"],
        timeout_s=v["timeout_s"],
        max_retries=v["max_retries"],
        failure_guard=FailureGuardConfig(**v["failure_guard"]),
        seed=v["seed"],
        run_dir=v["run_dir"],
        recommendation=v["recommendation"],
    )


def load_config(source: str | os.PathLike | Mapping[str, Any] | ExperimentConfig) -> ExperimentConfig:
    """Load and validate a config from a YAML file path, a dict, or return an `ExperimentConfig` unchanged.

    Raises:
        ConfigError: one line naming the file (if any) and the dotted key that is wrong.
    """
    if isinstance(source, ExperimentConfig):
        return source
    if isinstance(source, Mapping):
        return _load_mapping(source, None)
    if not isinstance(source, (str, os.PathLike)):
        raise ConfigError(f"a config is a YAML file path or a mapping; got {type(source).__name__}")
    path = os.fspath(source)
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except IsADirectoryError:
        raise ConfigError(f"config path is a folder, not a YAML file: {path}") from None
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror or exc}") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: the config file is over {MAX_CONFIG_BYTES} bytes; a config is a few kilobytes "
                          "(is this the right file?)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    return load_config_text(text, source=path)
