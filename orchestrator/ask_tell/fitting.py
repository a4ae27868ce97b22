"""Fitting the ask/tell optimizer's surrogate: the warm-started refit on every completed result, the final fit
that also fits from scratch and keeps the lower training loss, the checks that refuse a non-finite fit, and
the recommendation of the fitted model (quantile-expectile-bo.md §1.7: the observed input with the highest
posterior mean of the target).

A fit runs on a copy of the model outside the optimizer's lock and is swapped in when it ends, so `ask` may
keep proposing from the current model in another thread meanwhile. A fit that learned no lengthscale, or took
unusually long for its n, warns once per optimizer. `ModelFitting` is one part of `AskTellOptimizer`
(orchestrator/ask_tell/optimizer.py).
"""

from __future__ import annotations

import math
import threading
import time
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from orchestrator.errors import InputDataError, ModelFitError, ModelWarning, QbatchError
from orchestrator.models.base import fit_stop, use_device
from orchestrator.protocols import SurrogateProtocol, VariationalSurrogate
from orchestrator.recommend import recommendation_scores
from orchestrator.threads import bounded_threads

__all__ = ["ModelFitting", "SLOW_FIT_MAX_S", "SLOW_FIT_MIN_S", "SLOW_FIT_S_PER_RESULT"]

#: A model fit is slow for its n (`fit` warns once) when it takes longer than `SLOW_FIT_MIN_S` and than
#: `SLOW_FIT_S_PER_RESULT` seconds per result (warm: started from the previous fit; cold: from scratch), or
#: longer than `SLOW_FIT_MAX_S` whatever n. The default quantile model in 3 dimensions, on one core of a
#: 2-core machine shared with a benchmark, took 0.6-11.8 s at a warm refit for n = 30-510 (0.01-0.04 s per
#: result) and 2.5, 2.8, 3.2, 18, 60 and 308 s cold for n = 20, 50, 100, 200, 300 and 500 (0.03-0.62 s per
#: result; its m = n inducing inputs make a cold fit cubic in n up to 500); the README's warm refit at n =
#: 20,000 took 11 s. The bounds sit 6x (warm) and 3x (cold) above the slowest of these.
SLOW_FIT_MIN_S = 30.0
SLOW_FIT_MAX_S = 1800.0
SLOW_FIT_S_PER_RESULT = {"warm": 0.25, "cold": 2.0}
#: the model options that set how long a fit takes, named by the slow-fit warning
_SLOW_FIT_OPTIONS = {
    "quantile": ("num_inducing", "warm_max_steps", "max_steps"),
    "expectile": ("num_inducing", "warm_max_steps", "max_steps"),
    "heteroscedastic": ("num_inducing", "warm_max_steps", "max_steps"),
    "exact-gp": ("fit_maxiter",),
    "gpr-replicates": ("fit_maxiter", "num_bootstrap"),
}


def _training_loss(
    model: SurrogateProtocol, X: torch.Tensor, Y: torch.Tensor, diag: Mapping[str, Any]
) -> float:
    """A fitted model's training loss per datum on all of (X, Y), for `AskTellOptimizer.fit(restart=True)`:
    the full-data negative ELBO of a variational model (its fit reports the last epoch's minibatch average),
    else the loss its fit reported (the exact GP's is the full negative marginal likelihood); NaN when it has
    none."""
    if isinstance(model, VariationalSurrogate):
        try:
            return -float(model.elbo(X, Y))
        except Exception:
            return math.nan
    return float(diag.get("loss", math.nan))


class ModelFitting:
    """The optimizer's surrogate: its fits, its forecasts and its recommendation.

    `_init_fitting` sets the state: the model in use, how many results it saw, its recommendation and the
    warnings already given. A fit swaps its model in under `_lock`; the fit itself holds no lock.
    """

    def _init_fitting(self) -> None:
        self._model: SurrogateProtocol | None = None
        self._model_n = 0  # observations in the last fit
        self._warned_prior_mode = False  # `fit` warns once when the model learned no lengthscale
        self._warned_slow_fit = False  # `fit` warns once when a fit is slow for its n (`SLOW_FIT_MIN_S`)
        self._best: tuple[dict, float] | None = None
        self._recommender: SurrogateProtocol | None = None  # the model `_best` came from

    @property
    def model(self) -> SurrogateProtocol | None:
        """The latest fitted surrogate, or None before the first fit."""
        return self._model

    @property
    def num_stale(self) -> int:
        """Completed results the current model has not seen."""
        return len(self._obs_y) - self._model_n

    def can_fit(self) -> bool:
        """Whether a model fit is due: the proposer uses a model and `initial_design` (at least 2) results are
        in."""
        return self.needs_model() and len(self._obs_y) >= max(2, self.initial_design)

    def fit(self, restart: bool = True, stop: threading.Event | None = None) -> dict[str, Any]:
        """Fit the surrogate on all completed results, warm-started and from scratch; return diagnostics.

        Args:
            restart: also fit from scratch (the model's default start) and keep whichever fit ends with the
                lower training loss (negative marginal likelihood or ELBO per datum). A warm start can stay in
                the basin an early fit found on little data (e.g. a lengthscale that explains the later points
                as noise), so the fit a caller asks for before `best()` restarts, as the end of a run does;
                False fits warm-started only, as the refits inside `ask` do (`refit_restarts`).
            stop: once this event is set, the fit stops between two training steps and raises
                `FitInterrupted`, the model in use staying (the central actor's background refit, when the run
                ends: the final fit on every result replaces it anyway). The SVGP models stop; the exact GPs'
                fits, short L-BFGS runs, go to their end.

        The fit runs with the optimizer's `threads` (orchestrator/threads.py), the caller's setting restored
        after.

        Returns:
            ``{"seconds", "n", "best_params", "best_predicted", "swapped", ...model diagnostics}``
            (``swapped``: False when a fit on more results ended first, whose model stays in use; then without
            the two ``best_`` keys, which belong to the model in use); with `restart`, also ``"loss_warm"``,
            ``"loss_cold"`` and ``"restart_kept"`` (``"warm"`` or ``"cold"``).

        Raises:
            InputDataError: fewer than 2 completed results.
            ModelFitError: the fitted posterior is not finite (the current model stays in use).
            FitInterrupted: `stop` was set before the fit ended (the current model stays in use).

        Warns:
            ModelWarning: once per optimizer each, when the model learned no lengthscale, and when a fit took
                unusually long for its n (`SLOW_FIT_MIN_S`), naming the model options to change.
        """
        # the optimizer's `threads` (orchestrator/threads.py)
        with fit_stop(stop), bounded_threads(self.threads):
            use_device(self.torch_device)
            return self._fit(restart)

    def _fit(self, restart: bool) -> dict[str, Any]:
        if not self.defer_calibration:
            self.flush_calibration()
        X, Y, ids = self._snapshot()
        n = Y.shape[0]
        if n < 2:
            raise InputDataError(f"a model fit needs at least 2 completed results; have {n}")
        # the outcomes' spread overflows float64: no model can standardize
        if not math.isfinite(float(Y.std())):
            raise ModelFitError(
                f"the outcomes of the {n} results span [{float(Y.min()):g}, {float(Y.max()):g}], too wide "
                "for a model in float64 (their variance overflows); rescale the objective's values. The "
                "previous model is kept"
            )
        t0 = time.perf_counter()
        with self._lock:
            current = self._model
        # fit a copy (warm-started from the current posterior) and swap it in when ready, so `ask` may keep
        # proposing with the current model from another thread meanwhile
        model = self._build_model()
        warm = current is not None
        if current is not None:
            try:
                model.set_state(current.get_state())
            except NotImplementedError:  # a model without state dicts refits cold
                model = self._build_model()
                warm = False
        # (seconds, "warm" or "cold") of each model fit, for `_slow_fit_warning`
        fits: list[tuple[float, str]] = []
        t_fit = time.perf_counter()
        diag = dict(model.fit(X, Y) or {})
        fits.append((time.perf_counter() - t_fit, "warm" if diag.get("warm", warm) else "cold"))
        if restart and current is not None:
            cold = self._build_model()
            t_fit = time.perf_counter()
            cold_diag = dict(cold.fit(X, Y) or {})
            fits.append((time.perf_counter() - t_fit, "cold"))
            lw, lc = _training_loss(model, X, Y, diag), _training_loss(cold, X, Y, cold_diag)
            kept = "cold" if math.isfinite(lc) and not lw <= lc else "warm"  # a NaN warm loss loses
            if kept == "cold":
                model, diag = cold, cold_diag
            diag.update(loss_warm=lw, loss_cold=lc, restart_kept=kept)
        with torch.no_grad():
            target = model.objective_mean(X)
        loc, scale = model.outcome_transform
        bad = int((~torch.isfinite(target)).sum())
        if bad or not (math.isfinite(float(loc)) and math.isfinite(float(scale))):
            # a NaN posterior would propose from noise and recommend "nan": refuse it, keep the current model
            raise ModelFitError(
                f"the {self.model_name} fit on {n} results is not finite (posterior mean not finite at {bad} "
                f"of {n} observed points, outcome transform loc={float(loc):g}, scale={float(scale):g}; "
                f"outcomes span [{float(Y.min()):g}, {float(Y.max()):g}]); the previous model is kept"
            )
        rec_model = self._recommender_for(model, X, Y, diag) if restart else model
        if rec_model is not model:
            with torch.no_grad():
                target = rec_model.objective_mean(X)
            loc, scale = rec_model.outcome_transform
        i = int(torch.argmax(recommendation_scores(rec_model, X, self.recommendation, mean=target)))
        best_pred = self.sign * float(loc + scale * float(target[i]))
        with self._lock:  # as told (a log-scale float mapped back from x differs in its last digits)
            best_params = dict(self._trials[ids[i]].params)
        seconds = time.perf_counter() - t0
        with self._lock:
            # a fit on fewer results than the model in use ended after it (a refit that outlived the run's
            # end, while the final fit ran): the newer model stays, not the older one
            swapped = n >= self._model_n
            if swapped:
                self._model = model
                self._model_n = n
                self._best = (best_params, best_pred)
                self._recommender = rec_model
        diag = {k: v for k, v in diag.items() if isinstance(v, (int, float, str, bool))}
        diag.update(seconds=seconds, n=n, swapped=swapped)
        # once per optimizer (every later warm refit would say it again), for the model in use
        with self._lock:
            warn = swapped and bool(diag.get("lengthscales_at_prior_mode")) and not self._warned_prior_mode
            self._warned_prior_mode |= warn
        if warn:
            prior = (self.model_options or {}).get("lengthscale_prior", "dim-scaled")
            advice = (
                "set the model option `lengthscale_prior: dim-scaled` (config `model: {type: ..., options: "
                "{lengthscale_prior: dim-scaled}}`)"
                if prior != "dim-scaled"
                else "give it more results per dimension, or fewer dimensions"
            )
            warnings.warn(
                f"the {self.model_name} model learned no lengthscale from {n} results: all {self.space.dim} "
                "lengthscales of its objective latent sit at the prior's mode, so it is flat between its "
                f"points and its batches are close to random. In {self.space.dim} dimensions {advice}",
                ModelWarning,
                stacklevel=3,  # the caller of `fit`
            )
        slow = self._slow_fit_warning(fits, n)
        if slow is not None:
            warnings.warn(slow, ModelWarning, stacklevel=3)
        if swapped:  # the recommendation of the model in use (a report reads the last refit's)
            diag.update(best_params=best_params, best_predicted=best_pred)
        return diag

    def _slow_fit_warning(self, fits: Sequence[tuple[float, str]], n: int) -> str | None:
        """The warning for the first fit of this optimizer that was slow for its `n` (`SLOW_FIT_MIN_S`),
        naming the model options that set its length; None for a fit that was not, or once one was (every
        later refit would say it again)."""
        slow = [(s, kind) for s, kind in fits
                if s > SLOW_FIT_MAX_S or s > max(SLOW_FIT_MIN_S, SLOW_FIT_S_PER_RESULT[kind] * n)]
        if not slow:
            return None
        with self._lock:
            if self._warned_slow_fit:
                return None
            self._warned_slow_fit = True
        seconds, kind = max(slow)
        names = _SLOW_FIT_OPTIONS.get(self.model_name, ())
        example = (f"config `model: {{type: {self.model_name}, options: {{{names[0] if names else '...'}: "
                   "...}}`")
        if names:
            listed = [f"`{k}` ({self.model_options[k]!r})" if k in self.model_options else f"`{k}` (default)"
                      for k in names]
            options = (f"option {listed[0]}" if len(listed) == 1 else
                       f"options {', '.join(listed[:-1])} or {listed[-1]}")
            advice = f"lower the model {options} ({example})"
        else:
            advice = f"change its model options ({example})"
        if self.model_name in ("exact-gp", "gpr-replicates"):  # the cost of an exact GP's fit grows as n^3
            advice += ", or choose a sparse model (`model: quantile`)"
        return (
            f"the {self.model_name} fit on {n} results took {seconds:.0f} s ({seconds / n:.2g} s per result, "
            f"a {kind} fit), far longer than the default quantile model takes for {n} results; the refits "
            f"that follow take as long or longer. To make them shorter, {advice}"
        )

    def _recommender_for(self, model: SurrogateProtocol, X: torch.Tensor, Y: torch.Tensor,
                         diag: dict[str, Any]) -> SurrogateProtocol:
        """The model a final fit recommends from: `model.recommender(X, Y)` where it has one (the quantile
        model's constant-scale fit, `SVGPOptions.recommendation_scale`), else `model`. A recommender whose fit
        fails or whose mean is not finite leaves the recommendation to `model` (``diag["recommender"]``
        says which)."""
        recommender = getattr(model, "recommender", None)
        if recommender is None:
            return model
        try:
            rec = recommender(X, Y)
            with torch.no_grad():
                finite = bool(torch.isfinite(rec.objective_mean(X)).all())
        except (ModelFitError, torch.linalg.LinAlgError, RuntimeError, ValueError) as e:
            diag["recommender"] = f"model (its recommender's fit failed: {type(e).__name__})"
            return model
        if rec is model:
            return model
        diag["recommender"] = "fitted for it" if finite else "model (its recommender's mean is not finite)"
        return rec if finite else model

    @property
    def recommender(self) -> SurrogateProtocol | None:
        """The model the current recommendation (`best()`) came from: the model in use, or the model its
        final fit fitted for the recommendation (`SVGPOptions.recommendation_scale`); None before a fit."""
        with self._lock:
            rec = getattr(self, "_recommender", None)
            return rec if rec is not None else self._model

    def forecast(self, X: Tensor) -> list[dict | None]:
        """The current model's forecast at `n x d` points as plain dicts (model units), or Nones without a
        model."""
        if self._model is None:
            return [None] * X.shape[0]
        use_device(self.torch_device)
        with torch.no_grad():
            return self._model.forecast(X.to(**self._tk)).to_records()

    def best(self) -> tuple[dict, float]:
        """Recommended point and its value in the user's units.

        With a model: the observed input maximizing the posterior mean of the target at the last fit, with
        that predicted value (spec §1.7); `ask` fits before proposing, so call `fit()` after the last `tell`
        to include every result (that fit restarts, so the answer does not hang on the basin of an early warm
        start). Before the first fit: the best observed value.

        Raises:
            QbatchError: no completed result yet.
        """
        with self._lock:
            if self._best is not None:
                return dict(self._best[0]), self._best[1]
            if not self._obs_y:
                raise QbatchError("no completed results yet: best() needs at least one")
            i = max(range(len(self._obs_y)), key=self._obs_y.__getitem__)
            return dict(self._trials[self._obs_ids[i]].params), self.sign * self._obs_y[i]
