"""Laser (free-electron laser) tuning simulator: 16 quadrupole strengths -> X-ray pulse energy, skew-normal
noise.

Implements quantile-expectile-bo.md §4.3 (paper 003, after McIntire et al. 2016). The outcome at a setting
``x`` is ``Y ~ SN(xi(x), omega(x), alpha(x))``, density ``(2/omega) phi(z) Phi(alpha z)``, ``z = (y -
xi)/omega``; its exact tau-quantile is ``xi + omega * SN^-1(tau; alpha)``.

Built from a CSV in the format of the LCLS data (`LaserSimulator.from_csv`):
  1. keep rows with ``0.2 < GDET:FEE1:241:ENRC < 6.0``; inputs are the 16 ``QUAD:*BCTRL`` columns, the box
     their observed ranges;
  2. fit a GP m(x) to the pulse energy (scikit-learn, Matérn-5/2 ARD + white noise, on a seeded subsample);
  3. group repeated shots by rounding the inputs to 4 decimals; in each group with at least `min_repeats`
     shots fit (xi, omega, alpha) by maximum likelihood (`scipy.stats.skewnorm.fit`), with |alpha| capped;
  4. fit GPs to log omega and to alpha over the group centres (isotropic lengthscale >=
     `noise_lengthscale_min`).
A14 (does xi carry the signal or is it added to m?): xi carries it, and is *derived* so that the simulated
mean equals the energy GP: ``xi(x) = m(x) - omega(x) delta(alpha(x)) sqrt(2/pi)``, ``delta =
alpha/sqrt(1+alpha^2)``. The group estimates of xi are not modelled separately (they are m minus the same
offset at the groups, up to the GP's smoothing).

Without a file (`LaserSimulator()`), a synthetic simulator of the same form is used: fixed-seed Matérn-5/2 GP
draws (random Fourier features) in 16-D for m, log omega and alpha over the same named, plausible box.
Noise streams are seeded by ``(seed, point)`` like the other objectives here.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from scipy.interpolate import CubicSpline
from scipy.stats import skewnorm
from threadpoolctl import threadpool_limits

from objectives.base import ObjectiveError, SyntheticObjective, check_params
from objectives.functions import check_tau, maximize_on_box, point_rng
from objectives.gld import MaternRFF
from objectives.options import check_float, check_int, check_path, check_range

__all__ = ["ENERGY_COLUMN", "QUAD_BOX", "LaserSimulator"]

#: the output column of the LCLS data
ENERGY_COLUMN = "GDET:FEE1:241:ENRC"
#: the 16 quadrupoles and the box of the synthetic simulator (the observed ranges of the public LCLS subset)
QUAD_BOX: dict[str, tuple[float, float]] = {
    "QUAD:LI21:201:BCTRL": (-9.176, -7.010), "QUAD:LI21:211:BCTRL": (6.447, 7.418),
    "QUAD:LI21:271:BCTRL": (-8.128, -6.793), "QUAD:LI21:278:BCTRL": (7.550, 10.708),
    "QUAD:LI26:201:BCTRL": (1.441, 8.238), "QUAD:LI26:301:BCTRL": (-12.327, -4.882),
    "QUAD:LI26:401:BCTRL": (11.209, 21.307), "QUAD:LI26:501:BCTRL": (-14.165, -6.660),
    "QUAD:LI26:601:BCTRL": (10.023, 19.115), "QUAD:LI26:701:BCTRL": (-14.518, -7.306),
    "QUAD:LI26:801:BCTRL": (3.286, 12.023), "QUAD:LI26:901:BCTRL": (-9.772, -4.807),
    "QUAD:LTU1:620:BCTRL": (-74.712, -55.963), "QUAD:LTU1:640:BCTRL": (58.641, 69.233),
    "QUAD:LTU1:660:BCTRL": (-84.541, -71.900), "QUAD:LTU1:680:BCTRL": (51.100, 66.776),
}
#: floor on a group's fitted scale omega (mJ), so log omega stays finite
_OMEGA_FLOOR = 1e-3
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


class _GPMean:
    """Posterior mean of a fitted scikit-learn GP, on unit-cube inputs, in the target's units."""

    def __init__(
        self, Z: np.ndarray, y: np.ndarray, ard: bool, seed: int, lengthscale_min: float = 1e-2
    ) -> None:
        from sklearn.exceptions import ConvergenceWarning
        from sklearn.gaussian_process import GaussianProcessRegressor
        from sklearn.gaussian_process.kernels import ConstantKernel, Matern, WhiteKernel

        self.y_mean, self.y_std = float(np.mean(y)), float(np.std(y)) or 1.0
        ys = (y - self.y_mean) / self.y_std
        d = Z.shape[1]
        init = max(0.5, lengthscale_min)
        kernel = ConstantKernel(1.0, (1e-2, 1e2)) * Matern(
            length_scale=np.full(d, init) if ard else init, length_scale_bounds=(lengthscale_min, 1e3), nu=2.5
        ) + WhiteKernel(0.1, (1e-6, 1e1))
        # one BLAS thread: small Cholesky factorisations run faster so on a busy machine
        with warnings.catch_warnings(), threadpool_limits(limits=1):
            warnings.simplefilter("ignore", ConvergenceWarning)
            gp = GaussianProcessRegressor(kernel, normalize_y=False, random_state=seed).fit(Z, ys)
        self.kernel = gp.kernel_.k1  # signal part only: the white noise is not part of the mean
        self.Z, self.alpha = gp.X_train_, gp.alpha_
        self.noise_std = math.sqrt(float(gp.kernel_.k2.noise_level)) * self.y_std

    def __call__(self, Z: np.ndarray) -> np.ndarray:
        return self.y_mean + self.y_std * (self.kernel(np.atleast_2d(Z), self.Z) @ self.alpha)


class _Constant:
    """A constant field on the unit cube (picklable, unlike a lambda)."""

    def __init__(self, value: float) -> None:
        self.value = float(value)

    def __call__(self, Z: np.ndarray) -> np.ndarray:
        return np.full(np.atleast_2d(Z).shape[0], self.value)


class _SyntheticField:
    """The synthetic simulator's fields on the unit cube, from three fixed-seed Matérn-5/2 GP draws (RFF).

    ``m = 3.5 + 0.7 h0 - 3 mean_i (z_i - z0_i)^2`` (a GP draw around a broad hump at a random interior z0),
    ``log omega = log 0.15 + 0.5 h1``, raw ``alpha = -1 + 2.5 h2`` (mostly negative skew, as in the LCLS
    repeats, with positive regions).
    """

    def __init__(self, dim: int, seed: int) -> None:
        self.rff = MaternRFF(dim, 0.8, 3, 1000, seed=[seed, 0x1A5E])
        self.z0 = np.random.default_rng([seed, 0x1A5E, 1]).uniform(0.3, 0.7, size=dim)

    def __call__(self, Z: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(mean, log omega, raw alpha) at the rows of an `n x d` array in the unit cube."""
        Z = np.atleast_2d(Z)
        H = self.rff(Z)
        mean = 3.5 + 0.7 * H[:, 0] - 3.0 * ((Z - self.z0) ** 2).mean(axis=1)
        return mean, math.log(0.15) + 0.5 * H[:, 1], -1.0 + 2.5 * H[:, 2]


class _FittedFields:
    """The fitted simulator's fields: the energy GP, the log-omega GP and the raw-alpha GP (or constants)."""

    def __init__(self, mean: Any, log_omega: Any, alpha_raw: Any) -> None:
        self.mean, self.log_omega, self.alpha_raw = mean, log_omega, alpha_raw

    def __call__(self, Z: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self.mean(Z), self.log_omega(Z), self.alpha_raw(Z)


#: options that shape the fit to the measurements (`csv_path`), with their defaults; the synthetic simulator
#: refuses other values
MEASUREMENT_OPTIONS: dict[str, Any] = {"n_gp_max": 400, "min_repeats": 5, "energy_range": (0.2, 6.0),
                                       "noise_lengthscale_min": 1e-2}


class LaserSimulator(SyntheticObjective):
    """16-D FEL tuning simulator with skew-normal noise; maximise the pulse energy's tau-quantile.

    Args:
        csv_path: a CSV in the format of the LCLS data; None builds the synthetic simulator.
        model_seed: seed of the subsample (CSV) or of the GP draws (synthetic).
        n_gp_max: at most this many rows are used to fit the energy GP (keeps fitting to seconds).
        min_repeats: a replicate group needs this many shots to enter the noise fit.
        alpha_max: cap on |alpha| (skew-normal MLE diverges on small groups).
        energy_range: rows outside this open interval of pulse energy are dropped.
        noise_lengthscale_min: lower bound on the (isotropic, unit-cube) lengthscale of the log-omega and
            alpha GPs. The default 0.01 lets maximum likelihood place a bump at each replicate group's centre
            (0.05 on the LCLS data); 0.3 or more makes the noise fields smooth over the 21 groups.
        measurement_s: seconds one evaluation takes, as on the machine, where a setting is held while
            shots are recorded (the simulator itself answers in microseconds). 0 (default) adds no delay;
            the quickstart uses 1 s so the streaming pipeline has something to overlap.
    """

    name = "laser"
    path_options = ("csv_path",)
    direction = "maximize"
    noisy = True

    def __init__(
        self,
        csv_path: str | Path | None = None,
        model_seed: int = 0,
        n_gp_max: int = MEASUREMENT_OPTIONS["n_gp_max"],
        min_repeats: int = MEASUREMENT_OPTIONS["min_repeats"],
        alpha_max: float = 8.0,
        energy_range: tuple[float, float] = MEASUREMENT_OPTIONS["energy_range"],
        measurement_s: float = 0.0,
        noise_lengthscale_min: float = MEASUREMENT_OPTIONS["noise_lengthscale_min"],
    ) -> None:
        self.n_gp_max = check_int("n_gp_max", n_gp_max, 10)
        self.min_repeats = check_int("min_repeats", min_repeats, 3)
        self.alpha_max = check_float("alpha_max", alpha_max, 0.0, low_open=True)
        self.model_seed = check_int("model_seed", model_seed, 0, 2**32 - 1)
        energy_range = check_range("energy_range", energy_range)
        self.measurement_s = check_float("measurement_s", measurement_s, 0.0)
        self.noise_lengthscale_min = check_float(
            "noise_lengthscale_min", noise_lengthscale_min, 0.0, 1e3, low_open=True, high_open=True
        )
        self.csv_path = check_path("csv_path", csv_path, kind="file")
        if self.csv_path is None:  # they shape the fit to the measurements; the synthetic fields ignore them
            given = {
                "n_gp_max": n_gp_max,
                "min_repeats": min_repeats,
                "energy_range": tuple(map(float, energy_range)),
                "noise_lengthscale_min": noise_lengthscale_min,
            }
            unused = [k for k in MEASUREMENT_OPTIONS if given[k] != MEASUREMENT_OPTIONS[k]]
            if unused:
                raise ObjectiveError(f"option(s) {unused} apply to a simulator fitted to measurements "
                                     "(option 'csv_path'); the synthetic simulator (no csv_path) would "
                                     "ignore them")
        self._optimum_cache: dict[float, tuple[dict[str, Any], float]] = {}
        self._ppf_splines: dict[float, CubicSpline] = {}
        self.groups: dict[str, np.ndarray] = {}
        if self.csv_path is None:
            self._build_synthetic()
        else:
            self._build_from_csv(self.csv_path, energy_range)
        self.space = {
            n: {"type": "float", "low": float(lo), "high": float(hi), "log": False}
            for n, (lo, hi) in zip(self.names, self.bounds)
        }

    @classmethod
    def from_csv(cls, path: str | Path, **kwargs: Any) -> LaserSimulator:
        """The simulator fitted to a CSV of LCLS-format measurements (see module docstring)."""
        return cls(csv_path=path, **kwargs)

    # ------------------------------------------------------------------------------------------ building
    def _build_synthetic(self) -> None:
        self.names = list(QUAD_BOX)
        self.bounds = np.array([QUAD_BOX[n] for n in self.names], dtype=np.float64)
        self._fields: Any = _SyntheticField(len(self.names), self.model_seed)
        self._X_data = self._y_data = None

    def _build_from_csv(self, path: Path, energy_range: tuple[float, float]) -> None:
        import csv

        try:
            with open(path, newline="") as fh:
                reader = csv.reader(fh)
                header = [h.strip() for h in next(reader, [])]
                lines = [(reader.line_num, row) for row in reader if row]  # line numbers as in the file
        except (OSError, UnicodeDecodeError, csv.Error) as exc:
            raise ObjectiveError(f"cannot read option 'csv_path'={str(path)!r}: {exc}") from exc
        quads = [c for c in header if c.startswith("QUAD:") and c.endswith("BCTRL")]
        if ENERGY_COLUMN not in header:
            raise ObjectiveError(f"option 'csv_path': {str(path)!r} lacks the energy column "
                                 f"{ENERGY_COLUMN!r}")
        if not quads:
            raise ObjectiveError(f"option 'csv_path': {str(path)!r} has no 'QUAD:*BCTRL' input columns")
        cols = [header.index(c) for c in quads + [ENERGY_COLUMN]]
        data = np.empty((len(lines), len(cols)))
        for i, (line, row) in enumerate(lines):
            for j, c in enumerate(cols):
                try:
                    data[i, j] = float(row[c])
                except (IndexError, ValueError):
                    data[i, j] = np.nan
                if not np.isfinite(data[i, j]):
                    raise ObjectiveError(
                        f"option 'csv_path': {str(path)!r}: data row {i} (line {line}) has a missing or "
                        f"non-numeric {header[c]!r}: {row[c] if c < len(row) else ''!r}"
                    )
        lo_e, hi_e = energy_range
        data = data[(data[:, -1] > lo_e) & (data[:, -1] < hi_e)]
        if len(data) < 20:
            raise ObjectiveError(f"option 'csv_path': {str(path)!r}: only {len(data)} rows with "
                                 f"{lo_e} < energy < {hi_e} (option 'energy_range')")
        X, y = data[:, :-1], data[:, -1]
        self.names = quads
        lo, hi = X.min(axis=0), X.max(axis=0)
        pad = np.where(hi > lo, 0.0, 1e-6 * np.maximum(1.0, np.abs(lo)))  # a constant column gets a sliver
        self.bounds = np.stack([lo - pad, hi + pad], axis=1)
        self._X_data, self._y_data = X, y
        Z = self._to_unit(X)
        rng = np.random.default_rng(self.model_seed)
        idx = rng.choice(len(Z), size=min(self.n_gp_max, len(Z)), replace=False)
        energy_gp = _GPMean(Z[idx], y[idx], ard=True, seed=self.model_seed)

        # replicate groups and their skew-normal fits
        keys = np.round(X, 4)
        _, inverse, counts = np.unique(keys, axis=0, return_inverse=True, return_counts=True)
        inverse = inverse.reshape(-1)
        centres, xis, omegas, alphas, sizes = [], [], [], [], []
        for g in np.flatnonzero(counts >= self.min_repeats):
            rows = np.flatnonzero(inverse == g)
            fit = self._fit_group(y[rows])
            if fit is None:
                continue
            centres.append(Z[rows].mean(axis=0))
            xis.append(fit[0]), omegas.append(fit[1]), alphas.append(fit[2]), sizes.append(len(rows))
        self.groups = {
            "X": self._from_unit(np.array(centres).reshape(-1, Z.shape[1])), "xi": np.array(xis),
            "omega": np.array(omegas), "alpha": np.array(alphas), "size": np.array(sizes),
        }
        if len(centres) >= 3:
            C = np.array(centres)
            ls_min = self.noise_lengthscale_min
            log_omega_gp = _GPMean(
                C, np.log(np.array(omegas)), ard=False, seed=self.model_seed, lengthscale_min=ls_min
            )
            a = np.clip(np.array(alphas) / self.alpha_max, -0.95, 0.95)
            alpha_gp = _GPMean(C, self.alpha_max * np.arctanh(a), ard=False, seed=self.model_seed,
                               lengthscale_min=ls_min)
            self._fields = _FittedFields(energy_gp, log_omega_gp, alpha_gp)
        else:
            # too few replicate groups to model the noise: Gaussian noise at the energy GP's noise level
            log_omega = _Constant(math.log(max(energy_gp.noise_std, _OMEGA_FLOOR)))
            self._fields = _FittedFields(energy_gp, log_omega, _Constant(0.0))

    def _fit_group(self, yg: np.ndarray) -> tuple[float, float, float] | None:
        """Skew-normal MLE of one group, guarded against degenerate fits; None if the group has no spread."""
        if np.std(yg) <= 1e-9 * max(1.0, abs(float(np.mean(yg)))):
            return None
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                a, loc, scale = skewnorm.fit(yg)
            if not (np.isfinite(a) and np.isfinite(loc) and np.isfinite(scale) and scale > 0):
                raise ValueError("non-finite fit")
            if abs(a) > self.alpha_max:  # the MLE of alpha diverges on small samples: fix it at the cap
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    a, loc, scale = skewnorm.fit(yg, f0=math.copysign(self.alpha_max, a))
                if not (np.isfinite(loc) and np.isfinite(scale) and scale > 0):
                    raise ValueError("non-finite fit")
        except (ValueError, RuntimeError, FloatingPointError):
            a, loc, scale = 0.0, float(np.mean(yg)), float(np.std(yg, ddof=1))  # moments, no skew
        return float(loc), max(float(scale), _OMEGA_FLOOR), float(a)

    # ----------------------------------------------------------------------------------- numpy helpers
    def _to_unit(self, X: np.ndarray) -> np.ndarray:
        return (X - self.bounds[:, 0]) / (self.bounds[:, 1] - self.bounds[:, 0])

    def _from_unit(self, Z: np.ndarray) -> np.ndarray:
        return self.bounds[:, 0] + Z * (self.bounds[:, 1] - self.bounds[:, 0])

    def _as_array(self, X: np.ndarray) -> np.ndarray:
        X = np.atleast_2d(np.asarray(X, dtype=np.float64))
        if X.shape[1] != len(self.names):
            raise ObjectiveError(f"expected an `n x {len(self.names)}` array of settings; got shape "
                                 f"{X.shape}")
        return X

    def sn_params(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Skew-normal (xi, omega, alpha) at the rows of an `n x 16` array of settings (original units)."""
        Z = self._to_unit(self._as_array(X))
        mean, log_omega, alpha_raw = (np.asarray(v, dtype=np.float64) for v in self._fields(Z))
        omega = np.exp(log_omega)
        alpha = self.alpha_max * np.tanh(alpha_raw / self.alpha_max)
        delta = alpha / np.sqrt(1.0 + alpha**2)
        return mean - omega * delta * _SQRT_2_OVER_PI, omega, alpha

    def mean_array(self, X: np.ndarray) -> np.ndarray:
        """Mean pulse energy at the rows of an `n x 16` array (equals the energy GP, A14)."""
        xi, omega, alpha = self.sn_params(X)
        return xi + omega * (alpha / np.sqrt(1.0 + alpha**2)) * _SQRT_2_OVER_PI

    def noise_sd_array(self, X: np.ndarray) -> np.ndarray:
        """Standard deviation of the simulated pulse energy at the rows of an `n x 16` array (the
        skew-normal's, ``omega sqrt(1 - 2 delta^2 / pi)``)."""
        _, omega, alpha = self.sn_params(X)
        return omega * np.sqrt(1.0 - (alpha**2 / (1.0 + alpha**2)) * _SQRT_2_OVER_PI**2)

    def quantile_array(self, X: np.ndarray, tau: float) -> np.ndarray:
        """Exact tau-quantiles ``xi + omega SN^-1(tau; alpha)`` at the rows of an `n x 16` array."""
        tau = check_tau(tau)
        xi, omega, alpha = self.sn_params(X)
        return xi + omega * skewnorm.ppf(tau, alpha)

    def sample_array(self, X: np.ndarray, rng: np.random.Generator, size: int = 1) -> np.ndarray:
        """`size x n` draws at the rows of an `n x 16` array: ``xi + omega (delta |U0| + sqrt(1-delta^2)
        U1)``."""
        xi, omega, alpha = self.sn_params(X)
        delta = alpha / np.sqrt(1.0 + alpha**2)
        u0, u1 = rng.standard_normal((2, size, xi.size))
        return xi + omega * (delta * np.abs(u0) + np.sqrt(1.0 - delta**2) * u1)

    def initial_data(self, n_synthetic: int = 4000) -> tuple[np.ndarray, np.ndarray]:
        """Measured settings (`n x 16`, original units) and pulse energies (`n`).

        From a CSV: the filtered rows, for the paper's "400 initial points drawn at random from the real
        dataset". Synthetic: `n_synthetic` uniform settings in the box, one simulated shot each (seeded by
        `model_seed`), a stand-in with the same shape.
        """
        if self._X_data is not None:
            return self._X_data.copy(), self._y_data.copy()
        rng = np.random.default_rng([self.model_seed, 0xDA7A])
        X = self._from_unit(rng.random((int(n_synthetic), len(self.names))))
        return X, self.sample_array(X, rng)[0]

    def params_of(self, x: np.ndarray) -> dict[str, float]:
        """The parameter dict of one setting (a `16`-dim array, original units)."""
        return {n: float(v) for n, v in zip(self.names, np.asarray(x, dtype=np.float64).reshape(-1))}

    # ------------------------------------------------------------------------------------------ protocol
    def to_array(self, params: Mapping[str, Any]) -> np.ndarray:
        """Validate `params` and return the setting as a `16`-dim array."""
        check_params(self.space, params)
        return np.array([float(params[n]) for n in self.names], dtype=np.float64)

    def evaluate(self, params: Mapping[str, Any], seed: int) -> float:
        x = self.to_array(params)
        value = float(self.sample_array(x[None], point_rng(seed, x))[0, 0])
        if self.measurement_s:
            time.sleep(self.measurement_s)
        return value

    def quantile(self, params: Mapping[str, Any], tau: float) -> float:
        return float(self.quantile_array(self.to_array(params)[None], tau)[0])

    def optimum(self, tau: float) -> tuple[dict[str, Any], float]:
        """Best tau-quantile over the box: multi-start L-BFGS-B from Sobol points (and the best measured
        settings when built from data), with SN^-1(tau; .) interpolated during the search; cached per tau."""
        tau = check_tau(tau)
        if tau in self._optimum_cache:
            return self._optimum_cache[tau]
        if tau not in self._ppf_splines:
            grid = np.linspace(-self.alpha_max, self.alpha_max, 801)
            self._ppf_splines[tau] = CubicSpline(grid, skewnorm.ppf(tau, grid))
        ppf = self._ppf_splines[tau]

        def fast_quantile(X: np.ndarray) -> np.ndarray:
            xi, omega, alpha = self.sn_params(X)
            return xi + omega * ppf(alpha)

        extra = None
        if self._X_data is not None:
            extra = self._X_data[np.argsort(-fast_quantile(self._X_data))[:5]]
        x, _ = maximize_on_box(fast_quantile, self.bounds[:, 0], self.bounds[:, 1],
                               n_raw=4096, n_starts=15, seed=self.model_seed, extra_starts=extra)
        result = (self.params_of(x), float(self.quantile_array(x[None], tau)[0]))
        self._optimum_cache[tau] = result
        return result
