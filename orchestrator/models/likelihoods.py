"""GPyTorch likelihoods of the two-latent quantile, expectile and heteroscedastic GPs.

quantile-expectile-bo.md §1.2 (asymmetric Laplace and asymmetric Gaussian observation models) and §1.5
(closed-form expected log-likelihoods under factorised Gaussian q(f) q(g)); Picheny et al. 2022, eqs 6-7.
Each likelihood acts on two latents: f (the quantile, expectile, or mean) and g = log sigma, passed as
function samples with a trailing dimension of 2 (`... x n x 2`) or as a distribution over them (a 2-task
`MultitaskMultivariateNormal`, or anything whose `mean`/`variance` end in a dimension of 2).

Ambiguity A1: the asymmetric Gaussian uses exp(-rho^e_tau(u)) without a factor 1/2, as in the spec's main
formula; rho^e_0.5(u) = u^2 / 2, so at tau = 0.5 it is N(f, sigma^2). The alternative, exp(-rho^e_tau(u) / 2),
would give N(f, 2 sigma^2): it only rescales sigma by sqrt(2).
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
from gpytorch.likelihoods import Likelihood
from scipy import special
from torch import Tensor
from torch.distributions import Distribution, Normal

from orchestrator.errors import ConfigError, InputDataError
from orchestrator.models import distributions as D

__all__ = [
    "AsymmetricGaussianLikelihood",
    "AsymmetricLaplaceLikelihood",
    "HeteroscedasticGaussianLikelihood",
    "TwoLatentNoise",
    "check_tau",
]

#: floor on the posterior std of f inside the closed forms (spec §3.5)
MIN_STD_F = 1e-10
#: cap on the exponent of the log-normal factors exp(-k mu_g + ...) (spec §3.5: avoid overflow)
MAX_EXPONENT = 60.0
_LOG_2PI = math.log(2.0 * math.pi)


def check_tau(tau: Any, name: str = "tau") -> float:
    """Return `tau` as a float, or raise `ConfigError` naming it unless it lies in the open interval (0,
    1)."""
    try:
        value = float(tau)
    except (TypeError, ValueError):
        raise ConfigError(f"`{name}` must be a number in (0, 1); got {tau!r}") from None
    if not (0.0 < value < 1.0):
        raise ConfigError(f"`{name}` must be in the open interval (0, 1); got {tau!r}")
    return value


def _split_latents(function_samples: Tensor) -> tuple[Tensor, Tensor]:
    if function_samples.shape[-1] != 2:
        raise InputDataError(
            "function samples must end in a dimension of 2 (f, g = log sigma); "
            f"got shape {tuple(function_samples.shape)}"
        )
    return function_samples[..., 0], function_samples[..., 1]


def _latent_moments(function_dist: Any) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(mu_f, var_f, mu_g, var_g), each `... x n`, from a distribution over `... x n x 2` latents."""
    mean, var = function_dist.mean, function_dist.variance
    if mean.shape[-1] != 2 or var.shape != mean.shape:
        raise InputDataError(
            "the latent distribution must have mean and variance ending in a dimension of 2 (f, g); "
            f"got mean {tuple(mean.shape)} and variance {tuple(var.shape)}"
        )
    return mean[..., 0], var[..., 0], mean[..., 1], var[..., 1]


class TwoLatentNoise(Distribution):
    """Law of y given the latents: y = f + sigma * eps, eps from the noise law of `family` (spec §1.2).

    A thin `torch.distributions.Distribution` over `orchestrator.models.distributions` (log-density, CDF,
    sampling, moments), with batch shape the broadcast shape of `loc` and `scale`.

    Args:
        family: "asymmetric_laplace" or "asymmetric_gaussian" (or "gaussian").
        loc: f, the tau-quantile (AL) or tau-expectile (AG).
        scale: sigma = e^g > 0.
        tau: level in (0, 1).
    """

    arg_constraints: dict = {}
    has_rsample = True

    def __init__(self, family: str, loc: Tensor, scale: Tensor, tau: float) -> None:
        self.family = family
        self.tau = check_tau(tau)
        self.loc, self.scale = torch.broadcast_tensors(loc, scale)
        self._m, self._v = D.noise_constants(family, self.tau)
        super().__init__(batch_shape=self.loc.shape, validate_args=False)

    @property
    def mean(self) -> Tensor:
        return self.loc + self._m * self.scale

    @property
    def variance(self) -> Tensor:
        return self._v * self.scale**2

    def log_prob(self, value: Tensor) -> Tensor:
        return D.log_prob(self.family, value, self.loc, self.scale.log(), self.tau)

    def cdf(self, value: Tensor) -> Tensor:
        return D.cdf(self.family, value, self.loc, self.scale.log(), self.tau)

    def rsample(self, sample_shape: torch.Size = torch.Size()) -> Tensor:
        shape = torch.Size(sample_shape) + self.loc.shape
        return D.sample(self.family, self.loc.expand(shape), self.scale.log().expand(shape), self.tau)


def _lognormal_factor(k: float, mu_g: Tensor, var_g: Tensor) -> Tensor:
    """E[exp(-k g)] = exp(-k mu_g + k^2 var_g / 2) for g ~ N(mu_g, var_g), with a capped exponent."""
    return torch.exp((-k * mu_g + 0.5 * k * k * var_g).clamp(max=MAX_EXPONENT))


#: the elementwise functions of the closed-form gradients, on torch tensors or on numpy arrays (the site
#: updates of `orchestrator.models.full_variational` run on numpy arrays: a small array's operation costs a
#: fraction of a torch call there)
_TORCH_OPS = SimpleNamespace(exp=torch.exp, sqrt=torch.sqrt, ndtr=torch.special.ndtr, maximum=torch.clamp_min,
                             minimum=torch.clamp_max, as_float=lambda b, like: b.to(like.dtype))
_NUMPY_OPS = SimpleNamespace(
    exp=np.exp,
    sqrt=np.sqrt,
    ndtr=special.ndtr,
    maximum=np.maximum,
    minimum=np.minimum,
    as_float=lambda b, like: b.astype(like.dtype),
)


def _ops(x: Any) -> SimpleNamespace:
    return _NUMPY_OPS if isinstance(x, np.ndarray) else _TORCH_OPS


def _lognormal_factor_grads(k: float, mu_g: Any, var_g: Any) -> tuple[Any, Any]:
    """(E[exp(-k g)], 1 where the exponent is under its cap, else 0): the factor's derivatives in (mu_g,
    var_g) are (-k, k^2 / 2) times the factor times that mask (the capped exponent is constant, as autograd
    has it)."""
    o = _ops(mu_g)
    exponent = -k * mu_g + 0.5 * k * k * var_g
    return o.exp(o.minimum(exponent, MAX_EXPONENT)), o.as_float(exponent <= MAX_EXPONENT, exponent)


def _floored_std(var_f: Any) -> tuple[Any, Any, Any]:
    """(var_f floored at `MIN_STD_F`^2, its square root, 1 where var_f is at or above the floor, else 0: the
    floored value's derivative)."""
    o = _ops(var_f)
    floored = o.maximum(var_f, MIN_STD_F**2)
    return floored, o.sqrt(floored), o.as_float(var_f >= MIN_STD_F**2, var_f)


class _TwoLatentLikelihood(Likelihood):
    """Base of the likelihoods on (f, g): `forward` gives the law of y, `expected_log_prob` a closed form.

    A subclass names its `family` (models/distributions.py); `forward` is the law of y for that family at
    level `tau`, with loc f and scale e^g.
    """

    family: str

    def __init__(self, tau: float) -> None:
        super().__init__()
        self.tau = check_tau(tau)

    def forward(self, function_samples: Tensor, *args: Any, **kwargs: Any) -> Distribution:
        f, g = _split_latents(function_samples)
        return TwoLatentNoise(self.family, f, g.exp(), self.tau)

    def log_prob_latent(self, y: Tensor, f: Tensor, g: Tensor) -> Tensor:
        """log p(y | f, sigma = e^g), elementwise (broadcasting)."""
        return self.forward(torch.stack(torch.broadcast_tensors(f, g), dim=-1)).log_prob(y)

    def expected_log_prob_moments(
        self, y: Tensor, mu_f: Tensor, var_f: Tensor, mu_g: Tensor, var_g: Tensor
    ) -> Tensor:
        """E_{q(f) q(g)}[log p(y | f, e^g)] for independent Gaussian marginals, elementwise (spec §1.5)."""
        raise NotImplementedError

    def expected_log_prob_grads(
        self, y: Any, mu_f: Any, var_f: Any, mu_g: Any, var_g: Any
    ) -> tuple[Any, tuple]:
        """`expected_log_prob_moments` (elementwise) and its derivatives in (mu_f, var_f, mu_g, var_g), each
        elementwise (the gradients of the summed values), without an autograd graph; torch tensors or numpy
        arrays in, the same out.

        The natural-gradient site updates (`orchestrator.models.full_variational`) take these at every step;
        the families here override this with closed forms, this default differentiates the closed form by
        autograd.
        """
        if isinstance(mu_f, np.ndarray):
            value, grads = self.expected_log_prob_grads(*(torch.from_numpy(np.asarray(t, dtype=np.float64))
                                                          for t in (y, mu_f, var_f, mu_g, var_g)))
            return value.numpy(), tuple(g.numpy() for g in grads)
        with torch.enable_grad():
            leaves = [t.detach().clone().requires_grad_(True) for t in (mu_f, var_f, mu_g, var_g)]
            value = self.expected_log_prob_moments(y, *leaves)
            grads = torch.autograd.grad(value.sum(), leaves, allow_unused=True)
        return value.detach(), tuple(torch.zeros_like(t) if g is None else g for t, g in zip(leaves, grads))

    def expected_log_prob(
        self, observations: Tensor, function_dist: Any, *args: Any, **kwargs: Any
    ) -> Tensor:
        """Per-datum expected log-likelihood `... x n` under a distribution over `... x n x 2` latents.

        Only the marginal means and variances enter (q(f_n) and q(g_n) are independent, spec §1.5).
        """
        mu_f, var_f, mu_g, var_g = _latent_moments(function_dist)
        return self.expected_log_prob_moments(observations, mu_f, var_f, mu_g, var_g)


class AsymmetricLaplaceLikelihood(_TwoLatentLikelihood):
    """Quantile likelihood: p(y | f, sigma) = tau (1 - tau) / sigma exp(-rho_tau((y - f) / sigma)) (spec
    §1.2).

    f is the tau-quantile of y: P(y <= f) = tau.

    Args:
        tau: quantile level in (0, 1).
    """

    family = "asymmetric_laplace"

    def expected_log_prob_moments(
        self, y: Tensor, mu_f: Tensor, var_f: Tensor, mu_g: Tensor, var_g: Tensor
    ) -> Tensor:
        """log tau(1-tau) - mu_g - exp(-mu_g + s_g^2/2) [(tau - Phi(-zeta)) m + s_f phi(zeta)], m = y -
        mu_f."""
        tau = self.tau
        m = y - mu_f
        s_f = var_f.clamp_min(MIN_STD_F**2).sqrt()
        zeta = m / s_f
        e_rho = (tau - torch.special.ndtr(-zeta)) * m + s_f * torch.exp(-0.5 * zeta**2 - 0.5 * _LOG_2PI)
        return math.log(tau * (1.0 - tau)) - mu_g - _lognormal_factor(1.0, mu_g, var_g) * e_rho

    def expected_log_prob_grads(
        self, y: Any, mu_f: Any, var_f: Any, mu_g: Any, var_g: Any
    ) -> tuple[Any, tuple]:
        """With E[rho] = (tau - Phi(-zeta)) m + s_f phi(zeta) and c = E[e^-g]: dE[rho]/dm = tau - Phi(-zeta)
        and dE[rho]/ds_f = phi(zeta), so dE/dmu_f = c (tau - Phi(-zeta)), dE/dvar_f = -c phi(zeta) / (2 s_f),
        dE/dmu_g = -1 + c E[rho], dE/dvar_g = -c E[rho] / 2."""
        o, tau = _ops(mu_f), self.tau
        m = y - mu_f
        _, s_f, floor_mask = _floored_std(var_f)
        zeta = m / s_f
        phi = o.exp(-0.5 * zeta**2 - 0.5 * _LOG_2PI)
        below = tau - o.ndtr(-zeta)
        e_rho = below * m + s_f * phi
        c, cap_mask = _lognormal_factor_grads(1.0, mu_g, var_g)
        c_e = c * e_rho
        value = math.log(tau * (1.0 - tau)) - mu_g - c_e
        c_e = c_e * cap_mask
        return value, (c * below, -0.5 * c * phi / s_f * floor_mask, c_e - 1.0, -0.5 * c_e)


class AsymmetricGaussianLikelihood(_TwoLatentLikelihood):
    """Expectile likelihood: p(y | f, sigma) = C_tau / sigma exp(-|tau - 1{u<0}| u^2), u = (y - f) / sigma.

    f is the tau-expectile of y (spec §1.2; exponent without 1/2, ambiguity A1).

    Args:
        tau: expectile level in (0, 1).
    """

    family = "asymmetric_gaussian"

    def expected_log_prob_moments(
        self, y: Tensor, mu_f: Tensor, var_f: Tensor, mu_g: Tensor, var_g: Tensor
    ) -> Tensor:
        """log C - mu_g - exp(-2mu_g + 2s_g^2)[tau (m^2+s_f^2) + (1-2tau)((m^2+s_f^2)Phi(-zeta) - m s_f
        phi(zeta))]."""
        tau = self.tau
        m = y - mu_f
        var_f = var_f.clamp_min(MIN_STD_F**2)
        s_f = var_f.sqrt()
        zeta = m / s_f
        second = m**2 + var_f
        neg = second * torch.special.ndtr(-zeta) - m * s_f * torch.exp(-0.5 * zeta**2 - 0.5 * _LOG_2PI)
        e_w_u2 = tau * second + (1.0 - 2.0 * tau) * neg
        log_c = math.log(D.ag_normalizer(tau))
        return log_c - mu_g - _lognormal_factor(2.0, mu_g, var_g) * e_w_u2

    def expected_log_prob_grads(
        self, y: Any, mu_f: Any, var_f: Any, mu_g: Any, var_g: Any
    ) -> tuple[Any, tuple]:
        """With W = E[|tau - 1{u<0}| u^2] and c = E[e^-2g]: dW/dm = 2 tau m + 2 (1 - 2 tau)(m Phi(-zeta) - s_f
        phi(zeta)) and dW/dvar_f = tau + (1 - 2 tau) Phi(-zeta) (E[u^2; u < 0] has derivatives 2 E[u; u < 0]
        and P(u < 0)), so dE/dmu_f = c dW/dm, dE/dvar_f = -c dW/dvar_f, dE/dmu_g = -1 + 2 c W, dE/dvar_g = -2
        c W."""
        o, tau = _ops(mu_f), self.tau
        m = y - mu_f
        var_f, s_f, floor_mask = _floored_std(var_f)
        zeta = m / s_f
        phi = o.exp(-0.5 * zeta**2 - 0.5 * _LOG_2PI)
        below = o.ndtr(-zeta)
        second = m**2 + var_f
        e_w_u2 = tau * second + (1.0 - 2.0 * tau) * (second * below - m * s_f * phi)
        d_m = 2.0 * tau * m + 2.0 * (1.0 - 2.0 * tau) * (m * below - s_f * phi)
        d_v = tau + (1.0 - 2.0 * tau) * below
        c, cap_mask = _lognormal_factor_grads(2.0, mu_g, var_g)
        c_w = c * e_w_u2
        value = math.log(D.ag_normalizer(tau)) - mu_g - c_w
        c_w = c_w * cap_mask
        return value, (c * d_m, -c * d_v * floor_mask, 2.0 * c_w - 1.0, -2.0 * c_w)


class HeteroscedasticGaussianLikelihood(_TwoLatentLikelihood):
    """HetGP likelihood (Saul et al. 2016): y ~ N(f, e^{2g}) (spec §1.3).

    Args:
        tau: the level of the plug-in quantile mu_f + Phi^-1(tau) e^{mu_g} that the HetGP baseline optimizes
            (it does not enter the likelihood).
    """

    family = "gaussian"

    def __init__(self, tau: float = 0.5) -> None:
        super().__init__(tau)

    def forward(self, function_samples: Tensor, *args: Any, **kwargs: Any) -> Distribution:
        f, g = _split_latents(function_samples)
        return Normal(f, g.exp())

    def expected_log_prob_moments(
        self, y: Tensor, mu_f: Tensor, var_f: Tensor, mu_g: Tensor, var_g: Tensor
    ) -> Tensor:
        """-1/2 log 2pi - mu_g - 1/2 ((y - mu_f)^2 + s_f^2) exp(-2 mu_g + 2 s_g^2)."""
        return -0.5 * _LOG_2PI - mu_g - 0.5 * ((y - mu_f) ** 2 + var_f) * _lognormal_factor(2.0, mu_g, var_g)

    def expected_log_prob_grads(
        self, y: Any, mu_f: Any, var_f: Any, mu_g: Any, var_g: Any
    ) -> tuple[Any, tuple]:
        """With c = E[e^-2g]: dE/dmu_f = c (y - mu_f), dE/dvar_f = -c / 2, dE/dmu_g = -1 + c ((y - mu_f)^2 +
        var_f), dE/dvar_g = -c ((y - mu_f)^2 + var_f)."""
        m = y - mu_f
        second = m**2 + var_f
        c, cap_mask = _lognormal_factor_grads(2.0, mu_g, var_g)
        value = -0.5 * _LOG_2PI - mu_g - 0.5 * second * c
        c_s = c * second * cap_mask
        return value, (c * m, -0.5 * c, c_s - 1.0, -c_s)
