"""Classic test functions of paper 000 and the noisy Ackley of paper 002, with exact quantiles.

Implements the benchmark functions of calibrated-bo.md §2.2 (Forrester, Ackley, Alpine, six-hump camel,
Cosines, Beale, McCormick, Powers, cross-in-tray, drop-wave) with the domains of that table, and the
heteroscedastic Ackley of locbo.md §3.2. BoTorch's `botorch.test_functions.synthetic` problems are used where
one exists (Ackley, Beale, SixHumpCamel, DropWave); the others follow GPyOpt / the SFU library.

Noise. Every function of paper 000 takes ``noise_std`` (default 0: deterministic) and ``heteroscedastic``
(the noisy Ackley of paper 002 has its own ``noise_scale``, locbo.md §3.2). With Gaussian
noise of std ``s(x)`` the exact tau-quantile is ``f(x) + s(x) * Phi^-1(tau)``. The heteroscedastic option
makes the std grow linearly across the box, ``s(x) = noise_std * (0.2 + 1.6 * mean_i z_i)`` with ``z`` the
point in the unit cube (like the pubcode's ``noise * sum(x)`` Branin of quantile-expectile-bo), so ``s``
ranges over ``[0.2, 1.8] * noise_std`` and averages ``noise_std``.

Noise streams. The noise of one evaluation is a function of its ``seed`` *and* its point (the generator is
seeded by ``(seed, hash of the point)``), so equal seeds at different points give independent noise.

The module also holds `maximize_on_box`, the multi-start L-BFGS-B used by every objective here that needs a
numerical optimum (GLD problems, the laser simulator, heteroscedastic functions).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from scipy.optimize import minimize
from scipy.stats import norm, qmc
from threadpoolctl import threadpool_limits

from objectives.base import ObjectiveError, SyntheticObjective, check_params
from objectives.options import MAX_DIM, check_bool, check_bounds, check_float, check_int

__all__ = [
    "Ackley",
    "Alpine",
    "Beale",
    "Cosines",
    "CrossInTray",
    "Dropwave",
    "Forrester",
    "McCormick",
    "NoisyAckley",
    "Powers",
    "SixHumpCamel",
    "TestFunction",
    "maximize_on_box",
    "point_rng",
]


# ----------------------------------------------------------------------------------------------- helpers
def point_rng(seed: int, x: np.ndarray) -> np.random.Generator:
    """A generator seeded by ``(seed, x)``: same seed and point give the same draws, any change gives new
    ones.

    Args:
        seed: the evaluation's random seed (any integer; reduced modulo 2**64).
        x: the evaluated point, `d`-dim array.
    """
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise ObjectiveError(f"seed must be an integer; got {seed!r}")
    # + 0.0 makes -0.0 the point 0.0 (its bytes differ) and changes no other value
    point = np.ascontiguousarray(x, dtype=np.float64) + 0.0
    digest = hashlib.blake2b(point.tobytes(), digest_size=8).digest()
    return np.random.default_rng(
        np.random.SeedSequence([int(seed) % 2**64, int.from_bytes(digest, "little")])
    )


def check_tau(tau: float) -> float:
    """Return `tau` as a float in (0, 1) or raise `ObjectiveError` naming it."""
    if (
        isinstance(tau, bool)
        or not isinstance(tau, (int, float, np.floating))
        or not (0.0 < float(tau) < 1.0)
    ):
        raise ObjectiveError(f"quantile level tau must be in (0, 1); got {tau!r}")
    return float(tau)


def maximize_on_box(
    fun: Callable[[np.ndarray], np.ndarray],
    lower: Sequence[float],
    upper: Sequence[float],
    *,
    n_raw: int = 5000,
    n_starts: int = 50,
    seed: int = 0,
    extra_starts: np.ndarray | None = None,
    maxiter: int = 200,
) -> tuple[np.ndarray, float]:
    """Maximize a vectorised function over a box by multi-start L-BFGS-B (quantile-expectile-bo.md §4.1).

    `n_raw` scrambled Sobol points are scored, the best `n_starts` (plus `extra_starts`) start L-BFGS-B in
    the unit cube with forward-difference gradients computed in one vectorised call per step.

    Args:
        fun: maps an `n x d` array of points to `n` values (to maximize).
        lower: `d` lower bounds.
        upper: `d` upper bounds.
        n_raw: number of raw Sobol candidates.
        n_starts: number of L-BFGS-B runs from the best candidates.
        seed: seed of the Sobol scrambling.
        extra_starts: optional `m x d` points (in the box) also used as starts.
        maxiter: L-BFGS-B iteration limit per start.

    Returns:
        (x, value): the best point found (`d`-dim) and its value.
    """
    # L-BFGS-B's tiny BLAS calls are far slower with a threaded BLAS on a busy machine: use one thread
    with threadpool_limits(limits=1):
        return _maximize_on_box(fun, lower, upper, n_raw, n_starts, seed, extra_starts, maxiter)


def _maximize_on_box(
    fun: Callable[[np.ndarray], np.ndarray],
    lower: Sequence[float],
    upper: Sequence[float],
    n_raw: int,
    n_starts: int,
    seed: int,
    extra_starts: np.ndarray | None,
    maxiter: int,
) -> tuple[np.ndarray, float]:
    lo, hi = np.asarray(lower, dtype=np.float64), np.asarray(upper, dtype=np.float64)
    d = lo.size
    width = hi - lo

    def g(Z: np.ndarray) -> np.ndarray:
        return np.asarray(fun(lo + np.clip(Z, 0.0, 1.0) * width), dtype=np.float64).reshape(-1)

    m = 2 ** int(math.ceil(math.log2(max(n_raw, 2))))
    Z0 = qmc.Sobol(d, scramble=True, seed=seed).random(m)[:n_raw]
    vals = g(Z0)
    vals = np.where(np.isfinite(vals), vals, -np.inf)
    order = np.argsort(-vals)[: max(1, n_starts)]
    starts = Z0[order]
    best_z, best_v = Z0[order[0]].copy(), float(vals[order[0]])
    if extra_starts is not None and len(extra_starts):
        E = (np.atleast_2d(np.asarray(extra_starts, dtype=np.float64)) - lo) / width
        starts = np.vstack([np.clip(E, 0.0, 1.0), starts])
    h = 1e-7
    eye = np.eye(d) * h

    def neg_and_grad(z: np.ndarray) -> tuple[float, np.ndarray]:
        # forward differences, stepping inwards at the upper face
        step = np.where(z + h <= 1.0, 1.0, -1.0)
        v = g(np.vstack([z, z + eye * step[:, None]]))
        if not np.all(np.isfinite(v)):
            return 1e300, np.zeros(d)
        return -float(v[0]), -(v[1:] - v[0]) / (h * step)

    for z in starts:
        res = minimize(neg_and_grad, z, jac=True, method="L-BFGS-B", bounds=[(0.0, 1.0)] * d,
                       options={"maxiter": maxiter})
        zz = np.clip(res.x, 0.0, 1.0)
        v = float(g(zz[None])[0])
        if np.isfinite(v) and v > best_v:
            best_z, best_v = zz, v
    return lo + best_z * width, best_v


# ------------------------------------------------------------------------------------------- base class
class TestFunction(SyntheticObjective):
    """A deterministic test function `f` plus optional (heteroscedastic) Gaussian noise.

    Subclasses set `name`, `default_bounds`, `direction`, the known `optimizers`/`optimal_value` of the
    noise-free `f`, and implement `f(X)` on an `n x d` array.

    Args:
        noise_std: std of the Gaussian noise (0: deterministic).
        heteroscedastic: make the std vary across the box (see module docstring).
        bounds: override of the domain, `d` pairs (low, high).
    """

    __test__ = False  # not a pytest test class despite its name
    direction = "minimize"
    default_bounds: tuple[tuple[float, float], ...] = ()
    #: known global optimizers of the noise-free f on the default domain
    optimizers: tuple[tuple[float, ...], ...] = ()
    optimal_value: float = float("nan")

    def __init__(
        self,
        noise_std: float = 0.0,
        heteroscedastic: bool = False,
        bounds: Sequence[Sequence[float]] | None = None,
    ) -> None:
        self.noise_std = check_float("noise_std", noise_std, 0.0)
        self.heteroscedastic = check_bool("heteroscedastic", heteroscedastic)
        self._custom_bounds = bounds is not None
        bnds = self.default_bounds if bounds is None else check_bounds("bounds", bounds, self.dim)
        self.bounds = np.asarray(bnds, dtype=np.float64)
        self.space = {
            f"x{i}": {"type": "float", "low": float(lo), "high": float(hi), "log": False}
            for i, (lo, hi) in enumerate(self.bounds)
        }
        self.noisy = self.noise_std > 0
        self._optimum_cache: dict[float, tuple[dict[str, Any], float]] = {}

    @property
    def dim(self) -> int:
        return len(self.default_bounds)

    def _origin_box(self, dim: int, half_width: float) -> None:
        """Make the default domain [-half_width, half_width]^dim, with the origin its one known optimizer
        (the functions defined in any dimension)."""
        _check_dim(dim)
        self.default_bounds = ((-half_width, half_width),) * int(dim)
        self.optimizers = ((0.0,) * int(dim),)

    # --- the function
    def f(self, X: np.ndarray) -> np.ndarray:
        """Noise-free value at each row of an `n x d` array; returns `n` values."""
        raise NotImplementedError

    def noise_sd(self, X: np.ndarray) -> np.ndarray:
        """Std of the Gaussian noise at each row of an `n x d` array; returns `n` values."""
        X = np.atleast_2d(X)
        if not self.heteroscedastic:
            return np.full(X.shape[0], self.noise_std)
        Z = (X - self.bounds[:, 0]) / (self.bounds[:, 1] - self.bounds[:, 0])
        return self.noise_std * (0.2 + 1.6 * Z.mean(axis=1))

    # --- protocol
    def to_array(self, params: Mapping[str, Any]) -> np.ndarray:
        """Validate `params` against the space and return them as a `d`-dim array."""
        check_params(self.space, params)
        return np.array([float(params[k]) for k in self.space], dtype=np.float64)

    def evaluate(self, params: Mapping[str, Any], seed: int) -> float:
        x = self.to_array(params)
        value = float(self.f(x[None])[0])
        sd = float(self.noise_sd(x[None])[0])
        if sd > 0:
            value += sd * point_rng(seed, x).standard_normal()
        return value

    def quantile_array(self, X: np.ndarray, tau: float) -> np.ndarray:
        """Exact tau-quantiles at the rows of an `n x d` array (in the domain's units); returns `n` values."""
        tau = check_tau(tau)
        X = np.atleast_2d(np.asarray(X, dtype=np.float64))
        return self.f(X) + self.noise_sd(X) * norm.ppf(tau)

    def quantile(self, params: Mapping[str, Any], tau: float) -> float:
        return float(self.quantile_array(self.to_array(params)[None], tau)[0])

    def optimum(self, tau: float) -> tuple[dict[str, Any], float]:
        tau = check_tau(tau)
        if tau in self._optimum_cache:
            return self._optimum_cache[tau]
        known = [np.asarray(o, dtype=np.float64) for o in self.optimizers]
        inside = [o for o in known if np.all(o >= self.bounds[:, 0]) and np.all(o <= self.bounds[:, 1])]
        if inside and not (self.heteroscedastic and self.noise_std > 0) and not self._custom_bounds:
            x = inside[0]
            value = float(self.quantile_array(x[None], tau)[0])
        else:
            sign = -1.0 if self.direction == "minimize" else 1.0
            x, v = maximize_on_box(
                lambda X: sign * self.quantile_array(X, tau),
                self.bounds[:, 0], self.bounds[:, 1],
                n_raw=2048 * self.dim, n_starts=10 * self.dim,
                extra_starts=np.array(inside) if inside else None,
            )
            value = sign * v
        result = ({k: float(v) for k, v in zip(self.space, x)}, value)
        self._optimum_cache[tau] = result
        return result


class _BoTorchFunction(TestFunction):
    """A `TestFunction` evaluated through a BoTorch synthetic test problem.

    The problem is built on the function's default bounds: its formula does not depend on them, and BoTorch
    refuses custom bounds that leave out the known optimum, which a user's `bounds` may well do.
    """

    def _make_problem(self) -> Any:
        raise NotImplementedError

    def f(self, X: np.ndarray) -> np.ndarray:
        import torch

        if not hasattr(self, "_problem"):
            self._problem = self._make_problem()
        with torch.no_grad():
            y = self._problem.evaluate_true(torch.as_tensor(np.atleast_2d(X), dtype=torch.float64))
        return y.numpy().astype(np.float64)


# --------------------------------------------------------------------------------------- the functions
class Forrester(TestFunction):
    """Forrester et al. (2008): ``(6x - 2)^2 sin(12x - 4)`` on [0, 1]; min -6.0207 at x = 0.7572."""

    name = "forrester"
    default_bounds = ((0.0, 1.0),)
    optimizers = ((0.7572487144081974,),)
    optimal_value = -6.020740055767083

    def f(self, X: np.ndarray) -> np.ndarray:
        x = np.atleast_2d(X)[:, 0]
        return (6 * x - 2) ** 2 * np.sin(12 * x - 4)


class Ackley(_BoTorchFunction):
    """Ackley function (BoTorch) on [-32.768, 32.768]^d; min 0 at the origin.

    Args:
        dim: dimension (2 in paper 000).
        noise_std, heteroscedastic, bounds: see `TestFunction`.
    """

    name = "ackley"
    optimal_value = 0.0

    def __init__(self, dim: int = 2, noise_std: float = 0.0, heteroscedastic: bool = False,
                 bounds: Sequence[Sequence[float]] | None = None) -> None:
        self._origin_box(dim, 32.768)
        super().__init__(noise_std=noise_std, heteroscedastic=heteroscedastic, bounds=bounds)

    def _make_problem(self) -> Any:
        from botorch.test_functions.synthetic import Ackley as _A

        return _A(dim=self.dim, bounds=[tuple(b) for b in self.default_bounds])


class Alpine(TestFunction):
    """Alpine N.1 in its SFU form ``sum_i |x_i sin(x_i) + 0.1 x_i|`` on [-10, 10]^d (d = 10); min 0 at 0.

    GPyOpt's version lacks the absolute value; the positive minima reported in paper 000 suggest this form
    (calibrated-bo.md §2.2).
    """

    name = "alpine"
    optimal_value = 0.0

    def __init__(self, dim: int = 10, noise_std: float = 0.0, heteroscedastic: bool = False,
                 bounds: Sequence[Sequence[float]] | None = None) -> None:
        self._origin_box(dim, 10.0)
        super().__init__(noise_std=noise_std, heteroscedastic=heteroscedastic, bounds=bounds)

    def f(self, X: np.ndarray) -> np.ndarray:
        X = np.atleast_2d(X)
        return np.abs(X * np.sin(X) + 0.1 * X).sum(axis=1)


class SixHumpCamel(_BoTorchFunction):
    """Six-hump camel (BoTorch) on GPyOpt's domain [-2, 2] x [-1, 1]; min -1.0316 at (±0.0898, ∓0.7126)."""

    name = "six-hump-camel"
    default_bounds = ((-2.0, 2.0), (-1.0, 1.0))
    optimizers = ((0.08984201368301331, -0.7126564032704135), (-0.08984201368301331, 0.7126564032704135))
    optimal_value = -1.0316284534898774

    def _make_problem(self) -> Any:
        from botorch.test_functions.synthetic import SixHumpCamel as _S

        return _S(bounds=[tuple(b) for b in self.default_bounds])


class Cosines(TestFunction):
    """GPyOpt's Cosines: ``-(1 - sum_i (u_i^2 - 0.3 cos(3 pi u_i)))``, ``u = 1.6 x - 0.5``, on [0, 1]^2.

    Min -1.6 at (0.3125, 0.3125) (u = 0).
    """

    name = "cosines"
    default_bounds = ((0.0, 1.0), (0.0, 1.0))
    optimizers = ((0.3125, 0.3125),)
    optimal_value = -1.6

    def f(self, X: np.ndarray) -> np.ndarray:
        U = 1.6 * np.atleast_2d(X) - 0.5
        return -(1.0 - (U**2 - 0.3 * np.cos(3 * np.pi * U)).sum(axis=1))


class Beale(_BoTorchFunction):
    """Beale function (BoTorch) on the SFU domain [-4.5, 4.5]^2; min 0 at (3, 0.5)."""

    name = "beale"
    default_bounds = ((-4.5, 4.5), (-4.5, 4.5))
    optimizers = ((3.0, 0.5),)
    optimal_value = 0.0

    def _make_problem(self) -> Any:
        from botorch.test_functions.synthetic import Beale as _B

        return _B(bounds=[tuple(b) for b in self.default_bounds])


class McCormick(TestFunction):
    """McCormick ``sin(x1 + x2) + (x1 - x2)^2 - 1.5 x1 + 2.5 x2 + 1`` on [-1.5, 4] x [-3, 4]; min -1.9133."""

    name = "mccormick"
    default_bounds = ((-1.5, 4.0), (-3.0, 4.0))
    optimizers = ((-0.5471975511965976, -1.5471975511965976),)
    optimal_value = -1.913222954981037

    def f(self, X: np.ndarray) -> np.ndarray:
        X = np.atleast_2d(X)
        x1, x2 = X[:, 0], X[:, 1]
        return np.sin(x1 + x2) + (x1 - x2) ** 2 - 1.5 * x1 + 2.5 * x2 + 1.0


class Powers(TestFunction):
    """Sum of different powers ``sum_i |x_i|^(i+1)`` on [-1, 1]^d (d = 2: ``|x1|^2 + |x2|^3``); min 0 at 0."""

    name = "powers"
    optimal_value = 0.0

    def __init__(self, dim: int = 2, noise_std: float = 0.0, heteroscedastic: bool = False,
                 bounds: Sequence[Sequence[float]] | None = None) -> None:
        self._origin_box(dim, 1.0)
        super().__init__(noise_std=noise_std, heteroscedastic=heteroscedastic, bounds=bounds)

    def f(self, X: np.ndarray) -> np.ndarray:
        X = np.atleast_2d(X)
        return (np.abs(X) ** np.arange(2, X.shape[1] + 2)).sum(axis=1)


class CrossInTray(TestFunction):
    """Cross-in-tray (SFU) on [-10, 10]^2; min -2.06261 at (±1.3491, ±1.3491)."""

    name = "cross-in-tray"
    default_bounds = ((-10.0, 10.0), (-10.0, 10.0))
    optimizers = tuple((s1 * 1.349406608602084, s2 * 1.349406608602084) for s1 in (1, -1) for s2 in (1, -1))
    optimal_value = -2.062611870822739

    def f(self, X: np.ndarray) -> np.ndarray:
        X = np.atleast_2d(X)
        x1, x2 = X[:, 0], X[:, 1]
        inner = np.abs(np.sin(x1) * np.sin(x2) * np.exp(np.abs(100.0 - np.sqrt(x1**2 + x2**2) / np.pi)))
        return -1e-4 * (inner + 1.0) ** 0.1


class Dropwave(_BoTorchFunction):
    """Drop-wave (BoTorch) on GPyOpt's domain [-1, 1]^2; min -1 at the origin."""

    name = "dropwave"
    default_bounds = ((-1.0, 1.0), (-1.0, 1.0))
    optimizers = ((0.0, 0.0),)
    optimal_value = -1.0

    def _make_problem(self) -> Any:
        from botorch.test_functions.synthetic import DropWave as _D

        return _D(bounds=[tuple(b) for b in self.default_bounds])


class NoisyAckley(_BoTorchFunction):
    """Negated 2-D Ackley on [-10, 10]^2 with noise N(0, (||x|| + 10) / 20), to maximize (locbo.md §3.2).

    The second argument is the noise *variance*: the LOCBO code draws ``normal(0, sqrt((||x|| + 10) / 20))``.
    The std therefore grows from 0.71 at the optimum to 1.0 at the face centres and 1.10 at the corners.
    ``noise_scale`` multiplies the noise (1: the paper's; 0: the noise-free variant of Fig. 5a).

    Args:
        noise_scale: factor on the noise std (>= 0).
        bounds: override of the domain.
    """

    name = "noisy-ackley"
    direction = "maximize"
    default_bounds = ((-10.0, 10.0), (-10.0, 10.0))
    optimizers = ((0.0, 0.0),)
    optimal_value = 0.0

    def __init__(self, noise_scale: float = 1.0, bounds: Sequence[Sequence[float]] | None = None) -> None:
        self.noise_scale = check_float("noise_scale", noise_scale, 0.0)
        super().__init__(noise_std=self.noise_scale, heteroscedastic=self.noise_scale > 0, bounds=bounds)

    def _make_problem(self) -> Any:
        from botorch.test_functions.synthetic import Ackley as _A

        return _A(dim=2, bounds=[tuple(b) for b in self.default_bounds])

    def f(self, X: np.ndarray) -> np.ndarray:
        # BoTorch applies `negate` in forward(), not in evaluate_true(): negate here
        return -super().f(X)

    def noise_sd(self, X: np.ndarray) -> np.ndarray:
        X = np.atleast_2d(X)
        return self.noise_scale * np.sqrt((np.linalg.norm(X, axis=1) + 10.0) / 20.0)


def _check_dim(dim: Any) -> None:
    check_int("dim", dim, 1, MAX_DIM)
