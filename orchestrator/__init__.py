"""qbatch's brain: search space, surrogates, proposers, calibrators, the central actor and the CLI.

`models`, `calibration` and `acquisition` are plain PyTorch/GPyTorch and never touch Ray;
only `actor.py` and `cli.py` do (ARCHITECTURE.md).
"""

from orchestrator.errors import ConfigError, InputDataError, QbatchError, SpaceError, UnsupportedError
from orchestrator.space import ChoiceParam, FloatParam, IntParam, SearchSpace

__all__ = [
    "ChoiceParam",
    "ConfigError",
    "FloatParam",
    "InputDataError",
    "IntParam",
    "QbatchError",
    "SearchSpace",
    "SpaceError",
    "UnsupportedError",
]
