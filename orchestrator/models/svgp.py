"""The surrogate of the two-latent sparse variational GPs (quantile, expectile, heteroscedastic): its fit.

quantile-expectile-bo.md §1.3-1.6 (Picheny et al. 2022; Hensman et al. 2013; Saul et al. 2016): the model
`orchestrator.models.two_latent_svgp.TwoLatentSVGP` over f and g = log sigma (g one learned constant with the
option `noise_scale: constant`), with shared inducing inputs Z refreshed at every fit (never trained: every
observation while n is small, then a growing greedy allocation, `orchestrator.models.allocation`; or the
spec's k-means). Training maximises the ELBO (both KL terms, hyperpriors as GPyTorch adds them): on all the
data with L-BFGS while n is small (over the hyperparameters alone, with q(u) at its natural-gradient fixed
point, while Z
is every observed input: `orchestrator.models.full_variational`), else on minibatches (N/|B| scaling) with
Adam, a plateau learning-rate schedule and early stopping (§1.6). At every refresh q(u) is warm-started by
projecting the previous posterior onto the new Z (§1.4); the warm start and `sparse_parts` speak the
unwhitened (a, S) of the spec.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict
from typing import Any

import torch
from linear_operator.utils.cholesky import psd_safe_cholesky
from torch import Tensor

from orchestrator.errors import ConfigError, InputDataError
from orchestrator.models import distributions as D
from orchestrator.models.allocation import allocate_inducing, auto_num_inducing
from orchestrator.models.base import (
    TKWARGS,
    SparseLatentParts,
    Surrogate,
    check_fit_stop,
    check_training_data,
    on_cpu,
)
from orchestrator.models.full_variational import SiteState, fit_full_variational
from orchestrator.models.inducing import KMeansInducingPointSelector
from orchestrator.models.kernels import matern52
from orchestrator.models.likelihoods import check_tau
from orchestrator.models.svgp_options import (
    PRIOR_MODE_RTOL,
    SVGPOptions,
    _variance,
    lengthscale_prior_params,
    standardization,
    svgp_standardization,
)
from orchestrator.models.two_latent_svgp import (
    JITTER_REL,
    MIN_OUTPUTSCALE,
    MIN_VARIANCE,
    PredictiveCache,
    TwoLatentSVGP,
)

# the model's names and the options' stay importable from here (`orchestrator.models.svgp.SVGPOptions`)
__all__ = [
    "JITTER_REL",
    "MIN_OUTPUTSCALE",
    "MIN_VARIANCE",
    "SVGPOptions",
    "TwoLatentSVGP",
    "TwoLatentSVGPSurrogate",
    "lengthscale_prior_params",
    "matern52",
    "standardization",
    "svgp_standardization",
]

#: jitter added to the projected covariance S <- Sigma(Z', Z') + jitter I at a warm start (spec §1.4)
WARM_START_JITTER = 1e-6
#: most L-BFGS iterations of a cold fit (a fit on a few dozen noisy points converges in 100 to 500)
LBFGS_MAX_ITER = 1000
_LATENTS = {"f": 0, "g": 1}


class TwoLatentSVGPSurrogate(Surrogate):
    """A `Surrogate` backed by `TwoLatentSVGP`; subclasses pick the likelihood (family).

    Args:
        tau: quantile/expectile level (or plug-in quantile level for the Gaussian family), in (0, 1).
        **options: fields of `SVGPOptions`.
    """

    family: str = ""
    #: option defaults of this family that differ from `SVGPOptions`' (the user's options override them)
    default_options: dict[str, Any] = {}

    def __init__(self, tau: float = 0.5, **options: Any) -> None:
        self.tau = check_tau(tau)
        self.options = SVGPOptions.from_dict({**self.default_options, **options})
        self.likelihood = self._make_likelihood(self.tau)
        self.model: TwoLatentSVGP | None = None
        self._y_mean = 0.0
        self._y_std = 1.0
        self._n_fit = 0
        self._caches: dict[int, PredictiveCache] = {}
        self._sites: SiteState | None = None
        self._generator = torch.Generator().manual_seed(self.options.seed)

    def _make_likelihood(self, tau: float) -> Any:
        raise NotImplementedError

    # --- Surrogate interface -------------------------------------------------------------------------------
    @property
    def num_outputs_latent(self) -> int:
        return 2

    @property
    def outcome_transform(self) -> tuple[float, float]:
        return (self._y_mean, self._y_std)

    @property
    def is_fitted(self) -> bool:
        return self.model is not None

    def _require_fit(self) -> None:
        if self.model is None:
            raise InputDataError(f"{type(self).__name__} has not been fitted yet; call fit(X, Y) first")

    def _latent_index(self, latent: str) -> int:
        if latent not in _LATENTS:
            raise ConfigError(f"`latent` must be one of {sorted(_LATENTS)}; got {latent!r}")
        return _LATENTS[latent]

    def _check_X(self, X: Tensor) -> Tensor:
        if not torch.is_tensor(X) or X.ndim < 2:
            raise InputDataError(f"X must be a `... x n x d` tensor; got {type(X).__name__} "
                                 f"of shape {tuple(getattr(X, 'shape', ()))}")
        d = self.model.Z.shape[-1]
        if X.shape[-1] != d:
            raise InputDataError(f"X must have d = {d} columns; got shape {tuple(X.shape)}")
        return X.to(**TKWARGS)

    def _posterior(self, k: int, X: Tensor, full_cov: bool) -> tuple[Tensor, Tensor]:
        self._require_fit()
        X = self._check_X(X)
        if k not in self._caches:
            self._caches[k] = PredictiveCache(self.model, k)
        return self._caches[k].posterior(X, full_cov)

    def posterior_f(self, X: Tensor, full_cov: bool = True) -> tuple[Tensor, Tensor]:
        return self._posterior(0, X, full_cov)

    def posterior_g(self, X: Tensor, full_cov: bool = False) -> tuple[Tensor, Tensor]:
        return self._posterior(1, X, full_cov)

    def sparse_parts(self, latent: str = "f") -> SparseLatentParts:
        self._require_fit()
        k = self._latent_index(latent)
        if k not in self._caches:
            self._caches[k] = PredictiveCache(self.model, k)
        c = self._caches[k]
        return SparseLatentParts(
            constant_mean=c.constant.clone(),
            lengthscale=c.lengthscale.reshape(-1).clone(),
            outputscale=c.outputscale.clone(),
            Z=c.Z.clone(),
            u_mean=c.u_mean.clone(),
            u_covar=c.u_covar.clone(),
            nu=2.5,
            jitter=c.jitter,
        )

    # --- fitting -----------------------------------------------------------------------------------------
    def _initial_constants(self, Y_std: Tensor) -> tuple[float, float]:
        """Initial constant means (f, g) in the model's units: the empirical tau-quantile of Y for f (the mean
        for the Gaussian family), and g such that the noise variance is half of Var(Y_std) (1 when
        standardized)."""
        m_factor, v_factor = D.noise_constants(self.family, self.tau)
        raw = self.options.y_scale is not None  # standardized: mean 0 and variance 1 exactly
        center = float(Y_std.mean()) if raw else 0.0
        c_f = center if self.family == "gaussian" else float(torch.quantile(Y_std, self.tau))
        c_g = 0.5 * math.log(0.5 * (_variance(Y_std) if raw else 1.0) / v_factor)
        return c_f, c_g

    def _project(self, Z_new: Tensor, y_mean: float, y_std: float) -> TwoLatentSVGP:
        """A new model on `Z_new` whose q(u) is the current posterior at `Z_new` (spec §1.4), re-expressed in
        the new standardization (f' = (f s + m - m') / s', g' = g + log(s / s'))."""
        old = self.model
        new = self._new_model(Z_new)
        new.load_state_dict({k: v for k, v in old.state_dict().items()
                             if k != "Z" and not k.startswith("variational_distribution.")}, strict=False)
        ratio = self._y_std / y_std
        shift = (self._y_mean - y_mean) / y_std
        means, chols = [], []
        eye = torch.eye(Z_new.shape[0], **TKWARGS)
        with torch.no_grad():
            for k in (0, 1):
                mu, cov = self._posterior(k, Z_new, full_cov=True)
                mu = mu - self._caches[k].constant  # a = mu(Z') - m(Z')
                if k == 0:
                    mu, cov = mu * ratio, cov * ratio**2
                cov = cov + WARM_START_JITTER * cov.diagonal().mean().clamp_min(MIN_VARIANCE) * eye
                means.append(mu)
                chols.append(psd_safe_cholesky(cov))
            const = old.constant.detach().clone()
            const[0] = const[0] * ratio + shift
            const[1] = const[1] + math.log(ratio)
            new.mean_module.constant.copy_(const)
            new.covar_module.outputscale = (
                old.outputscale.detach() * torch.tensor([ratio**2, 1.0], **TKWARGS)
            ).clamp_min(2 * MIN_OUTPUTSCALE)
        new.set_variational(torch.stack(means), torch.stack(chols))
        return new

    def _new_model(self, Z: Tensor) -> TwoLatentSVGP:
        """A `TwoLatentSVGP` on inducing inputs `Z` as the options ask (cold, warm-projected and restored
        fits)."""
        opt = self.options
        return TwoLatentSVGP(
            Z,
            opt.lengthscale_init,
            opt.outputscale_init,
            opt.use_priors,
            opt.lengthscale_prior,
            opt.noise_scale == "constant",
        )

    def _cold_model(self, Z: Tensor, Y_std: Tensor) -> TwoLatentSVGP:
        opt = self.options
        model = self._new_model(Z)
        c_f, c_g = self._initial_constants(Y_std)
        with torch.no_grad():
            model.mean_module.constant.copy_(torch.tensor([c_f, c_g], **TKWARGS))
            # s^2 = outputscale_init * Var(Y) as the model sees it (1 standardized)
            if opt.y_scale is not None:
                model.covar_module.outputscale = torch.full(
                    (2,), max(opt.outputscale_init * _variance(Y_std), 2 * MIN_OUTPUTSCALE), **TKWARGS)
            model.set_variational(torch.zeros(2, Z.shape[0], **TKWARGS), model.kzz_chol())
        return model

    def fit(self, X: Tensor, Y: Tensor) -> dict[str, float]:
        """Fit to all data so far (`n x d`, `n`), warm-starting from the previous fit when there is one.

        Refreshes Z (`_inducing_inputs`), projects the previous posterior onto it, then optimizes the ELBO
        (`_train`: L-BFGS, on the hyperparameters with q(u)'s natural-gradient fixed point or on both, or
        minibatch Adam) up to the step cap (cold: `max_steps`; warm: `warm_max_steps`).
        """
        check_training_data(X, Y)
        if self.model is not None and X.shape[-1] != self.model.Z.shape[-1]:
            raise InputDataError(f"X must have d = {self.model.Z.shape[-1]} columns as in the previous fit; "
                                 f"got shape {tuple(X.shape)}")
        t0 = time.perf_counter()
        X = X.to(**TKWARGS)
        Y = Y.to(**TKWARGS)
        if self.options.y_scale is None:
            y_mean, y_std = svgp_standardization(Y)
        else:
            y_mean, y_std = 0.0, float(self.options.y_scale)
        Y_std = (Y - y_mean) / y_std
        warm = self.model is not None
        Z = self._inducing_inputs(X)
        t1 = time.perf_counter()
        model = self._project(Z, y_mean, y_std) if warm else self._cold_model(Z, Y_std)
        sites = self._sites.rescaled(self._y_std / y_std) if warm and self._sites is not None else None
        t2 = time.perf_counter()
        info, sites = self._train(model, X, Y_std, warm, sites)
        # the fitted model replaces the previous one only now (predictions meanwhile use the previous fit)
        self.model, self._y_mean, self._y_std, self._caches = model, y_mean, y_std, {}
        self._sites = sites
        self._n_fit = int(X.shape[0])
        t3 = time.perf_counter()
        info.update({"seconds": t3 - t0, "select_seconds": t1 - t0, "init_seconds": t2 - t1,
                     "train_seconds": t3 - t2, "warm": float(warm), "num_inducing": float(Z.shape[0]),
                     "lengthscales_at_prior_mode": float(self.lengthscales_at_prior_mode())})
        return info

    def recommender(self, X: Tensor, Y: Tensor) -> TwoLatentSVGPSurrogate:
        """The model that picks the recommendation (`SVGPOptions.recommendation_scale`): with "constant", a
        cold full-batch fit of this model with one constant noise scale on (X, Y) while n <=
        `recommendation_full_batch_max`; else this model."""
        opt = self.options
        if (opt.recommendation_scale != "constant" or opt.noise_scale == "constant"
                or X.shape[0] > opt.recommendation_full_batch_max):
            return self
        full = max(opt.full_batch_max, opt.recommendation_full_batch_max)
        other = type(self)(self.tau, **{**asdict(opt), "noise_scale": "constant", "full_batch_max": full})
        other.fit(X, Y)
        return other

    def num_inducing_for(self, n: int) -> int:
        """The most inducing inputs a fit on `n` observations uses (`SVGPOptions.num_inducing`)."""
        m = self.options.num_inducing
        return auto_num_inducing(n) if m == "auto" else int(m)

    def _inducing_inputs(self, X: Tensor) -> Tensor:
        """Z for a fit on `X`: k-means centroids (placement "kmeans", spec §1.4), else the greedy allocation
        of `orchestrator.models.allocation` among the observed inputs, weighted by the previous fit's f at a
        warm refit (placement "auto")."""
        opt, warm = self.options, self.model is not None
        m = self.num_inducing_for(X.shape[0])
        if opt.inducing_placement == "kmeans":
            init = self.model.Z if warm and opt.kmeans_warm_start else None
            return KMeansInducingPointSelector(m, opt.kmeans_iter)(X, generator=self._generator, init=init)
        if warm:
            lengthscale = self.model.lengthscale.detach()[0]
            outputscale = float(self.model.outputscale.detach()[0])
        else:
            lengthscale = torch.full((X.shape[-1],), self._initial_lengthscale(X.shape[-1]), **TKWARGS)
            outputscale = opt.outputscale_init
        posterior = None
        if warm and opt.inducing_placement == "auto":
            def posterior(Xc: Tensor) -> tuple[Tensor, Tensor]:
                return self._posterior(0, Xc, full_cov=False)
        return allocate_inducing(X, m, lengthscale, outputscale, posterior)

    def _initial_lengthscale(self, d: int) -> float:
        if self.options.lengthscale_init is not None:
            return float(self.options.lengthscale_init)
        return lengthscale_prior_params(self.options.lengthscale_prior, d)[2]

    def lengthscales_at_prior_mode(self, rel_tol: float = PRIOR_MODE_RTOL) -> bool:
        """Whether every lengthscale of f sits at its prior's mode (within `rel_tol`): the data moved none.

        In many dimensions with the spec's prior (mode 0.074) the points are too far apart for the kernel to
        correlate them, the likelihood's gradient vanishes, and the prior alone sets the lengthscales: the
        model then predicts a constant between its points (at d = 12-20 with 200 results, posterior-mean
        correlation with the truth 0.03 against 0.998 with the dimension-scaled prior).
        """
        self._require_fit()
        if not self.options.use_priors:
            return False
        ls = self.model.lengthscale.detach()[0].reshape(-1)
        loc, scale, _ = lengthscale_prior_params(self.options.lengthscale_prior, ls.numel())
        mode = math.exp(loc - scale**2)
        return bool(((ls - mode).abs() <= rel_tol * mode).all())

    def _train(self, model: TwoLatentSVGP, X: Tensor, Y: Tensor, warm: bool,
               sites: SiteState | None) -> tuple[dict[str, float], SiteState | None]:
        """Optimize the ELBO as `SVGPOptions.optimizer` says; returns the fit's info and, after a
        natural-gradient fit, its sites (the next fit's warm start)."""
        opt = self.options
        n = X.shape[0]
        if warm and opt.warm_max_steps == 0:
            with torch.no_grad():
                loss = float(self._loss(X, Y, n, model)) if n <= opt.full_batch_max else math.nan
            return {"iterations": 0.0, "epochs": 0.0, "loss": loss, "stopped_early": 0.0, "lbfgs": 0.0}, None
        max_iter = opt.warm_max_steps if warm else min(opt.max_steps, LBFGS_MAX_ITER)
        full_batch = opt.optimizer == "auto" and n <= opt.full_batch_max
        if opt.optimizer == "natural-gradient" or full_batch:
            fitted = self._full_variational(model, X, Y, max_iter, sites)
            if fitted is not None:
                return fitted
        if opt.optimizer in ("lbfgs", "natural-gradient") or full_batch:
            info = self._train_lbfgs(model, X, Y, max_iter)
            if info is not None:
                return info, None
        return self._train_adam(model, X, Y, warm), None

    def _full_variational(self, model: TwoLatentSVGP, X: Tensor, Y: Tensor, max_iter: int,
                          sites: SiteState | None) -> tuple[dict[str, float], SiteState] | None:
        """`fit_full_variational`, which computes with NumPy and LAPACK: a model on another device is fitted
        on the CPU (n is at most `full_batch_max` here, where LAPACK on the CPU is the right tool) and moved
        back."""
        n, device = X.shape[0], model.Z.device
        if device.type == "cpu":
            return fit_full_variational(model, lambda mod: self._loss(X, Y, n, mod), self.likelihood, X, Y,
                                        max_iter, sites)
        Xc, Yc = X.cpu(), Y.cpu()
        model.to("cpu")
        try:
            with on_cpu():
                return fit_full_variational(model, lambda mod: self._loss(Xc, Yc, n, mod), self.likelihood,
                                            Xc, Yc, max_iter, sites)
        finally:
            model.to(device)

    def _train_lbfgs(
        self, model: TwoLatentSVGP, X: Tensor, Y: Tensor, max_iter: int
    ) -> dict[str, float] | None:
        """Full-batch L-BFGS (at most `max_iter` iterations) on the exact negative ELBO; None (the model as it
        came) when the loss turns non-finite, so the caller falls back to Adam."""
        n = X.shape[0]
        params = [p for p in model.parameters() if p.requires_grad]
        start = [p.detach().clone() for p in params]
        lbfgs = torch.optim.LBFGS(params, lr=1.0, max_iter=max_iter, max_eval=2 * max_iter, history_size=10,
                                  tolerance_grad=1e-7, tolerance_change=1e-10, line_search_fn="strong_wolfe")
        evals = [0]

        def closure() -> Tensor:
            check_fit_stop()  # a fit nobody will use stops here (`AskTellOptimizer.fit`'s `stop`)
            lbfgs.zero_grad(set_to_none=True)
            loss = self._loss(X, Y, n, model)
            if torch.isfinite(loss):
                loss.backward()
            evals[0] += 1
            return loss

        lbfgs.step(closure)
        model.zero_grad(set_to_none=True)
        with torch.no_grad():
            loss = float(self._loss(X, Y, n, model))
        if not math.isfinite(loss) or not all(bool(torch.isfinite(p).all()) for p in params):
            with torch.no_grad():
                for p, p0 in zip(params, start):
                    p.copy_(p0)
            return None
        iterations = float(lbfgs.state[params[0]].get("n_iter", 0)) if params else 0.0
        return {"iterations": iterations, "epochs": 1.0, "loss": loss, "stopped_early": 0.0,
                "lbfgs": 1.0, "evaluations": float(evals[0])}

    def _train_adam(self, model: TwoLatentSVGP, X: Tensor, Y: Tensor, warm: bool) -> dict[str, float]:
        opt = self.options
        n = X.shape[0]
        b = min(opt.batch_size, n)
        batches_per_pass = math.ceil(n / b)
        steps_per_epoch = max(batches_per_pass, opt.min_steps_per_epoch)
        max_steps = opt.warm_max_steps if warm else opt.max_steps
        patience = opt.warm_early_stop_patience if warm else opt.early_stop_patience
        params = [p for p in model.parameters() if p.requires_grad]
        adam = torch.optim.Adam(params, lr=opt.lr)
        plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(
            adam, mode="min", factor=opt.plateau_factor, patience=opt.plateau_patience, min_lr=opt.min_lr,
            threshold=0.0,
        )
        best, wait, step, epoch_loss, stopped = math.inf, 0, 0, math.nan, False
        order = torch.empty(0, dtype=torch.long)
        pos = 0
        while step < max_steps and not stopped:
            total, count = 0.0, 0
            for _ in range(min(steps_per_epoch, max_steps - step)):
                check_fit_stop()  # a fit nobody will use stops here (`AskTellOptimizer.fit`'s `stop`)
                if pos >= order.numel():
                    order, pos = torch.randperm(n, generator=self._generator), 0
                idx = order[pos:pos + b]
                pos += b
                adam.zero_grad(set_to_none=True)
                loss = self._loss(X[idx], Y[idx], n, model)
                loss.backward()
                adam.step()
                total += float(loss.detach())
                count += 1
                step += 1
            epoch_loss = total / count
            plateau.step(epoch_loss)
            if epoch_loss < best - opt.min_delta:
                best, wait = epoch_loss, 0
            else:
                wait += 1
                stopped = wait >= patience
        model.zero_grad(set_to_none=True)
        return {"iterations": float(step), "epochs": float(math.ceil(step / steps_per_epoch)),
                "loss": float(epoch_loss), "stopped_early": float(stopped), "lbfgs": 0.0}

    def _loss(self, Xb: Tensor, Yb: Tensor, n: int, model: TwoLatentSVGP | None = None) -> Tensor:
        """Negative ELBO per datum: -(n/|B| sum_B E[log p] - KL_f - KL_g + log prior) / n (spec §1.5)."""
        model = self.model if model is None else model
        mean, var = model.marginals(Xb)
        ell = self.likelihood.expected_log_prob_moments(Yb, mean[0], var[0], mean[1], var[1]).sum()
        elbo = ell * (n / Xb.shape[0]) - model.kl_divergence() + model.log_prior()
        return -elbo / n

    def elbo(self, X: Tensor, Y: Tensor) -> float:
        """Full-data ELBO per datum of the current model on raw data (`n x d`, `n`), for diagnostics."""
        self._require_fit()
        check_training_data(X, Y)
        Y_std = (Y.to(**TKWARGS) - self._y_mean) / self._y_std
        with torch.no_grad():
            return -float(self._loss(X.to(**TKWARGS), Y_std, X.shape[0]))

    # --- state -------------------------------------------------------------------------------------------
    def get_state(self) -> dict[str, Any]:
        """Tensors and plain values only (loads with `torch.load(weights_only=True)`)."""
        state: dict[str, Any] = {
            "class": type(self).__name__,
            "family": self.family,
            "tau": self.tau,
            "options": asdict(self.options),
            "y_mean": self._y_mean,
            "y_std": self._y_std,
            "n_fit": self._n_fit,
            "generator": self._generator.get_state(),
            "model": None,
        }
        if self.model is not None:
            state["model"] = {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()}
        return state

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore from `get_state()`; the class and family must match."""
        if state.get("class") != type(self).__name__:
            raise InputDataError(f"state is for {state.get('class')!r}, not {type(self).__name__!r}")
        self.tau = check_tau(state["tau"])
        self.options = SVGPOptions.from_dict(dict(state["options"]))
        self.likelihood = self._make_likelihood(self.tau)
        self._y_mean, self._y_std = float(state["y_mean"]), float(state["y_std"])
        self._n_fit = int(state["n_fit"])
        self._generator = torch.Generator()
        self._generator.set_state(state["generator"])
        self._caches = {}
        self._sites = None
        if state["model"] is None:
            self.model = None
            return
        sd = state["model"]
        model = self._new_model(sd["Z"].to(**TKWARGS))
        model.load_state_dict(sd)
        self.model = model
