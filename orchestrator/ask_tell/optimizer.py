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

`AskTellOptimizer` is the facade of this package: `ask` and `tell` are here, its parts are beside it, one file
each (orchestrator/ask_tell/__init__.py lists them).
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from orchestrator.ask_tell.calibration_queue import CalibrationQueue
from orchestrator.ask_tell.dedup import DuplicateHandling
from orchestrator.ask_tell.factories import ComponentFactories
from orchestrator.ask_tell.fitting import ModelFitting
from orchestrator.ask_tell.repeats import Repeats
from orchestrator.ask_tell.replay import Replay
from orchestrator.ask_tell.trials import (
    Trial,
    TrialError,
    TrialRegistry,
    check_batch_size,
    plain_int,
    trial_seed,
)
from orchestrator.device import DEFAULT_DEVICE, check_device, resolve_device
from orchestrator.errors import ConfigError
from orchestrator.models.base import use_device
from orchestrator.protocols import CalibratorProtocol, ProposerProtocol, SurrogateProtocol
from orchestrator.recommend import DEFAULT_RULE, check_rule
from orchestrator.space import SearchSpace
from orchestrator.threads import bounded_threads, check_threads
from workers.records import classify_value

__all__ = ["AskTellOptimizer"]

#: failure reasons that do not make a point taken (`_ask`): the infrastructure failed, not the evaluation
_NO_BAN = ("worker-lost",)


class AskTellOptimizer(
    TrialRegistry, ComponentFactories, ModelFitting, CalibrationQueue, DuplicateHandling, Repeats, Replay
):
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
        threads: torch's intra-op threads in `fit` and `ask` (`orchestrator.threads.bounded_threads`; the
            caller's setting is restored after each): "auto" (default: at most `DEFAULT_THREADS`, never more
            than the caller's own) or an integer, used as given.
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
        threads: str | int = "auto",
        device: str = DEFAULT_DEVICE,
    ) -> None:
        self.space = space if isinstance(space, SearchSpace) else SearchSpace.from_description(space)
        if direction not in ("maximize", "minimize"):
            raise ConfigError(f"`direction` must be 'maximize' or 'minimize'; got {direction!r}")
        if isinstance(tau, bool) or not isinstance(tau, (int, float)) or not 0.0 < float(tau) < 1.0:
            raise ConfigError(f"`tau` must be a number in (0, 1); got {tau!r}")
        if initial_design is None:
            initial_design = max(2 * self.space.dim + 2, 5)
        # numpy integers are integers too (the config accepts them, so this does)
        initial_design, seed = plain_int(initial_design), plain_int(seed)
        if isinstance(initial_design, bool) or not isinstance(initial_design, int) or initial_design < 1:
            raise ConfigError(f"`initial_design` must be an integer >= 1; got {initial_design!r}")
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
            raise ConfigError(f"`seed` must be an integer in [0, 2**63); got {seed!r}")
        self.recommendation = check_rule(recommendation)
        self.threads = check_threads("`threads`", threads)
        self.device = check_device(device)
        #: the resolved torch device of `device` (a ConfigError now when it names a CUDA device not seen here)
        self.torch_device = resolve_device(device)
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
        #: each refit that `ask` starts also fits from scratch and keeps the lower training loss
        #: (`fit(restart=True)`, which the end of a run always does); False: refits are warm-started only
        self.refit_restarts = False
        #: the order of the re-evaluation candidates of `ask_repeats` (`repeats.REPEAT_ORDERS`): "mixed",
        #: alternately the recommendation rule's and the best observed outcome's; "model", the rule's alone
        self.repeat_order = "mixed"

        self._lock = threading.RLock()  # observation/trial state; never held during a fit or a proposal
        self._ask_lock = threading.Lock()  # one `ask` at a time (the Sobol counter, the proposer)
        self._calib_lock = threading.Lock()  # a flush and a checkpoint of the calibrator do not interleave
        self._init_trials()
        self._init_fitting()
        self._proposer: ProposerProtocol | None = None
        self._calibrator: CalibratorProtocol | None = self._build_calibrator()
        #: True (the default): `tell` queues calibrator updates and `flush_calibration` (called by `ask`
        #: before a model-based proposal, or by you) applies them, each flush in ask order, so what a batch
        #: teaches the calibrator does not depend on the order its results were told (applied at each `tell`,
        #: they would teach it in arrival order); `calibrator` may so hold
        #: updates not yet applied (`fit` does not apply them: the central actor's refit thread must not touch
        #: the calibrator, only its proposing thread). False applies each result at once, in the order told.
        self.defer_calibration = True
        self._init_calibration_queue()
        # a bad model/proposer/calibrator option or combination fails here, not after the design
        self.check_options()

    _LOCKS = ("_lock", "_ask_lock", "_calib_lock")

    def __getstate__(self) -> dict[str, Any]:
        """Picklable (and deep-copyable) like a BoTorch model or an Optuna study: `ray.put`, a Ray actor's
        argument, joblib; a snapshot taken between `ask`s and `tell`s, without the locks (`pickle.dumps`
        raises on an RLock). `get_state` / `set_state` remain the versioned, portable form."""
        with self._ask_lock, self._calib_lock, self._lock:
            # the containers copied under the locks: a `tell` from another thread during the pickling that
            # follows does not change what is pickled
            return {k: (v.copy() if isinstance(v, (list, dict)) else v) for k, v in self.__dict__.items()
                    if k not in self._LOCKS}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.__dict__.setdefault("_warned_prior_mode", False)  # a pickle from before these attributes
        self.__dict__.setdefault("_warned_slow_fit", False)
        self.__dict__.setdefault("threads", "auto")
        self.__dict__.setdefault("device", DEFAULT_DEVICE)
        self.__dict__.setdefault("torch_device", torch.device("cpu"))
        self._lock, self._ask_lock, self._calib_lock = threading.RLock(), threading.Lock(), threading.Lock()

    @classmethod
    def from_config(cls, cfg: Any, objective: Any) -> AskTellOptimizer:
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
            threads=cfg.threads,
            device=cfg.device,
        )
        opt.defer_calibration = True  # (the default; the actor depends on it)
        return opt

    # ------------------------------------------------------------------ ask
    def uses_model(self) -> bool:
        """Whether the next `ask` proposes with the model (else it continues the Sobol design)."""
        return self._design_left() <= 0 and (self._model is not None or self.can_fit())

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
            ModelFitError: with `fit`, the refit was refused (see `fit`); `ask(q, fit=False)` proposes from
                the current model, or continues the Sobol design before the first one.
        """
        q = check_batch_size(q)
        model_free = not self.needs_model()
        if design or self._design_left() > 0 or (
            not model_free and self._model is None and not (fit and self.can_fit())
        ):
            # a Sobol draw is cheap: it does not wait for a model-based `ask` in another thread
            with self._lock:
                return self._ask(q, fit=False, sobol=True)
        with self._ask_lock, bounded_threads(self.threads):
            use_device(self.torch_device)
            return self._ask(q, fit)

    def _ask(self, q: int, fit: bool, sobol: bool = False) -> list[Trial]:
        if not sobol:
            self.flush_calibration()
        if (
            fit
            and self._design_left() <= 0
            and self.can_fit()
            and (self._model is None or self.num_stale > 0)
        ):
            self.fit(restart=self.refit_restarts)
        with self._lock:
            batch_id = self._next_batch
            self._next_batch += 1
            X_pending = self._stack([t.x for t in self._pending.values()])
            X_observed = self._stack(self._obs_x)
            failed = [f for f in self.failures if f["trial_id"] in self._trials]
            # where an evaluation failed: never proposed again by a proposer that avoids taken points (GPR-EI
            # and qLogNEI, whose models never see a failure, would propose a failing corner batch after
            # batch); a point that also has a completed result is an observed one anyway. Not for a lost
            # worker or node: that says nothing about the point (one pre-emption would ban the best cell)
            X_failed = self._stack(
                [self._trials[f["trial_id"]].x for f in failed if f["error"] not in _NO_BAN]
            )
            X_all_failed = self._stack([self._trials[f["trial_id"]].x for f in failed])
            model = self._model
        forecasts: list[dict | None] = [None] * q
        if sobol or self._design_left() > 0 or (model is None and self.needs_model()):
            X, source = self._sobol(q), "sobol"
        else:
            # a model-free proposer (Sobol) counts what was asked to continue its sequence: failures used
            # points too
            seen = X_observed if self.needs_model() else torch.cat([X_observed, X_all_failed])
            X, source = self._propose(model, q, batch_id, X_pending, seen), "model"
        X_taken = torch.cat([X_observed, X_failed])
        if self._proposer is None or not self._proposer.allows_repeats:
            X = self._dedupe(X, X_pending, X_taken, batch_id)
        elif self._only_failed(X[0], X_observed, X_failed):
            # GPR-EI repeats its point on purpose, but not one that has only failed: its replicates go to a
            # new point instead
            X = self._dedupe(X[:1], X_pending, X_taken, batch_id).expand(X.shape[0], -1).clone()
        if source == "model" and model is not None:
            with torch.no_grad():
                forecasts = model.forecast(X.to(**self._tk)).to_records()
        with self._lock:
            infos = [{"sobol_index": self._n_sobol - q + i} for i in range(q)] if source == "sobol" else None
            return self._register_batch(batch_id, X, forecasts, source, infos)

    def _sobol(self, q: int) -> Tensor:
        engine = torch.quasirandom.SobolEngine(self.space.dim, scramble=True, seed=self.seed)
        if self._n_sobol:
            engine.fast_forward(self._n_sobol)
        X = engine.draw(q, dtype=torch.float64)
        self._n_sobol += q
        return self.space.snap(X)

    def _propose(self, model: SurrogateProtocol | None, q: int, batch_id: int, X_pending: Tensor,
                 X_observed: Tensor) -> Tensor:
        if self._proposer is None:
            self._proposer = self._build_proposer()
        if self._proposer.uses_observed_y:  # LOCBO's incumbent is the best observed outcome
            self._proposer.observed_y = torch.tensor(self._obs_y, dtype=torch.float64)
        X = self._proposer.propose(
            model,
            q,
            X_pending=X_pending,
            X_observed=X_observed,
            seed=trial_seed(self.seed, f"batch-{batch_id}"),
            dim=self.space.dim,
        )
        return self.space.snap(X.detach().to(**self._tk))

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
            self._queue_calibration(seq, trial, y)
        if not self.defer_calibration:
            self.flush_calibration()
        return "completed"

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
