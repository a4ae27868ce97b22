"""The config's one table (README "Configuration"): every key with its check and its default, as Ray checks
task options (STYLE.md §4.6), and the names and bounds the checks accept.

A key's value is checked by its `_Key.check` (orchestrator/config/values.py); a nested dict is a section
(`objective`, `model`, ...), which `_SHORTHAND` lets a config give as a bare string.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from orchestrator.config.values import (
    Check,
    _bool,
    _choice,
    _component,
    _device,
    _float,
    _int,
    _name,
    _objective_name,
    _optional,
    _options,
    _space,
    _threads,
    check_run_dir,
)
from orchestrator.device import DEFAULT_DEVICE
from orchestrator.recommend import DEFAULT_RULE, RULES
from workers.records import MAX_TIMEOUT_S

MODEL_TYPES = ("quantile", "expectile", "heteroscedastic", "exact-gp", "gpr-replicates")
PROPOSER_TYPES = ("thompson", "qgibbon", "sobol", "random", "qlognei", "gpr-ei", "calibrated")
CALIBRATOR_TYPES = ("none", "online", "online-interval", "offline-cv", "locbo", "conformal")
DIRECTIONS = ("maximize", "minimize")
MAX_BATCH = 4096
MAX_SEED = 2**32 - 1
_MISSING = object()


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
    "threads": _Key(_threads, "auto"),
    "device": _Key(_device, DEFAULT_DEVICE),
    "reevaluation": {
        "fraction": _Key(_float(0.0, 1.0, False, True), 0.1),
        "repeats": _Key(_int(1, 100), 1),
    },
    "run_dir": _Key(_optional(check_run_dir), None),
}
#: sections that may be given as a bare string: `model: expectile` means `model: {type: expectile}`
_SHORTHAND = {"objective": "name", "model": "type", "proposer": "type", "calibrator": "type"}
