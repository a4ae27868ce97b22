"""The library API: an ask/tell optimizer over a search space (README "As a library").

`AskTellOptimizer.ask(q)` returns `q` trials with ids and parameters in the user's names and types;
`tell(trial_id, value)` takes results in any order, one at a time, at any time. Like a Ray Tune `Searcher`
(STYLE.md §4.8), NaN, ±inf, None and non-numeric values become recorded failures that never reach the
model or the calibrator. The first `initial_design` points are scrambled Sobol; after that, once
`initial_design` results are in, a surrogate (orchestrator.models) is fitted on all completed results and
a batch proposer (orchestrator.acquisition) picks the next points, with every asked-but-untold point passed
as pending. Each model-based trial carries the model's forecast at its point, so the calibrator
(orchestrator.calibration) is updated with that one-step-ahead forecast when its result arrives.

`direction: minimize` is handled here and nowhere inside: values are negated on the way in, the model's
level is 1 - tau, and `best()` reports values in the user's units (ARCHITECTURE.md "Conventions").
Recommendation (`best`) follows quantile-expectile-bo.md §1.7: the observed input with the highest
posterior mean of the target. The central Ray actor (orchestrator/actor.py) wraps one instance.
"""

from __future__ import annotations

import bisect
import copy
import itertools
import json
import math
import threading
import time
import warnings
import zlib
from dataclasses import dataclass, field
from typing import Any, Mapping, NamedTuple, Sequence

import numpy as np
import torch
from torch import Tensor

from orchestrator.errors import (
    ConfigError, InputDataError, ModelFitError, ModelWarning, QbatchError, UnsupportedError,
)
from orchestrator.models.base import fit_stop
from orchestrator.recommend import DEFAULT_RULE, check_rule, recommendation_scores
from orchestrator.space import SearchSpace
from workers.records import classify_value

__all__ = ["AskTellOptimizer", "Trial", "TrialError", "DUPLICATE_TOL"]

#: two unit-cube points closer than this (max-norm) are the same point (as orchestrator.acquisition.base)
DUPLICATE_TOL = 1e-6
#: random draws tried to replace a snapped duplicate before a repeat is accepted (discrete spaces run out)
_REPLACE_TRIES = 64
#: an int/choice grid up to this many points has its free cells listed when random replacements miss them
_ENUMERATE_MAX = 100_000
#: failure reasons that do not make a point taken (`_ask`): the infrastructure failed, not the evaluation
_NO_BAN = ("worker-lost",)
#: A model fit is slow for its n (`fit` warns once) when it takes longer than `SLOW_FIT_MIN_S` and than
#: `SLOW_FIT_S_PER_RESULT` seconds per result (warm: started from the previous fit; cold: from scratch), or
#: longer than `SLOW_FIT_MAX_S` whatever n. The default quantile model in 3 dimensions, on one core of a 2-core
#: machine shared with a benchmark, took 0.6-11.8 s at a warm refit for n = 30-510 (0.01-0.04 s per result) and
#: 2.5, 2.8, 3.2, 18, 60 and 308 s cold for n = 20, 50, 100, 200, 300 and 500 (0.03-0.62 s per result; its m = n
#: inducing inputs make a cold fit cubic in n up to 500); the README's warm refit at n = 20,000 took 11 s.
#: The bounds sit 6x (warm) and 3x (cold) above the slowest of these.
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


class TrialError(QbatchError, ValueError):
    """A trial id is unknown or was already told, or `ask` got a bad batch size."""


class _CalibUpdate(NamedTuple):
    """A calibrator update told but not yet applied (`AskTellOptimizer.flush_calibration`)."""

    seq: int  # the trial's ask order
    trial_id: str
    forecast: dict | None  # the predictive recorded at proposal (None: `needs_every_result` calibrators only)
    y: float  # observed, in the optimizer's sign
    x: Tensor  # unit-cube point
    round: int  # which flush's update it belongs to (`end_calibration_round`)


@dataclass
class Trial:
    """One point handed out by `ask`.

    Attributes:
        trial_id: unique id, ``f"{batch_id}-{i}"``.
        params: parameter name -> value, in the user's types (float, int, choice value).
        x: `d` unit-cube coordinates of `params` (snapped onto discrete grids).
        batch_id: the proposal this trial belongs to (-1 for points told with `tell_point`).
        forecast: the model's predictive forecast at `x` when it was proposed (model units, i.e. after the
            sign flip of `direction: minimize`), or None for Sobol points.
        seed: random seed for the evaluation (derived from the optimizer's seed and the trial id).
        source: "sobol", "model" or "user".
    """

    trial_id: str
    params: dict
    x: Tensor
    batch_id: int
    forecast: dict | None = None
    seed: int = 0
    source: str = "sobol"
    info: dict = field(default_factory=dict)

    def copy(self) -> "Trial":
        """A copy the caller may change (`ask`, `pending` and `trial` hand these out: editing a trial's params in
        place, as a training script may do with its config, would otherwise rewrite the optimizer's record)."""
        return Trial(self.trial_id, copy.deepcopy(self.params), self.x.clone(), self.batch_id,
                     copy.deepcopy(self.forecast), self.seed, self.source, copy.deepcopy(self.info))


def _plain_int(v: Any) -> Any:
    """A numpy integer as a Python int; anything else as it is (the callers check it)."""
    import numpy as np

    return int(v) if isinstance(v, np.integer) else v


def trial_seed(seed: int, trial_id: str) -> int:
    """Deterministic per-trial evaluation seed in [0, 2^31)."""
    return zlib.crc32(f"{int(seed)}:{trial_id}".encode()) & 0x7FFFFFFF


def _under(key: str, exc: BaseException) -> str:
    """The first line of `exc`, prefixed by the config key it is about unless it already names it."""
    msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    section = key.split(".")[0]
    return msg if msg.startswith((f"`{key}", f"`{section}.type`")) else f"`{key}`: {msg}"


def _training_loss(model: Any, X: torch.Tensor, Y: torch.Tensor, diag: Mapping[str, Any]) -> float:
    """A fitted model's training loss per datum on all of (X, Y), for `AskTellOptimizer.fit(restart=True)`: the
    full-data negative ELBO of a variational model (its fit reports the last epoch's minibatch average), else
    the loss its fit reported (the exact GP's is the full negative marginal likelihood); NaN when it has none."""
    if hasattr(model, "elbo"):
        try:
            return -float(model.elbo(X, Y))
        except Exception:
            return math.nan
    return float(diag.get("loss", math.nan))


class AskTellOptimizer:
    """Quantile (or expectile / mean) Bayesian optimization driven by ask and tell.

    Args:
        space: a `SearchSpace` or a plain space description ``{name: {"type": ..., ...}}``.
        model: surrogate name for `orchestrator.models.build_model` ("quantile", "expectile",
            "heteroscedastic", "exact-gp", "gpr-replicates").
        tau: level of the quantile/expectile to optimize, in the user's own sense, in (0, 1).
        proposer: proposer name for `orchestrator.acquisition.build_proposer` ("thompson", "qgibbon").
        calibrator: calibrator name for `orchestrator.calibration.build_calibrator` ("none", "online", ...).
        direction: "maximize" or "minimize".
        initial_design: number of design points before the model takes over (Sobol points, and results
            added with `tell_point` count as design points too); also the number of completed results needed
            for the first fit. Default `max(2 d + 2, 5)`.
        seed: seeds the Sobol design, the proposer and the per-trial evaluation seeds.
        model_options, proposer_options, calibrator_options: keyword options of the factories.
        recommendation: the rule `best()` applies among the observed inputs (`orchestrator.recommend`):
            "mean" (default, spec §1.7), "lcb" or "lcb-2".
    """

    def __init__(
        self,
        space: SearchSpace | Mapping[str, Mapping[str, Any]],
        model: str = "quantile",
        tau: float = 0.5,
        proposer: str = "thompson",
        calibrator: str = "none",
        direction: str = "maximize",
        initial_design: int | None = None,
        seed: int = 0,
        model_options: Mapping[str, Any] | None = None,
        proposer_options: Mapping[str, Any] | None = None,
        calibrator_options: Mapping[str, Any] | None = None,
        recommendation: str = DEFAULT_RULE,
    ) -> None:
        self.space = space if isinstance(space, SearchSpace) else SearchSpace.from_description(space)
        if direction not in ("maximize", "minimize"):
            raise ConfigError(f"`direction` must be 'maximize' or 'minimize'; got {direction!r}")
        if isinstance(tau, bool) or not isinstance(tau, (int, float)) or not 0.0 < float(tau) < 1.0:
            raise ConfigError(f"`tau` must be a number in (0, 1); got {tau!r}")
        if initial_design is None:
            initial_design = max(2 * self.space.dim + 2, 5)
        # numpy integers are integers too (the config accepts them, so this does)
        initial_design, seed = _plain_int(initial_design), _plain_int(seed)
        if isinstance(initial_design, bool) or not isinstance(initial_design, int) or initial_design < 1:
            raise ConfigError(f"`initial_design` must be an integer >= 1; got {initial_design!r}")
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
            raise ConfigError(f"`seed` must be an integer in [0, 2**63); got {seed!r}")
        self.recommendation = check_rule(recommendation)
        self.direction = direction
        self.sign = 1.0 if direction == "maximize" else -1.0
        self.tau = float(tau)
        #: level of the model on the (possibly negated) outcome: the model always maximizes
        self.model_tau = self.tau if direction == "maximize" else 1.0 - self.tau
        self.initial_design = initial_design
        self.seed = seed
        self.model_name = model
        self.model_options = dict(model_options or {})
        self.proposer_name = proposer
        self.proposer_options = dict(proposer_options or {})
        self.calibrator_name = calibrator
        self.calibrator_options = dict(calibrator_options or {})
        self._tk = {"dtype": torch.float64, "device": torch.device("cpu")}

        self._lock = threading.RLock()  # observation/trial state; never held during a fit or a proposal
        self._ask_lock = threading.Lock()  # one `ask` at a time (the Sobol counter, the proposer)
        self._trials: dict[str, Trial] = {}
        self._seq: dict[str, int] = {}  # trial id -> position in ask order (the order of `_trials`)
        self._pending: dict[str, Trial] = {}
        self._told: dict[str, str] = {}  # trial_id -> "completed" | "failed"
        self._obs_ids: list[str] = []
        self._obs_x: list[Tensor] = []
        self._obs_y: list[float] = []  # model units (sign applied)
        self._obs_seq: list[int] = []  # `_seq` of each observation: the observations are kept in ask order
        self.failures: list[dict[str, Any]] = []
        self._n_sobol = 0
        self._n_prior = 0  # completed results added with `tell_point`
        self._next_batch = 0
        self._n_user = 0
        self._model: Any = None
        self._model_n = 0  # observations in the last fit
        self._warned_prior_mode = False  # `fit` warns once when the model learned no lengthscale
        self._warned_slow_fit = False  # `fit` warns once when a fit is slow for its n (`SLOW_FIT_MIN_S`)
        self._best: tuple[dict, float] | None = None
        self._proposer: Any = None
        self._calibrator: Any = self._build_calibrator()
        #: True (the default): `tell` queues calibrator updates and `flush_calibration` (called by `ask` before
        #: a model-based proposal, or by you) applies them, each flush in ask order, so what a batch teaches the
        #: calibrator does not depend on the order its results were told (applied at each `tell`, they would
        #: teach it in arrival order); `calibrator` may so hold
        #: updates not yet applied (`fit` does not apply them: the central actor's refit thread must not touch
        #: the calibrator, only its proposing thread). False applies each result at once, in the order told.
        self.defer_calibration = True
        self._calib_queue: list[_CalibUpdate] = []
        self._calib_round = 0
        #: trial ids the calibrator has learned from, in the order it did (`calibrator_checkpoint`)
        self._calib_taught: list[str] = []
        self._calib_lock = threading.Lock()  # a flush and a checkpoint of the calibrator do not interleave
        self.check_options()  # a bad model/proposer/calibrator option or combination fails here, not after the design

    _LOCKS = ("_lock", "_ask_lock", "_calib_lock")

    def __getstate__(self) -> dict[str, Any]:
        """Picklable (and deep-copyable) like a BoTorch model or an Optuna study: `ray.put`, a Ray actor's
        argument, joblib; a snapshot taken between `ask`s and `tell`s, without the locks (`pickle.dumps` raises
        on an RLock). `get_state` / `set_state` remain the versioned, portable form."""
        with self._ask_lock, self._calib_lock, self._lock:
            # the containers copied under the locks: a `tell` from another thread during the pickling that
            # follows does not change what is pickled
            return {k: (v.copy() if isinstance(v, (list, dict)) else v) for k, v in self.__dict__.items()
                    if k not in self._LOCKS}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.__dict__.setdefault("_warned_prior_mode", False)  # a pickle from before these attributes
        self.__dict__.setdefault("_warned_slow_fit", False)
        self._lock, self._ask_lock, self._calib_lock = threading.RLock(), threading.Lock(), threading.Lock()

    @classmethod
    def from_config(cls, cfg: Any, objective: Any) -> "AskTellOptimizer":
        """The optimizer of a validated `ExperimentConfig` for `objective` (its space and direction, with the
        config's overrides), as the central actor runs it. Calibration updates are deferred to
        `flush_calibration` (which `ask` calls before proposing)."""
        opt = cls(
            cfg.build_space(objective.space),
            model=cfg.model.type,
            tau=cfg.tau,
            proposer=cfg.proposer.type,
            calibrator=cfg.calibrator.type,
            direction=cfg.resolve_direction(objective.direction),
            initial_design=cfg.initial_design,
            seed=cfg.seed,
            model_options=dict(cfg.model.options),
            proposer_options=dict(cfg.proposer.options),
            calibrator_options=dict(cfg.calibrator.options),
            recommendation=cfg.recommendation,
        )
        opt.defer_calibration = True  # (the default; the actor depends on it)
        return opt

    # ------------------------------------------------------------------ factories
    def _build_model(self) -> Any:
        from orchestrator.models import build_model

        if "tau" in self.model_options:
            raise ConfigError("`tau` is not a model option: set the top-level `tau` (the optimizer's level)")

        return build_model(self.model_name, tau=self.model_tau, **self.model_options)

    def _build_proposer(self) -> Any:
        from orchestrator.acquisition import build_proposer

        options = dict(self.proposer_options)
        if self.proposer_name == "sobol" and "seed" not in options:  # continue the initial design's sequence
            # (a sequence scrambled afresh per batch is no better than random for small ones)
            options["seed"] = self.seed
        proposer = build_proposer(self.proposer_name, **options)
        if hasattr(proposer, "snap") and self.space.has_grid:  # a proposer that can reason on the grid
            proposer.snap = self.space.snap
        if self._calibrator is not None:
            from orchestrator.calibration import attach

            attach(self._calibrator, proposer)
        return proposer

    def _build_calibrator(self) -> Any:
        if self.calibrator_name in (None, "none") and not self.calibrator_options:
            return None
        from orchestrator.calibration import build_calibrator

        options = dict(self.calibrator_options)
        if self.calibrator_name == "offline-cv" and not {"model", "model_options", "model_factory"} & set(options):
            # the folds refit the run's own model (calibrated-bo.md §1.3), unless the config names a fold model
            options["model"] = self.model_name
            options["model_options"] = {"tau": self.model_tau, **self.model_options}
        return build_calibrator(self.calibrator_name, **options)

    def check_options(self) -> None:
        """Build the model, the calibrator and the proposer once and check that they work together: a bad option
        or combination is a `ConfigError` naming its config section now, not an error at the first model batch
        (after the initial design was spent). The built objects are dropped."""
        from orchestrator.models import MODELS

        if self.model_name not in MODELS:
            raise ConfigError(f"`model.type` must be one of {sorted(MODELS)}; got {self.model_name!r}")
        try:
            model = self._build_model()
        except ConfigError as exc:  # the component names the option; the config key says where it is
            raise ConfigError(_under("model.options", exc)) from None
        try:
            proposer = self._build_proposer()
        except UnsupportedError as exc:  # `attach`: no hook for this calibrator, or options it would not read
            msg = str(exc).splitlines()[0]
            if msg.startswith("`calibrator.options`"):
                raise ConfigError(f"{msg} (`proposer.type` {self.proposer_name!r})") from None
            raise ConfigError(f"`calibrator.type` {self.calibrator_name!r} does not work with `proposer.type` "
                              f"{self.proposer_name!r}: {msg}") from None
        except ConfigError as exc:
            raise ConfigError(_under("proposer.options", exc)) from None
        if proposer.requires_model:
            try:
                proposer.check_model(model)
            except (UnsupportedError, ConfigError) as exc:
                raise ConfigError(f"`proposer.type` {self.proposer_name!r} with `model.type` {self.model_name!r}"
                                  f"{'' if self.calibrator_name in (None, 'none') else f' and `calibrator.type` {self.calibrator_name!r}'}"
                                  f": {str(exc).splitlines()[0]}") from None

    def prepare(self) -> None:
        """Import the model's and proposer's code and build the proposer now rather than at the first fit.

        The central actor calls this when it is created, so heavy imports (GPyTorch, BoTorch) do not compete
        with its dispatch loop for the interpreter while the first evaluations start.
        """
        self._build_model()
        if self._proposer is None:
            self._proposer = self._build_proposer()

    # ------------------------------------------------------------------ properties
    @property
    def model(self) -> Any:
        """The latest fitted surrogate, or None before the first fit."""
        return self._model

    @property
    def calibrator(self) -> Any:
        return self._calibrator

    @property
    def num_completed(self) -> int:
        return len(self._obs_y)

    @property
    def num_failed(self) -> int:
        return len(self.failures)

    @property
    def num_pending(self) -> int:
        return len(self._pending)

    @property
    def num_stale(self) -> int:
        """Completed results the current model has not seen."""
        return len(self._obs_y) - self._model_n

    def pending(self) -> list[Trial]:
        """Trials asked but not yet told, in the order they were asked."""
        with self._lock:
            return [t.copy() for t in self._pending.values()]

    def trial(self, trial_id: str) -> Trial:
        """A copy of the trial `trial_id` (asked, told or added with `tell_point`)."""
        with self._lock:
            try:
                return self._trials[trial_id].copy()
            except KeyError:
                raise TrialError(f"unknown trial id {trial_id!r}") from None

    def observations(self) -> tuple[Tensor, Tensor]:
        """Completed results: `n x d` unit-cube points and `n` values in model units (sign applied).

        Rows are in the order the trials were asked, whatever order their results came in, so the same
        config and seed give the same fits and proposals in a synchronous run.
        """
        X, Y, _ = self._snapshot()
        return X, Y

    def _snapshot(self) -> tuple[Tensor, Tensor, list[str]]:
        """`observations` and the trial id of each row, taken together."""
        with self._lock:
            return self._stack(self._obs_x), torch.tensor(self._obs_y, **self._tk), list(self._obs_ids)

    def can_fit(self) -> bool:
        """Whether a model fit is due: the proposer uses a model and `initial_design` (at least 2) results are in."""
        return self.needs_model() and len(self._obs_y) >= max(2, self.initial_design)

    def needs_model(self) -> bool:
        """Whether the proposer reads a surrogate (Sobol and random search do not: no fit is ever made for them)."""
        if self._proposer is None:
            self._proposer = self._build_proposer()
        return bool(getattr(self._proposer, "requires_model", True))

    def uses_model(self) -> bool:
        """Whether the next `ask` proposes with the model (else it continues the Sobol design)."""
        return self._design_left() <= 0 and (self._model is not None or self.can_fit())

    def _design_left(self) -> int:
        """Design points still owed: `initial_design` less the Sobol points asked and the completed results
        added with `tell_point` (200 prior results need no first batch of Sobol)."""
        return self.initial_design - self._n_sobol - self._n_prior

    # ------------------------------------------------------------------ ask
    def ask(self, q: int, fit: bool = True, design: bool = False) -> list[Trial]:
        """Propose `q` new trials, counting all untold trials as pending.

        Args:
            q: batch size, an integer >= 1.
            fit: refit the model first when results arrived since the last fit (the actor passes False
                and refits in the background instead).
            design: continue the Sobol design even when a model is available (never waits for a
                model-based `ask` running in another thread).

        Returns:
            `q` trials, marked pending until told.

        Raises:
            TrialError: `q` is not an integer >= 1.
            ModelFitError: with `fit`, the refit was refused (see `fit`); `ask(q, fit=False)` proposes from the
                current model, or continues the Sobol design before the first one.
        """
        q = _plain_int(q)
        if isinstance(q, bool) or not isinstance(q, int) or q < 1:
            raise TrialError(f"q must be an integer >= 1; got {q!r}")
        model_free = not self.needs_model()
        if design or self._design_left() > 0 or (
            not model_free and self._model is None and not (fit and self.can_fit())
        ):
            with self._lock:  # a Sobol draw is cheap: it does not wait for a model-based `ask` in another thread
                return self._ask(q, fit=False, sobol=True)
        with self._ask_lock:
            return self._ask(q, fit)

    def _ask(self, q: int, fit: bool, sobol: bool = False) -> list[Trial]:
        if not sobol:
            self.flush_calibration()
        if fit and self._design_left() <= 0 and self.can_fit() and (self._model is None or self.num_stale > 0):
            self.fit()
        with self._lock:
            batch_id = self._next_batch
            self._next_batch += 1
            X_pending = self._stack([t.x for t in self._pending.values()])
            X_observed = self._stack(self._obs_x)
            failed = [f for f in self.failures if f["trial_id"] in self._trials]
            # where an evaluation failed: never proposed again by a proposer that avoids taken points (GPR-EI and
            # qLogNEI, whose models never see a failure, would propose a failing corner batch after batch); a
            # point that also has a completed result is an observed one anyway. Not for a lost worker or node:
            # that says nothing about the point (one pre-emption would ban the best cell)
            X_failed = self._stack([self._trials[f["trial_id"]].x for f in failed if f["error"] not in _NO_BAN])
            X_all_failed = self._stack([self._trials[f["trial_id"]].x for f in failed])
            model = self._model
        forecasts: list[dict | None] = [None] * q
        if sobol or self._design_left() > 0 or (model is None and self.needs_model()):
            X, source = self._sobol(q), "sobol"
        else:
            # a model-free proposer (Sobol) counts what was asked to continue its sequence: failures used points too
            seen = X_observed if self.needs_model() else torch.cat([X_observed, X_all_failed])
            X, source = self._propose(model, q, batch_id, X_pending, seen), "model"
        X_taken = torch.cat([X_observed, X_failed])
        if not getattr(self._proposer, "allows_repeats", False):
            X = self._dedupe(X, X_pending, X_taken, batch_id)
        elif self._only_failed(X[0], X_observed, X_failed):  # GPR-EI repeats its point on purpose, but not one
            # that has only failed: its replicates go to a new point instead
            X = self._dedupe(X[:1], X_pending, X_taken, batch_id).expand(X.shape[0], -1).clone()
        if source == "model" and model is not None:
            with torch.no_grad():
                forecasts = model.forecast(X.to(**self._tk)).to_records()
        trials = []
        with self._lock:
            params = self.space.from_unit(X)
            for i in range(q):
                tid = f"{batch_id}-{i}"
                t = Trial(tid, params[i], X[i].clone(), batch_id, forecasts[i], trial_seed(self.seed, tid), source)
                if source == "sobol":
                    t.info["sobol_index"] = self._n_sobol - q + i
                self._add_trial(t)
                self._pending[tid] = t
                trials.append(t.copy())
        return trials

    def _sobol(self, q: int) -> Tensor:
        engine = torch.quasirandom.SobolEngine(self.space.dim, scramble=True, seed=self.seed)
        if self._n_sobol:
            engine.fast_forward(self._n_sobol)
        X = engine.draw(q, dtype=torch.float64)
        self._n_sobol += q
        return self.space.snap(X)

    def _propose(self, model: Any, q: int, batch_id: int, X_pending: Tensor, X_observed: Tensor) -> Tensor:
        if self._proposer is None:
            self._proposer = self._build_proposer()
        if hasattr(self._proposer, "observed_y"):  # LOCBO's incumbent is the best observed outcome
            self._proposer.observed_y = torch.tensor(self._obs_y, dtype=torch.float64)
        X = self._proposer.propose(
            model, q, X_pending=X_pending, X_observed=X_observed, seed=trial_seed(self.seed, f"batch-{batch_id}"),
            dim=self.space.dim,
        )
        return self.space.snap(X.detach().to(**self._tk))

    def _only_failed(self, x: Tensor, X_observed: Tensor, X_failed: Tensor) -> bool:
        """Whether `x` is a point whose evaluations all failed, compared as `_dedupe` compares points (by cell,
        `_cell_keys`)."""
        k = self._cell_keys(x.reshape(1, -1))[0]
        return k in set(self._cell_keys(X_failed)) and k not in set(self._cell_keys(X_observed))

    def _dedupe(self, X: Tensor, X_pending: Tensor, X_observed: Tensor, batch_id: int) -> Tensor:
        """Replace points equal to a pending or observed (or failed: `_ask`) point or to an earlier point of the batch.

        With discrete parameters proposals can round onto taken grid points; in a float space only a proposer
        can repeat one (the built-in ones do not; a user's may). A duplicate is replaced by a random snapped
        point that is new (on an int/choice grid of up to `_ENUMERATE_MAX` points, a random one of the cells
        left when the draws miss them all); when the grid holds no untaken point (a small discrete space is
        exhausted), or a larger grid's draws find none, the repeat is kept: for a noisy objective a repeated
        evaluation is still informative.
        Points are compared by their cells (`_cell_keys`), as bytes in a set, so the cost is linear in the
        observations, whatever q.
        """
        from orchestrator.space import FloatParam, IntParam

        floats = [isinstance(p, FloatParam) for p in self.space.params]
        # how many points the space holds: None (unbounded) with a float parameter
        grid = None if any(floats) else math.prod(
            p.size if isinstance(p, IntParam) else len(p.choices) for p in self.space.params)
        keys = self._cell_keys
        taken = set(keys(X_pending)) | set(keys(X_observed))
        gen = torch.Generator().manual_seed(trial_seed(self.seed, f"dedupe-{batch_id}"))
        out = X.clone()
        free: list[tuple[bytes, Tensor]] | None = None  # a small grid's untaken cells, listed when draws miss
        for i, k in enumerate(keys(out)):
            if k in taken and (grid is None or len(taken) < grid):
                cands = self.space.snap(torch.rand(_REPLACE_TRIES, self.space.dim, generator=gen, dtype=torch.float64))
                for cand, ck in zip(cands, keys(cands)):
                    if ck not in taken:
                        out[i], k = cand.to(out.dtype), ck
                        break
                else:  # random draws rarely hit the last free cells of a nearly full grid: pick one of them
                    if grid is not None and grid <= _ENUMERATE_MAX:
                        if free is None:
                            cells = self._grid_cells()
                            free = [(ck, c) for ck, c in zip(keys(cells), cells) if ck not in taken]
                        while free:  # a random free cell; one taken since the list was made is dropped
                            j = int(torch.randint(len(free), (1,), generator=gen))
                            free[j], free[-1] = free[-1], free[j]
                            ck, cell = free.pop()
                            if ck not in taken:
                                out[i], k = cell.to(out.dtype), ck
                                break
            taken.add(k)
        return out

    def _cell_keys(self, rows: Tensor) -> list[bytes]:
        """One key per unit-cube row: the grid index of each int or choice coordinate (`cell_index`: exact, where
        rounding unit coordinates to `DUPLICATE_TOL` would merge neighbouring values of a log int near 1e5, and a
        grid of 100,000 such cells would have 98,259 keys) and each float coordinate rounded to
        `DUPLICATE_TOL`."""
        from orchestrator.space import FloatParam

        arr = rows.detach().cpu().numpy().astype(np.float64).reshape(-1, self.space.dim)
        cols = [np.round(arr[:, j], round(-math.log10(DUPLICATE_TOL))) + 0.0 if isinstance(p, FloatParam)  # no -0.0
                else p.cell_index(arr[:, j]).astype(np.float64) for j, p in enumerate(self.space.params)]
        out = np.stack(cols, axis=1) if cols else arr
        return [r.tobytes() for r in np.ascontiguousarray(out)]

    def _grid_cells(self) -> Tensor:
        """Every point of an all-int/choice space, as snapped unit-cube rows (only for a small grid): the product
        of each parameter's unit coordinates, computed once per value (a dict per cell through `to_unit` takes
        55 s for 1,000 choices x 100 ints)."""
        from orchestrator.space import IntParam

        axes = [torch.tensor([p.to_unit(v) for v in (p.values.tolist() if isinstance(p, IntParam) else p.choices)],
                             dtype=torch.float64) for p in self.space.params]
        return torch.cartesian_prod(*axes).reshape(-1, len(axes))

    def forecast(self, X: Tensor) -> list[dict | None]:
        """The current model's forecast at `n x d` points as plain dicts (model units), or Nones without a model."""
        if self._model is None:
            return [None] * X.shape[0]
        with torch.no_grad():
            return self._model.forecast(X.to(**self._tk)).to_records()

    # ------------------------------------------------------------------ tell
    def tell(self, trial_id: str, value: Any, error: str | None = None, message: str | None = None) -> str:
        """Record the result of an asked trial. Results may come in any order; each trial is told once.

        Args:
            trial_id: an id returned by `ask`.
            value: the objective's value in the user's units. NaN, ±inf, None or anything non-numeric
                becomes a recorded failure (reason "nan", "inf", "none", "non-numeric", "array").
            error: a failure reason (e.g. "exception", "timeout"); when given, `value` is ignored.
            message: with `error`, what went wrong (kept in `failures`; e.g. the exception's message).

        Returns:
            "completed" or "failed".

        Raises:
            TrialError: the id is unknown or was already told.
        """
        with self._lock:
            if not isinstance(trial_id, str) or trial_id not in self._trials:
                raise TrialError(f"unknown trial id {trial_id!r}; ask() hands out ids such as '0-0'")
            if trial_id in self._told:
                raise TrialError(f"trial {trial_id!r} was already told ({self._told[trial_id]})")
            trial = self._trials[trial_id]
            if error is None:
                v, reason, message = classify_value(value)
            else:
                v, reason, message = None, str(error), (None if message is None else str(message))
            self._pending.pop(trial_id, None)
            if reason is not None:
                self._told[trial_id] = "failed"
                self.failures.append({"trial_id": trial_id, "error": reason, "message": message})
                return "failed"
            y = self.sign * float(v)
            self._told[trial_id] = "completed"
            # in ask order, not arrival order: a synchronous run's fits must not depend on which result of a
            # batch came in first (the SVGP's minibatches and k-means inducing points see the data's order)
            seq = self._seq[trial_id]
            i = bisect.bisect_right(self._obs_seq, seq)
            self._obs_seq.insert(i, seq)
            self._obs_ids.insert(i, trial_id)
            self._obs_x.insert(i, trial.x)
            self._obs_y.insert(i, y)
            if self._calibrator is not None and (trial.forecast is not None or self._calibrator.needs_every_result):
                self._calib_queue.append(_CalibUpdate(seq, trial_id, trial.forecast, y, trial.x, self._calib_round))
        if not self.defer_calibration:
            self.flush_calibration()
        return "completed"

    def is_told(self, trial_id: str) -> bool:
        """Whether a result (completed or failed) was recorded for `trial_id`."""
        return trial_id in self._told

    def flush_calibration(self) -> int:
        """Apply the queued calibrator updates (forecast recorded at proposal, observed y): the results told since
        the last flush, in the order their trials were asked, in one `update`, so that the online recalibrator
        takes one step for them (calibrated-bo.md §4.3). `ask` flushes before a model-based proposal, so its map
        changes once per proposal: in a synchronous run with the results of the batch before, in a streaming run
        with whatever came in since the last ask, from any batches. One step per batch in a streaming flush
        instead (each batch's results apart, at the levels in force) over-covered, 0.933-0.942 of a central 90%
        interval with 8-16-point batches (`tests/orchestrator/calibration/test_online.py`). Results queued in
        several rounds (`end_calibration_round`: a resume replaying the log without a calibrator checkpoint) get
        one update per round, as the asks they came before gave them: one update for all of them would leave the
        map one step from the identity. A replay's rounds are exact for a synchronous run; for a streaming run
        too where the log records which results each ask's flush learned (the actor's `info["learned_ids"]`: a
        result told while the ask ran is logged before its proposals; the flush at the end of a session is
        marked by its final fit's record). They are approximate for logs of older versions, which record
        neither, and at the ask of a batch whose proposals were lost from a damaged log."""
        with self._calib_lock:
            with self._lock:
                todo = sorted(self._calib_queue, key=lambda u: (u.round, u.seq))
                self._calib_queue = []
                self._calib_round += 1
            if not todo or self._calibrator is None:
                return 0
            from orchestrator.models.predictive import Forecast

            # per round, the results with a forecast and those without one (only for `needs_every_result`)
            def run_key(u: _CalibUpdate) -> tuple[int, bool]:
                return u.round, u.forecast is not None

            for (_, has_forecast), run in itertools.groupby(todo, key=run_key):
                run = list(run)
                y = torch.tensor([u.y for u in run], **self._tk)
                X = torch.stack([u.x for u in run]).to(**self._tk)
                if has_forecast:
                    self._calibrator.update(Forecast.from_records([u.forecast for u in run]), y, X=X)
                else:
                    self._calibrator.observe(y, X)
            self._calib_taught.extend(u.trial_id for u in todo)
        return len(todo)

    def end_calibration_round(self, after: int | None = None, learned_ids: Sequence[str] | None = None) -> None:
        """Results told from now on belong to the next flush's update, not the one queued so far: what `ask`'s
        flush does, for a replay that tells a log's results in one go (the central actor calls it where the log
        shows a model-based batch proposed). Nothing is applied until `flush_calibration`.

        Args:
            after: how many results the calibrator had learned in all when that ask flushed (the actor logs it
                with each model batch, `info["calibrated"]`): the queued results past that count, in the order
                told, were told after the flush (while the ask ran, so logged before its proposals) and join the
                new round. None (a log written before the count was kept) leaves them where they are.
            learned_ids: the results that flush learned (the actor's `info["learned_ids"]`): the queued results
                of the round being ended that are not among them join the new round. Used in place of `after`
                when given: it does not depend on what the replay holds (a damaged log's lost results, or a
                resumed session whose first flush taught the results of several rounds).
        """
        with self._lock:
            current = self._calib_round
            self._calib_round = current + 1
            # the round being ended is the queue's tail (rounds never decrease along it): only the tail is read, so
            # a replay pays per marker for the results since the one before, not for the whole queue (rebuilt
            # whole at every marker, a replay of 20,000 one-point batches takes 11 s, quadratic)
            queue = self._calib_queue
            start = len(queue)
            while start > 0 and queue[start - 1].round == current:
                start -= 1
            tail = queue[start:]
            if learned_ids is not None:
                learned = set(learned_ids)
                last = max((j for j, u in enumerate(tail) if u.trial_id in learned), default=-1)
                # a result told before the last one this flush learned, yet not learned by it, was learned by an
                # earlier flush whose record the log lost (a damaged log): its update comes first, on its own, in
                # the round being ended (not after this one); then this flush's, then the
                # results told after it
                early = any(j < last and u.trial_id not in learned for j, u in enumerate(tail))
                base = current + 1 if early else current
                self._calib_round = base + 1
                tail = [u._replace(round=base if u.trial_id in learned else current if j < last else base + 1)
                        for j, u in enumerate(tail)]
                tail.sort(key=lambda u: u.round)  # (stable: told order within each round)
            elif after is not None:  # (only results of the round being ended move: a damaged log's count moves no more)
                k = max(0, int(after) - len(self._calib_taught))
                tail = [u._replace(round=current + 1) if start + j >= k else u for j, u in enumerate(tail)]
            queue[start:] = tail

    def calibrated_ids(self, start: int = 0) -> list[str]:
        """The trial ids of the results the calibrator has learned from, in the order it did, from the
        `start`-th on (`num_calibrated` before a flush gives the ones that flush taught it)."""
        with self._lock:
            return list(self._calib_taught[start:])

    @property
    def num_calibrated(self) -> int:
        """How many results the calibrator has learned from (0 without a calibrator)."""
        return len(self._calib_taught)

    def calibrator_checkpoint(self) -> dict[str, Any] | None:
        """The calibrator's state and the trial ids it has learned from, or None without a calibrator.
        `restore_calibrator` puts it back after a log replay in place of re-learning those results."""
        if self._calibrator is None:
            return None
        with self._calib_lock:
            return {"calibrator": self._calibrator.get_state(), "taught": list(self._calib_taught),
                    "calibrator_type": self.calibrator_name}

    def restore_calibrator(self, checkpoint: Mapping[str, Any]) -> int:
        """Use a `calibrator_checkpoint` after the results were replayed into this optimizer (told, their
        calibrator updates still queued): the calibrator takes the checkpoint's state and the queued updates
        of the results it had learned are dropped; the others stay queued, applied at the next flush. A
        resumed run's calibrator so ends where the interrupted run's was, not in the state of learning every
        result again in one flush (online OGD, LOCBO and time-series splits depend on the chunks).

        Returns:
            the number of results the restored calibrator had learned.

        Raises:
            QbatchError: no calibrator here, a checkpoint of another calibrator or other options, or one that
                learned results this optimizer holds no queued update for (another run, or a damaged log).
        """
        if self._calibrator is None:
            raise QbatchError("this run has no calibrator to restore")
        if checkpoint.get("calibrator_type") != self.calibrator_name:
            raise QbatchError(f"the calibrator checkpoint is of calibrator {checkpoint.get('calibrator_type')!r}; "
                              f"this run uses {self.calibrator_name!r}")
        taught = [str(t) for t in checkpoint["taught"]]
        with self._calib_lock:
            with self._lock:
                if self._calib_taught:
                    raise QbatchError(f"the calibrator has learned {len(self._calib_taught)} results already; a "
                                      "checkpoint is restored only right after the replay")
                queued = {u.trial_id for u in self._calib_queue}
                missing = [t for t in taught if t not in queued]
                if missing or len(set(taught)) != len(taught):
                    raise QbatchError(f"the calibrator checkpoint learned results the log does not hold (e.g. "
                                      f"{(missing or taught)[0]!r})")
            before = self._calibrator.get_state()
            try:
                self._calibrator.set_state(checkpoint["calibrator"])
            except Exception:
                self._calibrator.set_state(before)
                raise
            done = set(taught)
            with self._lock:
                # every result the checkpoint's last flush could see was learned by it: one still queued was told
                # after that flush, whatever round the replay gave it (a result told while an ask ran is logged
                # before the ask's proposals), so it joins the first round after the learned ones (left in the
                # last learned round, the next flush would step twice where the run stepped once)
                last = max((u.round for u in self._calib_queue if u.trial_id in done), default=-1)
                self._calib_queue = [u if u.round > last else u._replace(round=last + 1)
                                     for u in self._calib_queue if u.trial_id not in done]
                self._calib_round = max(self._calib_round, last + 1)
                self._calib_taught = taught
        return len(taught)

    def tell_many(self, trial_ids: Sequence[str], values: Sequence[Any]) -> list[str]:
        """`tell` several results (any subset of the pending trials, in any order)."""
        if len(trial_ids) != len(values):
            raise TrialError(f"got {len(trial_ids)} trial ids but {len(values)} values")
        # every id checked before any is told: a typo in the middle would leave the first ones told, and the
        # corrected call would then fail on them
        seen: set[str] = set()
        with self._lock:
            for i, t in enumerate(trial_ids):
                if not isinstance(t, str) or t not in self._trials:
                    raise TrialError(f"trial_ids[{i}]: unknown trial id {t!r}; nothing was told")
                if t in self._told or t in seen:
                    raise TrialError(f"trial_ids[{i}]: trial {t!r} was already told; nothing was told")
                seen.add(t)
        return [self.tell(t, v) for t, v in zip(trial_ids, values)]

    def tell_point(self, params: Mapping[str, Any], value: Any) -> str:
        """Add a result at a point that was not asked (e.g. earlier data). Errors name the bad parameter.

        The point is kept in the parameters' own types, as `ask` gives them: `{"layers": 2.0}` for an int
        parameter is recorded (and recommended by `best`) as 2, a float given as 1 as 1.0.
        """
        from orchestrator.space import FloatParam, IntParam

        X = self.space.to_unit([params])
        typed = {p.name: float(params[p.name]) if isinstance(p, FloatParam)
                 else int(params[p.name]) if isinstance(p, IntParam)  # on the grid: checked by to_unit above
                 else p.from_unit(p.to_unit(params[p.name])) for p in self.space.params}
        with self._lock:
            tid = f"user-{self._n_user}"
            self._n_user += 1
            t = Trial(tid, typed, X[0], -1, None, trial_seed(self.seed, tid), "user")
            self._add_trial(t)
        status = self.tell(tid, value)
        if status == "completed":
            with self._lock:
                self._n_prior += 1  # a design point (`initial_design`)
        return status

    # ------------------------------------------------------------------ model
    def fit(self, restart: bool = False, stop: threading.Event | None = None) -> dict[str, Any]:
        """Fit (warm-started) the surrogate on all completed results; return diagnostics.

        Args:
            restart: also fit from scratch (the model's default start) and keep whichever fit ends with the
                lower training loss (negative marginal likelihood or ELBO per datum). A warm start can stay in
                the basin an early fit found on little data (e.g. a lengthscale that explains the later points
                as noise); the end of a run asks for this, so that the final recommendation is not that basin's.
            stop: once this event is set, the fit stops between two training steps and raises `FitInterrupted`,
                the model in use staying (the central actor's background refit, when the run ends: the final fit
                on every result replaces it anyway). The SVGP models stop; the exact GPs' fits, short L-BFGS
                runs, go to their end.

        Returns:
            ``{"seconds", "n", "best_params", "best_predicted", "swapped", ...model diagnostics}`` (``swapped``:
            False when a fit on more results ended first, whose model stays in use; then without the two
            ``best_`` keys, which belong to the model in use); with `restart`, also
            ``"loss_warm"``, ``"loss_cold"`` and ``"restart_kept"`` (``"warm"`` or ``"cold"``).

        Raises:
            InputDataError: fewer than 2 completed results.
            ModelFitError: the fitted posterior is not finite (the current model stays in use).
            FitInterrupted: `stop` was set before the fit ended (the current model stays in use).

        Warns:
            ModelWarning: once per optimizer each, when the model learned no lengthscale, and when a fit took
                unusually long for its n (`SLOW_FIT_MIN_S`), naming the model options to change.
        """
        with fit_stop(stop):
            return self._fit(restart)

    def _fit(self, restart: bool) -> dict[str, Any]:
        if not self.defer_calibration:
            self.flush_calibration()
        X, Y, ids = self._snapshot()
        n = Y.shape[0]
        if n < 2:
            raise InputDataError(f"a model fit needs at least 2 completed results; have {n}")
        if not math.isfinite(float(Y.std())):  # the outcomes' spread overflows float64: no model can standardize
            raise ModelFitError(
                f"the outcomes of the {n} results span [{float(Y.min()):g}, {float(Y.max()):g}], too wide for a model "
                "in float64 (their variance overflows); rescale the objective's values. The previous model is kept")
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
        fits: list[tuple[float, str]] = []  # (seconds, "warm" or "cold") of each model fit, for `_slow_fit_warning`
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
                f"the {self.model_name} fit on {n} results is not finite (posterior mean not finite at {bad} of "
                f"{n} observed points, outcome transform loc={float(loc):g}, scale={float(scale):g}; outcomes "
                f"span [{float(Y.min()):g}, {float(Y.max()):g}]); the previous model is kept")
        i = int(torch.argmax(recommendation_scores(model, X, self.recommendation, mean=target)))
        best_pred = self.sign * float(loc + scale * float(target[i]))
        with self._lock:  # as told (a log-scale float mapped back from x differs in its last digits)
            best_params = dict(self._trials[ids[i]].params)
        seconds = time.perf_counter() - t0
        with self._lock:
            # a fit on fewer results than the model in use ended after it (a refit that outlived the run's end,
            # while the final fit ran): the newer model stays, not the older one
            swapped = n >= self._model_n
            if swapped:
                self._model = model
                self._model_n = n
                self._best = (best_params, best_pred)
        diag = {k: v for k, v in diag.items() if isinstance(v, (int, float, str, bool))}
        diag.update(seconds=seconds, n=n, swapped=swapped)
        with self._lock:  # once per optimizer (every later warm refit would say it again), for the model in use
            warn = swapped and bool(diag.get("lengthscales_at_prior_mode")) and not self._warned_prior_mode
            self._warned_prior_mode |= warn
        if warn:
            prior = (self.model_options or {}).get("lengthscale_prior", "dim-scaled")
            advice = ("set the model option `lengthscale_prior: dim-scaled` (config `model: {type: ..., options: "
                      "{lengthscale_prior: dim-scaled}}`)" if prior != "dim-scaled" else
                      "give it more results per dimension, or fewer dimensions")
            warnings.warn(
                f"the {self.model_name} model learned no lengthscale from {n} results: all {self.space.dim} "
                "lengthscales of its objective latent sit at the prior's mode, so it is flat between its points and "
                f"its batches are close to random. In {self.space.dim} dimensions {advice}", ModelWarning,
                stacklevel=3)  # the caller of `fit`
        slow = self._slow_fit_warning(fits, n)
        if slow is not None:
            warnings.warn(slow, ModelWarning, stacklevel=3)
        if swapped:  # the recommendation of the model in use (a report reads the last refit's)
            diag.update(best_params=best_params, best_predicted=best_pred)
        return diag

    def _slow_fit_warning(self, fits: Sequence[tuple[float, str]], n: int) -> str | None:
        """The warning for the first fit of this optimizer that was slow for its `n` (`SLOW_FIT_MIN_S`), naming
        the model options that set its length; None for a fit that was not, or once one was (every later refit
        would say it again)."""
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
        return (f"the {self.model_name} fit on {n} results took {seconds:.0f} s ({seconds / n:.2g} s per result, "
                f"a {kind} fit), far longer than the default quantile model takes for {n} results; the refits that "
                f"follow take as long or longer. To make them shorter, {advice}")

    def model_checkpoint(self) -> dict[str, Any] | None:
        """The fitted model's state for a checkpoint (tensors and plain values), or None (no model yet, or a
        model without state dicts). `restore_model` puts it back in place of a refit."""
        with self._lock:
            model, n, best = self._model, self._model_n, self._best
        if model is None:
            return None
        try:
            state = model.get_state()
        except NotImplementedError:
            return None
        return {"model": state, "model_n": n, "model_type": self.model_name, "tau": self.tau,
                "direction": self.direction, "model_tau": self.model_tau, "model_options": dict(self.model_options),
                "best": None if best is None else [dict(best[0]), float(best[1])]}

    def restore_model(self, checkpoint: Mapping[str, Any]) -> None:
        """Use a `model_checkpoint` as the current model (a resumed run proposes from it while it refits).

        Raises:
            QbatchError: the checkpoint is of another model, level (tau and direction) or model options (an
                edited config.yaml: its settings would otherwise carry on through every warm refit), or saw
                more results than this optimizer holds (it belongs to another run).
        """
        theirs = (checkpoint.get("model_type"), checkpoint.get("model_tau"), checkpoint.get("model_options"))
        if "model_tau" not in checkpoint:  # an older version's checkpoint: it records the user's tau only
            theirs = (theirs[0], self.model_tau if checkpoint.get("tau") == self.tau else None, self.model_options)
        direction = checkpoint.get("direction", self.direction)
        if direction != self.direction:  # tau 0.5 has the same model level in both directions
            raise QbatchError(f"the model checkpoint is of a run that {direction}s; this run {self.direction}s "
                              f"(`direction` changed)")
        if theirs != (self.model_name, self.model_tau, self.model_options):
            raise QbatchError(f"the model checkpoint is of model {theirs[0]!r} at level {theirs[1]!r} with options "
                              f"{theirs[2]!r}; this run fits {self.model_name!r} at level {self.model_tau!r} "
                              f"(tau {self.tau!r}, {self.direction}) with options {self.model_options!r}")
        n = int(checkpoint["model_n"])
        with self._lock:
            if n > len(self._obs_y):
                raise QbatchError(f"the model checkpoint saw {n} results; the log holds {len(self._obs_y)}")
        model = self._build_model()
        model.set_state(checkpoint["model"])
        best = checkpoint.get("best")
        with self._lock:
            self._model, self._model_n = model, n
            if best is not None:
                self._best = (dict(best[0]), float(best[1]))

    def best(self) -> tuple[dict, float]:
        """Recommended point and its value in the user's units.

        With a model: the observed input maximizing the posterior mean of the target at the last fit, with
        that predicted value (spec §1.7); `ask` fits before proposing, so call `fit()` after the last `tell` to
        include every result. Before the first fit: the best observed value.

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

    def best_observed(self) -> tuple[dict, float] | None:
        """The best raw observed value (user units) and its params, or None."""
        with self._lock:
            if not self._obs_y:
                return None
            i = max(range(len(self._obs_y)), key=self._obs_y.__getitem__)
            return dict(self._trials[self._obs_ids[i]].params), self.sign * self._obs_y[i]

    # ------------------------------------------------------------------ replay / state
    def restore_trial(
        self,
        trial_id: str,
        params: Mapping[str, Any],
        x: Sequence[float] | Tensor,
        batch_id: int,
        forecast: dict | None = None,
        seed: int | None = None,
        source: str = "sobol",
        sobol_index: int | None = None,
    ) -> Trial:
        """Re-register a trial from the event log (resume): it becomes pending until told."""
        with self._lock:
            if trial_id in self._trials:
                return self._trials[trial_id]
            xt = torch.as_tensor(list(x) if not isinstance(x, Tensor) else x, **self._tk).reshape(self.space.dim)
            seed = trial_seed(self.seed, trial_id) if seed is None else int(seed)
            t = Trial(trial_id, dict(params), xt, int(batch_id), forecast, seed, source)
            if sobol_index is not None:
                t.info["sobol_index"] = int(sobol_index)
                self._n_sobol = max(self._n_sobol, int(sobol_index) + 1)
            self._add_trial(t)
            self._pending[trial_id] = t
            if batch_id >= 0:
                self._next_batch = max(self._next_batch, int(batch_id) + 1)
            else:
                self._n_user += 1
            return t

    def get_state(self) -> dict[str, Any]:
        """Plain values and tensors only (loads with `torch.load(weights_only=True)`)."""
        # a flush takes the queue under `_lock` and teaches the calibrator outside it: without `_calib_lock`, a
        # state saved in between would hold those results neither queued nor learned
        with self._calib_lock, self._lock:
            trials = [
                {
                    "trial_id": t.trial_id,
                    "params": dict(t.params),
                    "x": t.x.tolist(),
                    "batch_id": t.batch_id,
                    "forecast": t.forecast,
                    "seed": t.seed,
                    "source": t.source,
                    "info": dict(t.info),
                }
                for t in self._trials.values()
            ]
            state: dict[str, Any] = {
                "trials": trials,
                "pending": list(self._pending),
                "told": dict(self._told),
                "obs_ids": list(self._obs_ids),
                "obs_y": list(self._obs_y),
                "failures": [dict(f) for f in self.failures],
                "n_sobol": self._n_sobol,
                "next_batch": self._next_batch,
                "n_user": self._n_user,
                "model_n": self._model_n,
                "best": None if self._best is None else [dict(self._best[0]), self._best[1]],
                # calibrator updates told but not yet applied (`defer_calibration`), by trial id
                "calib_queue": [[u.trial_id, float(u.y), int(u.round)] for u in self._calib_queue],
                "calib_round": self._calib_round,
                "settings": self._settings(),
                "calib_taught": list(self._calib_taught),
            }
            if self._model is not None:
                try:
                    state["model"] = self._model.get_state()
                except NotImplementedError:
                    state["model"] = None
            if self._calibrator is not None:
                state["calibrator"] = self._calibrator.get_state()
            if self._proposer is not None:
                state["proposer"] = self._proposer.get_state()
        return state

    def _settings(self) -> dict[str, Any]:
        """What a state's trials and model mean (JSON form): the space, the direction, the level and the model.
        The proposer and calibrator may differ (a benchmark starts every calibrator from one first fit; a
        calibrator refuses another's state itself)."""
        settings = {"space": self.space.describe(), "direction": self.direction, "tau": self.tau,
                    "model_tau": self.model_tau, "model": self.model_name, "model_options": self.model_options}
        return json.loads(json.dumps(settings, default=repr))

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restore from `get_state`. Without a model state the next `ask` refits from the observations.

        Raises:
            QbatchError: the state was saved by an optimizer with another space, direction, tau, model or model
                options, naming the first that differs (a minimize state loaded into a maximize optimizer would
                flip every value's sign, and one of another space would relabel its points).
        """
        theirs = state.get("settings")
        if theirs is not None:  # (states of older versions carry none)
            ours = self._settings()
            for key in ours:
                if key in theirs and theirs[key] != ours[key]:
                    raise QbatchError(f"the state was saved by an optimizer with {key}={theirs[key]!r}; this one has "
                                      f"{key}={ours[key]!r}: build it with the same settings to restore the state")
        with self._lock:
            self._trials, self._seq = {}, {}
            for r in state["trials"]:
                t = Trial(r["trial_id"], dict(r["params"]), torch.tensor(r["x"], **self._tk), int(r["batch_id"]),
                          r["forecast"], int(r["seed"]), r["source"], dict(r.get("info", {})))
                self._add_trial(t)
            self._pending = {tid: self._trials[tid] for tid in state["pending"]}
            self._told = dict(state["told"])
            obs = sorted(zip(state["obs_ids"], state["obs_y"]), key=lambda o: self._seq[o[0]])  # ask order
            self._obs_ids = [tid for tid, _ in obs]
            self._obs_seq = [self._seq[tid] for tid in self._obs_ids]
            self._obs_x = [self._trials[tid].x for tid in self._obs_ids]
            self._obs_y = [float(v) for _, v in obs]
            self.failures = [dict(f) for f in state["failures"]]
            self._n_sobol = int(state["n_sobol"])
            self._next_batch = int(state["next_batch"])
            self._n_user = int(state["n_user"])
            self._n_prior = sum(st == "completed" and self._trials[tid].source == "user" for tid, st in self._told.items())
            self._best = None if state.get("best") is None else (dict(state["best"][0]), float(state["best"][1]))
            # (states saved before the rounds were kept hold [id, y]: one round)
            self._calib_queue = [_CalibUpdate(self._seq[u[0]], u[0], self._trials[u[0]].forecast, float(u[1]),
                                              self._trials[u[0]].x, int(u[2]) if len(u) > 2 else 0)
                                 for u in state.get("calib_queue", [])]
            self._calib_round = int(state.get("calib_round", max([u.round for u in self._calib_queue], default=0)))
            self._calib_taught = list(state.get("calib_taught", []))
            self._model, self._model_n = None, 0
            if state.get("model") is not None:
                model = self._build_model()
                model.set_state(state["model"])
                self._model, self._model_n = model, int(state["model_n"])
            if self._calibrator is not None and state.get("calibrator") is not None:
                self._calibrator.set_state(state["calibrator"])
            if state.get("proposer") is not None:
                self._proposer = self._build_proposer()
                self._proposer.set_state(state["proposer"])

    # ------------------------------------------------------------------ helpers
    def _add_trial(self, t: Trial) -> None:
        """Register a new trial (caller holds `_lock`); its `_seq` is its place in ask order."""
        self._trials[t.trial_id] = t
        self._seq[t.trial_id] = len(self._seq)

    def _stack(self, xs: Sequence[Tensor]) -> Tensor:
        if not xs:
            return torch.empty(0, self.space.dim, **self._tk)
        return torch.stack(list(xs)).to(**self._tk)
