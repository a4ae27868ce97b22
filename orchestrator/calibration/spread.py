"""Spread factor s_t (global) or s_t(x) (local) for Thompson sampling and Q-GIBBON.

The SVGP proposers cannot use a level map (they sample f, not y), so calibration reaches them as a factor on
the posterior spread of f: a Thompson path becomes mu + s(x)(path - mu), Q-GIBBON uses s(x) sigma_f. s is
learned online from one-step-ahead central predictive intervals, in the adaptive-conformal form of
calibrated-bo.md §1.5 (ACI, q_{t+1} = q_t + eta(p - err)) applied to log s:

    e_t = 1{ y_t outside the central c-interval of the forecast with var_f scaled by s_t(x_t)^2 }
    r_t = s_t^2 var_f / Var_s[y]   (the share of the predictive variance of y that s controls)
    log s_{t+1}(.) = log s_t(.) + eta_t r_t (e_t - (1 - c)) k(x_t, .)

A miss widens, a hit narrows; the long-run miss rate tends to 1 - c while s stays inside its clip range.
r_t is the chain rule of that online gradient step: ACI's update is a gradient step of the interval's
quantile loss in the log width w, and d log w / d log s = r_t for a Gaussian predictive. Without it, when the
noise dominates the predictive of y, s cannot move the coverage and ACI would walk s to a clip end on the
noise model's own error (on the GLD benchmark s drifts to 0.66 and removes exploration); with it,
s stays near the model's own spread where y says nothing about f.
Global mode: k = 1 (one scalar). Local mode: the LOCBO-style threshold c_t + g_t(x) of locbo.md §1.3, with
k(x, x') = exp(-|x - x'|^2 / l^2) added to the global term, decaying by (1 - lambda_reg eta_t) per step.
s(x) is clipped to [SPREAD_MIN, SPREAD_MAX] (named constants below; not in any paper).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from orchestrator.calibration.options import check_option, check_same_options
from orchestrator.errors import ConfigError, InputDataError
from orchestrator.models.predictive import Forecast

if TYPE_CHECKING:
    from orchestrator.protocols import CalibratorProtocol, ProposerProtocol

__all__ = ["SpreadTracker", "SPREAD_KEYS", "SPREAD_MIN", "SPREAD_MAX", "attach", "scaled_forecast"]

#: lower clip of s(x): never shrink the posterior spread of f below a quarter of the model's
SPREAD_MIN = 0.25
#: upper clip of s(x): never widen beyond 10x (a wider f-posterior is exploration at random)
SPREAD_MAX = 10.0


def scaled_forecast(forecast: Forecast, s: Tensor | float) -> Forecast:
    """The forecast with the posterior variance of f multiplied by s^2 (`s` scalar or `n`)."""
    s = torch.as_tensor(s, dtype=torch.float64)
    return Forecast(
        forecast.family, forecast.tau, forecast.mu_f, forecast.var_f * s * s, forecast.mu_g, forecast.var_g
    )


#: `calibrator.options` key -> SpreadTracker argument (the mode is the option `spread` itself)
SPREAD_KEYS = {
    "spread_coverage": "coverage",
    "spread_eta": "eta",
    "spread_lengthscale": "lengthscale",
    "spread_decay": "decay",
    "spread_lambda_reg": "lambda_reg",
    "spread_min": "s_min",
    "spread_max": "s_max",
}
#: SpreadTracker option -> its config key: the state keys that are options, not learned
CONFIG_KEYS = {"mode": "spread", **{attr: key for key, attr in SPREAD_KEYS.items()}}


class SpreadTracker:
    """Online spread factor from one-step-ahead interval misses.

    Args:
        mode: "global" (one s_t) or "local" (s_t(x), needs the point of each result).
        coverage: nominal central coverage c of the tracked interval, in (0, 1).
        eta: step size on log s (> 0); local mode decays it as eta t^{-decay}.
        lengthscale: l of the localization kernel (unit-cube units, local mode).
        decay: exponent w of the step schedule eta_t = eta t^{-w} (local mode; locbo.md §1.3).
        lambda_reg: RKHS regularizer of the local term (each past term shrinks by 1 - lambda_reg eta_t).
        s_min, s_max: clip range of s(x).
    """

    def __init__(
        self,
        mode: str = "global",
        coverage: float = 0.8,
        eta: float = 0.1,
        lengthscale: float = 0.2,
        decay: float = 0.05,
        lambda_reg: float = 4e-3,
        s_min: float = SPREAD_MIN,
        s_max: float = SPREAD_MAX,
    ) -> None:
        if mode not in ("global", "local"):
            raise ConfigError("`calibrator.options.spread` must be one of ['global', 'local', 'off']; got "
                              f"{mode!r}")
        for key, v, ok in (
            ("spread_coverage", coverage, lambda v: 0 < v < 1),
            ("spread_eta", eta, lambda v: v > 0),
            ("spread_lengthscale", lengthscale, lambda v: v > 0),
            ("spread_decay", decay, lambda v: v >= 0),
            ("spread_lambda_reg", lambda_reg, lambda v: v >= 0),
            ("spread_min", s_min, lambda v: 0 < v <= 1),
            ("spread_max", s_max, lambda v: v >= 1),
        ):
            check_option(key, v, ok)
        # each step shrinks the local term by 1 - lambda_reg eta_t
        if mode == "local" and lambda_reg * eta >= 1:
            raise ConfigError("`calibrator.options.spread_lambda_reg` x `calibrator.options.spread_eta` "
                              f"must be < 1; got {lambda_reg!r} x {eta!r}")
        self.mode = mode
        self.coverage = float(coverage)
        self.eta = float(eta)
        self.lengthscale = float(lengthscale)
        self.decay = float(decay)
        self.lambda_reg = float(lambda_reg)
        self.s_min, self.s_max = float(s_min), float(s_max)
        self.log_s = 0.0
        self.t = 0
        self.misses = 0
        self.centers = torch.empty(0, 0, dtype=torch.float64)
        self.coefs = torch.empty(0, dtype=torch.float64)

    @property
    def needs_x(self) -> bool:
        return self.mode == "local"

    def log_spread(self, X: Tensor) -> Tensor:
        """Unclipped log s(x) at `... x n x d` -> `... x n`."""
        out = torch.full(X.shape[:-1], self.log_s, dtype=X.dtype, device=X.device)
        if self.mode == "local" and self.coefs.numel():
            C = self.centers.to(X)
            d2 = ((X.unsqueeze(-2) - C) ** 2).sum(-1)  # ... x n x t
            out = out + (torch.exp(-d2 / self.lengthscale**2) * self.coefs.to(X)).sum(-1)
        return out

    def __call__(self, X: Tensor) -> Tensor:
        """s(x) clipped to [s_min, s_max] at `... x n x d` -> `... x n`."""
        return self.log_spread(X).clamp(math.log(self.s_min), math.log(self.s_max)).exp()

    def miss(self, forecast: Forecast, y: Tensor, s: Tensor | float) -> Tensor:
        """1{y outside the central `coverage` interval of `forecast` with f widened by s} (`n` bool)."""
        u = scaled_forecast(forecast, s).cdf(torch.as_tensor(y, dtype=torch.float64).reshape(-1))
        return (2 * u - 1).abs() > self.coverage

    @staticmethod
    def sensitivity(forecast: Forecast, s: Tensor | float) -> float:
        """r = s^2 var_f / Var[y] of the first point of `forecast` with f widened by s: d log(width)/d log
        s."""
        scaled = scaled_forecast(forecast[:1], s)
        total = float(scaled.variance()[0])
        return float(scaled.var_f[0]) / total if total > 0 else 1.0

    def update(self, forecast: Forecast, y: Tensor, x: Tensor | None = None) -> None:
        """One result: `forecast` of one point, scalar `y`, its `d` point `x` (required in local mode)."""
        if self.mode == "local" and x is None:
            raise InputDataError("a local spread factor needs the point x of each result")
        self.t += 1
        xs = None if x is None else torch.as_tensor(x, dtype=torch.float64).reshape(1, -1)
        lo, hi = math.log(self.s_min), math.log(self.s_max)
        s = (
            self(xs)[0]
            if xs is not None
            else torch.tensor(math.exp(min(max(self.log_s, lo), hi)), dtype=torch.float64)
        )
        e = float(self.miss(forecast, y, s)[0])
        grad = (e - (1.0 - self.coverage)) * self.sensitivity(forecast, s)
        # the global term is kept inside the clip range so that a long run of misses cannot wind it up
        if self.mode == "global":
            self.log_s = min(max(self.log_s + self.eta * grad, lo), hi)
        else:
            eta_t = self.eta * self.t ** (-self.decay)
            self.log_s = min(max(self.log_s + eta_t * grad, lo), hi)
            if self.centers.numel() == 0:
                self.centers = torch.empty(0, xs.shape[-1], dtype=torch.float64)
            self.coefs = torch.cat(
                [
                    self.coefs * (1 - self.lambda_reg * eta_t),
                    torch.tensor([eta_t * grad], dtype=torch.float64),
                ]
            )
            self.centers = torch.cat([self.centers, xs])
        self.misses += int(e)

    def get_state(self) -> dict[str, Any]:
        return {
            "mode": self.mode, "coverage": self.coverage, "eta": self.eta, "lengthscale": self.lengthscale,
            "decay": self.decay, "lambda_reg": self.lambda_reg, "s_min": self.s_min, "s_max": self.s_max,
            "log_s": self.log_s, "t": self.t, "misses": self.misses,
            "centers": self.centers.clone(), "coefs": self.coefs.clone(),
        }

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore from `get_state`; a state saved with other options raises `QbatchError` naming them."""
        check_same_options("spread factor", self.get_state(), state, tuple(CONFIG_KEYS), names=CONFIG_KEYS)
        for k in (*CONFIG_KEYS, "log_s"):
            setattr(self, k, state[k] if k == "mode" else float(state[k]))
        self.t, self.misses = int(state["t"]), int(state["misses"])
        self.centers = state["centers"].clone().to(torch.float64)
        self.coefs = state["coefs"].clone().to(torch.float64)


def attach(calibrator: CalibratorProtocol, proposer: ProposerProtocol) -> ProposerProtocol:
    """Wire a calibrator into a proposer (the actor calls this once; the proposer then reads live state).

    - Proposers that read the spread factor (`uses_spread`: Thompson sampling, Q-GIBBON) get
      `proposer.spread = calibrator.spread`, or None when the calibrator has no spread tracker (`none`, or
      `spread: off`).
    - Proposers that read a calibrator (`uses_calibrator`: `AcquisitionProposer`) get the calibrator itself.
    - A calibrator marked `acquisition_only` (conformal, offline-cv) is refused by the others: its options
      would do nothing.
    - Options the proposer would never read are refused: a calibrator's own options (`eta`, `levels`, `alpha`,
      ...) or `spread: off` with a spread-only proposer, `spread`/`spread_*` with `AcquisitionProposer`.

    Returns:
        the proposer.

    Raises:
        UnsupportedError: the proposer has neither hook, or only a `spread` hook for an `acquisition_only`
            calibrator.
    """
    from orchestrator.errors import UnsupportedError

    # `attach` is public: a proposer of user code need not subclass `Proposer`, and one without these flags
    # has neither hook
    uses_spread = bool(getattr(proposer, "uses_spread", False))
    uses_calibrator = bool(getattr(proposer, "uses_calibrator", False))
    if calibrator.acquisition_only and not uses_calibrator:
        raise UnsupportedError(
            f"calibrator {calibrator.name!r} acts only inside the acquisition of proposer 'calibrated' (EI "
            f"or UCB); {type(proposer).__name__} would use its spread factor alone, which 'online-interval' "
            "gives")
    given, given_spread = calibrator.given_options, calibrator.given_spread_options
    if uses_spread and not uses_calibrator:
        if given:
            raise UnsupportedError(
                f"`calibrator.options` {list(given)} act only inside the acquisition of proposer "
                f"'calibrated'; {type(proposer).__name__} uses the calibrator's spread factor alone (options "
                "'spread', 'spread_*'): remove them (to resume a run made before this check, from its "
                "config.yaml)")
        if calibrator.spread_tracker is None and calibrator.name != "none":
            raise UnsupportedError(
                f"with `spread: off` calibrator {calibrator.name!r} does nothing for "
                f"{type(proposer).__name__}, which uses only the spread factor")
    if uses_calibrator and not uses_spread and given_spread:
        raise UnsupportedError(
            f"`calibrator.options` {list(given_spread)} set the spread factor of Thompson sampling and "
            f"Q-GIBBON; {type(proposer).__name__} does not use it: remove them (to resume a run made before "
            f"this check, from its config.yaml)")
    if not (uses_spread or uses_calibrator):
        raise UnsupportedError(f"{type(proposer).__name__} has no `spread` or `calibrator` hook to attach a "
                               "calibrator to")
    if uses_calibrator:
        proposer.calibrator = calibrator
    if uses_spread:
        proposer.spread = None if calibrator.spread_tracker is None else calibrator.spread
    return proposer
