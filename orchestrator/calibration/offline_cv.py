"""Offline cross-validated recalibration of paper 001 (Kuleshov et al. 2018 inside BO), calibrated-bo.md
§1.2–1.3.

CALIBRATE(M, D): refit the base model on folds of the data, collect out-of-fold forecasts and PIT values
u_i = F_{-i}(y_i), and fit a monotone recalibrator R on (u_i, P̂(u_i)), P̂ the empirical CDF of the PITs:
isotonic regression (sklearn, Kuleshov's choice), a GP regressor (paper 001's choice, made monotone by a
running max), or paper 000's online recalibrator replayed over the PITs in temporal order (Alg. 4). The
calibrated CDF is F~ = R(F), so the level map is R^-1. Splits: leave-one-out, or time-series one-step-ahead
splits (train on the first i points, test on point i+1, for the last `n_splits` points). The sigma-rescaling
mode (§1.6 (a1)) keeps mu and scales sigma by s, s^2 = mean_i z_i^2 of the out-of-fold standardized residuals.
Refits need the data: `update` stores the completed (x, y) of a batch and rebuilds the recalibrator (with fold
refits) once when `refit_every` or more results have come in; `fit(X, Y)` replaces the data (e.g. with the
initial design) and rebuilds now.
Reading the map never refits, so acquisitions stay cheap. Refits reuse earlier folds: a time-series fold
trains on a prefix of the data, which appending results never changes, so its forecast is kept and reused
(only the newest fold is fitted at each step); a LOO fold's model is kept and refitted warm-started from
its previous hyperparameters.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from orchestrator.calibration.base import Calibrator, LevelMap, as_observations
from orchestrator.calibration.options import check_option
from orchestrator.checks import check_int
from orchestrator.errors import ConfigError, InputDataError
from orchestrator.models.predictive import Forecast

__all__ = ["OfflineCVCalibrator", "cv_forecasts"]

#: grid of base levels on which R is evaluated to build the level map
_GRID = np.concatenate([[1e-4, 1e-3, 5e-3], np.linspace(0.01, 0.99, 99), [0.995, 0.999, 1 - 1e-4]])
#: smallest training fold (a GP on one point has no scale)
MIN_TRAIN = 2


def cv_forecasts(
    model_factory: Callable[[], Any],
    X: Tensor,
    Y: Tensor,
    splits: str = "loo",
    n_splits: int | None = None,
    cache: dict[int, Any] | None = None,
    warm_from: Any = None,
) -> tuple[Forecast, Tensor, Tensor]:
    """Out-of-fold forecasts (CREATE_SPLITS + refits of §1.3).

    Args:
        model_factory: returns a fresh unfitted `Surrogate`.
        X: `n x d` points in acquisition order; Y: `n` values.
        splits: "loo" or "time-series".
        n_splits: time-series only: number of one-step-ahead splits (default n - MIN_TRAIN, i.e. all).
        cache: optional dict kept by the caller between calls (fold index -> entry). Time-series: the
            fold's training prefix and its forecast, reused when the prefix is unchanged (the same fit would
            give the same forecast). Not used by LOO.
        warm_from: LOO: a model fitted to all of (X, Y) whose state starts every fold's fit (a warm start that
            depends on the data only, not on the history of fits: a restored calibrator maps the same).

    Returns:
        (forecasts of the held-out points, their `y`, their indices), in temporal order.
    """
    n = X.shape[0]
    if splits == "loo":
        tests = list(range(n))
    elif splits == "time-series":
        k = n - MIN_TRAIN if n_splits is None else min(int(n_splits), n - MIN_TRAIN)
        tests = list(range(n - k, n))
    else:
        raise ConfigError("`calibrator.options.splits` must be one of ['loo', 'time-series']; got "
                          f"{splits!r}")
    records, idx = [], []
    for i in tests:
        train = torch.arange(n) != i if splits == "loo" else torch.arange(n) < i
        if int(train.sum()) < MIN_TRAIN:
            continue
        if splits == "time-series" and cache is not None and i in cache:
            Xc, Yc, recs = cache[i]
            if Xc.shape == X[:i].shape and torch.equal(Xc, X[:i]) and torch.equal(Yc, Y[:i]):
                records.extend(recs)
                idx.append(i)
                continue
        model = model_factory()
        if splits == "loo" and warm_from is not None:
            model.set_state(warm_from.get_state())
        model.fit(X[train], Y[train])
        recs = model.forecast(X[i : i + 1]).to_records()
        if cache is not None and splits == "time-series":
            cache[i] = (X[:i].clone(), Y[:i].clone(), recs)
        records.extend(recs)
        idx.append(i)
    if cache is not None:
        for k in set(cache) - set(idx):  # folds no longer in the split set
            del cache[k]
    if not records:
        raise InputDataError(f"cross-validation needs at least {MIN_TRAIN + 1} observations; got {n}")
    index = torch.tensor(idx)
    return Forecast.from_records(records), Y[index].to(torch.float64), index


def _build_model(model: str, options: dict[str, Any]) -> Any:
    """A fresh surrogate `model` with `options` (the default model factory)."""
    from orchestrator.models import build_model

    return build_model(model, **options)


class OfflineCVCalibrator(Calibrator):
    """`calibrator.type: offline-cv`.

    Args:
        model_factory: callable returning a fresh `Surrogate` (default: `build_model(model,
            **model_options)`).
        model: model name for the default factory ("exact-gp"). In a run (`AskTellOptimizer`) the default is
            the run's own model, with its options and tau: the spec's folds refit "the same model class as M"
            (calibrated-bo.md §1.3); set `model: exact-gp` for a cheaper stand-in of a heteroscedastic SVGP.
        model_options: options of the default factory.
        splits: "loo" (default, both papers' main text) or "time-series".
        n_splits: number of time-series splits (default: all).
        regressor: "isotonic" (default), "gp", or "online" (paper 000's Alg. 4).
        mode: "quantile" (R on PITs) or "sigma" (sigma-rescaling).
        refit_every: rebuild R after this many new results (>= 1).
        min_points: no recalibration (identity) below this many observations.
        eta: step size of the "online" regressor.
        spread: optional `SpreadTracker`.
    """

    name = "offline-cv"
    needs_x = True
    needs_every_result = True  # D is every result, the Sobol design included (calibrated-bo.md §1.3-1.4)
    #: its level map acts only inside the `calibrated` proposer's acquisition: Thompson sampling and Q-GIBBON
    #: would read its spread factor alone (the online calibrator's) after paying for the fold refits
    acquisition_only = True

    def __init__(
        self,
        model_factory: Callable[[], Any] | None = None,
        model: str = "exact-gp",
        model_options: dict[str, Any] | None = None,
        splits: str = "loo",
        n_splits: int | None = None,
        regressor: str = "isotonic",
        mode: str = "quantile",
        refit_every: int = 1,
        min_points: int = 3,
        eta: float = 0.1,
        spread: Any = None,
    ) -> None:
        super().__init__(spread)
        if splits not in ("loo", "time-series"):
            raise ConfigError("`calibrator.options.splits` must be one of ['loo', 'time-series']; got "
                              f"{splits!r}")
        if regressor not in ("isotonic", "gp", "online"):
            raise ConfigError("`calibrator.options.regressor` must be one of ['gp', 'isotonic', 'online']; "
                              f"got {regressor!r}")
        if mode not in ("quantile", "sigma"):
            raise ConfigError(f"`calibrator.options.mode` must be one of ['quantile', 'sigma']; got {mode!r}")
        refit_every = check_int("`calibrator.options.refit_every`", refit_every, 1)
        min_points = check_int("`calibrator.options.min_points`", min_points, MIN_TRAIN + 1)
        n_splits = check_int("`calibrator.options.n_splits`", n_splits, 1, optional=True,
                             must="an integer >= 1 or null")
        # LOO holds out every point: n_splits would be ignored
        if n_splits is not None and splits != "time-series":
            raise ConfigError(
                "`calibrator.options.n_splits` is read only with splits 'time-series'; got n_splits "
                f"{n_splits!r} with splits {splits!r} (leave-one-out holds out every point)"
            )
        if model_factory is None:
            # checked here: wrong types would be a ValueError / TypeError traceback from dict() or the model
            # table
            if not isinstance(model, str):
                raise ConfigError("`calibrator.options.model` must be a model name (a string); got "
                                  f"{model!r}")
            if model_options is not None and not isinstance(model_options, Mapping):
                raise ConfigError(f"`calibrator.options.model_options` must be a mapping of option names to "
                                  f"values; got {model_options!r}")
            opts = dict(model_options or {})
            # a partial of a module-level function, not a closure: the calibrator (an AskTellOptimizer holding
            # it) pickles
            model_factory = functools.partial(_build_model, model, opts)

            # once now: a bad `model` or `model_options` is refused before the run, not at its first refit
            try:
                model_factory()
            except ConfigError as exc:
                raise ConfigError(f"`calibrator.options` (model {model!r}, model_options {opts}): "
                                  f"{str(exc).splitlines()[0]}") from None

        self.model_factory = model_factory
        self.splits, self.n_splits, self.regressor, self.mode = splits, n_splits, regressor, mode
        self.refit_every, self.min_points, self.eta = (
            refit_every,
            min_points,
            check_option("eta", eta, lambda v: v > 0),
        )
        self.X = torch.empty(0, 0, dtype=torch.float64)
        self.Y = torch.empty(0, dtype=torch.float64)
        self._since = 0
        self._map: LevelMap | None = None
        self._scale = 1.0
        self.pits = torch.empty(0, dtype=torch.float64)
        self._z_rms = 1.0
        # cv_forecasts' time-series cache (not state: the same fits rebuild it)
        self._folds: dict[int, Any] = {}

    # ------------------------------------------------------------------ data
    def update(
        self, forecast: Forecast, y: Tensor | float | Sequence[float], X: Tensor | None = None
    ) -> None:
        """Append the `n` results (ask order) and recalibrate once for all of them.

        The recorded forecasts are not used: this calibrator makes its own, out of fold. Taking a batch's
        results one by one, as `Calibrator.update` does, would refit the folds after each point and throw that
        work away at the next one. The spread factor, if any, still steps once per result.
        """
        forecast, yt, X = as_observations(forecast, y, X)
        if X is None:
            raise InputDataError("offline-cv refits the model on folds and needs the point x of each result")
        if self.spread_tracker is not None:
            for i in range(yt.shape[0]):
                self.spread_tracker.update(forecast[i], yt[i], X[i])
        self.num_updates += yt.shape[0]
        self._add(X.reshape(yt.shape[0], -1), yt)

    def _update_one(self, forecast: Forecast, y: Tensor, x: Tensor | None) -> None:
        if x is None:
            raise InputDataError("offline-cv refits the model on folds and needs the point x of each result")
        self._add(x.reshape(1, -1), y.reshape(1))

    def observe(self, y: Tensor | Sequence[float], X: Tensor) -> None:
        """Results without a forecast (the initial design): added to the data like any other (the forecasts of
        `update` are not used: this calibrator makes its own, out of fold), then one refit for all of them."""
        y = torch.as_tensor(y, dtype=torch.float64).reshape(-1)
        if y.numel():
            self._add(torch.as_tensor(X).reshape(y.shape[0], -1), y)

    def _add(self, X: Tensor, y: Tensor) -> None:
        """Append `n` results (`n x d`, `n`) and recalibrate if `refit_every` new ones have come in."""
        X, y = X.to(torch.float64), y.to(torch.float64)
        self.X = X if self.X.numel() == 0 else torch.cat([self.X, X])
        self.Y = torch.cat([self.Y, y])
        self._since += y.shape[0]
        self._maybe_refit()

    def fit(self, X: Tensor, Y: Tensor) -> None:
        """Replace the data by all completed results (`n x d`, `n`, acquisition order) and recalibrate now."""
        self.X, self.Y = X.to(torch.float64).clone(), Y.to(torch.float64).reshape(-1).clone()
        self._refit()

    def _maybe_refit(self) -> None:
        if self._since >= self.refit_every and self.Y.numel() >= self.min_points:
            self._refit()

    def _refit(self) -> None:
        self._since = 0
        if self.Y.numel() < self.min_points:
            self._map, self._scale = None, 1.0
            return
        warm = None
        if self.splits == "loo":  # every fold starts from a cold fit to all the data (deterministic given it)
            warm = self.model_factory()
            warm.fit(self.X, self.Y)
            try:
                warm.get_state()
            except NotImplementedError:  # a model without state: cold folds
                warm = None
        fc, y, _ = cv_forecasts(
            self.model_factory, self.X, self.Y, self.splits, self.n_splits, self._folds, warm
        )
        self.pits = fc.cdf(y).clamp(0.0, 1.0)
        z = (y - fc.mean()) / fc.variance().clamp_min(1e-300).sqrt()
        self._z_rms = float(z.pow(2).mean().sqrt())
        self._build_map()

    def _build_map(self) -> None:
        """The level map from the stored out-of-fold PITs (or the (a1) scale in sigma mode); no refits."""
        u = self.pits
        if self.mode == "sigma":
            if not (math.isfinite(self._z_rms) and self._z_rms > 1e-12):
                # no out-of-fold error at all (e.g. every outcome equal): nothing to rescale by; identity
                self._map, self._scale = None, 1.0
                return
            self._scale = self._z_rms
            p = torch.as_tensor(_GRID)
            # calibrated CDF R(u) = Phi(Phi^-1(u)/s), so the level map R^-1(p) = Phi(s Phi^-1(p)) widens by s
            self._map = LevelMap(_GRID, torch.special.ndtr(torch.special.ndtri(p) / self._scale).numpy())
            return
        R = self._fit_regressor(u.numpy())  # calibrated CDF value for each base PIT on _GRID
        # the level map is R^-1: knots (R(g), g) -> build the map of R on the grid and invert it
        self._map = LevelMap(_GRID, R)
        self._scale = Calibrator.sigma_scale(self)

    def _fit_regressor(self, u: np.ndarray) -> np.ndarray:
        """Values of the recalibrator R on `_GRID` (monotone, in [0, 1])."""
        if self.regressor == "online":
            from orchestrator.calibration.online import OnlineQuantileRecalibrator

            rec = OnlineQuantileRecalibrator(eta=self.eta)
            rec.update_pit(torch.as_tensor(u))  # temporal order of the splits
            return rec.unmap_levels(torch.as_tensor(_GRID)).numpy()
        p_hat = (u[None, :] <= u[:, None]).mean(axis=1)  # P̂(u_t) = |{s : u_s <= u_t}| / N
        if self.regressor == "isotonic":
            from sklearn.isotonic import IsotonicRegression

            iso = IsotonicRegression(y_min=0.0, y_max=1.0, out_of_bounds="clip", increasing=True)
            iso.fit(np.concatenate([[0.0], u, [1.0]]), np.concatenate([[0.0], p_hat, [1.0]]))
            return np.clip(iso.predict(_GRID), 0.0, 1.0)
        from scipy.stats import norm
        from sklearn.gaussian_process import GaussianProcessRegressor
        from sklearn.gaussian_process.kernels import RBF, ConstantKernel, WhiteKernel

        # regress in probit coordinates of u: an over-confident forecast puts its PITs at 1e-10 and 1 - 1e-10,
        # where R is steep in u but smooth in Phi^-1(u)
        def z(v: np.ndarray) -> np.ndarray:
            return norm.ppf(np.clip(v, 1e-12, 1 - 1e-12))[:, None]

        # the GP models R(u) - u, so that away from the PITs it falls back to the identity (calibrated), not
        # to the mean of p-hat: that would hold R at ~0.46 from u = 1e-4 to the median for uniform PITs, a
        # point mass at -inf; made monotone by isotonic regression, not a running maximum
        from sklearn.isotonic import IsotonicRegression

        gp = GaussianProcessRegressor(
            ConstantKernel(1.0) * RBF(1.0) + WhiteKernel(1e-3), normalize_y=True, random_state=0
        )
        gp.fit(z(u), p_hat - u)
        r = np.clip(_GRID + gp.predict(z(_GRID)), 0.0, 1.0)
        return np.clip(IsotonicRegression(increasing=True).fit(_GRID, r).predict(_GRID), 0.0, 1.0)

    # ------------------------------------------------------------------ the map
    def map_levels(self, p: Tensor) -> Tensor:
        """R^-1(p): base level whose quantile is the calibrated p-quantile."""
        if self._map is None:
            return torch.as_tensor(p, dtype=torch.float64).clone()
        return self._map.inverse(p)

    def unmap_levels(self, u: Tensor) -> Tensor:
        """R(u): calibrated CDF value of a base PIT u."""
        if self._map is None:
            return torch.as_tensor(u, dtype=torch.float64).clone()
        return self._map(u)

    def sigma_scale(self) -> float:
        """s of the sigma route: (a1) in sigma mode, the (a2) fit of the map otherwise."""
        return self._scale if self._map is not None else 1.0

    # ----------------------------------------------- state (data and PITs; the map is rebuilt without refits)
    #: a state restored into a calibrator built otherwise would rebuild its map with these options, not the
    #: saved ones (a sigma-mode state would restore silently into a GP-regressor calibrator); the model
    #: factory is not compared (a run passes its own model)
    option_keys = ("splits", "n_splits", "regressor", "mode", "refit_every", "min_points", "eta")

    def _option_values(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.option_keys}

    def _get_state(self) -> dict[str, Any]:
        return {"X": self.X.clone(), "Y": self.Y.clone(), "since": self._since, "pits": self.pits.clone(),
                "z_rms": self._z_rms, "fitted": self._map is not None, **self._option_values()}

    def _set_state(self, state: dict[str, Any]) -> None:
        self.X, self.Y = state["X"].clone().to(torch.float64), state["Y"].clone().to(torch.float64)
        self._since = int(state["since"])
        self._folds = {}
        self.pits, self._z_rms = state["pits"].clone().to(torch.float64), float(state["z_rms"])
        self._map, self._scale = None, 1.0
        if bool(state["fitted"]):
            self._build_map()
