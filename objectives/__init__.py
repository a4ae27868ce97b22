"""The black boxes qbatch optimizes, and the protocol for user objectives.

This package imports nothing from `orchestrator` or `workers` (ARCHITECTURE.md, "Rooms").
Heavy dependencies (torch for the CNN, gensim, gymnasium) load only when that objective is built.
"""

from objectives.base import EvalResult, Objective, ObjectiveError, Resources, SyntheticObjective
from objectives.registry import available_objectives, load_objective

__all__ = [
    "EvalResult",
    "Objective",
    "ObjectiveError",
    "Resources",
    "SyntheticObjective",
    "available_objectives",
    "load_objective",
]
