"""Marginal-likelihood fitting of the exact-GP surrogates that never stops a run.

BoTorch's `fit_gpytorch_mll` raises `ModelFittingError` when every L-BFGS attempt ends with an optimizer
warning or a non-PD matrix. Its retries restart from parameters sampled from the priors, so a model
without priors (the exact GP of papers 000-002, 004) retries from the same start, and a warm start
that sits in a degenerate basin (e.g. one ARD lengthscale collapsed to 1e-7 on noisy data: the kernel
turns into white noise) fails every time. One failed refit must not abort a BO run, so `fit_exact_mll`
goes down a chain and reports which step it took:

0. warm start (when given), BoTorch's default acceptance;
1. default hyperparameters (cold start), default acceptance;
2. cold start, one attempt whose optimizer warnings are accepted (scipy's ABNORMAL line-search exit
   usually stops next to an optimum);
3. the default hyperparameters unfitted, with a `RuntimeWarning`.
"""

from __future__ import annotations

import warnings
from typing import Callable

from botorch.exceptions.errors import ModelFittingError
from botorch.fit import fit_gpytorch_mll
from gpytorch.mlls import MarginalLogLikelihood

__all__ = ["fit_exact_mll", "FIT_STEPS"]

FIT_STEPS = ("warm", "cold", "cold-lenient", "unfitted")


def fit_exact_mll(build: Callable[[bool], MarginalLogLikelihood], warm: bool,
                  name: str = "exact GP") -> tuple[MarginalLogLikelihood, int]:
    """Fit an exact marginal likelihood down the fallback chain of the module docstring.

    Args:
        build: `build(warm)` returns a fresh mll over the model, warm-started from the previous
            hyperparameters when `warm` is true, at its default hyperparameters otherwise.
        warm: whether a warm start exists (step 0 is skipped otherwise).
        name: the model's name in the warning of step 3.

    Returns:
        The fitted mll (in eval mode) and the index of the step that produced it in `FIT_STEPS`.
    """
    lenient = {"max_attempts": 1, "warning_handler": lambda w: True}
    steps = [(0, True, {}), (1, False, {}), (2, False, lenient)][0 if warm else 1:]
    errors = []
    for step, warm_start, kwargs in steps:
        mll = build(warm_start)
        try:
            fit_gpytorch_mll(mll, **kwargs)
        except ModelFittingError as exc:
            errors.append(str(exc))
            continue
        return mll, step
    mll = build(False)
    warnings.warn(f"{name}: every marginal-likelihood fit failed ({'; '.join(errors)}); the default "
                  "hyperparameters are used until the next refit", RuntimeWarning, stacklevel=3)
    mll.eval()
    return mll, len(FIT_STEPS) - 1
