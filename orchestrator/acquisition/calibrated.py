"""Calibrated EI / PI / UCB, LOCBO EI and conformal EI / UCB as BoTorch acquisitions, and one generic
proposer.

Gaussian-likelihood surrogates only (the exact GP, or a BoTorch GP): the predictive of y at x is
N(mu, sigma~^2) with sigma~^2 = sigma_f^2 + sigma^2, in standardized units, maximization.
- calibrated-bo.md §1.6 (a), sigma-rescaling: sigma~ -> s sigma~ with the calibrator's global s, closed forms.
- §1.6 (b), recalibrated-quantile route: Q~(p) = mu + sigma~ Phi^-1(R(p)); PI = 1 - R^-1(Phi((f* + xi -
  mu)/sigma~)), EI = int_{p*}^1 (Q~(p) - f*) dp with p* = F~(f*), by K midpoint levels on [p*, 1] (the spec's
  levels on [0, 1] give EI 0 more than 2.7 sd below f*; these reach about 8 sd), UCB = Q~(Phi(beta)). R does
  not depend on x.
- locbo.md §1.6: EI under the denoised calibrated posterior of f (calibration/locbo.py).
- conformal-bo.md §1.7: EI / UCB averaged over GPs conditioned on candidate labels with conformal weights.
`AcquisitionProposer` optimizes any of them with `botorch.optim.optimize_acqf`, one point at a time for q > 1
(sequential greedy): earlier points of the batch and pending points are `X_pending`, which shrink the
posterior variance of f at x as if they had been observed at their posterior mean (Kriging believer, exact
for the joint Gaussian posterior); the calibrator never sees them.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from botorch.acquisition import AcquisitionFunction
from botorch.optim import optimize_acqf
from torch import Tensor

from orchestrator.acquisition.base import DUPLICATE_TOL, Proposer, check_target_is_f, min_distance
from orchestrator.checks import check_float, check_int
from orchestrator.errors import ConfigError, UnsupportedError
from orchestrator.limits import MAX_RAW_SAMPLES, MAX_RESTARTS, check_at_most

__all__ = [
    "AcquisitionProposer",
    "CalibratedExpectedImprovement",
    "CalibratedProbabilityOfImprovement",
    "CalibratedUpperConfidenceBound",
    "ConformalExpectedImprovement",
    "ConformalUpperConfidenceBound",
    "LOCBOExpectedImprovement",
    "gaussian_predictive",
]

#: midpoint levels of the quantile-route EI on [F~(f*), 1]
EI_LEVELS = 128
#: clip of the recalibrated levels in that EI (Phi^-1(1 - 1e-15) = 7.9: the quantiles stay finite)
EI_LEVEL_EPS = 1e-15
#: floor on predictive std (training points of a noiseless model)
MIN_STD = 1e-9


def gaussian_predictive(
    model: Any, X: Tensor, X_pending: Tensor | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """(mu, var_f, noise_var), each `b`, of a Gaussian-likelihood model at `b x 1 x d` (standardized units).

    With `X_pending` (`m x d`), var_f is the posterior variance after also observing f + noise at the pending
    points (their values do not matter for the variance; the mean is kept: Kriging believer).

    Raises:
        UnsupportedError: a qbatch `Surrogate` whose family is not "gaussian".
    """
    from orchestrator.models.base import Surrogate

    if X.ndim < 2 or X.shape[-2] != 1:
        raise UnsupportedError("analytic calibrated acquisitions take `b x 1 x d` inputs; got "
                               f"{tuple(X.shape)}")
    x = X.squeeze(-2)
    d = x.shape[-1]
    x = x.reshape(-1, d)
    m = 0 if X_pending is None else X_pending.shape[0]
    Xc = (
        x.unsqueeze(-2)
        if m == 0
        else torch.cat([X_pending.to(x).expand(x.shape[0], m, d), x.unsqueeze(-2)], dim=-2)
    )
    if isinstance(model, Surrogate):
        if model.family != "gaussian":
            raise UnsupportedError(
                "calibrated EI/PI/UCB need a Gaussian-likelihood surrogate (exact-gp or heteroscedastic); "
                f"got family {model.family!r}"
            )
        mean, cov = model.posterior_f(Xc, full_cov=True)
        mu_g, var_g = model.posterior_g(Xc, full_cov=False)
        # E[sigma^2] = exp(2 mu_g + 2 s_g^2) over the posterior of g: the variance `Forecast` gives the
        # calibrators, so the level map is applied to the predictive it was learned on (exact GP: s_g = 0)
        noise = torch.exp(2 * mu_g + 2 * var_g)
    else:  # a BoTorch model with a Gaussian likelihood
        post = model.posterior(Xc)
        mean = post.mean.squeeze(-1)
        cov = post.distribution.covariance_matrix if m > 0 else post.variance.squeeze(-1).unsqueeze(-1)
        # in the posterior's units: the likelihood's noise is in the model's (outcome-transformed) units
        noisy = model.posterior(Xc, observation_noise=True)
        noise = (noisy.variance - post.variance).squeeze(-1).clamp_min(0.0)
    mu = mean[..., -1]
    if m == 0:
        var_f = cov[..., -1, -1] if cov.ndim == mean.ndim + 1 else cov[..., -1]
    else:
        C_pp = cov[..., :m, :m] + torch.diag_embed(noise[..., :m])
        c = cov[..., :m, -1:]
        sol = torch.linalg.solve(C_pp, c)
        var_f = cov[..., -1, -1] - (c * sol).sum((-1, -2))
    return mu, var_f.clamp_min(0.0), noise[..., -1]


def _phi(z: Tensor) -> Tensor:
    return torch.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)


class _GaussianAcquisition(AcquisitionFunction):
    """Shared parts: the model's Gaussian predictive, pending points, the calibrator and the route."""

    def __init__(
        self, model: Any, calibrator: Any = None, route: str = "quantile", X_pending: Tensor | None = None
    ) -> None:
        super().__init__(model)
        if route not in ("quantile", "sigma"):
            raise ConfigError(f"`proposer.options.route` must be one of ['quantile', 'sigma']; got {route!r}")
        self.calibrator = calibrator
        self.route = route
        self.set_X_pending(X_pending)

    def _predictive(self, X: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        mu, var_f, noise = gaussian_predictive(self.model, X, self.X_pending)
        sd = (var_f + noise).clamp_min(MIN_STD**2).sqrt()
        if self.calibrator is not None and self.route == "sigma":
            sd = sd * self.calibrator.sigma_scale()
        return mu, sd, var_f

    def _levels(self, p: Tensor, eps: float | None = None) -> Tensor:
        """R(p): the calibrator's map (identity without one or on the sigma route), clipped to [eps, 1 - eps]
        (default `LEVEL_EPS`)."""
        from orchestrator.calibration.base import LEVEL_EPS

        if self.calibrator is None or self.route == "sigma":
            return p
        eps = LEVEL_EPS if eps is None else eps
        return self.calibrator.map_levels(p).clamp(eps, 1 - eps)

    def _cdf_map(self, u: Tensor) -> Tensor:
        if self.calibrator is None or self.route == "sigma":
            return u
        return self.calibrator.unmap_levels(u)


class _ImprovementAcquisition(_GaussianAcquisition):
    """An acquisition of the improvement over an incumbent `best_f` by a margin `xi` (EI and PI)."""

    def __init__(self, model: Any, best_f: float | Tensor, calibrator: Any = None, route: str = "quantile",
                 xi: float = 0.0, X_pending: Tensor | None = None) -> None:
        super().__init__(model, calibrator, route, X_pending)
        self.register_buffer("best_f", torch.as_tensor(best_f, dtype=torch.float64))
        self.xi = float(xi)


class CalibratedExpectedImprovement(_ImprovementAcquisition):
    """EI of y over `best_f` under the recalibrated predictive (maximization).

    Args:
        model: Gaussian-likelihood surrogate.
        best_f: incumbent f* (standardized units).
        calibrator: a `Calibrator` (None: plain EI).
        route: "quantile" (§1.6 b) or "sigma" (§1.6 a).
        xi: improvement margin (GPyOpt's jitter).
    """

    def forward(self, X: Tensor) -> Tensor:
        mu, sd, _ = self._predictive(X)
        target = self.best_f + self.xi
        if self.calibrator is None or self.route == "sigma":
            z = (mu - target) / sd
            return sd * (z * torch.special.ndtr(z) + _phi(z))
        # EI = int_{p*}^1 (Q~(p) - target) dp with p* = F~(target): K midpoint levels on [p*, 1] (spec §1.6 b
        # puts them on [0, 1], where every level misses a point more than 2.7 sd below the target: EI 0, no
        # gradient). Levels are clipped at EI_LEVEL_EPS, not LEVEL_EPS (which would end the tail at 4.75 sd);
        # in float64, 1 - p* = 1 - F~(target) keeps few digits past about 7 sd and none past 8.2 sd, where EI
        # is 0 (the closed form there is below 1e-15 sd).
        upper = torch.special.log_ndtr((mu - target) / sd).exp()  # 1 - Phi(z_target)
        tail = (1 - self._cdf_map(1 - upper)).clamp(0.0, 1.0)
        u = (torch.arange(EI_LEVELS, dtype=mu.dtype, device=mu.device) + 0.5) / EI_LEVELS
        p = (1 - tail).unsqueeze(-1) + tail.unsqueeze(-1) * u
        q = mu.unsqueeze(-1) + sd.unsqueeze(-1) * torch.special.ndtri(self._levels(p, EI_LEVEL_EPS))
        return tail * (q - target).clamp_min(0.0).mean(-1)


class CalibratedProbabilityOfImprovement(_ImprovementAcquisition):
    """P(y > f* + xi) under the recalibrated predictive: 1 - R^-1(Phi((f* + xi - mu)/sigma~))."""

    def forward(self, X: Tensor) -> Tensor:
        mu, sd, _ = self._predictive(X)
        u = torch.special.ndtr((self.best_f + self.xi - mu) / sd)
        return 1 - self._cdf_map(u)


class CalibratedUpperConfidenceBound(_GaussianAcquisition):
    """Recalibrated upper quantile Q~(Phi(beta)) = mu + sigma~ Phi^-1(R(Phi(beta))) (UCB of weight beta)."""

    def __init__(self, model: Any, beta: float = 2.0, calibrator: Any = None, route: str = "quantile",
                 X_pending: Tensor | None = None) -> None:
        super().__init__(model, calibrator, route, X_pending)
        self.beta = float(beta)

    def forward(self, X: Tensor) -> Tensor:
        mu, sd, _ = self._predictive(X)
        level = torch.special.ndtr(torch.tensor(self.beta, dtype=mu.dtype))
        return mu + sd * torch.special.ndtri(self._levels(level))


class LOCBOExpectedImprovement(_GaussianAcquisition):
    """EI under LOCBO's denoised calibrated posterior of f (locbo.md §1.5–1.6), threshold from the
    calibrator."""

    def __init__(
        self, model: Any, best_f: float | Tensor, calibrator: Any, X_pending: Tensor | None = None
    ) -> None:
        super().__init__(model, calibrator, "quantile", X_pending)
        # a public acquisition: `calibrator` is the caller's object, which may be any calibrator, or none
        if not hasattr(calibrator, "threshold"):
            raise UnsupportedError("LOCBOExpectedImprovement needs a LOCBOCalibrator")
        self.register_buffer("best_f", torch.as_tensor(best_f, dtype=torch.float64))

    def forward(self, X: Tensor) -> Tensor:
        from orchestrator.calibration.locbo import locbo_expected_improvement

        mu, var_f, noise = gaussian_predictive(self.model, X, self.X_pending)
        lam = self.calibrator.threshold(X.squeeze(-2).reshape(-1, X.shape[-1])).reshape(mu.shape)
        return locbo_expected_improvement(mu, var_f, noise, lam, self.calibrator.alpha, self.best_f)


class _ConformalAcquisition(AcquisitionFunction):
    """Conformal-set acquisitions (conformal-bo.md §1.7) over an exact GP's `ExactGPParts`."""

    def __init__(self, parts: Any, alpha: float, temp: float = 3e-2, num_labels: int = 64, ratio: Any = None,
                 X_pending: Tensor | None = None) -> None:
        super().__init__(model=None)  # type: ignore[arg-type]
        self.parts = parts
        self.alpha = float(alpha)
        self.temp = float(temp)
        self.num_labels = int(num_labels)
        self.ratio = ratio
        self.set_X_pending(X_pending)

    def _weights(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Importance weights `b x (n+1)` (exchangeable or density-ratio) and the OOD factor `b`."""
        n = self.parts.X.shape[0]
        if self.ratio is None:
            w = torch.full((x.shape[0], n + 1), 1.0 / (n + 1), dtype=x.dtype, device=x.device)
        else:
            r_train = self.ratio(self.parts.X).detach().expand(x.shape[0], n)
            w = torch.cat([r_train, self.ratio(x).unsqueeze(-1)], -1)
            w = w / w.sum(-1, keepdim=True)
        ood = torch.sigmoid((w[..., -1] - self.alpha) / self.temp)
        return w, ood

    def _mixture(self, X: Tensor, optimistic: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        from orchestrator.calibration.conformal import (
            candidate_labels,
            conditioned_f,
            conformal_masks,
            conformal_weights,
        )

        if X.shape[-2] != 1:
            raise UnsupportedError(f"conformal acquisitions take `b x 1 x d` inputs; got {tuple(X.shape)}")
        x = X.reshape(-1, X.shape[-1])
        _, _, _, (mu, var_f) = self.parts.augmented(x)
        if self.X_pending is not None and self.X_pending.shape[0]:
            # pending points shrink var_f as in `gaussian_predictive` (Kriging believer)
            P = self.X_pending.to(x)
            Xc = torch.cat([P.expand(x.shape[0], *P.shape), x.unsqueeze(-2)], -2)
            _, var_f = _conditional_var(self.parts, Xc)
        labels, logp = candidate_labels(mu, var_f + self.parts.noise_var, self.num_labels)
        w, ood = self._weights(x)
        m = conformal_masks(self.parts, x, labels, w, self.alpha, self.temp)
        o = (labels >= mu.unsqueeze(-1)).to(labels.dtype) if optimistic else None
        om = conformal_weights(m, logp, self.alpha, o)
        f_mean, f_sd = conditioned_f(self.parts, mu, var_f, labels)
        return om, f_mean, f_sd, ood


def _conditional_var(parts: Any, Xc: Tensor) -> tuple[Tensor, Tensor]:
    """Posterior mean/variance of f at the last point of each `b x (m+1) x d` given D and noisy pending
    points."""
    n = parts.X.shape[0]
    b, m1, d = Xc.shape
    Xa = torch.cat([parts.X.expand(b, n, d), Xc], -2)
    K = parts.kernel(Xa, Xa)
    obs = n + m1 - 1
    Ko = K[..., :obs, :obs] + parts.noise_var * torch.eye(obs, dtype=K.dtype, device=K.device)
    k = K[..., :obs, -1:]
    sol = torch.linalg.solve(Ko, k)
    var = K[..., -1, -1] - (k * sol).sum((-1, -2))
    return torch.zeros_like(var), var.clamp_min(1e-12)


class ConformalExpectedImprovement(_ConformalAcquisition):
    """Conformal EI: sum_j omega_j EI(f | D + (x, y^_j)) times (1 - ood(x)) (conformal-bo.md §1.7)."""

    def __init__(self, parts: Any, best_f: float | Tensor, alpha: float, **kwargs: Any) -> None:
        super().__init__(parts, alpha, **kwargs)
        self.register_buffer("best_f", torch.as_tensor(best_f, dtype=torch.float64))

    def forward(self, X: Tensor) -> Tensor:
        om, f_mean, f_sd, ood = self._mixture(X, optimistic=False)
        z = (f_mean - self.best_f) / f_sd
        ei = f_sd * (z * torch.special.ndtr(z) + _phi(z))
        return (1 - ood) * (om * ei).sum(-1)


class ConformalUpperConfidenceBound(_ConformalAcquisition):
    """Conformal UCB: optimistic mask o_j = 1{y^_j >= mu(x)}, utility mean_j + beta s_j, beta = Phi^-1(1 -
    alpha/2)."""

    def forward(self, X: Tensor) -> Tensor:
        om, f_mean, f_sd, ood = self._mixture(X, optimistic=True)
        beta = float(torch.special.ndtri(torch.tensor(1 - self.alpha / 2, dtype=torch.float64)))
        return (1 - ood) * (om * (f_mean + beta * f_sd)).sum(-1)


#: acquisition names of `AcquisitionProposer`
ACQUISITIONS = ("ei", "pi", "ucb")


class AcquisitionProposer(Proposer):
    """Optimizes a (calibrated) analytic acquisition with `optimize_acqf`; sequential greedy for q > 1.

    Which acquisition is built depends on the attached calibrator (`attach` sets `self.calibrator`):
    none / identity -> plain EI/PI/UCB; online, offline-cv -> calibrated EI/PI/UCB on `route`;
    locbo -> LOCBO EI (`acquisition` must be "ei"); conformal -> conformal EI or UCB.

    Args:
        acquisition: "ei", "pi" or "ucb".
        calibrator: a `Calibrator` or None (usually set by `attach`).
        route: "quantile" (recalibrated quantiles) or "sigma" (sigma-rescaling) for online / offline-cv.
        beta: UCB weight (GPyOpt's default 2).
        xi: EI/PI margin.
        num_restarts, raw_samples, maxiter: `optimize_acqf` settings.
    """

    uses_calibrator = True
    uses_observed_y = True

    def __init__(
        self,
        acquisition: str = "ei",
        calibrator: Any = None,
        route: str = "quantile",
        beta: float = 2.0,
        xi: float = 0.0,
        num_restarts: int = 8,
        raw_samples: int = 256,
        maxiter: int = 200,
    ) -> None:
        if acquisition not in ACQUISITIONS:
            raise ConfigError(f"`proposer.options.acquisition` must be one of {list(ACQUISITIONS)}; got "
                              f"{acquisition!r}")
        if route not in ("quantile", "sigma"):
            raise ConfigError(f"`proposer.options.route` must be one of ['quantile', 'sigma']; got {route!r}")
        num_restarts = check_int("`proposer.options.num_restarts`", num_restarts, 1)
        raw_samples = check_int("`proposer.options.raw_samples`", raw_samples, 1)
        maxiter = check_int("`proposer.options.maxiter`", maxiter, 1)
        check_at_most("`proposer.options.num_restarts`", num_restarts, MAX_RESTARTS)
        check_at_most("`proposer.options.raw_samples`", raw_samples, MAX_RAW_SAMPLES)
        beta = check_float("`proposer.options.beta`", beta, 0.0, must="a finite number >= 0")
        xi = check_float("`proposer.options.xi`", xi, 0.0, must="a finite number >= 0")
        self.acquisition = acquisition
        self.calibrator = calibrator
        #: the outcomes observed so far, in the units the model is fitted to (before its standardization); the
        #: optimizer sets them before each proposal, and LOCBO's incumbent is their best (locbo.md §1.6)
        self.observed_y: Tensor | None = None
        self.route = route
        self.beta, self.xi = float(beta), float(xi)
        self.num_restarts, self.raw_samples, self.maxiter = num_restarts, raw_samples, maxiter

    def check_model(self, model: Any) -> None:
        """EI/PI/UCB read a Gaussian predictive; LOCBO defines EI only; conformal sets need an exact GP and
        define EI and UCB (the checks `build` makes at the first model batch, made before the run)."""
        from orchestrator.models.base import Surrogate

        if isinstance(model, Surrogate) and model.family != "gaussian":
            raise UnsupportedError(
                "calibrated EI/PI/UCB need a Gaussian-likelihood surrogate (model exact-gp or "
                f"heteroscedastic); got {type(model).__name__} (family {model.family!r})"
            )
        check_target_is_f(model, f"calibrated {self.acquisition.upper()}")
        name = "none" if self.calibrator is None else self.calibrator.name
        if name == "locbo" and self.acquisition != "ei":
            raise ConfigError("calibrator 'locbo' defines EI only; got `proposer.options.acquisition` "
                              f"{self.acquisition!r}")
        if name == "conformal":
            if self.acquisition == "pi":
                raise ConfigError("calibrator 'conformal' defines EI and UCB; got "
                                  "`proposer.options.acquisition` 'pi'")
            if isinstance(model, Surrogate) and model.num_outputs_latent != 1:
                raise UnsupportedError("conformal sets need an exact Gaussian GP (model exact-gp); got "
                                       f"{type(model).__name__}")
        self._check_read_options(name)

    def _check_read_options(self, calibrator: str) -> None:
        """`ConfigError` for an option set away from its default that this acquisition and calibrator never
        read (`xi` and `route` under locbo or conformal would change nothing): `xi` is EI's and PI's
        margin, but LOCBO's and the conformal acquisitions have none; `route` picks how online and offline-cv
        recalibrate; `beta` is UCB's weight."""
        unread = {}
        if self.xi != 0.0 and (self.acquisition == "ucb" or calibrator in ("locbo", "conformal")):
            unread["xi"] = self.xi
        if self.route != "quantile" and calibrator not in ("online", "online-interval", "offline-cv"):
            unread["route"] = self.route
        if self.beta != 2.0 and self.acquisition != "ucb":
            unread["beta"] = self.beta
        if unread:
            raise ConfigError(f"`proposer.options` {sorted(unread)} "
                              f"({', '.join(f'{k}={v!r}' for k, v in unread.items())}) are not read by "
                              f"acquisition {self.acquisition!r} with calibrator {calibrator!r}; remove them "
                              "(to resume a run made before this check, from its config.yaml: they changed "
                              "nothing in it)")

    def build(
        self, model: Any, X_observed: Tensor, generator: torch.Generator | None = None
    ) -> AcquisitionFunction:
        """The acquisition for the current model and calibrator (incumbent: best posterior mean at X_observed;
        LOCBO's: the best observed outcome, standardized, when `observed_y` is set)."""
        self.check_model(model)
        cal = self.calibrator
        name = "none" if cal is None else cal.name
        d = X_observed.shape[-1]
        if X_observed.shape[0]:
            with torch.no_grad():
                mu, _, _ = gaussian_predictive(model, X_observed.reshape(-1, 1, d))
            best = float(mu.max())
        else:
            best = 0.0
        if name == "locbo":  # EI only (check_model); f* is the best standardized noisy y (locbo.md §1.6)
            if self.observed_y is not None and self.observed_y.numel():
                loc, scale = model.outcome_transform
                best = float((self.observed_y.max() - loc) / scale)
            return LOCBOExpectedImprovement(model, best, cal)
        if name == "conformal":
            return self._conformal(model, X_observed, best, generator)
        use = None if name == "none" else cal
        if self.acquisition == "ei":
            return CalibratedExpectedImprovement(model, best, use, self.route, self.xi)
        if self.acquisition == "pi":
            return CalibratedProbabilityOfImprovement(model, best, use, self.route, self.xi)
        return CalibratedUpperConfidenceBound(model, self.beta, use, self.route)

    def _conformal(
        self, model: Any, X_observed: Tensor, best: float, generator: torch.Generator | None
    ) -> AcquisitionFunction:
        from orchestrator.calibration.conformal import DensityRatioEstimator, ExactGPParts

        cal = self.calibrator
        parts = ExactGPParts.from_model(model)
        alpha = cal.alpha(parts.X.shape[0])
        ratio = None
        if cal.density_ratio and parts.X.shape[0] >= 2:
            # query samples: Sobol points resampled in proportion to exp(a(x)/T) under the plain acquisition
            # (p_query ∝ exp(a), §1.1), a stand-in for the code's SGLD iterates
            d = parts.X.shape[-1]
            seed = int(torch.randint(0, 2**31 - 1, (1,), generator=generator)) if generator is not None else 0
            sob = torch.quasirandom.SobolEngine(d, scramble=True, seed=seed).draw(512).to(parts.X)
            plain = (
                CalibratedExpectedImprovement(model, best)
                if self.acquisition == "ei"
                else CalibratedUpperConfidenceBound(model, self.beta)
            )
            with torch.no_grad():
                a = plain(sob.unsqueeze(-2))
            temp = a.std().clamp_min(1e-12)
            probs = torch.softmax((a - a.max()) / temp, 0)
            idx = torch.multinomial(probs.cpu(), 256, replacement=True, generator=generator).to(probs.device)
            ratio = DensityRatioEstimator(d, seed=seed)
            ratio.fit(parts.X, sob[idx], steps=cal.ratio_steps)
            ratio.requires_grad_(False)
        kw = {"temp": cal.temp, "num_labels": cal.num_labels, "ratio": ratio}
        if self.acquisition == "ucb":
            return ConformalUpperConfidenceBound(parts, alpha, **kw)
        return ConformalExpectedImprovement(parts, best, alpha, **kw)  # EI or UCB only (check_model)

    def _propose(
        self, model: Any, q: int, X_pending: Tensor, X_observed: Tensor, generator: torch.Generator
    ) -> Tensor:
        d = X_observed.shape[-1] if X_observed.numel() else X_pending.shape[-1]
        tk = {"dtype": torch.float64, "device": X_pending.device}  # the model's device (`Proposer.propose`)
        bounds = torch.stack([torch.zeros(d, **tk), torch.ones(d, **tk)])
        acq = self.build(model, X_observed, generator)
        chosen = torch.empty(0, d, **tk)
        for _ in range(q):
            pend = torch.cat([X_pending, chosen])
            acq.set_X_pending(pend if pend.shape[0] else None)
            seed = int(torch.randint(0, 2**31 - 1, (1,), generator=generator))
            with torch.random.fork_rng():
                torch.manual_seed(seed)
                cand, _ = optimize_acqf(
                    acq, bounds, q=1, num_restarts=self.num_restarts, raw_samples=self.raw_samples,
                    options={"maxiter": self.maxiter, "seed": seed},
                )
            x = cand.detach().reshape(1, d).clamp(0.0, 1.0)
            taken = torch.cat([pend, X_observed])
            if float(min_distance(x, taken)[0]) < DUPLICATE_TOL:
                x = self._fallback(acq, taken, d, seed).to(**tk)
            chosen = torch.cat([chosen, x])
        acq.set_X_pending(None)
        return chosen

    def _fallback(self, acq: AcquisitionFunction, taken: Tensor, d: int, seed: int) -> Tensor:
        """Best raw Sobol point that repeats nothing (when the optimum sits on a taken point)."""
        sob = (
            torch.quasirandom.SobolEngine(d, scramble=True, seed=seed)
            .draw(max(self.raw_samples, 64))
            .to(taken)
        )
        with torch.no_grad():
            vals = acq(sob.unsqueeze(-2))
        vals = torch.where(
            min_distance(sob, taken, bound=2 * DUPLICATE_TOL) < DUPLICATE_TOL,
            torch.full_like(vals, -math.inf),
            vals,
        )
        return sob[int(vals.argmax())].reshape(1, d)

    def get_state(self) -> dict[str, Any]:
        return {}
