"""Loading a config: YAML text, a file or a mapping -> a validated `ExperimentConfig` (README
"Configuration").

The YAML is read by a SafeLoader that refuses duplicate keys and reads `1e-3` as a number; the mapping is
checked against the one table (orchestrator/config/schema.py), section by section, and an unknown key lists
the valid ones. A bad config raises `ConfigError` with one line that names the file and the dotted key, e.g.
"`batch_size` must be an integer in [1, 4096]; got 0". Validation imports no heavy module and happens before
Ray starts and before any run directory is created.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

import yaml

from orchestrator.checks import show, suggest
from orchestrator.config.experiment import (
    ComponentConfig,
    ExperimentConfig,
    FailureGuardConfig,
    ObjectiveConfig,
    ReevaluationConfig,
)
from orchestrator.config.schema import _MISSING, _SHORTHAND, _TABLE
from orchestrator.config.values import _one_line
from orchestrator.errors import ConfigError

#: largest config file or text read, in bytes: a config is a few kilobytes, and PyYAML parses tens of
#: megabytes for minutes before any key is checked
MAX_CONFIG_BYTES = 1_000_000


def _validate_section(table: Mapping[str, Any], raw: Any, prefix: str) -> dict[str, Any]:
    where = f"`{prefix}`" if prefix else "the config"
    if not isinstance(raw, Mapping):
        raise ConfigError(
            f"{where} must be a mapping with keys {', '.join(table)}; got {show(raw)}"
            if prefix
            else f"the config must be a YAML mapping of keys to values; got {type(raw).__name__}"
        )
    for k in raw:
        if k not in table:
            dotted = f"{prefix}.{k}" if prefix else str(k)
            level = f"in `{prefix}`" if prefix else "at the top level"
            hint = suggest(k, table)
            raise ConfigError(f"unknown key `{_one_line(dotted)}`{hint}; valid keys {level}: "
                              f"{', '.join(table)}")
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


def load_config_text(text: str, source: str = "<config>") -> ExperimentConfig:
    """Parse YAML `text` and validate it; errors are prefixed by `source`.

    Raises:
        ConfigError: one line: invalid YAML (with its line and column), an unknown key or a bad value.
    """
    if len(text) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{source}: the config is {len(text)} characters long; at most {MAX_CONFIG_BYTES} "
                          "are read (is this the right file?)")
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
        threads=v["threads"],
        device=v["device"],
        reevaluation=ReevaluationConfig(**v["reevaluation"]),
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
        raise ConfigError(f"{path}: the config file is over {MAX_CONFIG_BYTES} bytes; a config is a few "
                          "kilobytes (is this the right file?)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    return load_config_text(text, source=path)
