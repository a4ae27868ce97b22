"""Typed errors of qbatch: every message names the key or value that was wrong.

All qbatch errors derive from `QbatchError` (STYLE.md §4.6), so callers can catch one type.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "QbatchError",
    "ConfigError",
    "SpaceError",
    "InputDataError",
    "UnsupportedError",
    "UsageError",
    "ModelFitError",
    "ModelWarning",
    "FitInterrupted",
    "describe_nonfinite",
]


class QbatchError(Exception):
    """Base class of every error qbatch raises on purpose."""


class ConfigError(QbatchError, ValueError):
    """A config key is unknown or its value is out of range. The message names the key."""


class SpaceError(QbatchError, ValueError):
    """A search space is malformed, or a point does not belong to it."""


class InputDataError(QbatchError, ValueError):
    """Observations handed to a model or proposer are malformed (NaN, inf, wrong shape, out of bounds)."""


class UnsupportedError(QbatchError, NotImplementedError):
    """A combination of options that qbatch does not support."""


class UsageError(QbatchError):
    """A request that cannot be carried out as given, refused before anything starts (a run directory that is
    missing, busy or not new; an address where no cluster answers). The CLI exits 2 on it."""


class ModelFitError(QbatchError, RuntimeError):
    """A model fit ended in a posterior that is not finite (e.g. outcomes too large for float64 arithmetic);
    the fit is not used and the previous model stays in place."""


class FitInterrupted(QbatchError):
    """A model fit stopped before its end because the event it was given was set (`AskTellOptimizer.fit`'s
    `stop`): no model was fitted, and the one in use stays."""


class ModelWarning(UserWarning):
    """A fitted model that is valid but probably useless (e.g. it learned no lengthscale from the data); the
    message says which option to change. Filter it with `warnings.simplefilter("ignore", ModelWarning)`."""


def describe_nonfinite(t: Any) -> str | None:
    """For an error message: None when every entry of the tensor `t` is finite, else "k of n entries, the
    first at flat index i (value)"."""
    import torch

    bad = ~torch.isfinite(t)
    if not bad.any():
        return None
    i = int(bad.reshape(-1).nonzero()[0])
    return f"{int(bad.sum())} of {t.numel()} entries, the first at flat index {i} ({t.reshape(-1)[i].item()})"
