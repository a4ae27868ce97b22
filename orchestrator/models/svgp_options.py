"""Options of the two-latent SVGPs, the outcome standardization they fit in, and their lengthscale priors.

quantile-expectile-bo.md §1.3-1.6: `SVGPOptions` names every setting of the inducing inputs, the ELBO's
optimizers, the priors and the noise scale, with its default and where it deviates from the spec;
`svgp_standardization` is the scale the models see (mean/std, or the quartiles when a few outliers dominate);
`lengthscale_prior_params` gives the spec's and the dimension-scaled (Hvarfner et al. 2024) priors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import Tensor

from orchestrator.checks import check_bool, check_float, check_int
from orchestrator.errors import ConfigError
from orchestrator.limits import MAX_INDUCING, check_at_most
from orchestrator.models.allocation import PLACEMENTS, check_num_inducing

__all__ = ["LENGTHSCALE_PRIORS", "NOISE_SCALES", "OPTIMIZERS", "PRIOR_MODE_RTOL", "RECOMMENDATION_SCALES",
           "SVGPOptions", "check_lengthscale_prior", "lengthscale_prior_params", "standardization",
           "svgp_standardization"]

#: floor of the outcome std used for standardization (constant outcomes)
MIN_Y_STD = 1e-9
#: names of the optimizers of the ELBO (`SVGPOptions.optimizer`)
OPTIMIZERS = ("auto", "natural-gradient", "lbfgs", "adam")
#: names of the scale latent's forms (`SVGPOptions.noise_scale`)
NOISE_SCALES = ("gp", "constant")
#: names of the recommendation's fits (`SVGPOptions.recommendation_scale`)
RECOMMENDATION_SCALES = ("model", "constant")

@dataclass
class SVGPOptions:
    """Options of the two-latent SVGPs (spec §1.4-1.6; defaults and deviations documented per field).

    Attributes:
        num_inducing: m, the number of inducing inputs. "auto" (default): every distinct observed input while
            n <= 500 (the full variational model), then 500 sqrt(n / 500), at most 1000
            (`orchestrator.models.allocation.auto_num_inducing`). An integer: at most that many.
        inducing_placement: where the inducing inputs go when there are fewer than distinct observations.
            "auto" (default): BoTorch's greedy pivoted-Cholesky allocation among the observed inputs, weighted
            at a warm refit by the expected improvement of the previous fit's f (Moss et al. 2023);
            "greedy-variance": the same without the weighting; "kmeans": the spec's k-means centroids (§1.4),
            padded with uniform points when k-means finds fewer than m.
        optimizer: "auto" (default): while n <= `full_batch_max`, full-batch L-BFGS (torch's, strong-Wolfe
            line search) on the exact ELBO, else minibatch Adam. While Z is every distinct observed input,
            L-BFGS fits the hyperparameters alone, q(u) being the natural-gradient fixed point of one Gaussian
            site per input at each value (`orchestrator.models.full_variational`: the same optimum as the free
            factor, 4-15x faster at n = 20-100 in benchmarks/results/quality/screen_fit); else L-BFGS also
            fits q(u)'s free Cholesky factor. "natural-gradient", "lbfgs" (the free factor) or "adam" force
            one ("natural-gradient" falls back to "lbfgs" when Z is not the observed inputs). L-BFGS reaches
            a lower loss than Adam's early-stopped steps (tests/orchestrator/models/test_allocation.py).
        full_batch_max: the largest n that "auto" fits with full-batch L-BFGS (500). L-BFGS takes at most
            min(`max_steps`, 1000) iterations at a cold fit and `warm_max_steps` at a warm refit.
        batch_size: minibatch size (200, spec §1.6); the full data when n is smaller.
        lr: Adam learning rate (1e-2, spec §1.6).
        max_steps: cap on minibatch steps of a cold fit (the pubcode's 5000 epochs are unaffordable).
        warm_max_steps: cap on minibatch steps of a warm refit (after the first fit); 0 only refreshes Z and
            projects q(u) onto it. 100 steps = one pass over 20000 points at batch 200: the warm start already
            holds the previous posterior, and each BO iteration refits again.
        min_steps_per_epoch: an "epoch" (the unit of the plateau and early-stopping schedules) is
            max(ceil(n / batch_size), this) minibatch steps, so small data sets are not stopped after a
            handful of steps.
        plateau_patience, plateau_factor, min_lr: ReduceLROnPlateau on the epoch loss (10, 0.5, 1e-6).
        early_stop_patience, min_delta: early stopping on the epoch loss: 20 epochs (the pubcode's 50 costs
            4x the steps for no measurable gain in the recovered quantile), 0.01 nats per datum.
        warm_early_stop_patience: early-stopping patience (epochs) of warm refits.
        lengthscale_init: initial ARD lengthscale of both latents; None (default): 0.2 with the spec's prior
            (§1.3), the prior's mode with the dimension-scaled one.
        lengthscale_prior: "dim-scaled" (default): l_d ~ LogNormal(sqrt 2 + log(d)/2, sqrt 3) (Hvarfner et al.
            2024, BoTorch's default), mode 0.36 at d = 3, 0.50 at d = 6, 0.82 at d = 16; "spec":
            l_d ~ LogNormal(log 0.2, 1), spec §1.3, whose mode is 0.074 in every dimension. With few
            observations in several dimensions the fit sits near the prior's mode, and 0.074 there leaves the
            model knowing nothing between its points (benchmarks/hpo.py, README).
        outputscale_init: initial outputscale of both latents as a fraction of the variance of Y as the model
            sees it (0.5: Var(Y)/2, the pubcode's, spec §1.3; with standardized outcomes, 0.5).
        y_scale: None (default): the model sees standardized outcomes (Y - mean) / std, or (Y - median) / (IQR
            / 1.349) when a few outliers dominate the std (`svgp_standardization`). A positive number s:
            the model sees Y / s, neither centred nor standardized, the pubcode's convention (spec §1.3: no
            standardization, lunar-lander rewards divided by 300). The hyperpriors are in the units the model
            sees, so this changes how wide the outputscale prior LogNormal(0, 1) is against the data.
        use_priors: add the hyperpriors s^2 ~ LogNormal(0, 1) and the lengthscale prior to the loss
            (spec §1.3, ambiguity A2: GPyTorch adds registered priors).
        kmeans_iter: k-means restarts for the inducing inputs (cold fits).
        kmeans_warm_start: at a warm refit, start k-means from the previous Z (converges in a few
            iterations; Z still follows the new data) instead of random data points.
        noise_scale: "gp" (the spec's model; HetGP's default): g = log sigma is a GP, so the noise's scale may
            change with x. Every model defaults to it: with the converged natural-gradient fit it recommends
            better than "constant" on the quality benchmark's problems (benchmarks/results/quality/screen_ng).
            "constant": g is one learned constant (its GP's variance is held at `MIN_OUTPUTSCALE`, so
            it varies by about 0.1% at most, and its hyperpriors leave the loss): the noise has the same scale
            everywhere. A GP g can explain an isolated high measurement as noise where it stands; a constant
            one cannot, and takes it as signal (the laser simulator's narrow peak; the sparse approximation
            may still smooth it away as observations outnumber the inducing points: README, Laser, "Two
            causes").
        recommendation_scale: which fit picks the recommendation after a run's final fit
            (`AskTellOptimizer.fit(restart=True)`; `TwoLatentSVGPSurrogate.recommender`). "model" (default):
            the fitted model itself. "constant" (the quantile model's default): a cold fit of the same model
            with one constant noise scale on the same data, while n <= `recommendation_full_batch_max`
            (past it, the model itself). With few results a GP scale g can take the structure of the
            outcomes as noise, leaving f nearly flat and its argmax arbitrary; one constant scale cannot
            (benchmarks/results/quality/screen_rec_scale). Proposals always use the fitted model.
        recommendation_full_batch_max: the largest n at which the "constant" recommendation fit is made
            (1000): that cold fit is full-batch L-BFGS up to this n even where the model's own fits have
            moved to minibatch Adam (past `full_batch_max`), a cost paid once, at the final fit: 37-210 s of
            one core at n = 750 on GLD d = 3, where it recommends better than the minibatch-fitted model on
            3 of the 4 settings (benchmarks/results/gld_mixed/screen_rec).
        seed: seed of the minibatch order, k-means and the uniform fill of Z.
    """

    num_inducing: int | str = "auto"
    inducing_placement: str = "auto"
    optimizer: str = "auto"
    full_batch_max: int = 500
    batch_size: int = 200
    lr: float = 1e-2
    max_steps: int = 5000
    warm_max_steps: int = 100
    min_steps_per_epoch: int = 10
    plateau_patience: int = 10
    plateau_factor: float = 0.5
    min_lr: float = 1e-6
    early_stop_patience: int = 20
    warm_early_stop_patience: int = 3
    min_delta: float = 0.01
    lengthscale_init: float | None = None
    lengthscale_prior: str = "dim-scaled"
    outputscale_init: float = 0.5
    y_scale: float | None = None
    use_priors: bool = True
    kmeans_iter: int = 1
    kmeans_warm_start: bool = True
    noise_scale: str = "gp"
    recommendation_scale: str = "model"
    recommendation_full_batch_max: int = 1000
    seed: int = 0

    def __post_init__(self) -> None:
        self.warm_max_steps = check_int("`warm_max_steps`", self.warm_max_steps, 0, must="a non-negative "
                                                                                         "integer")
        positive_ints = ("batch_size", "max_steps", "min_steps_per_epoch", "plateau_patience",
                         "early_stop_patience", "warm_early_stop_patience", "kmeans_iter", "full_batch_max",
                         "recommendation_full_batch_max")
        for name in positive_ints:
            setattr(self, name, check_int(f"`{name}`", getattr(self, name), 1, must="a positive integer"))
        self.seed = check_int("`seed`", self.seed, 0, 2**63, hi_open=True, must="an integer in [0, 2**63)")
        for name in ("lr", "min_lr", "lengthscale_init", "outputscale_init", "y_scale"):
            optional = name in ("lengthscale_init", "y_scale")
            setattr(
                self,
                name,
                check_float(
                    f"`{name}`",
                    getattr(self, name),
                    0.0,
                    lo_open=True,
                    optional=optional,
                    must="a positive number",
                ),
            )
        self.min_delta = check_float("`min_delta`", self.min_delta, 0.0, must="a non-negative number")
        self.plateau_factor = check_float("`plateau_factor`", self.plateau_factor, 0.0, 1.0, lo_open=True,
                                          hi_open=True, must="in (0, 1)")
        self.num_inducing = check_num_inducing(self.num_inducing)
        if self.num_inducing != "auto":
            check_at_most("`num_inducing`", self.num_inducing, MAX_INDUCING)
        for name, valid in (("inducing_placement", PLACEMENTS), ("optimizer", OPTIMIZERS)):
            if not isinstance(getattr(self, name), str) or getattr(self, name) not in valid:
                raise ConfigError(f"`{name}` must be one of {list(valid)}; got {getattr(self, name)!r}")
        check_lengthscale_prior(self.lengthscale_prior)
        for name, valid in (("noise_scale", NOISE_SCALES), ("recommendation_scale", RECOMMENDATION_SCALES)):
            if not isinstance(getattr(self, name), str) or getattr(self, name) not in valid:
                raise ConfigError(f"`{name}` must be one of {list(valid)}; got {getattr(self, name)!r}")
        for name in ("use_priors", "kmeans_warm_start"):
            setattr(self, name, check_bool(f"`{name}`", getattr(self, name)))

    @classmethod
    def from_dict(cls, options: dict[str, Any]) -> SVGPOptions:
        """Build from a dict, naming any unknown key and listing the valid ones."""
        valid = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - valid)
        if unknown:
            raise ConfigError(f"unknown model option(s) {unknown}; valid options: {sorted(valid)}")
        return cls(**options)


def standardization(Y: Tensor) -> tuple[float, float]:
    """(mean, std) that standardize the outcomes `Y`: std 1 for fewer than two points or a constant Y (a
    spread at roundoff level, <= `ROUNDOFF_REL` |mean|, 64 float64 ulps); any real spread is kept, however
    small (outcomes of order 1e-10 are not constant: replacing their std by 1 flattened them and the
    recommendation went to a cube corner)."""
    y_mean = float(Y.mean())
    y_std = float(Y.std()) if Y.shape[0] > 1 else 0.0
    return y_mean, (y_std if y_std > ROUNDOFF_REL * abs(y_mean) and y_std > 0.0 else 1.0)


#: relative spread below which outcomes count as constant (`standardization`): 64 float64 ulps. A looser
#: 1e-12 (4,500 ulps) would take 1e9 + 1e-4 f(x), a real spread of 150 ulps, for a constant
ROUNDOFF_REL = 64 * 2.0**-52
#: IQR / NORMAL_IQR is a normal sample's standard deviation (the IQR of N(0, 1) is 1.349)
NORMAL_IQR = 1.3490
#: std / (IQR / NORMAL_IQR) above which `svgp_standardization` scales by the quartiles: about 1 for normal,
#: uniform or GLD outcomes, 1.4 for the lander's rewards, 5.6 for Beale's function (max 1e5, median 1e3) on
#: a Sobol design; 4e5 for one -1e6 (a "failed" sentinel) among 60 outcomes of order 1
OUTLIER_STD_RATIO = 20.0


def svgp_standardization(Y: Tensor) -> tuple[float, float]:
    """(center, scale) of the SVGP models' outcomes: `standardization`'s (mean, std), unless a few outliers
    dominate the std (it exceeds `OUTLIER_STD_RATIO` quartile-based stds): then (median, IQR / 1.349).

    A single -1e6 among outcomes of order 1 makes the std 1e5 and the signal 1e-5 standardized units, below
    what the hyperpriors and the fit resolve: every SVGP's recommendation would be arbitrary and its
    prediction far outside the data. With the quartiles the bulk of the outcomes keeps unit scale and the
    outlier is one far point, which the asymmetric-Laplace likelihood of the quantile model discounts. The
    exact GP keeps the mean/std standardization of BoTorch's `Standardize` (done here, by `standardization`),
    as its users expect.
    """
    center, scale = standardization(Y)
    if Y.shape[0] >= 4:
        q1, median, q3 = (
            float(v)
            for v in torch.quantile(Y, torch.tensor([0.25, 0.5, 0.75], dtype=Y.dtype, device=Y.device))
        )
        robust = (q3 - q1) / NORMAL_IQR
        if robust > ROUNDOFF_REL * abs(median) and scale > OUTLIER_STD_RATIO * robust:
            return median, robust
    return center, scale


def _variance(Y: Tensor) -> float:
    """Sample variance of `Y`, 1 for fewer than two points or a constant Y (the standardized convention)."""
    v = float(Y.var()) if Y.shape[0] > 1 else 1.0
    return v if v > MIN_Y_STD**2 else 1.0


#: relative distance from the prior's mode within which a fitted lengthscale counts as not moved by the data
PRIOR_MODE_RTOL = 0.01

#: names of the lengthscale priors (`SVGPOptions.lengthscale_prior`)
LENGTHSCALE_PRIORS = ("spec", "dim-scaled")


def check_lengthscale_prior(kind: Any) -> str:
    """`kind` if it names a lengthscale prior; else a ConfigError naming the option and the valid names."""
    if kind not in LENGTHSCALE_PRIORS:
        raise ConfigError(f"`lengthscale_prior` must be one of {list(LENGTHSCALE_PRIORS)}; got {kind!r}")
    return kind


def lengthscale_prior_params(kind: str, d: int) -> tuple[float, float, float]:
    """(loc, scale, default initial value) of the LogNormal lengthscale prior `kind` in `d` dimensions.

    "spec": LogNormal(log 0.2, 1), initial 0.2 (spec §1.3). "dim-scaled": LogNormal(sqrt 2 + log(d)/2,
    sqrt 3) (Hvarfner, Hellsten & Nardi 2024, "Vanilla Bayesian optimization performs great in high
    dimensions"; BoTorch's default kernel prior), initial value its mode exp(loc - scale^2).
    """
    if check_lengthscale_prior(kind) == "spec":
        return math.log(0.2), 1.0, 0.2
    loc, scale = math.sqrt(2.0) + 0.5 * math.log(d), math.sqrt(3.0)  # "dim-scaled"
    return loc, scale, math.exp(loc - scale**2)
