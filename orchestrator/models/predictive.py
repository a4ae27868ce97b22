"""The predictive distribution of y at a point: what a forecast records and a calibrator scores.

For the two-latent models (quantile-expectile-bo.md §1.2–1.4), y | f, g follows the noise law of the
family with sigma = e^g, and the posterior has independent marginals f ~ N(mu_f, var_f),
g ~ N(mu_g, var_g). The predictive CDF is E_{f,g}[F(y | f, e^g)]: the f-integral is closed form for
the Gaussian and asymmetric-Laplace laws (Gaussian integrals of exponentials) and for the asymmetric
Gaussian (f plus either half-normal half of its noise is skew-normal: Owen's T); the g-integral uses
Gauss–Hermite quadrature. An exact GP is the Gaussian family with var_g = 0 (g = log noise std).
Everything is in the original units of y.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from botorch.utils.probability.utils import log_ndtr
from scipy.special import owens_t
from torch import Tensor

from orchestrator.models import distributions as D

__all__ = ["Forecast"]

#: Gauss–Hermite nodes for the g-integral
_GH_G = 32
#: floor on the posterior std of f, below which f is treated as known (avoids 0/0)
_MIN_STD_F = 1e-12
#: bisection steps for quantiles (bracket shrinks by 2^-80)
_BISECT_STEPS = 80


_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


def _log_exp_ndtr(lin: Tensor, u: Tensor, x: Tensor) -> Tensor:
    """log(exp(lin) Phi(-x)) where lin = (x^2 - u^2) / 2, which equals log(phi(u) M(x)), M the Mills ratio
    Phi(-x) / phi(x). For x >= 0 by the scaled complementary error function, M(x) =
    sqrt(pi/2) erfcx(x / sqrt(2)): `lin` and log Phi(-x) would both be ~x^2/2 there and cancel (at 1e17 once
    the noise scale is 1e-10 of f's spread). For x < 0 as written: Phi(-x) ~ 1 and `lin` holds no large part
    that cancels, whereas u^2/2 may (f's spread tiny next to the noise)."""
    pos = x.clamp_min(0)
    mills = -0.5 * u * u + torch.log(torch.special.erfcx(pos / math.sqrt(2))) + 0.5 * math.log(math.pi / 2)
    return torch.where(x >= 0, mills - _HALF_LOG_2PI, lin + log_ndtr(-x.clamp_max(0)))


def _gauss_hermite(n: int, **tk: Any) -> tuple[Tensor, Tensor]:
    """Nodes z and weights w with sum_i w_i h(z_i) ~ E[h(Z)], Z ~ N(0, 1)."""
    x, w = np.polynomial.hermite.hermgauss(n)
    return torch.tensor(x * math.sqrt(2.0), **tk), torch.tensor(w / math.sqrt(math.pi), **tk)


def _normal_plus_half_normal_cdf(y: Tensor, mu: Tensor, s: Tensor, h: Tensor) -> Tensor:
    """P(f + h|Z| <= y) for f ~ N(mu, s^2) and Z ~ N(0, 1) independent, h signed (broadcast).

    f + h|Z| is skew-normal with scale omega = sqrt(s^2 + h^2) and shape alpha = h/s (Azzalini 1985), whose
    CDF is Phi(z) - 2 T(z, alpha) at z = (y - mu)/omega, T being Owen's T function. Exact for any h/s: a
    quadrature over f turns the noise law's CDF, a step about |h| wide, into a staircase once |h| << s
    (48 Gauss-Hermite nodes were 0.05 off at |h|/s = 0.05).
    """
    y, mu, s, h = torch.broadcast_tensors(y, mu, s, h)
    z = (y - mu) / torch.sqrt(s * s + h * h)
    tee = torch.from_numpy(
        owens_t(z.detach().cpu().double().numpy(), (h / s).detach().cpu().double().numpy())
    )
    return torch.special.ndtr(z) - 2 * tee.to(z)


@dataclass
class Forecast:
    """Independent predictive marginals of y at `n` points.

    Attributes:
        family: "asymmetric_laplace", "asymmetric_gaussian" or "gaussian".
        tau: level of the AL/AG law (ignored by "gaussian").
        mu_f, var_f: `n` posterior mean and variance of f.
        mu_g, var_g: `n` posterior mean and variance of g = log sigma.
    """

    family: str
    tau: float
    mu_f: Tensor
    var_f: Tensor
    mu_g: Tensor
    var_g: Tensor

    def __post_init__(self) -> None:
        D.noise_constants(self.family, self.tau if self.family != "gaussian" else 0.5)
        parts = (self.mu_f, self.var_f, self.mu_g, self.var_g)
        device = next((t.device for t in parts if torch.is_tensor(t)), None)
        tensors = [torch.as_tensor(t, dtype=torch.float64, device=device) for t in parts]
        self.mu_f, self.var_f, self.mu_g, self.var_g = (
            t.reshape(-1) for t in torch.broadcast_tensors(*tensors)
        )

    def __len__(self) -> int:
        return self.mu_f.shape[0]

    def __getitem__(self, idx: Any) -> Forecast:
        sel = lambda t: t[idx].reshape(-1)  # noqa: E731
        return Forecast(
            self.family, self.tau, sel(self.mu_f), sel(self.var_f), sel(self.mu_g), sel(self.var_g)
        )

    # ------------------------------------------------------------------ records
    def to_records(self) -> list[dict[str, Any]]:
        """One plain dict per point (what the event log stores with a proposal)."""
        return [
            {
                "family": self.family,
                "tau": float(self.tau),
                "mu_f": float(a),
                "var_f": float(b),
                "mu_g": float(c),
                "var_g": float(d),
            }
            for a, b, c, d in zip(
                self.mu_f.tolist(), self.var_f.tolist(), self.mu_g.tolist(), self.var_g.tolist()
            )
        ]

    @classmethod
    def from_records(cls, records: Sequence[dict[str, Any]]) -> Forecast:
        """Inverse of `to_records`; all records must share family and tau."""
        if not records:
            raise ValueError("from_records needs at least one record")
        fam, tau = records[0]["family"], float(records[0]["tau"])
        for i, r in enumerate(records):
            if r["family"] != fam or float(r["tau"]) != tau:
                raise ValueError(f"record {i} has family/tau {r['family']}/{r['tau']}; expected {fam}/{tau}")
        col = lambda k: torch.tensor([float(r[k]) for r in records], dtype=torch.float64)  # noqa: E731
        return cls(fam, tau, col("mu_f"), col("var_f"), col("mu_g"), col("var_g"))

    # ------------------------------------------------------------------ moments
    def mean(self) -> Tensor:
        """E[y] = mu_f + c_m E[sigma]."""
        cm, _ = D.noise_constants(self.family, self.tau)
        return self.mu_f + cm * torch.exp(self.mu_g + 0.5 * self.var_g)

    def variance(self) -> Tensor:
        """Var[y] = var_f + c_m^2 Var(sigma) + c_v E[sigma^2] (spec §3.2 diagonal)."""
        cm, cv = D.noise_constants(self.family, self.tau)
        e_s2 = torch.exp(2 * self.mu_g + 2 * self.var_g)
        var_s = torch.expm1(self.var_g) * torch.exp(2 * self.mu_g + self.var_g)
        return self.var_f + cm * cm * var_s + cv * e_s2

    # ------------------------------------------------------------------ CDF and quantiles
    def cdf(self, y: Tensor | float) -> Tensor:
        """P(Y_i <= y_i): `y` is a scalar, `n`, or `n x k` (points first); returns its shape (`n` for a
        scalar)."""
        y = torch.as_tensor(y, dtype=torch.float64, device=self.mu_f.device)
        if y.ndim == 0:
            y = y.expand(len(self))
        if y.shape[0] != len(self):
            raise ValueError(f"y must have the {len(self)} points first; got shape {tuple(y.shape)}")
        shape = (len(self),) + (1,) * (y.ndim - 1)

        def col(t: Tensor) -> Tensor:
            return t.reshape(shape)

        z_g, w_g = _gauss_hermite(_GH_G, dtype=torch.float64, device=self.mu_f.device)
        # latent axis last: g nodes
        g = col(self.mu_g).unsqueeze(-1) + col(self.var_g).clamp_min(0).sqrt().unsqueeze(-1) * z_g
        mu = col(self.mu_f).unsqueeze(-1)
        s = col(self.var_f).clamp_min(0).sqrt().clamp_min(_MIN_STD_F).unsqueeze(-1)
        yy = y.unsqueeze(-1)
        sigma = torch.exp(g)
        if self.family == "gaussian":
            vals = torch.special.ndtr((yy - mu) / torch.sqrt(sigma * sigma + s * s))
        elif self.family == "asymmetric_laplace":
            t = self.tau
            a, b = (1 - t) / sigma, t / sigma
            d = yy - mu
            # tau * E[exp(a(y-f)) 1{f>y}] = tau exp(a d + (a s)^2/2) Phi(-x1), x1 = u + a s, u = d / s, and
            # (1-tau) * E[exp(-b(y-f)) 1{f<=y}] = (1-tau) exp(-b d + (b s)^2/2) Phi(-x2), x2 = b s - u
            u = d / s
            log1 = math.log(t) + _log_exp_ndtr(a * d + 0.5 * (a * s) ** 2, u, u + a * s)
            log2 = math.log(1 - t) + _log_exp_ndtr(-b * d + 0.5 * (b * s) ** 2, u, b * s - u)
            vals = torch.exp(log1) + torch.special.ndtr(u) - torch.exp(log2)
        else:  # asymmetric_gaussian: y = f + e, e a two-piece normal (D.sample); each half is exact
            t = self.tau
            p_left = 0.5 * D.ag_normalizer(t) * math.sqrt(math.pi / (1 - t))
            vals = (p_left * _normal_plus_half_normal_cdf(yy, mu, s, -sigma / math.sqrt(2 * (1 - t)))
                    + (1 - p_left) * _normal_plus_half_normal_cdf(yy, mu, s, sigma / math.sqrt(2 * t)))
        return (vals * w_g).sum(-1).clamp(0.0, 1.0)

    def quantile(self, levels: Tensor | Sequence[float] | float) -> Tensor:
        """`n x k` predictive quantiles for `k` levels in (0, 1), by vectorised bisection on the CDF."""
        p = torch.as_tensor(levels, dtype=torch.float64, device=self.mu_f.device).reshape(-1)
        if ((p <= 0) | (p >= 1)).any() or not torch.isfinite(p).all():
            raise ValueError(f"quantile levels must be in (0, 1); got {p.tolist()}")
        sd = self.variance().clamp_min(1e-300).sqrt()
        span = 60.0 * sd + 60.0 * torch.exp(self.mu_g + 3 * self.var_g.clamp_min(0).sqrt()) + 1e-9
        lo = (self.mu_f - span).unsqueeze(-1).expand(-1, p.numel()).clone()
        hi = (self.mu_f + span).unsqueeze(-1).expand(-1, p.numel()).clone()
        for _ in range(_BISECT_STEPS):
            mid = 0.5 * (lo + hi)
            below = self.cdf(mid) < p
            lo = torch.where(below, mid, lo)
            hi = torch.where(below, hi, mid)
        return 0.5 * (lo + hi)

    def interval(self, coverage: float) -> tuple[Tensor, Tensor]:
        """Central interval holding `coverage` of the predictive mass: (lower `n`, upper `n`)."""
        if not 0 < coverage < 1:
            raise ValueError(f"coverage must be in (0, 1); got {coverage}")
        q = self.quantile([(1 - coverage) / 2, (1 + coverage) / 2])
        return q[:, 0], q[:, 1]
