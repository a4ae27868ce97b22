"""Online quantile recalibration of paper 000 (Deshpande, Marx, Kuleshov), calibrated-bo.md §1.5.

Per level p_k, online gradient descent on the quantile pinball loss of the PIT values u_t = F_t(y_t):
q_{k, t+1} = q_{k, t} + eta (p_k - 1{u_t <= q_{k, t}}), the spec's corrected sign of eq. (9) (the paper prints
q_t = +eta sum g_s). Started at q = p (identity map). Guarantee (Thm 4.2, eq. 10), for any sequence:
|(1/T) sum_t 1{u_t <= q_{k, t}} - p_k| <= (1 + eta) / (eta T). Per-level trajectories can cross
(spec caveat to Lemma 4), so the map R(p) interpolates monotone levels: by default their isotonic fit (pool
adjacent violators, `rearrangement="isotonic"`), or the sorted levels (`rearrangement="sort"`, monotone
rearrangement). `update` (the optimizer's flush passes the results told since the last ask, one batch's in a
synchronous run) scores them at the levels in force, those the batch was proposed with in a synchronous run,
and takes one step
with their mean gradient (§4.3): then T in the bounds counts asks, not results. `update_pit` steps once per
PIT value. `OnlineIntervalCalibrator` is the conformal interval variant: two levels (1 -+ c)/2 per coverage c
(ACI on PIT scores, miscoverage -> 1 - c at rate 2(1 + eta)/(eta T), T steps).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from orchestrator.calibration.base import Calibrator, LevelMap
from orchestrator.checks import check_float
from orchestrator.errors import ConfigError
from orchestrator.models.predictive import Forecast

__all__ = ["OnlineQuantileRecalibrator", "OnlineIntervalCalibrator", "DEFAULT_LEVELS", "DEFAULT_ETA"]

#: default level grid: 0.05, 0.10, ..., 0.95 plus 0.01, 0.025, 0.975, 0.99 (the paper leaves K open, spec
#: §1.5); it holds both ends of the central 50/80/90% intervals
DEFAULT_LEVELS: tuple[float, ...] = (
    (0.01, 0.025) + tuple(round(0.05 * k, 2) for k in range(1, 20)) + (0.975, 0.99)
)
#: default OGD step size eta (spec §1.5: not given in the paper); bound (1+eta)/(eta T) = 0.037 after T = 300
#: steps (300 results one at a time, or 300 batches).
#: Larger steps make neighbouring levels of the default grid cross more often, and the rearrangement then
#: moves the map away from the raw iterates the bound is about
DEFAULT_ETA = 0.1


def _check_levels(levels: Sequence[float], key: str = "levels") -> np.ndarray:
    try:
        lv = np.unique(np.asarray([float(v) for v in levels], dtype=np.float64))
    except (TypeError, ValueError):
        raise ConfigError(f"`calibrator.options.{key}` must be a list of numbers in (0, 1); got "
                          f"{levels!r}") from None
    if lv.size == 0 or not np.all((lv > 0) & (lv < 1)):
        raise ConfigError(f"`calibrator.options.{key}` must be non-empty, each in (0, 1); got "
                          f"{list(levels)!r}")
    return lv


def _check_eta(eta: float) -> float:
    return check_float("`calibrator.options.eta`", eta, 0.0, lo_open=True, must="a finite number > 0")


class OnlineQuantileRecalibrator(Calibrator):
    """`calibrator.type: online`: per-level OGD on the pinball loss of PITs, with monotone rearrangement.

    Args:
        levels: nominal levels p_k in (0, 1) (sorted and deduplicated).
        eta: OGD step size > 0.
        rearrangement: how crossing levels are made monotone: "isotonic" (default, pool adjacent violators)
            or "sort" (monotone rearrangement); neither is in the paper (spec §1.5 caveat).
        spread: optional `SpreadTracker` (spread.py) for the SVGP proposers.
    """

    name = "online"

    def __init__(
        self,
        levels: Sequence[float] = DEFAULT_LEVELS,
        eta: float = DEFAULT_ETA,
        rearrangement: str = "isotonic",
        spread: Any = None,
    ) -> None:
        super().__init__(spread)
        self.levels = _check_levels(levels)
        self.eta = _check_eta(eta)
        if rearrangement not in ("isotonic", "sort"):
            raise ConfigError("`calibrator.options.rearrangement` must be one of ['isotonic', 'sort']; got "
                              f"{rearrangement!r}")
        self.rearrangement = rearrangement
        self.reset()

    def reset(self) -> None:
        """Back to the identity map, with no results seen."""
        self.q = self.levels.copy()  # raw per-level trajectories, may leave [0, 1] (Lemma 3)
        self.hits = np.zeros_like(self.levels)  # sum_t 1{u_t <= q_{k,t}}: coverage actually achieved
        self.T = 0
        self._map: LevelMap | None = None

    # ------------------------------------------------------------------ updates
    def update_pit(self, u: float | Sequence[float] | Tensor) -> None:
        """OGD steps for PIT values u (in order): q_k += eta (p_k - 1{u <= q_k}); O(K) each."""
        for v in torch.as_tensor(u, dtype=torch.float64).reshape(-1, 1).numpy():
            self._step(v)

    def update_pit_batch(self, u: float | Sequence[float] | Tensor) -> None:
        """One OGD step for a batch of PIT values scored at the same levels (calibrated-bo.md §4.3):
        q_k += eta (p_k - mean_i 1{u_i <= q_k}).

        The batch's points were proposed under one map, so that is the map their results are scored against.
        Stepping once per result instead (`update_pit`) scores most of them at levels their proposals never
        used, and the map the proposals did use then covers too much: 0.957 of a central 90% interval with
        batches of 10 and eta 0.1 on an over-confident model
        (`tests/orchestrator/calibration/test_online.py`). Summing the steps, as the spec's §4.3 writes it,
        widens Lemma 3's range to [-B eta, 1 + B eta]; the mean keeps q in [-eta, 1 + eta], and the bound of
        eq. (10) holds for the mean coverage of the batches at their own levels, |(1/N) sum_b mean_i 1{u_bi <=
        q_kb} - p_k| <= (1 + eta) / (eta N) over N batches.
        """
        v = torch.as_tensor(u, dtype=torch.float64).reshape(-1).numpy()
        if v.size:
            self._step(v)

    def _step(self, v: np.ndarray) -> None:
        """One OGD step for the PIT values `v` (one or more), all scored at the current levels."""
        o = (v[:, None] <= self.q[None, :]).astype(np.float64)
        self.hits += o.sum(axis=0)
        self.q = self.q + self.eta * (self.levels - o.mean(axis=0))
        self.T += v.size
        self._map = None

    def _update_results(self, forecast: Forecast, y: Tensor, X: Tensor | None) -> None:
        # the results told since the last ask (the optimizer's flush): one step at the levels in force, those
        # the batch was proposed with in a synchronous run. In a streaming run they come from batches proposed
        # under earlier maps; scoring them at those (delayed-feedback OGD, a snapshot per open batch) was
        # measured worse with many small batches in flight, whose stale steps overshoot: 0.937 of a central
        # 90% interval with 16 single-point batches, against 0.905 (test_online.py's streaming test)
        self.update_pit_batch(forecast.cdf(y))

    def coverage(self) -> np.ndarray:
        """(1/T) sum_t 1{u_t <= q_{k,t}} per level, each result scored at the levels it was scored against
        (its batch's, for `update_pit_batch`): the frequency the theorem bounds, for batches the mean over
        batches when they are of one size (NaN before any update)."""
        return self.hits / self.T if self.T else np.full_like(self.levels, np.nan)

    # ------------------------------------------------------------------ the map
    def level_map(self) -> LevelMap:
        """The current monotone map R_t (rebuilt lazily after updates)."""
        if self._map is None:
            self._map = LevelMap(self.levels, self.q, self.rearrangement)
        return self._map

    def map_levels(self, p: Tensor) -> Tensor:
        """R_t(p): the rearranged levels, interpolated in probit space (base.LevelMap), values in [0, 1]."""
        return self.level_map()(p)

    def unmap_levels(self, u: Tensor) -> Tensor:
        """R_t^{-1}(u), so that the recalibrated CDF is R_t^{-1}(F(y))."""
        return self.level_map().inverse(u)

    def raw_levels(self) -> np.ndarray:
        """The un-rearranged per-level OGD iterates q_k (may cross, may leave [0, 1])."""
        return self.q.copy()

    # ------------------------------------------------------------------ state
    option_keys = ("levels", "eta", "rearrangement")

    def _get_state(self) -> dict[str, Any]:
        return {
            "levels": torch.tensor(self.levels),
            "eta": self.eta,
            "rearrangement": self.rearrangement,
            "q": torch.tensor(self.q),
            "hits": torch.tensor(self.hits),
            "T": self.T,
        }

    def _set_state(self, state: dict[str, Any]) -> None:
        self.levels = state["levels"].numpy().astype(np.float64).copy()
        self.eta = float(state["eta"])
        self.rearrangement = str(state["rearrangement"])
        self.q = state["q"].numpy().astype(np.float64).copy()
        self.hits = state["hits"].numpy().astype(np.float64).copy()
        self.T = int(state["T"])
        self._map = None


class OnlineIntervalCalibrator(OnlineQuantileRecalibrator):
    """Conformal interval variant (spec §1.5): levels (1 - c)/2 and (1 + c)/2 for each coverage c.

    `interval_levels(c)` gives the base-forecast levels whose quantiles bound the recalibrated central
    interval; a level <= 0 or >= 1 means an infinite end (the theorem's convention), which is what
    `interval` returns, so its long-run coverage is exactly guaranteed.

    Args:
        coverages: nominal central coverages c in (0, 1).
        eta: OGD step size > 0.
        spread: optional `SpreadTracker`.
    """

    name = "online-interval"

    def __init__(
        self,
        coverages: Sequence[float] = (0.5, 0.8, 0.9),
        eta: float = DEFAULT_ETA,
        rearrangement: str = "isotonic",
        spread: Any = None,
    ) -> None:
        cov = _check_levels(coverages, "coverages")
        self.coverages = cov
        super().__init__(
            levels=np.concatenate([(1 - cov) / 2, (1 + cov) / 2]),
            eta=eta,
            rearrangement=rearrangement,
            spread=spread,
        )

    def interval_levels(self, coverage: float) -> tuple[float, float]:
        """Raw (lo, hi) OGD levels of the nominal `coverage` (must be one of `coverages`), sorted."""
        k = np.flatnonzero(np.isclose(self.coverages, coverage))
        if k.size == 0:
            raise ConfigError(f"coverage {coverage} is not tracked; tracked: {self.coverages.tolist()}")
        lo_i = int(np.flatnonzero(np.isclose(self.levels, (1 - coverage) / 2))[0])
        hi_i = int(np.flatnonzero(np.isclose(self.levels, (1 + coverage) / 2))[0])
        lo, hi = sorted((float(self.q[lo_i]), float(self.q[hi_i])))
        return lo, hi

    def interval(self, forecast: Forecast, coverage: float) -> tuple[Tensor, Tensor]:
        """Recalibrated interval [Q(q_lo), Q(q_hi)] (`n`, `n`), with -inf / +inf where a level left (0, 1)."""
        lo, hi = self.interval_levels(coverage)
        n = len(forecast)
        inner = [v for v in (lo, hi) if 0 < v < 1]
        qs = forecast.quantile(inner) if inner else torch.empty(n, 0, dtype=torch.float64)
        j = 0
        ends = []
        for v in (lo, hi):
            if 0 < v < 1:
                ends.append(qs[:, j])
                j += 1
            elif v <= 0:
                ends.append(torch.full((n,), -math.inf, dtype=torch.float64))
            else:
                ends.append(torch.full((n,), math.inf, dtype=torch.float64))
        return ends[0], ends[1]

    def covers(self, forecast: Forecast, y: Tensor, coverage: float) -> Tensor:
        """Whether each y lies in the recalibrated interval, via PITs (no quantile bisection): `n` bool."""
        lo, hi = self.interval_levels(coverage)
        u = forecast.cdf(torch.as_tensor(y, dtype=torch.float64).reshape(-1))
        return (u > lo) & (u <= hi)

    option_keys = ("coverages", "eta", "rearrangement")

    def _get_state(self) -> dict[str, Any]:
        state = super()._get_state()
        state["coverages"] = torch.tensor(self.coverages)
        return state

    def _set_state(self, state: dict[str, Any]) -> None:
        super()._set_state(state)
        self.coverages = state["coverages"].numpy().astype(np.float64).copy()
