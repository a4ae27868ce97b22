"""A load generator for orchestration tests and the utilization benchmark.

`SleepObjective` returns a cheap analytic value of its parameters plus Gaussian noise, after a random
delay drawn from a lognormal distribution with a given mean and coefficient of variation. The delay
stands in for an expensive simulation, so the orchestrator's dispatch, streaming and utilization can be
measured without burning CPU (a sleeping evaluation needs no core; see benchmarks/utilization.py).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from objectives.base import EvalResult, Objective, ObjectiveError, Resources
from objectives.options import MAX_DIM, check_float, check_int

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
        dim = check_int("dim", dim, 1, MAX_DIM)
        mean_s, cv, noise, num_cpus = (
            check_float(k, v, 0.0)
            for k, v in (("mean_s", mean_s), ("cv", cv), ("noise", noise), ("num_cpus", num_cpus))
        )
        self.fail_rate = check_float("fail_rate", fail_rate, 0.0, 1.0)
        int_param = check_int("int_param", int_param, 0)
        self.dim = dim
        self.mean_s = float(mean_s)
        self.cv = float(cv)
        self.noise = float(noise)
        self.space = {f"x{i}": {"type": "float", "low": 0.0, "high": 1.0} for i in range(dim)}
        if int_param:
            self.space["k"] = {"type": "int", "low": 0, "high": int(int_param)}
        if custom_resources is not None and not isinstance(custom_resources, Mapping):
            raise ObjectiveError("option 'custom_resources' must be a mapping of name to quantity; got "
                                 f"{custom_resources!r}")
        try:
            self.resources = Resources(num_cpus=num_cpus, custom=dict(custom_resources or {}))
        except ObjectiveError as exc:
            raise ObjectiveError(f"option 'custom_resources': {exc}") from None

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
