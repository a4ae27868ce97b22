"""A plain Python callable as an objective, and its trip to the workers by value.

ARCHITECTURE.md "The path of one evaluation", step 3, for `qbatch.optimize`: the objective is a function, a
lambda or a callable object, perhaps defined in a notebook or in `__main__`, which no worker can import by
name. `CallableObjective` wraps it with its space, direction and resources; `ByValue` carries it to the
workers as cloudpickle bytes (Ray's serializer, which pickles `__main__` and notebook code by value), beside
the `(name, options)` spec that a YAML config names.

The bytes are unpickled only in the sandbox child (workers/sandbox.py), as a spec is built only there, so the
Ray worker runs none of the user's code before it forks; their digest identifies the objective, so the child
that built it serves the worker's later evaluations. The bytes travel through Ray's object store and never
enter the run directory, where nothing is unpickled.

The run's config.yaml names `CALLABLE_OBJECTIVE` with the space, direction and resources as its options: the
central actor builds that stand-in (no callable: it only reads the space) and the driver hands the workers the
real one.
"""

from __future__ import annotations

import hashlib
import inspect
import os
import pickle
import site
import sys
import sysconfig
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from objectives.base import EvalResult, Objective, ObjectiveError, Resources

__all__ = ["CALLABLE_OBJECTIVE", "ByValue", "CallableObjective"]

#: the objective name a run of a callable stores in its config.yaml (importable: the central actor builds it)
CALLABLE_OBJECTIVE = "workers.by_value:CallableObjective"
#: the library's own top-level packages: their code is installed wherever qbatch runs, so it goes by reference
_LIBRARY = ("objectives", "workers", "orchestrator", "qbatch")


def _seed_style(fn: Callable[..., Any]) -> str:
    """How `fn` takes the evaluation's seed: "positional" (a second positional parameter), "keyword" (a
    keyword-only parameter named `seed`), or "none" (it takes the params alone, or its signature cannot be
    read)."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return "none"
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(positional) >= 2 or any(p.kind is p.VAR_POSITIONAL for p in params):
        return "positional"
    if any(p.name == "seed" and p.kind is p.KEYWORD_ONLY for p in params):
        return "keyword"
    return "none"


class CallableObjective(Objective):
    """An `Objective` that calls `fn(params)`, or `fn(params, seed)` when `fn` takes a second argument or a
    keyword `seed`.

    `fn` returns a number or an `EvalResult(value, metrics)`; anything else (NaN, None, a string), and any
    exception it raises, is a failed trial with its reason, as for every objective.

    Args:
        space: the plain space description (objectives/base.py), e.g. ``{"x": {"type": "float", "low": 0,
            "high": 1}}``.
        direction: "maximize" or "minimize", the sense of `fn`'s value.
        resources: what one evaluation needs (a `Resources`, or a mapping of its fields); default one CPU.
        label: a name for `fn` in messages and the run's config (default: its qualified name).
        fn: the callable. None builds the stand-in the central actor reads the space from: evaluating it
            raises `ObjectiveError`, since a run's config cannot hold a callable.
    """

    noisy = True

    def __init__(
        self,
        space: Mapping[str, Mapping[str, Any]],
        direction: str = "maximize",
        resources: Resources | Mapping[str, Any] | None = None,
        label: str | None = None,
        fn: Callable[..., Any] | None = None,
    ) -> None:
        if fn is not None and not callable(fn):
            raise ObjectiveError(f"the objective must be callable; got a {type(fn).__name__}")
        if not isinstance(space, Mapping):
            raise ObjectiveError("space must be a mapping of parameter name to spec; got a "
                                 f"{type(space).__name__}")
        if direction not in ("maximize", "minimize"):
            raise ObjectiveError(f"direction must be 'maximize' or 'minimize'; got {direction!r}")
        if resources is None:
            resources = Resources()
        elif isinstance(resources, Mapping):
            try:
                resources = Resources(**dict(resources))
            except TypeError as exc:
                raise ObjectiveError(f"resources: {exc} (fields: num_cpus, num_gpus, memory, "
                                     "custom)") from None
        if not isinstance(resources, Resources):
            raise ObjectiveError(f"resources must be a Resources or a mapping of its fields; got "
                                 f"{type(resources).__name__}")
        self.space = {str(k): dict(v) for k, v in space.items()}
        self.direction = direction
        self.resources = resources
        self.fn = fn
        self.label = label if label is not None else _qualified_name(fn)
        self.name = self.label
        self._seed = "none" if fn is None else _seed_style(fn)

    def options(self) -> dict[str, Any]:
        """The keyword options that build this objective's stand-in (`fn` left out): what config.yaml
        holds."""
        r = self.resources
        return {"space": self.space, "direction": self.direction, "label": self.label,
                "resources": {"num_cpus": r.num_cpus, "num_gpus": r.num_gpus, "memory": r.memory,
                              "custom": dict(r.custom)}}

    def evaluate(self, params: Mapping[str, Any], seed: int) -> float | EvalResult:
        if self.fn is None:
            raise ObjectiveError(
                f"objective {self.label!r} is a Python callable, which a run's config cannot hold: run and "
                "resume it with qbatch.optimize(fn, space, ...), which hands the callable to the workers")
        if self._seed == "positional":
            return self.fn(dict(params), seed)
        if self._seed == "keyword":
            return self.fn(dict(params), seed=seed)
        return self.fn(dict(params))


def _qualified_name(fn: Any) -> str:
    """`module.qualname` of a function or class, or of a callable object's class; "objective" for None."""
    if fn is None:
        return "objective"
    target = fn if hasattr(fn, "__qualname__") else type(fn)
    module = getattr(target, "__module__", None)
    name = getattr(target, "__qualname__", type(fn).__name__)
    return f"{module}.{name}" if module else name


@dataclass(frozen=True)
class ByValue:
    """An objective as cloudpickle bytes, what a worker gets in place of a `(name, options)` spec.

    Attributes:
        payload: the pickled `Objective`.
        key: the payload's SHA-256 digest: the same objective, whichever task brings it.
        label: the objective's name, for messages.
    """

    payload: bytes
    key: str
    label: str

    @classmethod
    def of(cls, objective: Objective) -> ByValue:
        """Pickle `objective` with Ray's cloudpickle. Functions and classes of `__main__` or a notebook go by
        value, and so does the module that defines a `CallableObjective`'s callable where it is not an
        installed package (a module beside the script, or one on a path the notebook added), which the workers
        may not import.

        Raises:
            ObjectiveError: it cannot be pickled (e.g. it holds a lock or an open connection); the message
                names the objective and the cause.
        """
        import ray.cloudpickle as cloudpickle

        if not isinstance(objective, Objective):
            raise ObjectiveError(f"ByValue.of takes an Objective; got a {type(objective).__name__}")
        module = _local_module(objective.fn) if isinstance(objective, CallableObjective) else None
        registered = getattr(getattr(cloudpickle, "cloudpickle", None), "_PICKLE_BY_VALUE_MODULES", set())
        mine = module is not None and module.__name__ not in registered  # one the caller registered stays so
        if mine:
            cloudpickle.register_pickle_by_value(module)
        try:
            payload = cloudpickle.dumps(objective)
        except Exception as exc:  # noqa: BLE001 - anything the user's callable holds may refuse pickling
            raise ObjectiveError(
                f"objective {objective.name!r} cannot be sent to the workers: pickling it failed with "
                f"{type(exc).__name__}: {exc} (build what cannot be pickled, a lock, a client, an open file, "
                "inside the function, or in a class's __call__ on first use)") from exc
        finally:
            if mine:
                cloudpickle.unregister_pickle_by_value(module)
        return cls(payload, hashlib.sha256(payload).hexdigest(), str(objective.name))

    def load(self) -> Objective:
        """The objective, unpickled (importing the modules it names). Call it only where the objective runs.

        Raises:
            TypeError: the payload holds something other than an `Objective`.
        """
        objective = pickle.loads(self.payload)
        if not isinstance(objective, Objective):
            raise TypeError(f"the objective {self.label!r} unpickled as a {type(objective).__name__}, not an "
                            "Objective")
        return objective


def _installed_roots() -> list[str]:
    """The folders that hold installed code: the standard library and the site-packages folders."""
    paths = sysconfig.get_paths()
    roots = [paths.get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")]
    try:
        roots += [*site.getsitepackages(), site.getusersitepackages()]
    except AttributeError:  # pragma: no cover - a virtualenv's old site module
        pass
    return [os.path.realpath(r) for r in roots if r]


def _local_module(fn: Any) -> ModuleType | None:
    """The module that defines `fn` (a callable object's class) when it is the user's own code rather than an
    installed package, the library or `__main__` (which cloudpickle sends by value anyway); else None."""
    name = getattr(fn, "__module__", None)
    module = sys.modules.get(name) if isinstance(name, str) else None
    if module is None or name == "__main__" or name.split(".")[0] in _LIBRARY:
        return None
    file = getattr(module, "__file__", None)
    if not file:  # built in, or a namespace package
        return None
    path = os.path.realpath(file)
    if any(path.startswith(root + os.sep) for root in _installed_roots()):
        return None
    return module
