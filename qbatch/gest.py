"""gest-api adapter: `QbatchGenerator`, a generator of the standard that Xopt, optimas and libEnsemble share.

The gest-api standard (`gest_api.Generator`) describes a problem by its VOCS (variables, objectives,
constraints, constants, observables) and drives a generator with `suggest(n) -> list[dict]`, `ingest(results)`
and `finalize()`. Here `suggest(n)` is one `ask(n)` of qbatch's `AskTellOptimizer`, each point carrying its
trial id under ``"_id"``; `ingest` tells each result by that id, or adds a result without one (earlier data)
with `tell_point`; `finalize` refits the model on every result, so that `optimizer.best()` covers them. The
adapter goes through the optimizer's public methods only.

qbatch optimizes one objective (MINIMIZE or MAXIMIZE) over continuous and discrete variables, without
constraints; a VOCS that asks for more is refused by name.
"""

from __future__ import annotations

import math
from typing import Any

from gest_api import Generator
from gest_api.vocs import (
    VOCS,
    ContextualVariable,
    ContinuousVariable,
    DiscreteVariable,
    MaximizeObjective,
    MinimizeObjective,
)

from orchestrator.ask_tell import AskTellOptimizer, TrialError
from orchestrator.errors import ConfigError, SpaceError

__all__ = ["QbatchGenerator", "space_from_vocs"]

_FLOAT_DTYPES = (None, float, "float", "float64")


def _sorted_values(values: Any) -> list:
    """A discrete variable's set of values in a fixed order (a set's order changes with PYTHONHASHSEED)."""
    try:
        return sorted(values)
    except TypeError:  # values of types that do not compare with each other
        return sorted(values, key=lambda v: (type(v).__name__, repr(v)))


def space_from_vocs(vocs: VOCS) -> dict[str, dict[str, Any]]:
    """qbatch's space description of a VOCS's variables: a continuous variable is a float parameter over its
    domain, a discrete one a choice among its values (in sorted order).

    Raises:
        SpaceError: no variables, a contextual variable, an array `dtype`, or a domain qbatch refuses (the
            message names the variable).
    """
    if not vocs.variables:
        raise SpaceError("the VOCS has no variables: qbatch needs at least one")
    space: dict[str, dict[str, Any]] = {}
    for name, var in vocs.variables.items():
        if isinstance(var, ContextualVariable):
            raise SpaceError(f"variable {name!r}: qbatch cannot condition on a contextual variable")
        if var.dtype not in _FLOAT_DTYPES:
            raise SpaceError(f"variable {name!r}: qbatch's variables are scalars; got dtype {var.dtype!r}")
        if isinstance(var, ContinuousVariable):
            low, high = (float(v) for v in var.domain)
            if not (math.isfinite(low) and math.isfinite(high)):
                raise SpaceError(f"variable {name!r}: qbatch needs a finite domain; got {var.domain}")
            space[name] = {"type": "float", "low": low, "high": high}
        elif isinstance(var, DiscreteVariable):
            space[name] = {"type": "choice", "choices": _sorted_values(var.values)}
        else:
            raise SpaceError(f"variable {name!r}: qbatch cannot represent a {type(var).__name__}")
    return space


def _direction(vocs: VOCS) -> tuple[str, str]:
    """The VOCS's one objective and its direction; anything else raises naming what qbatch cannot take."""
    if vocs.constraints:
        name = next(iter(vocs.constraints))
        raise ConfigError(f"constraint {name!r}: qbatch optimizes without constraints; fold the constraint "
                          f"into the objective (a penalty) or use a generator that models constraints")
    if len(vocs.objectives) != 1:
        raise ConfigError(f"qbatch optimizes one objective; the VOCS has {len(vocs.objectives)}: "
                          f"{vocs.objective_names}")
    name, objective = next(iter(vocs.objectives.items()))
    if isinstance(objective, MinimizeObjective):
        return name, "minimize"
    if isinstance(objective, MaximizeObjective):
        return name, "maximize"
    raise ConfigError(f"objective {name!r}: qbatch minimizes or maximizes; got {type(objective).__name__}")


class QbatchGenerator(Generator):
    """A gest-api generator that proposes batches with qbatch's `AskTellOptimizer`.

    Example:
        ``QbatchGenerator(VOCS(variables={"x": [0, 1]}, objectives={"f": "MINIMIZE"}), batch_size=10)``

    Args:
        vocs: the problem: variables, one MINIMIZE or MAXIMIZE objective, constants; no constraints.
        batch_size: the number of points `suggest()` returns without `num_points`.
        optimizer: an optimizer to drive in place of one built from the VOCS and `options`; its parameters
            must be the VOCS's variables and its direction the objective's.
        **options: keyword arguments of `AskTellOptimizer` (model, tau, proposer, initial_design, seed, ...);
            the direction is the objective's.

    Raises:
        SpaceError, ConfigError (both ValueErrors, as the standard asks): a VOCS qbatch cannot optimize (the
            message names the variable, objective or constraint), or a bad option.
    """

    returns_id = True

    def __init__(self, vocs: VOCS, batch_size: int = 8, optimizer: AskTellOptimizer | None = None,
                 **options: Any) -> None:
        super().__init__(vocs)  # calls `_validate_vocs`
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ConfigError(f"`batch_size` must be an integer >= 1; got {batch_size!r}")
        if "direction" in options:
            raise ConfigError("`direction` is the VOCS objective's (MINIMIZE or MAXIMIZE)")
        self.vocs = vocs
        self.batch_size = batch_size
        self._objective, direction = _direction(vocs)
        space = space_from_vocs(vocs)
        if optimizer is None:
            optimizer = AskTellOptimizer(space, direction=direction, **options)
        elif options:
            raise ConfigError(f"options {sorted(options)} go to an optimizer this generator builds; "
                              "`optimizer` is built")
        elif list(optimizer.space.describe()) != list(space) or optimizer.direction != direction:
            raise ConfigError(f"the optimizer's parameters {list(optimizer.space.describe())} "
                              f"({optimizer.direction}) are not the VOCS's variables {list(space)} "
                              f"({direction})")
        self._optimizer = optimizer
        self._constants = {name: c.value for name, c in vocs.constants.items()}

    def _validate_vocs(self, vocs: VOCS) -> None:
        """Raise a ValueError naming what qbatch cannot optimize: constraints, several or no objectives, an
        EXPLORE objective, contextual or array variables."""
        _direction(vocs)
        space_from_vocs(vocs)

    @property
    def optimizer(self) -> AskTellOptimizer:
        """The optimizer this generator drives (e.g. `generator.optimizer.best()`)."""
        return self._optimizer

    def suggest(self, num_points: int | None = None) -> list[dict]:
        """`num_points` new points (`batch_size` without it), each with the VOCS's constants and its
        ``"_id"``; every point suggested and not yet ingested is pending, so the next ones avoid it."""
        trials = self._optimizer.ask(self.batch_size if num_points is None else num_points)
        return [{**t.params, **self._constants, "_id": t.trial_id} for t in trials]

    def ingest(self, results: list[dict]) -> None:
        """Tell each result: by its ``"_id"``, or, without one, as a result at its variables' values. A
        missing, NaN or infinite objective value is a recorded failure.

        Raises:
            ValueError: an ``"_id"`` this generator did not suggest, or one already ingested (nothing of
                `results` is told then).
        """
        seen: set[str] = set()
        for i, r in enumerate(results):
            tid = r.get("_id")
            if tid is not None and not self._optimizer.has_trial(tid):
                raise TrialError(f"results[{i}]: unknown _id {tid!r}; nothing was ingested")
            if tid is not None and (self._optimizer.is_told(tid) or tid in seen):
                raise TrialError(f"results[{i}]: _id {tid!r} was ingested already; nothing was ingested")
            seen.add(tid)
        for r in results:
            tid = r.get("_id")
            if tid is None:
                point = {name: r[name] for name in self.vocs.variable_names if name in r}
                # (a missing variable raises by name)
                self._optimizer.tell_point(point, r.get(self._objective))
            elif self._objective not in r:
                self._optimizer.tell(tid, None, error="no-value", message="the result has no "
                                                                          f"{self._objective!r}")
            else:
                self._optimizer.tell(tid, r[self._objective])

    def finalize(self) -> None:
        """Refit the model on every ingested result (when one is due), so that `optimizer.best()` covers
        them."""
        if self._optimizer.can_fit() and self._optimizer.num_stale > 0:
            self._optimizer.fit()
