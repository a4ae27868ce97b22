"""The recommendation: which observed input a run hands back (quantile-expectile-bo.md §1.7, and a robust
rule).

The spec recommends the observed input with the largest posterior mean of the target. The posterior mean at a
point that was measured once in a noisy region can sit high on one lucky draw; a lower confidence bound,
mean - kappa sd of the objective latent f, prefers inputs whose level the model is sure of (those observed
near others, or repeatedly). Rules:

- "mean": argmax of the posterior mean of the target (the spec's rule);
- "lcb": argmax of the mean minus one posterior standard deviation of f;
- "lcb-2": the same with two.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from orchestrator.errors import ConfigError

__all__ = ["DEFAULT_RULE", "RULES", "check_rule", "recommend_index", "recommendation_scores"]

#: rule name -> kappa, the number of posterior standard deviations of f taken off the mean
RULES: dict[str, float] = {"mean": 0.0, "lcb": 1.0, "lcb-2": 2.0}
#: the rule of `AskTellOptimizer.best()` and of a run's end
DEFAULT_RULE = "mean"


def check_rule(rule: Any) -> str:
    """`rule` if it names a recommendation rule; else a ConfigError naming the option and the valid names."""
    if not isinstance(rule, str) or rule not in RULES:
        raise ConfigError(f"`recommendation` must be one of {list(RULES)}; got {rule!r}")
    return rule


def recommendation_scores(model: Any, X: Tensor, rule: str = "mean", mean: Tensor | None = None) -> Tensor:
    """Scores of the `n x d` inputs `X` under `rule`, in the model's standardized units (larger is better).
    `mean`: the model's `objective_mean(X)` when the caller has it already."""
    kappa = RULES[check_rule(rule)]
    with torch.no_grad():
        score = model.objective_mean(X) if mean is None else mean
        if kappa:
            _, var = model.posterior_f(X, full_cov=False)
            score = score - kappa * var.clamp_min(0.0).sqrt()
    return score


def recommend_index(model: Any, X: Tensor, rule: str = "mean") -> int:
    """Row of `X` that `rule` recommends."""
    return int(torch.argmax(recommendation_scores(model, X, rule)))
