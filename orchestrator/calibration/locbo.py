"""LOCBO: localized online conformal calibration of paper 002 (Kim, Zecchin, Park, Kang, Simeone), locbo.md.

Threshold lambda_t(x) = c_t + g_t(x) (§1.3) with the localization kernel k_g(x, x') = kappa exp(-|x - x'|^2 /
l^2) (l = inf: non-localized; kappa = 0: plain online CP), updated after each result by
c += eta_t (alpha - e_t), g <- (1 - lambda_reg eta_t) g + eta_t (alpha - e_t) k_g(x_t, .), eta_t = eta0 t^-w,
started at c_1 = alpha, g_1 = 0. The conformity score of §1.2, 2Q(|y - mu| / sigma~), is written through the
forecast's PIT as 1 - |2u - 1| (equal for a Gaussian forecast, and defined for every family); the set
{score >= lambda} is mu -+ Phi^-1(1 - lambda/2) sigma~ (eq. 26), covering always for lambda <= 0, never for
lambda > 1. Module functions give the corrected likelihood (eq. 28), the denoised posterior of f with the
corrected tail term of §1.5 (Ambiguity A1: the printed eq. 45 is wrong), and its expected improvement (eq.
30), all in the standardized units of a Gaussian-likelihood GP: mu, var_f = sigma_f^2 and noise_var = sigma^2.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import Tensor

from orchestrator.calibration.base import Calibrator
from orchestrator.calibration.options import check_option
from orchestrator.errors import ConfigError, InputDataError
from orchestrator.models.predictive import Forecast

__all__ = [
    "LAMBDA_MIN",
    "LAMBDA_MAX",
    "LOCBOCalibrator",
    "denoise_coefficients",
    "locbo_expected_improvement",
    "locbo_interval",
    "locbo_likelihood",
    "locbo_posterior_density",
]

#: lambda is clipped to [2Q(3.4), 1 - 1e-6] only when the likelihood is built (locbo.md A3); c and g are not
LAMBDA_MIN = 2.0 * 0.5 * math.erfc(3.4 / math.sqrt(2.0))
LAMBDA_MAX = 1.0 - 1e-6
#: Gauss-Legendre nodes of the tail part of the EI integral (fixed nodes: a smooth surface for L-BFGS, A8)
_GL_NODES = 64
#: the tail integral runs over mu -+ _TAIL_SDS sigma_f
_TAIL_SDS = 10.0
#: floors on standard deviations (avoid 0/0 at training points or with noiseless models)
_MIN_STD = 1e-9


def _phi(z: Tensor) -> Tensor:
    return torch.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)


def locbo_interval(mu: Tensor, var_f: Tensor, noise_var: Tensor, lam: Tensor) -> tuple[Tensor, Tensor]:
    """[L, U] = mu -+ Phi^-1(1 - lambda/2) sigma~ (eq. 26), lambda clipped to [LAMBDA_MIN, LAMBDA_MAX]."""
    lam = torch.as_tensor(lam, dtype=mu.dtype).clamp(LAMBDA_MIN, LAMBDA_MAX)
    z = torch.special.ndtri(1 - lam / 2)
    sd = (var_f + noise_var).clamp_min(_MIN_STD**2).sqrt()
    return mu - z * sd, mu + z * sd


def locbo_likelihood(
    y: Tensor, mu: Tensor, var_f: Tensor, noise_var: Tensor, lam: Tensor, alpha: float
) -> Tensor:
    """Calibrated predictive density of y (eq. 28): (1-alpha)/(U-L) on [L, U], alpha p_GP(y)/lambda
    outside."""
    lam = torch.as_tensor(lam, dtype=mu.dtype).clamp(LAMBDA_MIN, LAMBDA_MAX)
    L, U = locbo_interval(mu, var_f, noise_var, lam)
    sd = (var_f + noise_var).clamp_min(_MIN_STD**2).sqrt()
    inside = (y >= L) & (y <= U)
    return torch.where(inside, (1 - alpha) / (U - L), alpha * _phi((y - mu) / sd) / sd / lam)


def denoise_coefficients(var_f: Tensor, noise_var: Tensor) -> tuple[Tensor, Tensor]:
    """(a, s^2) of f | D, (x, y') ~ N(a y' + (1 - a) mu, s^2): a = sigma_f^2/sigma~^2, s^2 = sigma_f^2
    sigma^2/sigma~^2 (§1.5)."""
    tot = (var_f + noise_var).clamp_min(_MIN_STD**2)
    return var_f / tot, var_f * noise_var / tot


def locbo_posterior_density(
    f: Tensor, mu: Tensor, var_f: Tensor, noise_var: Tensor, lam: Tensor, alpha: float
) -> Tensor:
    """Denoised calibrated posterior density of f(x) (eq. 29, closed form of locbo.md §1.5, corrected tail).

    p(f) = (1-alpha)/(a(U-L)) [Phi((aU+b-f)/s) - Phi((aL+b-f)/s)]
         + (alpha/lambda) phi((f-mu)/sigma_f)/sigma_f [1 - Phi((U-f)/sigma) + Phi((L-f)/sigma)].
    All arguments broadcast. Mass 1 - alpha inside part, alpha tail part, for any lambda in (0, 1).
    """
    lam = torch.as_tensor(lam, dtype=mu.dtype).clamp(LAMBDA_MIN, LAMBDA_MAX)
    L, U = locbo_interval(mu, var_f, noise_var, lam)
    a, s2 = denoise_coefficients(var_f, noise_var)
    b = (1 - a) * mu
    s = s2.clamp_min(_MIN_STD**2).sqrt()
    width = (a * (U - L)).clamp_min(1e-300)
    inside = (
        (1 - alpha)
        / width
        * (torch.special.ndtr((a * U + b - f) / s) - torch.special.ndtr((a * L + b - f) / s))
    )
    sf = var_f.clamp_min(_MIN_STD**2).sqrt()
    sn = noise_var.clamp_min(_MIN_STD**2).sqrt()
    tail_prob = 1 - torch.special.ndtr((U - f) / sn) + torch.special.ndtr((L - f) / sn)
    tail = alpha / lam * _phi((f - mu) / sf) / sf * tail_prob
    return inside + tail


def _Psi(z: Tensor) -> Tensor:
    """Antiderivative of psi(z) = z Phi(z) + phi(z): ((z^2 + 1) Phi(z) + z phi(z)) / 2."""
    return 0.5 * ((z * z + 1) * torch.special.ndtr(z) + z * _phi(z))


def _psi(z: Tensor) -> Tensor:
    return z * torch.special.ndtr(z) + _phi(z)


def locbo_expected_improvement(
    mu: Tensor, var_f: Tensor, noise_var: Tensor, lam: Tensor, alpha: float, best_f: Tensor | float
) -> Tensor:
    """EI = int (f - f*)_+ p_LOCBO(f) df (eq. 30), for maximization; broadcasts over all tensor arguments.

    Inside part in closed form (f = a y' + b + s eps with y' uniform on [L, U]:
    (1-alpha) s^2 [Psi(z_U) - Psi(z_L)] / (a(U-L))); tail part as the closed-form EI of N(mu, sigma_f^2) minus
    a panelled Gauss-Legendre quadrature of (f - f*)_+ phi_{sigma_f}(f - mu) P(y' in [L, U] | f) (fixed nodes:
    a smooth surface for L-BFGS, locbo.md A8).
    """
    mu, var_f, noise_var, lam, best_f = torch.broadcast_tensors(
        mu,
        var_f,
        torch.as_tensor(noise_var, dtype=mu.dtype),
        torch.as_tensor(lam, dtype=mu.dtype),
        torch.as_tensor(best_f, dtype=mu.dtype),
    )
    lam = lam.clamp(LAMBDA_MIN, LAMBDA_MAX)
    L, U = locbo_interval(mu, var_f, noise_var, lam)
    a, s2 = denoise_coefficients(var_f, noise_var)
    b = (1 - a) * mu
    s = s2.clamp_min(_MIN_STD**2).sqrt()
    mL, mU = a * L + b, a * U + b
    width = mU - mL
    wide = width > 1e-6 * s
    ratio = (
        s
        * s
        * (_Psi((mU - best_f) / s) - _Psi((mL - best_f) / s))
        / torch.where(wide, width, torch.ones_like(width))
    )
    mid = s * _psi((0.5 * (mL + mU) - best_f) / s)  # a (U - L) -> 0: the uniform collapses to a point
    inside = (1 - alpha) * torch.where(wide, ratio, mid)
    # tail part: alpha/lambda (E[(f - f*)_+] - E[(f - f*)_+ P(y' in [L, U] | f)]) under f ~ N(mu, sigma_f^2);
    # the first term is closed form, the second is smooth except for steps of width sigma at L and U, so it is
    # integrated by Gauss-Legendre on three panels: [L -+ 8 sigma], between, [U -+ 8 sigma], cut to f >= f*
    sf = var_f.clamp_min(_MIN_STD**2).sqrt()
    sn = noise_var.clamp_min(_MIN_STD**2).sqrt()
    ei_f = sf * _psi((mu - best_f) / sf)
    cut_lo = torch.maximum(best_f, mu - _TAIL_SDS * sf)
    cut_hi = mu + _TAIL_SDS * sf
    edges = [L - 8 * sn, L + 8 * sn, U - 8 * sn, U + 8 * sn]
    edges = [torch.minimum(torch.maximum(e, cut_lo), cut_hi) for e in edges]
    edges[2] = torch.maximum(edges[2], edges[1])
    edges[3] = torch.maximum(edges[3], edges[2])
    nodes, weights = np.polynomial.legendre.leggauss(_GL_NODES // 2)
    t = torch.as_tensor(nodes, dtype=mu.dtype)
    w = torch.as_tensor(weights, dtype=mu.dtype)
    inner = torch.zeros_like(mu)
    for lo, hi in zip(edges[:-1], edges[1:]):
        half = (0.5 * (hi - lo)).unsqueeze(-1)
        f = (0.5 * (hi + lo)).unsqueeze(-1) + half * t
        in_prob = torch.special.ndtr((U.unsqueeze(-1) - f) / sn.unsqueeze(-1)) - torch.special.ndtr(
            (L.unsqueeze(-1) - f) / sn.unsqueeze(-1)
        )
        dens = _phi((f - mu.unsqueeze(-1)) / sf.unsqueeze(-1)) / sf.unsqueeze(-1)
        gain = (f - best_f.unsqueeze(-1)).clamp_min(0) * dens * in_prob * w
        inner = inner + half.squeeze(-1) * gain.sum(-1)
    tail = alpha / lam * (ei_f - inner).clamp_min(0.0)
    return inside + tail


class LOCBOCalibrator(Calibrator):
    """`calibrator.type: locbo`: the localized online-CP threshold lambda_t(x) of paper 002.

    Args:
        alpha: target miscoverage in (0, 1) (paper: 0.2 on Ackley, 0.25 on RRM).
        kappa: effective scale of k_g (>= 0; locbo.md A6: one parameter; kappa = 0 gives plain online CP).
        lengthscale: l of k_g in unit-cube units (> 0, or inf for non-localized; paper's l = 5 on
            [-10, 10]^2 is 0.25 here).
        lambda_reg: RKHS regularizer (>= 0).
        eta0: step size scale (> 0); eta_t = eta0 t^-decay.
        decay: w of the step schedule (>= 0; paper 0.05).
        spread: optional `SpreadTracker`.
    """

    name = "locbo"
    needs_x = True

    def __init__(
        self,
        alpha: float = 0.2,
        kappa: float = 2.0,
        lengthscale: float = 0.25,
        lambda_reg: float = 4e-3,
        eta0: float = 5e-3,
        decay: float = 0.05,
        spread: Any = None,
    ) -> None:
        super().__init__(spread)
        self.alpha = check_option("alpha", alpha, lambda v: 0 < v < 1)
        self.kappa = check_option("kappa", kappa, lambda v: v >= 0)
        # inf: one global threshold
        self.lengthscale = check_option("lengthscale", lengthscale, lambda v: v > 0, allow_inf=True)
        self.lambda_reg = check_option("lambda_reg", lambda_reg, lambda v: v >= 0)
        self.eta0 = check_option("eta0", eta0, lambda v: v > 0)
        self.decay = check_option("decay", decay, lambda v: v >= 0)
        # each step shrinks g by 1 - lambda_reg eta_t: it must stay in (0, 1]
        if self.lambda_reg * self.eta0 >= 1:
            raise ConfigError("`calibrator.options.lambda_reg` x `calibrator.options.eta0` must be < 1 "
                              f"(locbo.md Lemma 1: eta_t < 1 / lambda_reg); got {lambda_reg!r} x {eta0!r}")
        self.c = self.alpha
        self.t = 0
        self.misses = 0
        self.centers = torch.empty(0, 0, dtype=torch.float64)
        self.coefs = torch.empty(0, dtype=torch.float64)

    def kernel(self, X: Tensor, centers: Tensor) -> Tensor:
        """k_g(X, centers): `... x n x t`."""
        if math.isinf(self.lengthscale):
            return torch.full(X.shape[:-1] + centers.shape[:1], self.kappa, dtype=X.dtype, device=X.device)
        d2 = ((X.unsqueeze(-2) - centers.to(X)) ** 2).sum(-1)
        return self.kappa * torch.exp(-d2 / self.lengthscale**2)

    def threshold(self, X: Tensor) -> Tensor:
        """Unclipped lambda_t(x) = c_t + g_t(x) at `... x n x d` -> `... x n`."""
        out = torch.full(X.shape[:-1], self.c, dtype=X.dtype, device=X.device)
        if self.coefs.numel():
            out = out + (self.kernel(X, self.centers) * self.coefs.to(X)).sum(-1)
        return out

    @staticmethod
    def score(forecast: Forecast, y: Tensor) -> Tensor:
        """Conformity score 1 - |2 F(y) - 1| (= 2Q(|y - mu|/sigma~) for a Gaussian forecast): `n`."""
        u = forecast.cdf(torch.as_tensor(y, dtype=torch.float64).reshape(-1))
        return 1 - (2 * u - 1).abs()

    def covers(self, forecast: Forecast, y: Tensor, X: Tensor) -> Tensor:
        """y in Gamma_t(x) = {score >= lambda_t(x)} with the current threshold: `n` bool."""
        return self.score(forecast, y) >= self.threshold(
            torch.as_tensor(X, dtype=torch.float64).reshape(len(forecast), -1)
        )

    def _update_one(self, forecast: Forecast, y: Tensor, x: Tensor | None) -> None:
        if x is None:
            raise InputDataError("LOCBO needs the point x of each result")
        xs = x.reshape(1, -1).to(torch.float64)
        e = float(~self.covers(forecast, y, xs)[0])
        self.t += 1
        eta_t = self.eta0 * self.t ** (-self.decay)
        step = eta_t * (self.alpha - e)
        if self.centers.numel() == 0:
            self.centers = torch.empty(0, xs.shape[-1], dtype=torch.float64)
        elif self.centers.shape[-1] != xs.shape[-1]:
            raise InputDataError(f"x has {xs.shape[-1]} dimensions; earlier results had "
                                 f"{self.centers.shape[-1]}")
        self.coefs = torch.cat(
            [self.coefs * (1 - self.lambda_reg * eta_t), torch.tensor([step], dtype=torch.float64)]
        )
        self.centers = torch.cat([self.centers, xs])
        self.c += step
        self.misses += int(e)

    option_keys = ("alpha", "kappa", "lengthscale", "lambda_reg", "eta0", "decay")

    def _get_state(self) -> dict[str, Any]:
        return {
            **{k: getattr(self, k) for k in self.option_keys},
            "c": self.c,
            "t": self.t,
            "misses": self.misses,
            "centers": self.centers.clone(),
            "coefs": self.coefs.clone(),
        }

    def _set_state(self, state: dict[str, Any]) -> None:
        for k in (*self.option_keys, "c"):
            setattr(self, k, float(state[k]))
        self.t, self.misses = int(state["t"]), int(state["misses"])
        self.centers = state["centers"].clone().to(torch.float64)
        self.coefs = state["coefs"].clone().to(torch.float64)
