"""A noisy test problem whose mean-optimal and tau-optimal settings differ: skewed, input-dependent noise.

qbatch's own check of quantile optimization (the quality benchmark, `benchmarks/quality.py`). The outcome at
x in [0, 1]^d is ``Y = m(x) - s(x) E`` with ``E ~ Exponential(1)``: a long lower tail ("bad runs") whose
scale s(x) changes with x. Its tau-quantile is exact, ``q_tau(x) = m(x) + s(x) log(tau)``. The mean m has a
tall bump at ``a`` where the noise is wide, and a lower bump at ``b`` where it is narrow:

- ``m(x) = 1.6 exp(-|x - a|^2 / (2 * 0.2^2)) + 1.0 exp(-|x - b|^2 / (2 * 0.15^2))``;
- ``s(x) = 0.05 + 0.45 exp(-|x - a|^2 / (2 * 0.25^2))``.

The mean and the median are best near ``a``, the 10% quantile near ``b`` (about 0.88 against 0.45 at ``a``),
so a method that optimizes the mean, or ignores how the noise changes, recommends the wrong setting.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from objectives.base import ObjectiveError, SyntheticObjective, check_params
from objectives.functions import check_tau, maximize_on_box, point_rng
from objectives.options import MAX_DIM, check_int

__all__ = ["SkewedNoiseProblem"]


class SkewedNoiseProblem(SyntheticObjective):
    """Maximise the tau-quantile of ``m(x) - s(x) E`` on [0, 1]^d (module docstring).

    Args:
        dim: input dimension d (>= 1); parameters are named ``x0 .. x{d-1}``. The centres are
            ``a_i = 0.3`` and ``b_i = 0.7`` for even i, ``0.65`` and ``0.35`` for odd i.
    """

    direction = "maximize"
    noisy = True

    def __init__(self, dim: int = 3) -> None:
        self.dim = check_int("dim", dim, 1, MAX_DIM)
        self.name = f"skewed-{self.dim}d"
        self.space = {
            f"x{i}": {"type": "float", "low": 0.0, "high": 1.0, "log": False} for i in range(self.dim)
        }
        even = np.arange(self.dim) % 2 == 0
        self.a = np.where(even, 0.3, 0.65)
        self.b = np.where(even, 0.7, 0.35)
        self._optimum_cache: dict[float, tuple[dict[str, Any], float]] = {}

    def _unit(self, X: np.ndarray) -> np.ndarray:
        X = np.atleast_2d(np.asarray(X, dtype=np.float64))
        if X.shape[1] != self.dim:
            raise ObjectiveError(f"expected an `n x {self.dim}` array of points; got shape {X.shape}")
        return X

    def mean_scale(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(m(x), s(x)) at the rows of an `n x d` array."""
        X = self._unit(X)
        da = ((X - self.a) ** 2).sum(axis=1)
        db = ((X - self.b) ** 2).sum(axis=1)
        m = 1.6 * np.exp(-da / (2 * 0.2**2)) + 1.0 * np.exp(-db / (2 * 0.15**2))
        s = 0.05 + 0.45 * np.exp(-da / (2 * 0.25**2))
        return m, s

    def quantile_unit(self, X: np.ndarray, tau: float) -> np.ndarray:
        """Exact tau-quantiles ``m(x) + s(x) log(tau)`` at the rows of an `n x d` array."""
        m, s = self.mean_scale(X)
        return m + s * np.log(check_tau(tau))

    def mean_unit(self, X: np.ndarray) -> np.ndarray:
        """Exact means ``m(x) - s(x)``."""
        m, s = self.mean_scale(X)
        return m - s

    def sample_unit(self, X: np.ndarray, rng: np.random.Generator, size: int = 1) -> np.ndarray:
        """`size x n` draws of Y at the rows of an `n x d` array."""
        m, s = self.mean_scale(X)
        return m - s * rng.exponential(1.0, size=(size, m.shape[0]))

    def evaluate(self, params: Mapping[str, Any], seed: int) -> float:
        """One draw of Y; E comes from a generator seeded by ``(seed, x)``."""
        check_params(self.space, params)
        x = np.array([float(params[k]) for k in self.space])
        return float(self.sample_unit(x[None], point_rng(seed, x))[0, 0])

    def quantile(self, params: Mapping[str, Any], tau: float) -> float:
        check_params(self.space, params)
        x = np.array([float(params[k]) for k in self.space])
        return float(self.quantile_unit(x[None], tau)[0])

    def optimum(self, tau: float) -> tuple[dict[str, Any], float]:
        """Best tau-quantile over [0, 1]^d by multi-start L-BFGS-B; cached."""
        tau = check_tau(tau)
        if tau not in self._optimum_cache:
            x, v = maximize_on_box(
                lambda X: self.quantile_unit(X, tau),
                np.zeros(self.dim),
                np.ones(self.dim),
                n_raw=5000,
                n_starts=20,
                seed=0,
            )
            self._optimum_cache[tau] = ({k: float(xi) for k, xi in zip(self.space, x)}, float(v))
        return self._optimum_cache[tau]
