"""Noise laws of the quantile and expectile models, as plain torch functions (spec §1.2).

quantile-expectile-bo.md §1.2: with u = (y - f)/sigma,
- asymmetric Laplace (AL): p = tau(1-tau)/sigma * exp(-rho_tau(u)); f is the tau-quantile of y;
- asymmetric Gaussian (AG): p = C_tau/sigma * exp(-|tau - 1{u<0}| u^2); f is the tau-expectile;
- Gaussian: y ~ N(f, sigma^2) (the chained heteroscedastic GP).
Mean and variance are f + sigma*m and sigma^2*v with the constants below. Ambiguity A1 is decided
as the spec's main formula: the AG exponent is rho^e (no 1/2).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from orchestrator.device import rand, randn

__all__ = [
    "al_constants",
    "ag_constants",
    "ag_normalizer",
    "noise_constants",
    "log_prob",
    "cdf",
    "sample",
    "pinball",
]

_SQRT_PI = math.sqrt(math.pi)


def _check_tau(tau: float) -> float:
    tau = float(tau)
    if not 0.0 < tau < 1.0:
        raise ValueError(f"tau must be in (0, 1); got {tau}")
    return tau


def pinball(u: Tensor, tau: float) -> Tensor:
    """Pinball (check) loss rho_tau(u) = max(tau u, (tau - 1) u) (spec §1.1, eq. 2)."""
    return torch.maximum(tau * u, (tau - 1.0) * u)


def al_constants(tau: float) -> tuple[float, float]:
    """(c_m, c_v) of the asymmetric Laplace: E[y] = f + sigma c_m, Var[y] = sigma^2 c_v (spec §1.2)."""
    t = _check_tau(tau)
    return (1 - 2 * t) / (t * (1 - t)), (1 - 2 * t + 2 * t * t) / (t * t * (1 - t) ** 2)


def ag_normalizer(tau: float) -> float:
    """C_tau = 2 sqrt(tau(1-tau)) / (sqrt(pi) (sqrt(tau) + sqrt(1-tau))) of the asymmetric Gaussian."""
    t = _check_tau(tau)
    return 2 * math.sqrt(t * (1 - t)) / (_SQRT_PI * (math.sqrt(t) + math.sqrt(1 - t)))


def ag_constants(tau: float) -> tuple[float, float]:
    """(m_e, v_e) of the asymmetric Gaussian: E[y] = f + sigma m_e, Var[y] = sigma^2 v_e (spec §1.2)."""
    t = _check_tau(tau)
    m_e = (1 - 2 * t) / (_SQRT_PI * math.sqrt(t * (1 - t)) * (math.sqrt(t) + math.sqrt(1 - t)))
    e_u2 = (1 - math.sqrt(t * (1 - t))) / (2 * t * (1 - t))
    return m_e, e_u2 - m_e * m_e


def noise_constants(family: str, tau: float) -> tuple[float, float]:
    """(mean factor, variance factor) of the noise law of `family` at level `tau`."""
    if family == "asymmetric_laplace":
        return al_constants(tau)
    if family == "asymmetric_gaussian":
        return ag_constants(tau)
    if family == "gaussian":
        return 0.0, 1.0
    raise ValueError(f"unknown likelihood family {family!r}")


def log_prob(family: str, y: Tensor, f: Tensor, g: Tensor, tau: float) -> Tensor:
    """log p(y | f, sigma = e^g) for `family`; broadcasts over all arguments."""
    u = (y - f) * torch.exp(-g)
    if family == "asymmetric_laplace":
        t = _check_tau(tau)
        return math.log(t * (1 - t)) - g - pinball(u, t)
    if family == "asymmetric_gaussian":
        t = _check_tau(tau)
        w = torch.where(u < 0, 1 - t, t)
        return math.log(ag_normalizer(t)) - g - w * u * u
    if family == "gaussian":
        return -0.5 * math.log(2 * math.pi) - g - 0.5 * u * u
    raise ValueError(f"unknown likelihood family {family!r}")


def cdf(family: str, y: Tensor, f: Tensor, g: Tensor, tau: float) -> Tensor:
    """P(Y <= y | f, sigma = e^g) for `family`; broadcasts over all arguments.

    AL: tau e^{(1-tau)u} for u < 0, 1 - (1-tau) e^{-tau u} for u >= 0.
    AG: integrating C e^{-w t^2}: C sqrt(pi/(1-tau)) Phi(u sqrt(2(1-tau))) for u < 0, and
    C sqrt(pi/(1-tau))/2 + C sqrt(pi/tau) (Phi(u sqrt(2 tau)) - 1/2) for u >= 0.
    """
    u = (y - f) * torch.exp(-g)
    if family == "gaussian":
        return torch.special.ndtr(u)
    t = _check_tau(tau)
    neg = u < 0
    if family == "asymmetric_laplace":
        lo = t * torch.exp((1 - t) * torch.where(neg, u, torch.zeros_like(u)))
        hi = 1 - (1 - t) * torch.exp(-t * torch.where(neg, torch.zeros_like(u), u))
        return torch.where(neg, lo, hi)
    if family == "asymmetric_gaussian":
        c = ag_normalizer(t)
        a_lo = c * math.sqrt(math.pi / (1 - t))
        a_hi = c * math.sqrt(math.pi / t)
        lo = a_lo * torch.special.ndtr(u * math.sqrt(2 * (1 - t)))
        hi = 0.5 * a_lo + a_hi * (torch.special.ndtr(u * math.sqrt(2 * t)) - 0.5)
        return torch.where(neg, lo, hi)
    raise ValueError(f"unknown likelihood family {family!r}")


def sample(
    family: str, f: Tensor, g: Tensor, tau: float, generator: torch.Generator | None = None
) -> Tensor:
    """One draw of y for every element of the broadcast (f, g).

    AL: sigma (E1/tau - E2/(1-tau)), E1, E2 ~ Exp(1) (spec §1.2). AG: a two-piece normal: the
    left half with probability P(u<0) = C sqrt(pi/(1-tau))/2 and half-normal scales 1/sqrt(2w).
    """
    f, g = torch.broadcast_tensors(f, g)
    sigma = torch.exp(g)
    tk = {"dtype": f.dtype, "device": f.device}
    if family == "gaussian":
        return f + sigma * randn(*f.shape, generator=generator, **tk)
    t = _check_tau(tau)
    if family == "asymmetric_laplace":
        where = {"dtype": f.dtype, "device": generator.device if generator is not None else f.device}
        e1 = torch.empty(f.shape, **where).exponential_(generator=generator).to(f.device)
        e2 = torch.empty(f.shape, **where).exponential_(generator=generator).to(f.device)
        return f + sigma * (e1 / t - e2 / (1 - t))
    if family == "asymmetric_gaussian":
        p_left = 0.5 * ag_normalizer(t) * math.sqrt(math.pi / (1 - t))
        left = rand(*f.shape, generator=generator, **tk) < p_left
        z = randn(*f.shape, generator=generator, **tk).abs()
        u = torch.where(left, -z / math.sqrt(2 * (1 - t)), z / math.sqrt(2 * t))
        return f + sigma * u
    raise ValueError(f"unknown likelihood family {family!r}")
