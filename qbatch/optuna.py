"""Optuna adapter: `QbatchSampler`, an Optuna sampler driven by qbatch's `AskTellOptimizer`.

Optuna samples one trial at a time; qbatch proposes batches. As OptunaHub's batch sampler does, the first
trial of a batch asks `batch_size` points at once and the trials after it take the queued points, one each,
through relative sampling (`sample_relative`); `after_trial` tells each trial's value, or a failure for a
failed or pruned trial. Every point asked and not yet told is pending in the optimizer, so the next batch
avoids the points still queued or running (`study.optimize(..., n_jobs=k)` runs k trials at once). The adapter
goes through the optimizer's public methods only.

The search space is given up front, as Optuna distributions (`FloatDistribution`, log or not,
`IntDistribution`, `CategoricalDistribution`) or as qbatch's space description (orchestrator/space.py); the
objective suggests each parameter with the same distribution.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.samplers import BaseSampler
from optuna.study import Study, StudyDirection
from optuna.trial import FrozenTrial, TrialState

from orchestrator.ask_tell import AskTellOptimizer
from orchestrator.errors import ConfigError, ModelFitError, SpaceError, UsageError
from orchestrator.space import ChoiceParam, FloatParam, IntParam, SearchSpace

__all__ = ["QbatchSampler", "space_from_optuna", "distributions_of"]

_DIRECTION = {StudyDirection.MAXIMIZE: "maximize", StudyDirection.MINIMIZE: "minimize"}


def _spec(name: str, dist: Any) -> dict[str, Any]:
    """The qbatch spec of one Optuna distribution (a qbatch spec passes as it is); others raise naming
    `name`."""
    if isinstance(dist, Mapping):
        return dict(dist)
    if isinstance(dist, FloatDistribution):
        if dist.step is not None:
            raise SpaceError(f"parameter {name!r}: qbatch float parameters have no step (got "
                             f"step={dist.step}); use a FloatDistribution without one, an IntDistribution or "
                             "a CategoricalDistribution")
        return {"type": "float", "low": dist.low, "high": dist.high, "log": dist.log}
    if isinstance(dist, IntDistribution):
        return {"type": "int", "low": dist.low, "high": dist.high, "step": dist.step, "log": dist.log}
    if isinstance(dist, CategoricalDistribution):
        return {"type": "choice", "choices": list(dist.choices)}
    raise SpaceError(f"parameter {name!r}: qbatch cannot represent {dist!r}; use a FloatDistribution, an "
                     f"IntDistribution, a CategoricalDistribution or a qbatch spec")


def space_from_optuna(search_space: Mapping[str, Any]) -> SearchSpace:
    """The qbatch search space of Optuna distributions or qbatch specs, ``{name: distribution or spec}``.

    Raises:
        SpaceError: a distribution qbatch cannot represent (a float with a step) or a bad spec, naming it.
    """
    return SearchSpace.from_description({name: _spec(name, d) for name, d in search_space.items()})


def distributions_of(space: SearchSpace) -> dict[str, BaseDistribution]:
    """The Optuna distribution of each parameter of a qbatch space."""
    out: dict[str, BaseDistribution] = {}
    for p in space.params:
        if isinstance(p, FloatParam):
            out[p.name] = FloatDistribution(p.low, p.high, log=p.log)
        elif isinstance(p, IntParam):
            out[p.name] = IntDistribution(int(p.low), int(p.high), log=p.log, step=int(p.step))
        elif isinstance(p, ChoiceParam):
            out[p.name] = CategoricalDistribution(p.choices)
    return out


class QbatchSampler(BaseSampler):
    """An Optuna sampler that proposes batches with qbatch's `AskTellOptimizer`.

    Example:
        ``optuna.create_study(sampler=QbatchSampler({"x": FloatDistribution(-5, 5)}, batch_size=4, tau=0.2))``

    Args:
        search_space: ``{name: Optuna distribution or qbatch spec}``; None with `optimizer`, whose space it
            is.
        batch_size: the `q` of each `ask`, e.g. the `n_jobs` of `study.optimize` or a multiple of it.
        optimizer: an optimizer to drive (e.g. `AskTellOptimizer.from_config(cfg, objective)`), in place of
            `search_space` and `options`; its direction must be the study's.
        **options: keyword arguments of `AskTellOptimizer` (model, tau, proposer, initial_design, seed, ...);
            the direction is the study's.

    Raises:
        ConfigError: a bad `batch_size`, `direction` among the options, or neither or both of `search_space`
            and `optimizer`.
        SpaceError: a distribution qbatch cannot represent, naming the parameter.
    """

    def __init__(self, search_space: Mapping[str, Any] | None = None, batch_size: int = 8,
                 optimizer: AskTellOptimizer | None = None, **options: Any) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ConfigError(f"`batch_size` must be an integer >= 1; got {batch_size!r}")
        if "direction" in options:
            raise ConfigError("`direction` is the study's: pass it to optuna.create_study")
        if (search_space is None) == (optimizer is None):
            raise ConfigError("pass either `search_space` (with the optimizer's options) or `optimizer`")
        if optimizer is not None and options:
            raise ConfigError(f"options {sorted(options)} go to an optimizer this sampler builds; "
                              "`optimizer` is built")
        self._space = optimizer.space if optimizer is not None else space_from_optuna(search_space)
        self._distributions = distributions_of(self._space)
        self._optimizer = optimizer
        self._options = options
        self._batch_size = batch_size
        self._lock = threading.Lock()  # `study.optimize(n_jobs=k)` samples and ends trials from k threads
        self._queue: list[str] = []  # qbatch trial ids asked and not yet taken by a trial, in ask order
        self._trials: dict[int, str] = {}  # Optuna trial number -> qbatch trial id

    @property
    def optimizer(self) -> AskTellOptimizer | None:
        """The optimizer this sampler drives; None until the first trial samples (or `optimizer=` given)."""
        return self._optimizer

    @property
    def batch_size(self) -> int:
        return self._batch_size

    def _optimizer_for(self, study: Study) -> AskTellOptimizer:
        if len(study.directions) != 1:
            raise UsageError("QbatchSampler optimizes one objective; the study has "
                             f"{len(study.directions)} directions")
        direction = _DIRECTION[study.direction]
        if self._optimizer is None:
            self._optimizer = AskTellOptimizer(self._space, direction=direction, **self._options)
        elif self._optimizer.direction != direction:
            raise UsageError(f"the study's direction is {direction!r}; the optimizer's is "
                             f"{self._optimizer.direction!r}")
        return self._optimizer

    def infer_relative_search_space(self, study: Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        """The whole search space, sampled at once by `sample_relative`."""
        return dict(self._distributions)

    def sample_relative(self, study: Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        """The next queued point for `trial`; an empty queue is refilled by one `ask(batch_size)`."""
        if not search_space:
            return {}
        with self._lock:
            opt = self._optimizer_for(study)
            if not self._queue:
                try:
                    trials = opt.ask(self._batch_size)
                except ModelFitError as exc:  # as the central actor does: the current model stays in use
                    warnings.warn("qbatch refit refused, proposing from the current model: "
                                  f"{exc}", stacklevel=2)
                    trials = opt.ask(self._batch_size, fit=False)
                self._queue = [t.trial_id for t in trials]
            qid = self._queue.pop(0)
            self._trials[trial.number] = qid
            return opt.trial(qid).params

    def sample_independent(self, study: Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        """Never samples: a parameter reaches here only when the objective suggests it outside the search
        space, or with another distribution than the space gives it; both raise, naming the parameter."""
        if param_name in self._distributions:
            raise SpaceError(f"parameter {param_name!r}: the objective suggests {param_distribution!r}, the "
                             f"QbatchSampler's search space has {self._distributions[param_name]!r}; suggest "
                             f"it with the search space's distribution")
        raise SpaceError(f"parameter {param_name!r} is not in the QbatchSampler's search space "
                         f"{sorted(self._distributions)}; add it to `search_space`")

    def after_trial(self, study: Study, trial: FrozenTrial, state: TrialState,
                    values: Sequence[float] | None) -> None:
        """Tell the optimizer the trial's value; a failed or pruned trial becomes a recorded failure. A trial
        that evaluated other values than its proposal (fixed parameters) fails that proposal and, when
        complete, adds its own point with `tell_point`; so does a complete trial that sampled nothing here
        (`enqueue_trial`)."""
        with self._lock:
            qid = self._trials.pop(trial.number, None)
            opt = self._optimizer
            if opt is None and qid is None and state == TrialState.COMPLETE:
                opt = self._optimizer_for(study)
            if opt is None:
                return
            value = values[0] if state == TrialState.COMPLETE and values else None
            if qid is not None:
                proposed = opt.trial(qid).params
                if any(name in trial.params and trial.params[name] != v for name, v in proposed.items()):
                    opt.tell(qid, None, error="not-evaluated",
                             message=f"Optuna trial {trial.number} evaluated other values (fixed parameters)")
                elif state == TrialState.COMPLETE:
                    opt.tell(qid, value)
                    return
                else:
                    reason = "pruned" if state == TrialState.PRUNED else "failed"
                    opt.tell(qid, None, error=reason, message=f"Optuna trial {trial.number} ended "
                                                              f"{state.name}")
                    return
            if state == TrialState.COMPLETE and all(name in trial.params for name in self._distributions):
                try:
                    opt.tell_point({name: trial.params[name] for name in self._distributions}, value)
                except SpaceError as exc:
                    warnings.warn(f"Optuna trial {trial.number} is not told to qbatch: {exc}", stacklevel=2)
