"""A load generator for orchestration tests and the utilization benchmark (issue 4).

`SleepObjective` returns a cheap analytic value of its parameters plus Gaussian noise, after a random
delay drawn from a lognormal distribution with a given mean and coefficient of variation. The delay
stands in for an expensive simulation, so the orchestrator's dispatch, streaming and utilization can be
measured without burning CPU (a sleeping evaluation needs no core; see benchmarks/utilization.py).
"""

from __future__ import annotations

import math
import time
from typing import Any, Mapping

import numpy as np

from objectives.base import EvalResult, Objective, ObjectiveError, Resources

__all__ = ["SleepObjective", "lognormal_params"]


def lognormal_params(mean_s: float, cv: float) -> tuple[float, float]:
    """(mu, sigma) of the lognormal whose mean is `mean_s` and coefficient of variation is `cv`."""
    sigma2 = math.log1p(cv * cv)
    return math.log(mean_s) - 0.5 * sigma2, math.sqrt(sigma2)


class SleepObjective(Objective):
    """Value `-sum_i (x_i - 0.3)^2 + noise * eps` (maximized at x = 0.3), after a lognormal delay.

    Args:
        dim: number of float parameters `x0 .. x{dim-1}` in [0, 1].
        mean_s: mean delay in seconds (0 gives no delay).
        cv: coefficient of variation of the delay (0 gives a fixed delay of `mean_s`).
        noise: standard deviation of the additive Gaussian noise.
        num_cpus: CPUs one evaluation asks Ray for (fractional is fine: the evaluation only sleeps).
        custom_resources: custom Ray resources one evaluation asks for, e.g. ``{"sensor": 1}``.
        int_param: if > 0, adds an int parameter ``k`` in [0, int_param] (exercises snapping/duplicates).
        fail_rate: probability that an evaluation returns NaN instead of a value (exercises failure handling).
    """

    name = "sleep"
    direction = "maximize"
    noisy = True

    def __init__(
        self,
        dim: int = 2,
        mean_s: float = 1.0,
        cv: float = 0.5,
        noise: float = 0.1,
        num_cpus: float = 1.0,
        custom_resources: Mapping[str, float] | None = None,
        int_param: int = 0,
        fail_rate: float = 0.0,
    ) -> None:
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
            raise ObjectiveError(f"option 'dim' must be an integer >= 1; got {dim!r}")
        for key, v in (("mean_s", mean_s), ("cv", cv), ("noise", noise), ("num_cpus", num_cpus)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ObjectiveError(f"option {key!r} must be a finite number >= 0; got {v!r}")
        if isinstance(fail_rate, bool) or not isinstance(fail_rate, (int, float)) or not 0.0 <= fail_rate <= 1.0:
            raise ObjectiveError(f"option 'fail_rate' must be a number in [0, 1]; got {fail_rate!r}")
        self.fail_rate = float(fail_rate)
        if isinstance(int_param, bool) or not isinstance(int_param, int) or int_param < 0:
            raise ObjectiveError(f"option 'int_param' must be an integer >= 0; got {int_param!r}")
        self.dim = dim
        self.mean_s = float(mean_s)
        self.cv = float(cv)
        self.noise = float(noise)
        self.space = {f"x{i}": {"type": "float", "low": 0.0, "high": 1.0} for i in range(dim)}
        if int_param:
            self.space["k"] = {"type": "int", "low": 0, "high": int(int_param)}
        self.resources = Resources(num_cpus=float(num_cpus), custom=dict(custom_resources or {}))

    def delay(self, rng: np.random.Generator) -> float:
        """One random delay in seconds."""
        if self.mean_s <= 0:
            return 0.0
        if self.cv <= 0:
            return self.mean_s
        mu, sigma = lognormal_params(self.mean_s, self.cv)
        return float(rng.lognormal(mu, sigma))

    def true_value(self, params: Mapping[str, Any]) -> float:
        """The noise-free value at `params`."""
        v = -sum((float(params[f"x{i}"]) - 0.3) ** 2 for i in range(self.dim))
        if "k" in params:
            v -= 0.01 * (float(params["k"]) - 1.0) ** 2
        return v

    def evaluate(self, params: Mapping[str, Any], seed: int) -> EvalResult:
        rng = np.random.default_rng(seed)
        d = self.delay(rng)
        time.sleep(d)
        value = self.true_value(params) + self.noise * float(rng.standard_normal())
        if self.fail_rate and rng.random() < self.fail_rate:
            value = float("nan")
        return EvalResult(value=value, metrics={"delay_s": d})
