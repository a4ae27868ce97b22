"""Expectile SVGP: two latent GPs (f = the tau-expectile, g = log sigma) with the asymmetric Gaussian
likelihood.

quantile-expectile-bo.md §1.2 (asymmetric Gaussian, ambiguity A1: exponent rho^e without 1/2) and §1.3-1.6
(Picheny et al. 2022); the shared SVGP machinery lives in `orchestrator.models.svgp`.
"""

from __future__ import annotations

from orchestrator.models.likelihoods import AsymmetricGaussianLikelihood
from orchestrator.models.svgp import TwoLatentSVGPSurrogate

__all__ = ["ExpectileSVGP"]


class ExpectileSVGP(TwoLatentSVGPSurrogate):
    """SVGP whose latent f is the tau-expectile of y (family "asymmetric_gaussian").

    Args:
        tau: expectile level in (0, 1).
        **options: fields of `orchestrator.models.svgp.SVGPOptions`.
    """

    family = "asymmetric_gaussian"

    def _make_likelihood(self, tau: float) -> AsymmetricGaussianLikelihood:
        return AsymmetricGaussianLikelihood(tau)
