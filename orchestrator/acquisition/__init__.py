"""Batch proposers: Thompson sampling, Q-GIBBON, and calibrated analytic acquisitions.

`build_proposer(name, **options)` maps a config's `proposer.type` to a class, importing it only
when chosen (like Ray Tune's `tune/search/__init__.py`); an unknown name lists the valid ones.
"""

from __future__ import annotations

import importlib
from typing import Any

from orchestrator.acquisition.base import DUPLICATE_TOL, Proposer
from orchestrator.errors import ConfigError

__all__ = ["DUPLICATE_TOL", "PROPOSERS", "Proposer", "build_proposer"]

#: config name -> "module:class"
PROPOSERS: dict[str, str] = {
    "thompson": "orchestrator.acquisition.thompson:ThompsonSampling",
    "qgibbon": "orchestrator.acquisition.qgibbon:QGibbon",
    "sobol": "orchestrator.acquisition.baselines:SobolProposer",
    "random": "orchestrator.acquisition.baselines:RandomProposer",
    "qlognei": "orchestrator.acquisition.baselines:LogNEIProposer",
    "gpr-ei": "orchestrator.acquisition.baselines:ReplicatedEIProposer",
    "calibrated": "orchestrator.acquisition.calibrated:AcquisitionProposer",
}


def build_proposer(name: str, **options: Any) -> Proposer:
    """Instantiate the proposer registered as `name` with keyword `options`."""
    if name not in PROPOSERS:
        raise ConfigError(f"`proposer.type` must be one of {sorted(PROPOSERS)}; got {name!r}")
    module_name, _, attr = PROPOSERS[name].partition(":")
    cls = getattr(importlib.import_module(module_name), attr)
    hooks = sorted({"spread", "calibrator"} & set(options))
    # `attach` sets them from the calibrator; given here they would be ignored or break the proposer
    if hooks:
        raise ConfigError(f"`proposer.options` {hooks} are set by the `calibrator` section, not here")
    try:
        return cls(**options)
    except TypeError as exc:
        from orchestrator.models import valid_options_note

        note = valid_options_note(cls, exclude=("spread", "calibrator"))  # set by `attach`, not options
        raise ConfigError(f"bad `proposer.options` for {name!r}: {exc}{note}") from None
