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

Each L-BFGS-B run goes to scipy's convergence test unless `maxiter` caps it (BoTorch's default: no cap below
scipy's 15,000). The fit reports its iterations, summed over every attempt of the chain. On the laser
benchmark's exact-ts run 7, refits on 1,200 and 1,300 16-D points took 422 s and 400 s, each ONE attempt
without a warning: a slow refit is a long optimization, not a retry (warm refits of 500-1,200 of that run's
points took 99-532 iterations, 14-64 s, on a busy machine).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

from botorch.exceptions.errors import ModelFittingError
from botorch.fit import fit_gpytorch_mll
from gpytorch.mlls import MarginalLogLikelihood

from orchestrator.checks import check_int

__all__ = ["fit_exact_mll", "check_fit_maxiter", "ExactFit", "FIT_STEPS"]

FIT_STEPS = ("warm", "cold", "cold-lenient", "unfitted")


class ExactFit(NamedTuple):
    """What `fit_exact_mll` returns: the fitted mll, its step in `FIT_STEPS` and the L-BFGS-B iterations of
    every attempt together."""

    mll: MarginalLogLikelihood
    step: int
    iterations: int


def check_fit_maxiter(value: Any) -> int | None:
    """The model option `fit_maxiter`: None (scipy's convergence test decides) or an integer >= 1."""
    return check_int("`fit_maxiter`", value, 1, optional=True, must="an integer >= 1 or null (no cap)")


def fit_exact_mll(build: Callable[[bool], MarginalLogLikelihood], warm: bool,
                  name: str = "exact GP", maxiter: int | None = None) -> ExactFit:
    """Fit an exact marginal likelihood down the fallback chain of the module docstring.

    Args:
        build: `build(warm)` returns a fresh mll over the model, warm-started from the previous
            hyperparameters when `warm` is true, at its default hyperparameters otherwise.
        warm: whether a warm start exists (step 0 is skipped otherwise).
        name: the model's name in the warning of step 3.
        maxiter: cap on each L-BFGS-B attempt's iterations (None: scipy's convergence test alone). An
            attempt stopped by the cap counts as a success, as BoTorch counts it.

    Returns:
        `ExactFit`: the fitted mll (in eval mode), the index of the step that produced it in `FIT_STEPS`,
        and the L-BFGS-B iterations of all attempts.
    """
    iterations = 0

    def count(parameters: Any, result: Any) -> None:  # called by BoTorch's scipy_minimize once per iteration
        nonlocal iterations
        iterations += 1

    optimizer_kwargs: dict[str, Any] = {"callback": count}
    if maxiter is not None:
        optimizer_kwargs["options"] = {"maxiter": int(maxiter)}
    lenient = {"max_attempts": 1, "warning_handler": lambda w: True}
    steps = [(0, True, {}), (1, False, {}), (2, False, lenient)][0 if warm else 1:]
    errors = []
    for step, warm_start, kwargs in steps:
        mll = build(warm_start)
        try:
            fit_gpytorch_mll(mll, optimizer_kwargs=optimizer_kwargs, **kwargs)
        except ModelFittingError as exc:
            errors.append(str(exc))
            continue
        return ExactFit(mll, step, iterations)
    mll = build(False)
    warnings.warn(f"{name}: every marginal-likelihood fit failed ({'; '.join(errors)}); the default "
                  "hyperparameters are used until the next refit", RuntimeWarning, stacklevel=3)
    mll.eval()
    return ExactFit(mll, len(FIT_STEPS) - 1, iterations)
