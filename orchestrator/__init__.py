"""qbatch's brain: search space, surrogates, proposers, calibrators, the central actor and the CLI.

`models`, `calibration` and `acquisition` are plain PyTorch/GPyTorch and never touch Ray;
only `actor.py` and `cli.py` do (ARCHITECTURE.md). Exports are lazy so that light commands
(`qbatch objectives`, `qbatch status`) do not pay for importing torch.
"""

from __future__ import annotations

import importlib
from typing import Any

from orchestrator.errors import ConfigError, InputDataError, QbatchError, SpaceError, UnsupportedError

_LAZY = {
    "ChoiceParam": "orchestrator.space",
    "FloatParam": "orchestrator.space",
    "IntParam": "orchestrator.space",
    "SearchSpace": "orchestrator.space",
    "AskTellOptimizer": "orchestrator.ask_tell",
    "Trial": "orchestrator.ask_tell",
    "TrialError": "orchestrator.ask_tell",
    "ExperimentConfig": "orchestrator.config",
    "load_config": "orchestrator.config",
    "run_experiment": "orchestrator.runner",
    "resume_experiment": "orchestrator.runner",
}

__all__ = ["ConfigError", "InputDataError", "QbatchError", "SpaceError", "UnsupportedError", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'orchestrator' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
