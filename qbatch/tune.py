"""Ray Tune adapter: `QbatchSearch`, a Tune `Searcher` driven by qbatch's `AskTellOptimizer`.

Tune asks a searcher for one configuration at a time (`suggest(trial_id)`); qbatch proposes batches. One
`ask(batch_size)` fills a queue that the following `suggest` calls drain, each Tune trial id mapped to the
qbatch trial it got, and `on_trial_complete` tells that trial's metric (or a failure). Every point asked and
not yet told, queued or running, is pending in the optimizer, so the next batch avoids them (STYLE.md §4.8:
the optimizer works like a Tune `Searcher`). The adapter goes through the optimizer's public methods only.

The search space is qbatch's space description (``{name: {"type": "float", "low": ..., "high": ...}}``,
orchestrator/space.py) or Tune's domains (`tune.uniform`, `loguniform`, `randint`, `lograndint`, `qrandint`,
`choice`), given to the searcher or, through `set_search_properties`, as the Tuner's `param_space`.
"""

from __future__ import annotations

import math
import pickle
import warnings
from collections.abc import Mapping
from typing import Any

from ray.tune.search import Searcher
from ray.tune.search.sample import Categorical, Domain, Float, Integer, LogUniform, Quantized, Uniform
from ray.tune.search.variant_generator import parse_spec_vars

from orchestrator.ask_tell import AskTellOptimizer
from orchestrator.errors import ConfigError, ModelFitError, SpaceError, UsageError

__all__ = ["QbatchSearch", "space_from_tune"]

#: the batch size when neither `batch_size` nor Tune's `max_concurrent_trials` gives one
DEFAULT_BATCH_SIZE = 8
_DIRECTION = {"max": "maximize", "min": "minimize"}
_QBATCH_TYPES = ("float", "int", "choice")


def _domain_spec(name: str, domain: Domain) -> dict[str, Any]:
    """The qbatch parameter spec of one Tune domain; a domain qbatch cannot represent raises naming `name`."""
    sampler = domain.get_sampler()
    q = None
    if isinstance(sampler, Quantized):
        q, sampler = sampler.q, sampler.get_sampler()
    log = isinstance(sampler, LogUniform)
    if isinstance(domain, Float) and (isinstance(sampler, Uniform) or log) and q is None:
        return {"type": "float", "low": float(domain.lower), "high": float(domain.upper), "log": log}
    if isinstance(domain, Integer) and (isinstance(sampler, Uniform) or log) and q in (None, 1):
        # randint and lograndint exclude the upper end
        return {"type": "int", "low": int(domain.lower), "high": int(domain.upper) - 1, "log": log}
    if isinstance(domain, Integer) and isinstance(sampler, Uniform) and isinstance(q, int) and q > 1:
        # qrandint: the multiples of q in [lower, upper], both ends included
        low, high = math.ceil(domain.lower / q) * q, math.floor(domain.upper / q) * q
        return {"type": "int", "low": int(low), "high": int(high), "step": q}
    if isinstance(domain, Categorical) and isinstance(sampler, Uniform):
        return {"type": "choice", "choices": list(domain.categories)}
    kind = f"{type(domain).__name__} domain sampled by {type(sampler).__name__.strip('_').lower()}"
    raise SpaceError(
        f"parameter {name!r}: qbatch cannot represent a Tune "
        f"{kind}{f' quantized by {q}' if q is not None else ''}; use tune.uniform, tune.loguniform, "
        f"tune.randint, tune.lograndint, tune.qrandint or tune.choice, or a qbatch space description")


def _is_qbatch_spec(value: Any) -> bool:
    return (isinstance(value, Mapping) and value.get("type") in _QBATCH_TYPES
            and not any(isinstance(v, Domain) for v in value.values()))


def space_from_tune(config: Mapping[str, Any], constants: bool = True) -> dict[str, tuple[tuple, dict]]:
    """The qbatch parameters of a Tune config or a qbatch space description: ``{name: (path, spec)}``.

    A nested domain (``{"opt": {"lr": tune.loguniform(...)}}``) is named by its path joined with "/"
    (``"opt/lr"``), as Tune's own searchers name it. Plain values are constants, which Tune merges into each
    trial's config.

    Args:
        config: Tune domains, qbatch specs (``{"type": "float", "low": ..., "high": ...}``) and constants.
        constants: take plain values as constants; False refuses them (a space given to the searcher itself).

    Raises:
        SpaceError: a grid search, a domain inside a list, a domain qbatch cannot represent, or (without
            `constants`) a plain value; the message names the key.
    """
    specs: dict[str, tuple[tuple, dict]] = {}
    flat: dict[tuple, Any] = {}
    order: list[str] = []  # the config's order is the space's

    def walk(path: tuple, value: Any) -> None:
        order.append("/".join(map(str, path)))
        if _is_qbatch_spec(value):
            specs[order[-1]] = (path, dict(value))
        elif isinstance(value, Mapping) and set(value) != {"grid_search"}:
            for k, v in value.items():
                walk(path + (k,), v)
        else:
            flat[path] = value

    for key, value in config.items():
        walk((key,), value)
    resolved, domains, grids = parse_spec_vars({"/".join(map(str, p)): v for p, v in flat.items()})
    paths = {"/".join(map(str, p)): p for p in flat}
    for (name, *_), _ in grids:
        raise SpaceError(f"parameter {name!r}: a grid search cannot be converted to a qbatch space; use "
                         "tune.choice")
    for (name, *rest), value in domains:
        if rest:  # a domain inside a list: Tune's paths go through list indices, a trial's config would not
            raise SpaceError(f"parameter {name!r}: a Tune domain inside a list is not supported; use a dict")
        specs[name] = (paths[name], _domain_spec(name, value))
    if not constants and resolved:
        name = "/".join(map(str, resolved[0][0]))
        raise SpaceError(f"parameter {name!r}: {resolved[0][1]!r} is not a Tune domain or a qbatch spec; "
                         f"give constants in the Tuner's param_space")
    return {name: specs[name] for name in order if name in specs}


def _nest(paths: Mapping[str, tuple], params: Mapping[str, Any]) -> dict[str, Any]:
    """A trial's flat params as Tune's nested config."""
    config: dict[str, Any] = {}
    for name, value in params.items():
        node = config
        *head, last = paths[name]
        for k in head:
            node = node.setdefault(k, {})
        node[last] = value
    return config


class QbatchSearch(Searcher):
    """A Ray Tune searcher that proposes batches with qbatch's `AskTellOptimizer`.

    Example:
        ``tune.Tuner(train, tune_config=tune.TuneConfig(search_alg=QbatchSearch(tau=0.2), metric="loss",
        mode="min", max_concurrent_trials=4, num_samples=40), param_space={"lr": tune.loguniform(1e-4,
        1e-1)})``

    Args:
        space: qbatch's space description or Tune domains; None takes them from the Tuner's `param_space`.
        metric: the result key to optimize; None takes `TuneConfig(metric=...)`.
        mode: "max" or "min"; None takes `TuneConfig(mode=...)`, else the `optimizer`'s direction.
        batch_size: the `q` of each `ask`; None takes Tune's `max_concurrent_trials`, else 8.
        optimizer: an optimizer to drive (e.g. `AskTellOptimizer.from_config(cfg, objective)`), in place of
            `space` and `options`.
        **options: keyword arguments of `AskTellOptimizer` (model, tau, proposer, initial_design, seed, ...);
            the direction comes from `mode`.

    Raises:
        ConfigError: a bad `mode` or `batch_size`, `direction` among the options, or `optimizer` with `space`,
            options or a `mode` against its direction.
        SpaceError: a space qbatch cannot represent (the message names the key).
    """

    def __init__(
        self,
        space: Mapping[str, Any] | None = None,
        metric: str | None = None,
        mode: str | None = None,
        batch_size: int | None = None,
        optimizer: AskTellOptimizer | None = None,
        **options: Any,
    ) -> None:
        if mode is not None and mode not in _DIRECTION:
            raise ConfigError(f"`mode` must be 'max' or 'min'; got {mode!r}")
        if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int)
                                       or batch_size < 1):
            raise ConfigError(f"`batch_size` must be an integer >= 1; got {batch_size!r}")
        if "direction" in options:
            raise ConfigError("`direction` comes from `mode` ('max' or 'min'); pass `mode` instead")
        if optimizer is not None:
            if space is not None or options:
                raise ConfigError("pass either `optimizer` or `space` and the optimizer's options, not both")
            mode = mode or ("max" if optimizer.direction == "maximize" else "min")
            if _DIRECTION[mode] != optimizer.direction:
                raise ConfigError(f"`mode` {mode!r} disagrees with the optimizer's direction "
                                  f"{optimizer.direction!r}")
        super().__init__(metric=metric, mode=mode)
        self._optimizer = optimizer
        self._paths: dict[str, tuple] | None = None
        self._space: dict[str, dict] | None = None
        if optimizer is not None:
            self._space = optimizer.space.describe()
            self._paths = {name: (name,) for name in self._space}
        elif space is not None:
            self._set_space(space_from_tune(space, constants=False))
        self._options = options
        self._batch_size = batch_size
        self._max_concurrent: int | None = None
        self._queue: list[str] = []  # qbatch trial ids asked and not yet handed to Tune, in ask order
        self._trials: dict[str, str] = {}  # Tune trial id -> qbatch trial id

    def _set_space(self, converted: Mapping[str, tuple[tuple, dict]]) -> None:
        self._paths = {name: path for name, (path, _) in converted.items()}
        self._space = {name: spec for name, (_, spec) in converted.items()}

    @property
    def optimizer(self) -> AskTellOptimizer | None:
        """The optimizer this searcher drives; None until the first `suggest` (or `optimizer=` given)."""
        return self._optimizer

    @property
    def batch_size(self) -> int:
        """The `q` of each `ask`: `batch_size`, else Tune's `max_concurrent_trials`, else 8."""
        return self._batch_size or self._max_concurrent or DEFAULT_BATCH_SIZE

    def set_search_properties(self, metric: str | None, mode: str | None, config: dict, **spec: Any) -> bool:
        """Take the `TuneConfig`'s metric and mode where the searcher has none, and the `param_space`'s
        domains where it has no space yet. False (Tune then refuses the run) when the config has domains and
        the searcher has a space already."""
        if mode is not None and mode not in _DIRECTION:
            raise ConfigError(f"`mode` must be 'max' or 'min'; got {mode!r}")
        converted = space_from_tune(config or {})
        if converted and self._space is not None:
            return False
        if self._metric is None:
            self._metric = metric
        if self._mode is None and mode is not None:
            self._mode = mode
        if converted:
            self._set_space(converted)
        return True

    def set_max_concurrency(self, max_concurrent: int) -> bool:
        """Tune's `max_concurrent_trials` becomes the default batch size; Tune still limits the running
        trials."""
        self._max_concurrent = int(max_concurrent)
        return False

    def _build(self) -> AskTellOptimizer:
        if self._space is None:
            raise UsageError("QbatchSearch has no search space: pass `space`, or Tune domains in the Tuner's "
                             "param_space")
        if self._metric is None or self._mode is None:
            raise UsageError("QbatchSearch needs a metric and a mode: pass them to QbatchSearch, or to "
                             "TuneConfig with a non-empty param_space (Tune hands a searcher its metric and "
                             "mode only then)")
        return AskTellOptimizer(self._space, direction=_DIRECTION[self._mode], **self._options)

    def suggest(self, trial_id: str) -> dict | None:
        """The next queued point's config for the Tune trial `trial_id`; an empty queue is refilled by one
        `ask`."""
        if self._optimizer is None:
            self._optimizer = self._build()
        if not self._queue:
            try:
                trials = self._optimizer.ask(self.batch_size)
            except ModelFitError as exc:  # as the central actor does: the current model stays in use
                warnings.warn(f"qbatch refit refused, proposing from the current model: {exc}", stacklevel=2)
                trials = self._optimizer.ask(self.batch_size, fit=False)
            self._queue = [t.trial_id for t in trials]
        qid = self._queue.pop(0)
        self._trials[trial_id] = qid
        return _nest(self._paths, self._optimizer.trial(qid).params)

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        """Tell the optimizer the trial's metric: NaN, ±inf, a missing metric and an errored trial become
        recorded failures. A trial this searcher did not suggest is ignored."""
        qid = self._trials.pop(trial_id, None)
        if qid is None or self._optimizer is None or self._optimizer.is_told(qid):
            return
        if error:
            self._optimizer.tell(qid, None, error="tune-error", message=f"Tune trial {trial_id} raised an "
                                                                        "error")
        elif not result or self._metric not in result:
            self._optimizer.tell(qid, None, error="no-metric",
                                 message=f"Tune trial {trial_id} reported no {self._metric!r}")
        else:
            self._optimizer.tell(qid, result[self._metric])

    def get_state(self) -> dict[str, Any]:
        """The searcher's whole state: the optimizer (it pickles), the queue and the trial ids' mapping."""
        return {
            "optimizer": self._optimizer,
            "space": self._space,
            "paths": self._paths,
            "metric": self._metric,
            "mode": self._mode,
            "options": dict(self._options),
            "batch_size": self._batch_size,
            "max_concurrent": self._max_concurrent,
            "queue": list(self._queue),
            "trials": dict(self._trials),
        }

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restore from `get_state`."""
        self._optimizer, self._space, self._paths = state["optimizer"], state["space"], state["paths"]
        self._metric, self._mode, self._options = state["metric"], state["mode"], dict(state["options"])
        self._batch_size, self._max_concurrent = state["batch_size"], state["max_concurrent"]
        self._queue, self._trials = list(state["queue"]), dict(state["trials"])

    def save(self, checkpoint_path: str) -> None:
        """Write `get_state` to `checkpoint_path` (Tune calls it during `Tuner.fit`)."""
        with open(checkpoint_path, "wb") as f:
            pickle.dump(self.get_state(), f)

    def restore(self, checkpoint_path: str) -> None:
        """Read a state written by `save` (a pickle: open only checkpoints you wrote)."""
        with open(checkpoint_path, "rb") as f:
            self.set_state(pickle.load(f))
