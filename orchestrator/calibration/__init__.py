"""Calibrators of the predictive distribution: online (paper 000), offline CV (paper 001), LOCBO (paper 002),
conformal sets (paper 004); specs calibrated-bo.md, locbo.md, conformal-bo.md.

`build_calibrator(name, **options)` maps a config's `calibrator.type` to a calibrator; `attach(calibrator,
proposer)` wires it into a proposer. Common options of every calibrator but `none` (the spread factor of
the SVGP proposers, spread.py): `spread` ("global", "local" or "off"), `spread_coverage`, `spread_eta`,
`spread_lengthscale`, `spread_decay`, `spread_lambda_reg`, `spread_min`, `spread_max`.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from orchestrator.calibration.base import CalibratedForecast, Calibrator, IdentityCalibrator
from orchestrator.calibration.metrics import (
    calibration_score,
    calibration_summary,
    interval_coverage,
    pit_histogram,
    pit_values,
    running_coverage,
)
from orchestrator.calibration.online import OnlineIntervalCalibrator, OnlineQuantileRecalibrator
from orchestrator.calibration.spread import SPREAD_KEYS, SPREAD_MAX, SPREAD_MIN, SpreadTracker, attach
from orchestrator.errors import ConfigError

__all__ = [
    "CALIBRATORS", "CalibratedForecast", "Calibrator", "IdentityCalibrator", "OnlineIntervalCalibrator",
    "OnlineQuantileRecalibrator", "SPREAD_MAX", "SPREAD_MIN", "SpreadTracker", "attach", "build_calibrator",
    "calibration_score", "calibration_summary", "interval_coverage", "pit_histogram", "pit_values",
    "running_coverage"
]

#: config name -> ("module:class", default spread mode)
CALIBRATORS: dict[str, tuple[str, str]] = {
    "none": ("orchestrator.calibration.base:IdentityCalibrator", "off"),
    "online": ("orchestrator.calibration.online:OnlineQuantileRecalibrator", "global"),
    "online-interval": ("orchestrator.calibration.online:OnlineIntervalCalibrator", "global"),
    "offline-cv": ("orchestrator.calibration.offline_cv:OfflineCVCalibrator", "global"),
    "locbo": ("orchestrator.calibration.locbo:LOCBOCalibrator", "local"),
    "conformal": ("orchestrator.calibration.conformal:ConformalCalibrator", "global"),
}


def build_calibrator(name: str, **options: Any) -> Calibrator:
    """Instantiate the calibrator registered as `name` with keyword `options`.

    Raises:
        ConfigError: unknown name (listing the valid ones) or a bad option (naming it).
    """
    if name not in CALIBRATORS:
        raise ConfigError(f"`calibrator.type` must be one of {sorted(CALIBRATORS)}; got {name!r}")
    target, default_mode = CALIBRATORS[name]
    module_name, _, attr = target.partition(":")
    cls = getattr(importlib.import_module(module_name), attr)
    opts = dict(options)
    if name == "none":
        if opts:
            raise ConfigError(f"`calibrator.options` must be empty for type 'none'; got keys {sorted(opts)}")
        return cls()
    mode = opts.pop("spread", default_mode)
    spread_kw = {v: opts.pop(k) for k, v in SPREAD_KEYS.items() if k in opts}
    if mode == "off":
        if spread_kw:
            raise ConfigError(f"`calibrator.options` {sorted(spread_kw)} need `spread` other than 'off'")
        tracker = None
    else:
        tracker = SpreadTracker(mode=mode, **spread_kw)
    valid = [p for p in inspect.signature(cls.__init__).parameters if p not in ("self", "spread")]
    unknown = sorted(set(opts) - set(valid))
    if unknown:
        raise ConfigError(
            f"unknown `calibrator.options` {unknown} for type {name!r}; valid: "
            f"{sorted(valid + ['spread'] + list(SPREAD_KEYS))}"
        )
    cal = cls(spread=tracker, **opts)
    # what the config set, so `attach` can refuse options the chosen proposer would never read
    cal.given_options = tuple(sorted(opts))
    cal.given_spread_options = tuple(sorted(k for k in options if k in SPREAD_KEYS
                                            or k == "spread" and options[k] != "off"))
    return cal
