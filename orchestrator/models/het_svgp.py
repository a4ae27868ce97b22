"""Heteroscedastic SVGP (the HetGP baseline, Saul et al. 2016 "chained GP"): y ~ N(f, e^{2g}).

quantile-expectile-bo.md §1.3 and §4.4: the same two-latent SVGP, inducing-point, k-means and optimiser
settings as the quantile model, with a Gaussian likelihood; the optimized target is the plug-in quantile
mu_f + Phi^-1(tau) exp(mu_g) (§1.7, `Surrogate.objective_mean` for family "gaussian").
"""

from __future__ import annotations

from orchestrator.models.likelihoods import HeteroscedasticGaussianLikelihood
from orchestrator.models.svgp import TwoLatentSVGPSurrogate

__all__ = ["HeteroscedasticSVGP"]


class HeteroscedasticSVGP(TwoLatentSVGPSurrogate):
    """SVGP with y ~ N(f, e^{2g}) (family "gaussian"); `tau` is the plug-in quantile level.

    Args:
        tau: level of the plug-in quantile mu_f + Phi^-1(tau) e^{mu_g}, in (0, 1).
        **options: fields of `orchestrator.models.svgp.SVGPOptions`.
    """

    family = "gaussian"

    def _make_likelihood(self, tau: float) -> HeteroscedasticGaussianLikelihood:
        return HeteroscedasticGaussianLikelihood(tau)
