"""Closed-form terms of Q-GIBBON: the batch covariance C, the conditional variances V_i(g*), in log space.

quantile-expectile-bo.md §3.2 (Picheny et al. 2022, appendix eqs 14-20) and §3.5 (numerical safeguards).
Two latents f ⊥ g with σ = e^g log-normal; the observation law is the asymmetric Laplace (constants
c_m, c_v) or the asymmetric Gaussian (m_e, v_e), both from `orchestrator.models.distributions`:

- C_ij = Σ_f[i,j] + c_m² Cov(σ_i, σ_j), Cov(σ_i, σ_j) = exp(μ_gi + μ_gj + ½(s²_gi + s²_gj)) (e^{Σ_g[i,j]} −
  1);
- C_ii = s²_fi + N_i with the noise part N_i = c_m² Var(σ_i) + c_v E[σ_i²] = e^{2μ_g + 2s²_g} (c_v − c_m²
  expm1(−s²_g));
- V_i(g*) = s²_fi v(γ_i) + N_i, γ_i = (g* − μ_fi)/s_fi, v(γ) = Var(Z | Z ≤ γ) = 1 − γr − r², r = φ(γ)/Φ(γ).

The acquisition pieces (quality Q = mean_{g*} ½ log(C_ii/V_i), repulsion R = ½ log(Schur/C_xx)) are
returned as logarithms of their magnitudes, so that huge candidate sets (large γ) never round them to
zero (the failure of BoTorch's GIBBON in meta-pytorch/botorch issue #3368), and `signed_log_gain` joins them
into one strictly increasing, never-zero transform of the greedy gain Q + w R for the optimizer.
"""

from __future__ import annotations

import math

import torch
from botorch.utils.probability.utils import log_phi
from botorch.utils.safe_math import log1mexp
from torch import Tensor

__all__ = [
    "STD_FLOOR",
    "TRUNC_VAR_FLOOR",
    "TRUNC_ASYMPTOTIC_GAMMA",
    "SCHUR_FLOOR",
    "MU_G_MAX",
    "VAR_G_MAX",
    "truncated_variance_factor",
    "log_info_factor",
    "log_noise_variance",
    "sigma_cross_covariance",
    "batch_covariance",
    "conditional_variance",
    "log_quality",
    "log_repulsion",
    "signed_log_gain",
    "qgibbon_value",
]

#: spec §3.5: posterior std of f is clipped at s_f >= 1e-10 (so variances at 1e-20)
STD_FLOOR = 1e-10
#: spec §3.5: the truncated-variance factor 1 − γr − r² is clamped at >= 1e-12
TRUNC_VAR_FLOOR = 1e-12
#: spec §3.5 switches to the asymptotic series of v(γ) below γ = −8 with 1/γ² − 6/γ⁴. That two-term series is
#: 1.1% off at γ = −8 (a visible jump), while the direct 1 − r(γ + r) is accurate to 3e-11 there. We keep the
#: spec's series with its next two terms (+50/γ⁶ − 518/γ⁸) and switch where both forms agree (4e-8): γ = −25.
TRUNC_ASYMPTOTIC_GAMMA = -25.0
#: spec §3.5: the Schur complement C_xx − c_xPᵀ C_PP⁻¹ c_xP is clamped at >= 1e-12 · C_xx
SCHUR_FLOOR = 1e-12
#: spec §3.5: μ_g is clamped to [−MU_G_MAX, MU_G_MAX] (standardized units) so e^{2μ_g + 2s²_g} cannot overflow
MU_G_MAX = 100.0
#: spec §3.5 (same purpose): s²_g is clamped at <= VAR_G_MAX
VAR_G_MAX = 50.0
#: smallest log-gap |log Q − log wR| used in `signed_log_gain` (keeps log1mexp and its gradient finite)
MIN_LOG_GAP = 1e-12
#: below this log x, log(−log1p(−x)) is evaluated as log x + x/2 (the next term, x²/3, is < 1e-18 there)
_SMALL_LOG_X = -20.0
_LOG_HALF = math.log(0.5)


def _log_truncation_direct(gamma: Tensor) -> tuple[Tensor, Tensor]:
    """(log v, log(1 − v)) from r = φ(γ)/Φ(γ) = exp(log φ − log Φ), for γ >= TRUNC_ASYMPTOTIC_GAMMA (there
    torch's log_ndtr and its gradient are accurate; BoTorch's `log_ndtr` guards the far left tail, which the
    asymptotic branch covers)."""
    log_r = log_phi(gamma) - torch.special.log_ndtr(gamma)
    r = log_r.exp()
    g_plus_r = (gamma + r).clamp_min(torch.finfo(gamma.dtype).tiny)  # > 0 mathematically (E[Z|Z<=γ] = −r < γ)
    log_1mv = log_r + g_plus_r.log()  # log(r(γ + r)) = log(1 − v)
    log_v = (1.0 - r * g_plus_r).clamp_min(TRUNC_VAR_FLOOR).log()
    return log_v, log_1mv


def _log_truncation_pieces(gamma: Tensor) -> tuple[Tensor, Tensor]:
    """(log v(γ), log(1 − v(γ))) for the upper-truncated standard normal, stable for all finite γ."""
    asym = gamma < TRUNC_ASYMPTOTIC_GAMMA
    if not bool(asym.any()):  # the common case: one branch, fewer ops to differentiate
        return _log_truncation_direct(gamma)
    # both branches on masked inputs (so neither branch's gradient sees inf/NaN), joined by torch.where
    log_v_d, log_1mv_d = _log_truncation_direct(torch.where(asym, torch.zeros_like(gamma), gamma))
    # asymptotic branch: v ≈ 1/γ² − 6/γ⁴ + 50/γ⁶ − 518/γ⁸ (spec §3.5 series, two more terms)
    ga = torch.where(asym, gamma, torch.full_like(gamma, TRUNC_ASYMPTOTIC_GAMMA))
    w = ga.reciprocal().square()
    v_asym = w * (1.0 + w * (-6.0 + w * (50.0 - 518.0 * w)))
    log_v = torch.where(asym, v_asym.log(), log_v_d)
    log_1mv = torch.where(asym, torch.log1p(-v_asym), log_1mv_d)
    return log_v, log_1mv


def truncated_variance_factor(gamma: Tensor) -> Tensor:
    """v(γ) = Var(Z | Z ≤ γ) for Z ~ N(0, 1), i.e. 1 − γr − r² with r = φ(γ)/Φ(γ) (spec §3.2 eq 18).

    Args:
        gamma: any-shape tensor of standardized truncation points.

    Returns:
        Same-shape tensor in [TRUNC_VAR_FLOOR, 1].
    """
    return _log_truncation_pieces(gamma)[0].exp()


def log_info_factor(gamma: Tensor) -> Tensor:
    """log(1 − v(γ)) = log(r(γ + r)): the log of the variance share removed by conditioning on f ≤ g*.

    Finite for every finite γ (about −γ²/2 for large γ), where 1 − v(γ) itself underflows past γ ≈ 38.
    """
    return _log_truncation_pieces(gamma)[1]


def _clamp_g(mu_g: Tensor, var_g: Tensor) -> tuple[Tensor, Tensor]:
    return mu_g.clamp(-MU_G_MAX, MU_G_MAX), var_g.clamp(0.0, VAR_G_MAX)


def log_noise_variance(mu_g: Tensor, var_g: Tensor, c_m: float, c_v: float) -> Tensor:
    """log N with N = c_m² Var(σ) + c_v E[σ²] = e^{2μ_g + 2s²_g} (c_v − c_m² expm1(−s²_g)) (spec §3.2).

    Args:
        mu_g, var_g: posterior mean and variance of g = log σ (broadcastable).
        c_m, c_v: mean and variance factors of the noise law (AL: c_m, c_v; AG: m_e, v_e).
    """
    mu_g, var_g = _clamp_g(mu_g, var_g)
    return 2.0 * mu_g + 2.0 * var_g + torch.log(c_v - (c_m * c_m) * torch.expm1(-var_g))


def sigma_cross_covariance(
    mu_g_i: Tensor, var_g_i: Tensor, mu_g_j: Tensor, var_g_j: Tensor, cov_g_ij: Tensor
) -> Tensor:
    """Cov(σ_i, σ_j) = exp(μ_gi + μ_gj + ½(s²_gi + s²_gj)) · expm1(Σ_g[i,j]) for σ = e^g (spec §3.2, the ×½
    form).

    The exponent is formed in log space and exponentiated once; all arguments broadcast.
    """
    mu_g_i, var_g_i = _clamp_g(mu_g_i, var_g_i)
    mu_g_j, var_g_j = _clamp_g(mu_g_j, var_g_j)
    cov = cov_g_ij.clamp(-VAR_G_MAX, VAR_G_MAX)
    return torch.exp(mu_g_i + mu_g_j + 0.5 * (var_g_i + var_g_j)) * torch.expm1(cov)


def batch_covariance(Sigma_f: Tensor, mu_g: Tensor, Sigma_g: Tensor, c_m: float, c_v: float) -> Tensor:
    """The predictive covariance C of the noisy outputs y_1..n of one batch (spec §3.2, eqs 19-20).

    Args:
        Sigma_f: `... x n x n` joint posterior covariance of f.
        mu_g: `... x n` posterior mean of g.
        Sigma_g: `... x n x n` joint posterior covariance of g.
        c_m, c_v: noise-law constants (AL c_m, c_v; AG m_e, v_e).

    Returns:
        `... x n x n` C: off-diagonal Σ_f + c_m² Cov(σ_i, σ_j); diagonal s²_f + c_m² Var(σ) + c_v E[σ²].
    """
    var_g = torch.diagonal(Sigma_g, dim1=-2, dim2=-1)
    var_f = torch.diagonal(Sigma_f, dim1=-2, dim2=-1).clamp_min(STD_FLOOR**2)
    cov_sigma = sigma_cross_covariance(
        mu_g.unsqueeze(-1), var_g.unsqueeze(-1), mu_g.unsqueeze(-2), var_g.unsqueeze(-2), Sigma_g
    )
    C = Sigma_f + (c_m * c_m) * cov_sigma
    diag = var_f + log_noise_variance(mu_g, var_g, c_m, c_v).exp()
    eye = torch.eye(C.shape[-1], dtype=torch.bool, device=C.device)
    return torch.where(eye, torch.diag_embed(diag), C)


def conditional_variance(
    mu_f: Tensor, var_f: Tensor, mu_g: Tensor, var_g: Tensor, g_star: Tensor, c_m: float, c_v: float
) -> Tensor:
    """V_i(g*) = Var(f_i | f_i ≤ g*) + c_m² Var(σ_i) + c_v E[σ_i²] (spec §3.2 eqs 16-18).

    Args:
        mu_f, var_f, mu_g, var_g: `... x n` posterior marginals of f and g.
        g_star: `s` max-value samples.
        c_m, c_v: noise-law constants.

    Returns:
        `s x ... x n` conditional variances.
    """
    var_f = var_f.clamp_min(STD_FLOOR**2)
    gs = g_star.reshape(g_star.shape + (1,) * mu_f.ndim)
    gamma = (gs - mu_f) / var_f.sqrt()
    return var_f * truncated_variance_factor(gamma) + log_noise_variance(mu_g, var_g, c_m, c_v).exp()


def _log_neg_log1m(log_x: Tensor, log_1mx: Tensor) -> Tensor:
    """log(−log(1 − x)) for x in (0, 1) given both log x and log(1 − x) (whichever is accurate is used)."""
    small = log_x < _SMALL_LOG_X
    large = log_x > _LOG_HALF
    any_small, any_large = bool(small.any()), bool(large.any())
    lx_mid = log_x.clamp(_SMALL_LOG_X, _LOG_HALF) if (any_small or any_large) else log_x
    out = torch.log(-torch.log1p(-lx_mid.exp()))
    if any_small:  # −log(1 − x) = x + x²/2 + ...: log = log x + x/2 to double precision
        lx_small = log_x.clamp_max(_SMALL_LOG_X)
        out = torch.where(small, lx_small + 0.5 * lx_small.exp(), out)
    if any_large:  # x near 1: use log(1 − x) directly
        l1mx_large = torch.where(large, log_1mx, torch.full_like(log_1mx, -1.0)).clamp_max(-1e-300)
        out = torch.where(large, torch.log(-l1mx_large), out)
    return out


def log_quality(
    mu_f: Tensor, var_f: Tensor, log_noise: Tensor, g_star: Tensor
) -> tuple[Tensor, Tensor]:
    """log Q with Q = mean_{g*} ½ log(C_xx / V_x(g*)), the per-point "quality" (spec §3.4, step 1).

    Per sample, ½ log(C/V) = −½ log(1 − x) with x = (s²_f/C)(1 − v(γ)); log x comes from `log_info_factor`,
    so log Q stays finite where Q itself underflows (γ → +∞, huge candidate sets).

    Args:
        mu_f, var_f: `... x n` posterior mean and variance of f (spread already applied).
        log_noise: `... x n` log N (see `log_noise_variance`).
        g_star: `s` max-value samples.

    Returns:
        (`... x n` log Q, `... x n` log C_xx).
    """
    var_f = var_f.clamp_min(STD_FLOOR**2)
    log_var_f = var_f.log()
    log_C = torch.logaddexp(log_var_f, log_noise)
    gs = g_star.reshape(g_star.shape + (1,) * mu_f.ndim)
    gamma = (gs - mu_f) / var_f.sqrt()
    log_v, log_1mv = _log_truncation_pieces(gamma)
    log_x = log_var_f - log_C + log_1mv
    log_V = torch.logaddexp(log_var_f + log_v, log_noise)
    per_sample = _LOG_HALF + _log_neg_log1m(log_x, log_V - log_C)  # finite, so a plain logsumexp is safe
    return torch.logsumexp(per_sample, dim=0) - math.log(per_sample.shape[0]), log_C


def log_repulsion(quad: Tensor, C_xx: Tensor) -> Tensor:
    """log(−R), R = ½ log(Schur/C_xx) ≤ 0, Schur = C_xx − quad with quad = c_xPᵀ C_PP⁻¹ c_xP (spec §3.4).

    The Schur complement is clamped at SCHUR_FLOOR · C_xx (spec §3.5); a zero `quad` is floored at the
    smallest normal float so the result stays finite (very far points repel by ~1e-308, not by 0).
    """
    tiny = torch.finfo(quad.dtype).tiny
    log_C = C_xx.log()
    log_q = quad.clamp_min(tiny).log()
    schur = torch.maximum(C_xx - quad, SCHUR_FLOOR * C_xx)
    log_x = torch.minimum(log_q - log_C, torch.full_like(log_C, math.log1p(-SCHUR_FLOOR)))
    return _LOG_HALF + _log_neg_log1m(log_x, schur.log() - log_C)


def _log_scale_map(z: Tensor) -> Tensor:
    """h(z) = 1 + z for z >= 0 and 1/(1 − z) for z < 0: positive, increasing, C¹, and never underflows."""
    pos = z >= 0
    return torch.where(pos, 1.0 + z.clamp_min(0.0), (1.0 - z.clamp_max(0.0)).reciprocal())


def signed_log_gain(log_q: Tensor, log_r: Tensor | None, log_delta: Tensor | float) -> Tensor:
    """A strictly increasing, never-zero transform of the greedy gain α = Q − |wR| for the optimizer.

    T(α) = sign(α) · h(log|α| − log δ) with h(z) = 1 + z (z >= 0), 1/(1 − z) (z < 0), computed from log Q and
    log|wR| only: T ≈ 1 + log(α/δ) for α >= δ (log scale, as in LogEI), decays like 1/log(δ/α) towards 0, and
    tells apart gains far below the smallest float (e.g. e^{−20000}) instead of rounding them to zero. Same
    argmax as α; δ is chosen per greedy step from the candidates' scale.

    Args:
        log_q: `...` log Q.
        log_r: `...` log(w|R|), or None for the first point of a batch without pending points (R = 0).
        log_delta: log δ (scalar or broadcastable).
    """
    if log_r is None:
        return _log_scale_map(log_q - log_delta)
    pos = log_q > log_r
    hi = torch.maximum(log_q, log_r)
    gap = (log_q - log_r).abs().clamp_min(MIN_LOG_GAP)
    log_abs = hi + log1mexp(-gap)
    mag = _log_scale_map(log_abs - log_delta)
    return torch.where(pos, mag, -mag)


def qgibbon_value(C: Tensor, V: Tensor) -> Tensor:
    """α_QG = ½ log det C − mean_{g*} Σ_i ½ log V_i(g*) for whole batches (spec §3.1 eq 12).

    Args:
        C: `... x n x n` batch covariance (`batch_covariance`).
        V: `s x ... x n` conditional variances (`conditional_variance`).

    Returns:
        `...` values.
    """
    L = torch.linalg.cholesky(C)
    half_logdet = torch.log(torch.diagonal(L, dim1=-2, dim2=-1)).sum(-1)
    return half_logdet - 0.5 * V.log().sum(-1).mean(0)
