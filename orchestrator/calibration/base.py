"""The calibrator interface: what the central actor feeds with one-step-ahead results.

A calibrator consumes, in ask order (`AskTellOptimizer.flush_calibration` sorts the results it has), the
`Forecast` recorded when a point was proposed and the observed y (calibrated-bo.md §1.5 "pure online",
locbo.md §1.3). It never sees pending or fantasized
points: only `update` changes its state, and only the actor calls it, with completed results.
Its current map sends a nominal level p to the level of the base forecast to use,
Q̃_x(p) = Q_x(R(p)) (calibrated-bo.md §1.5–1.6), and its `spread(X)` is the factor s(x) by which
Thompson sampling and Q-GIBBON widen the posterior of f (spread.py). State is plain values and
tensors (`get_state`/`set_state`), so a resume restores it or rebuilds it by replaying the log.
"""

from __future__ import annotations

import math
from abc import ABC
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from orchestrator.calibration.options import check_same_options
from orchestrator.calibration.spread import SPREAD_MAX, SPREAD_MIN
from orchestrator.errors import InputDataError, QbatchError
from orchestrator.models.predictive import Forecast

__all__ = [
    "Calibrator",
    "CalibratedForecast",
    "IdentityCalibrator",
    "LEVEL_EPS",
    "LevelMap",
    "as_observations",
    "monotone_interp",
]

#: inside the calibrated acquisitions (UCB, PI) recalibrated levels are clipped to [LEVEL_EPS, 1 - LEVEL_EPS]
#: before a quantile is taken, so that a level pushed outside (0, 1) (calibrated-bo.md §1.5 Lemma 3: q in
#: [-eta, 1 + eta]) gives a wide but finite quantile to optimize; the sigma route leaves such levels out of
#: its fit. `CalibratedForecast.quantile` does not clip (it reports infinite quantiles). The spec leaves the
#: clip open ("[not in paper]")
LEVEL_EPS = 1e-6


def as_observations(
    forecast: Forecast, y: Tensor | float | Sequence[float], X: Tensor | None = None
) -> tuple[Forecast, Tensor, Tensor | None]:
    """Check a (forecast, y[, X]) triple and return it with `y` as an `n` float64 tensor.

    Raises:
        InputDataError: `forecast` is not a `Forecast`, lengths differ, y or the forecast's CDF at y is not
            finite, or X has the wrong shape.
    """
    if not isinstance(forecast, Forecast):
        raise InputDataError("forecast must be an orchestrator.models.predictive.Forecast; got "
                             f"{type(forecast).__name__}")
    yt = torch.as_tensor(y, dtype=torch.float64).reshape(-1)
    if yt.shape[0] != len(forecast):
        raise InputDataError(f"y has {yt.shape[0]} values but the forecast has {len(forecast)} points")
    bad = ~torch.isfinite(yt)
    if bad.any():
        i = int(bad.nonzero()[0])
        raise InputDataError(f"y[{i}] is not finite ({yt[i].item()}); failures must never reach a calibrator")
    bad = ~torch.isfinite(torch.as_tensor(forecast.cdf(yt), dtype=torch.float64).reshape(-1))
    if bad.any():  # a NaN PIT is read differently by each calibrator (above every level, a miss, a hit)
        i = int(bad.nonzero()[0])
        raise InputDataError(f"forecast {i} is not finite at y = {yt[i].item()} (its CDF there is not a "
                             "number)")
    if X is not None:
        X = torch.as_tensor(X, dtype=torch.float64)
        X = X.reshape(1, -1) if X.ndim == 1 and len(forecast) == 1 else X
        if X.ndim != 2 or X.shape[0] != len(forecast):
            raise InputDataError(f"X must be `n x d` with n = {len(forecast)}; got shape {tuple(X.shape)}")
    return forecast, yt, X


def monotone_interp(x: Tensor, xp: Tensor, fp: Tensor) -> Tensor:
    """Piecewise-linear interpolation through knots (`xp` increasing, `fp` non-decreasing), differentiable in
    `x`.

    Values outside [xp[0], xp[-1]] are clamped to the end values. `x` has any shape.
    """
    xp = xp.to(x)
    fp = fp.to(x)
    xc = x.clamp(xp[0], xp[-1])
    idx = torch.searchsorted(xp.contiguous(), xc.detach().contiguous(), right=True).clamp(1, xp.numel() - 1)
    x0, x1 = xp[idx - 1], xp[idx]
    f0, f1 = fp[idx - 1], fp[idx]
    w = (xc - x0) / (x1 - x0).clamp_min(1e-300)
    return f0 + w * (f1 - f0)


class CalibratedForecast:
    """A `Forecast` seen through a monotone level map: Q̃(p) = Q(R(p)), F̃(y) = R^{-1}(F(y)).

    Args:
        forecast: the base forecast (`n` points).
        calibrator: supplies `map_levels` (R) and `unmap_levels` (R^{-1}).
    """

    def __init__(self, forecast: Forecast, calibrator: Calibrator) -> None:
        self.base = forecast
        self.calibrator = calibrator

    def __len__(self) -> int:
        return len(self.base)

    def cdf(self, y: Tensor | float) -> Tensor:
        """Recalibrated CDF R^{-1}(F(y)), same shape rules as `Forecast.cdf`."""
        return self.calibrator.unmap_levels(self.base.cdf(y))

    def quantile(self, levels: Tensor | Sequence[float] | float) -> Tensor:
        """`n x k` recalibrated quantiles Q(R(p)); -inf where R(p) = 0 and +inf where R(p) = 1 (a level the
        online recursion pushed out of [0, 1], calibrated-bo.md §1.5 Lemma 3: q < 0 means Q(q) = -inf).

        The mapped levels are not clipped: clipping them to [LEVEL_EPS, 1 - LEVEL_EPS] would end every
        interval at 4.75 base sd, and a central 90% interval of a model 3x over-confident would cover 0.795 of
        y where the recalibrated CDF covers 0.90.
        """
        p = torch.as_tensor(levels, dtype=torch.float64).reshape(-1)
        r = self.calibrator.map_levels(p)
        q = self.base.quantile(
            r.clamp(torch.finfo(torch.float64).tiny, 1 - torch.finfo(torch.float64).eps / 2)
        )
        q = torch.where(r <= 0, torch.tensor(-math.inf, dtype=q.dtype), q)
        return torch.where(r >= 1, torch.tensor(math.inf, dtype=q.dtype), q)

    def interval(self, coverage: float) -> tuple[Tensor, Tensor]:
        """Recalibrated central interval of nominal `coverage`: (lower `n`, upper `n`)."""
        if not 0 < coverage < 1:
            raise ValueError(f"coverage must be in (0, 1); got {coverage}")
        q = self.quantile([(1 - coverage) / 2, (1 + coverage) / 2])
        return q[:, 0], q[:, 1]


class Calibrator(ABC):  # noqa: B024 -- a subclass overrides one of two update hooks, either
    """Base class of every calibrator (`orchestrator.protocols.CalibratorProtocol`): identity map and unit
    spread until a subclass learns otherwise.

    Subclasses override `_update_one` (one completed result, O(levels)) or `_update_results` (the results of
    one `update` call together) and, when their map is not the
    identity, `map_levels`/`unmap_levels`. A `SpreadTracker` (spread.py), when given, is updated with every
    result and answers `spread(X)`.

    Args:
        spread: a `SpreadTracker`, or None for s(x) = 1.
    """

    #: config name (`calibrator.type`)
    name: str = "base"
    #: whether `update` needs the unit-cube point X of each result (localized calibrators)
    needs_x: bool = False
    #: whether results without a recorded forecast (the initial design, user points) must reach `observe`:
    #: a calibrator that makes its own forecasts (offline-cv's cross-validation) works on all of the data
    needs_every_result: bool = False
    #: whether it acts only inside the acquisition of proposer 'calibrated' (conformal, offline-cv): `attach`
    #: refuses it for a proposer that would use its spread factor alone
    acquisition_only: bool = False
    #: the options of its own and the spread options the config set (`build_calibrator` records them), so
    #: that `attach` can refuse those the chosen proposer would never read
    given_options: tuple[str, ...] = ()
    given_spread_options: tuple[str, ...] = ()

    def __init__(self, spread: Any = None) -> None:
        self.spread_tracker = spread
        self.num_updates = 0

    # ------------------------------------------------------------------ online updates
    def update(
        self, forecast: Forecast, y: Tensor | float | Sequence[float], X: Tensor | None = None
    ) -> None:
        """Consume completed results (the optimizer's flush passes the results told since the last ask per
        call).

        By default each result is scored against the level (LOCBO: threshold) left by the results before it,
        in the order given (`_update_one`); the online guarantee holds for any ordering (calibrated-bo.md
        §4.2). The online recalibrator instead scores all of them at the levels in force and takes one step
        (§4.3; `OnlineQuantileRecalibrator.update_pit_batch`): the optimizer calls it once per ask, so in a
        synchronous run these are the levels the batch was proposed with. The spread factor, if any, steps
        once per result.

        Args:
            forecast: the forecast recorded when the point(s) were proposed (`n` points; the optimizer passes
                the results told since the last ask, one batch's in a synchronous run, in ask order).
            y: the `n` observed values (original units, finite).
            X: optional `n x d` unit-cube points; required by localized calibrators (`needs_x`).

        Raises:
            InputDataError: mismatched lengths, non-finite y, or a missing X where `needs_x`.
        """
        forecast, yt, X = as_observations(forecast, y, X)
        if X is None and (self.needs_x or (self.spread_tracker is not None and self.spread_tracker.needs_x)):
            raise InputDataError(f"calibrator {self.name!r} is localized and needs the points X of each "
                                 "result")
        self._update_results(forecast, yt, X)
        if self.spread_tracker is not None:
            for i in range(yt.shape[0]):
                self.spread_tracker.update(forecast[i], yt[i], None if X is None else X[i])
        self.num_updates += yt.shape[0]

    def _update_results(self, forecast: Forecast, y: Tensor, X: Tensor | None) -> None:
        """The `n` results of one `update` call: by default one `_update_one` each, in the order given."""
        for i in range(y.shape[0]):
            self._update_one(forecast[i], y[i], None if X is None else X[i])

    def _update_one(self, forecast: Forecast, y: Tensor, x: Tensor | None) -> None:
        """One result: `forecast` of one point, scalar `y`, `d` point `x` (or None)."""

    def observe(self, y: Tensor | Sequence[float], X: Tensor) -> None:
        """Results that carry no forecast (`n` values at `n x d` points), for `needs_every_result`
        calibrators; the others learn only from forecasts and ignore them."""

    # ------------------------------------------------------------------ the current map
    def map_levels(self, p: Tensor) -> Tensor:
        """Nominal levels `p` (any shape) -> levels R(p) of the base forecast to use (identity here)."""
        return torch.as_tensor(p, dtype=torch.float64).clone()

    def unmap_levels(self, u: Tensor) -> Tensor:
        """Inverse map R^{-1}: base PIT values -> calibrated PIT values (identity here)."""
        return torch.as_tensor(u, dtype=torch.float64).clone()

    def sigma_scale(self) -> float:
        """Global scale s of the Gaussian sigma-rescaling route (calibrated-bo.md §1.6 (a2)).

        Least-squares match of the recalibrated quantiles: s = sum_k z_k z~_k / sum_k z_k^2 with z_k =
        Phi^-1(p_k), z~_k = Phi^-1(R(p_k)) over p_k = 0.05, 0.10, ..., 0.95, leaving out levels whose R(p_k)
        is clipped (outside [LEVEL_EPS, 1 - LEVEL_EPS]: an infinite quantile has no finite scale). 1 for the
        identity map. Clipped to [SPREAD_MIN, SPREAD_MAX], as the spread factor is: a biased model's map drops
        the levels of one tail, and the fit through the origin can then come out negative (-0.56 for a mean 2
        sd off with the right spread), which would turn the sigma-route EI to <= 0 everywhere and UCB into
        LCB.
        """
        p = torch.arange(1, 20, dtype=torch.float64) / 20
        r = self.map_levels(p)
        ok = (r > LEVEL_EPS) & (r < 1 - LEVEL_EPS)
        if not ok.any():
            ok = torch.ones_like(ok)
        z = torch.special.ndtri(p[ok])
        zt = torch.special.ndtri(r[ok].clamp(LEVEL_EPS, 1 - LEVEL_EPS))
        return min(max(float((z * zt).sum() / (z * z).sum()), SPREAD_MIN), SPREAD_MAX)

    def recalibrate(self, forecast: Forecast) -> CalibratedForecast:
        """The forecast under the current map (quantiles Q(R(p)), CDF R^{-1}(F))."""
        return CalibratedForecast(forecast, self)

    def spread(self, X: Tensor) -> Tensor:
        """Spread factor s(x) for `... x n x d` points -> `... x n` (ones when no tracker)."""
        if self.spread_tracker is None:
            return torch.ones(X.shape[:-1], dtype=X.dtype, device=X.device)
        return self.spread_tracker(X)

    # ------------------------------------------------------------------ state
    def get_state(self) -> dict[str, Any]:
        """Plain values and tensors only (loads with `torch.load(weights_only=True)`)."""
        state: dict[str, Any] = {"name": self.name, "num_updates": self.num_updates}
        state.update(self._get_state())
        if self.spread_tracker is not None:
            state["spread"] = self.spread_tracker.get_state()
        return state

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore from `get_state`. A state saved with other options (`option_keys`) or with a spread factor
        this calibrator lacks, or the reverse, raises `QbatchError` naming the keys: the state would otherwise
        replace the options this calibrator was built with."""
        if state.get("name") != self.name:
            raise InputDataError(f"state belongs to calibrator {state.get('name')!r}, not {self.name!r}")
        if self.option_keys:
            check_same_options(f"calibrator {self.name!r}", self._option_values(), state, self.option_keys)
        if (self.spread_tracker is None) != ("spread" not in state):
            raise QbatchError(f"calibrator {self.name!r}: the state was saved "
                              f"{'with' if 'spread' in state else 'without'} a spread factor, this "
                              f"calibrator has {'one' if self.spread_tracker is not None else 'none'} "
                              "(option `spread`)")
        self.num_updates = int(state["num_updates"])
        self._set_state(state)
        if self.spread_tracker is not None and "spread" in state:
            self.spread_tracker.set_state(state["spread"])

    def _get_state(self) -> dict[str, Any]:
        return {}

    def _set_state(self, state: dict[str, Any]) -> None:
        pass

    #: the keys of `_get_state` that are options (fixed when built), not learned state
    option_keys: tuple[str, ...] = ()

    def _option_values(self) -> dict[str, Any]:
        """This calibrator's values of `option_keys`, compared with a state's by `set_state` (the state by
        default; a calibrator whose state holds its data returns the options alone)."""
        return self._get_state()


class IdentityCalibrator(Calibrator):
    """`calibrator.type: none`: the identity map and s(x) = 1; it still counts the results it sees."""

    name = "none"


#: slope bounds of the level map's linear tails in probit space (beyond the first and last level)
TAIL_SLOPE_MIN, TAIL_SLOPE_MAX = 0.05, 50.0
#: levels are kept inside [_P_FLOOR, 1 - _P_FLOOR] before the probit transform (Phi^-1(1e-15) = -7.9)
_P_FLOOR = 1e-15


def _interp_extrap(x: Tensor, xp: Tensor, fp: Tensor, slope_lo: float, slope_hi: float) -> Tensor:
    """Piecewise-linear through (xp, fp) inside, linear with the given slopes outside; differentiable in x."""
    inner = monotone_interp(x, xp, fp)
    lo = fp[0] + slope_lo * (x - xp[0])
    hi = fp[-1] + slope_hi * (x - xp[-1])
    return torch.where(x < xp[0], lo, torch.where(x > xp[-1], hi, inner))


class LevelMap:
    """A monotone map R of [0, 1] onto itself through knots (p_k, r_k), linear in probit space.

    R(p) = Phi(h(Phi^-1(p))) with h piecewise linear through (Phi^-1(p_k), Phi^-1(r_k)) and linear tails (end
    slopes clamped to [TAIL_SLOPE_MIN, TAIL_SLOPE_MAX]). Interpolating in probit space keeps resolution in the
    tails, where an over-confident forecast puts its PITs, and represents a pure scale error of a Gaussian
    forecast exactly (h linear). The knot values are first made monotone (`rearrangement`). A knot value <= 0
    or >= 1 keeps the theorem's meaning (calibrated-bo.md §1.5: Q(p) = -inf for p < 0, +inf for p > 1):
    R = 0 (resp. 1) at and beyond that knot, so intervals built from R are unbounded there.

    Args:
        levels: `K` increasing knot positions in (0, 1).
        values: `K` raw values R(p_k) (any reals; e.g. the OGD iterates, possibly crossing or outside [0, 1]).
        rearrangement: "isotonic" (pool adjacent violators: crossing neighbours are averaged; moves them
            least) or "sort" (monotone rearrangement). Neither changes an already monotone sequence.
    """

    def __init__(self, levels: np.ndarray, values: np.ndarray, rearrangement: str = "isotonic") -> None:
        values = np.asarray(values, dtype=np.float64)
        levels = np.asarray(levels, dtype=np.float64)
        if rearrangement == "sort":
            v = np.sort(values)
        elif rearrangement == "isotonic":
            from scipy.optimize import isotonic_regression

            v = isotonic_regression(values).x
        else:
            raise ValueError(f"rearrangement must be 'isotonic' or 'sort'; got {rearrangement!r}")
        low, high = v <= 0.0, v >= 1.0
        #: R = 0 for p <= lo_cut, R = 1 for p >= hi_cut (levels sent to -inf / +inf quantiles)
        self.lo_cut = float(levels[low].max()) if low.any() else 0.0
        self.hi_cut = float(levels[high].min()) if high.any() else 1.0
        fin = ~(low | high)
        zp = torch.special.ndtri(torch.as_tensor(levels[fin]))
        zf = torch.special.ndtri(torch.as_tensor(v[fin]))
        # strictly increasing values so the inverse is a function (ties broken by a negligible ramp)
        if zf.numel():
            zf = torch.cummax(zf, 0).values + torch.linspace(0.0, 1e-9, zf.numel(), dtype=zf.dtype)
        self.zp, self.zf = zp, zf
        if zp.numel() >= 2:
            sl = float((zf[1] - zf[0]) / (zp[1] - zp[0]))
            sh = float((zf[-1] - zf[-2]) / (zp[-1] - zp[-2]))
        else:
            sl = sh = 1.0
        self.slope_lo = min(max(sl, TAIL_SLOPE_MIN), TAIL_SLOPE_MAX)
        self.slope_hi = min(max(sh, TAIL_SLOPE_MIN), TAIL_SLOPE_MAX)

    def __call__(self, p: Tensor) -> Tensor:
        """R(p) for `p` of any shape, values in [0, 1]."""
        p = torch.as_tensor(p, dtype=torch.float64)
        if self.zp.numel() == 0:
            # every level at 0 or 1: a step function, flat in p (`0 * p` keeps the graph: an acquisition built
            # on it must still differentiate, or PI's optimizer raises on it)
            return torch.where(p <= self.lo_cut, 0.0, torch.where(p >= self.hi_cut, 1.0, 0.5)).to(p) + 0.0 * p
        z = torch.special.ndtri(p.clamp(_P_FLOOR, 1 - _P_FLOOR))
        r = torch.special.ndtr(_interp_extrap(z, self.zp.to(z), self.zf.to(z), self.slope_lo, self.slope_hi))
        return torch.where(
            p <= self.lo_cut, torch.zeros_like(r), torch.where(p >= self.hi_cut, torch.ones_like(r), r)
        )

    def inverse(self, u: Tensor) -> Tensor:
        """R^{-1}(u) for `u` of any shape, values in [lo_cut, hi_cut]."""
        u = torch.as_tensor(u, dtype=torch.float64)
        if self.zp.numel() == 0:  # flat, with the graph kept (see `__call__`)
            return torch.full_like(u, self.lo_cut if self.lo_cut > 0 else self.hi_cut) + 0.0 * u
        z = torch.special.ndtri(u.clamp(_P_FLOOR, 1 - _P_FLOOR))
        r = torch.special.ndtr(
            _interp_extrap(z, self.zf.to(z), self.zp.to(z), 1 / self.slope_lo, 1 / self.slope_hi)
        )
        return r.clamp(self.lo_cut, self.hi_cut)
