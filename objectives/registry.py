"""Name -> factory table of built-in objectives, and loading of user objectives by import path.

Like Ray Tune's `search/__init__.py`, a built-in's module is imported only when it is chosen, so heavy
dependencies (gensim, gymnasium, torch) load on demand. A user objective is given as
``"package.module:name"``, where `name` is an `Objective` subclass, a factory, or an instance.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import sys
from collections.abc import Iterator, Mapping
from typing import Any

from objectives.base import Objective, ObjectiveError, Resources

__all__ = [
    "BUILTIN_OBJECTIVES",
    "available_objectives",
    "import_objective_module",
    "inspect_objective",
    "load_objective",
    "objective_path",
]

#: name -> ("module:attribute", one-line description). Filled in by each objective module's author.
BUILTIN_OBJECTIVES: dict[str, tuple[str, str]] = {
    # physics / stochastic simulators (quantile-expectile-bo.md §4)
    "laser": ("objectives.laser:LaserSimulator", "16-D FEL quadrupole tuning simulator, skew-normal noise "
                                                 "(synthetic or from an LCLS CSV)"),
    "gld": ("objectives.gld:GLDProblem", "stochastic problem with Generalised-Lambda noise whose parameters "
                                         "are GP draws"),
    "skewed": ("objectives.skewed:SkewedNoiseProblem", "skewed input-dependent noise; mean and 10% quantile "
                                                       "best apart"),
    "lunar-lander": ("objectives.lunar_lander:LunarLander", "6 thresholds of the heuristic LunarLander "
                                                            "controller; one episode's reward"),
    # machine-learning hyperparameter tuning (calibrated-bo.md §2.3)
    "cnn": ("objectives.cnn:CNNTraining", "6 CNN training hyperparameters -> held-out classification error"),
    "lda": ("objectives.lda:OnlineLDA", "online LDA (minibatch, kappa, tau0) -> held-out perplexity"),
    # classic test functions of paper 000, and paper 002's noisy Ackley
    "forrester": ("objectives.functions:Forrester", "1-D Forrester function"),
    "ackley": ("objectives.functions:Ackley", "Ackley function"),
    "alpine": ("objectives.functions:Alpine", "Alpine function"),
    "six-hump-camel": ("objectives.functions:SixHumpCamel", "2-D six-hump camel function"),
    "cosines": ("objectives.functions:Cosines", "2-D cosines function"),
    "beale": ("objectives.functions:Beale", "2-D Beale function"),
    "mccormick": ("objectives.functions:McCormick", "2-D McCormick function"),
    "powers": ("objectives.functions:Powers", "sum of different powers"),
    "cross-in-tray": ("objectives.functions:CrossInTray", "2-D cross-in-tray function"),
    "dropwave": ("objectives.functions:Dropwave", "2-D drop-wave function"),
    "noisy-ackley": ("objectives.functions:NoisyAckley", "Ackley with heteroscedastic noise N(0, "
                                                         "(|x|+10)/20) (paper 002)"),
    # load generator for orchestration tests and benchmarks
    "sleep": ("objectives.timing:SleepObjective", "cheap analytic value after a random (lognormal) delay; "
                                                  "for load tests"),
}


def available_objectives() -> dict[str, str]:
    """Built-in objective names with their one-line descriptions."""
    return {name: desc for name, (_, desc) in sorted(BUILTIN_OBJECTIVES.items())}


def _import_target(path: str) -> Any:
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ObjectiveError(f"objective import path must look like 'package.module:name'; got {path!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ObjectiveError(f"cannot import module {module_name!r} of objective {path!r}: {exc}") from exc
    except Exception as exc:  # the user's module fails while it loads (SyntaxError, a raise at import time)
        raise ObjectiveError(
            f"module {module_name!r} of objective {path!r} fails to import: {type(exc).__name__}: {exc}"
        ) from exc
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ObjectiveError(f"module {module_name!r} has no attribute {attr!r} (objective "
                             f"{path!r})") from None


def _unknown_options(target: Any, options: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """(options `target` does not take, the ones it takes); nothing is unknown to a factory taking
    ``**kwargs`` or one whose signature cannot be read."""
    try:
        params = inspect.signature(target).parameters.values()
    except (TypeError, ValueError):
        return [], []
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return [], []
    accepted = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    return sorted(k for k in options if k not in accepted), accepted


def objective_path(name: str) -> str:
    """The ``module:attribute`` that defines objective `name`: a built-in's entry, else `name` itself."""
    return BUILTIN_OBJECTIVES[name][0] if name in BUILTIN_OBJECTIVES else name


def load_objective(name: str, options: Mapping[str, Any] | None = None) -> Objective:
    """Build an objective from a built-in name or a ``package.module:name`` path, with keyword options."""
    options = dict(options or {})
    path = objective_path(name)
    if ":" in path:
        target = _import_target(path)
    else:
        raise ObjectiveError(
            f"unknown objective {name!r}; built-ins are {sorted(BUILTIN_OBJECTIVES)}, "
            "or give a user objective as 'package.module:name'"
        )
    if isinstance(target, Objective):
        if options:
            raise ObjectiveError(f"objective {name!r} is an instance and takes no options; got "
                                 f"{sorted(options)}")
        return target
    if not callable(target):
        raise ObjectiveError(f"objective {name!r} is neither an Objective nor a factory")
    unknown, accepted = _unknown_options(target, options)
    if unknown:
        raise ObjectiveError(f"bad options for objective {name!r}: unknown option(s) {unknown}; it takes "
                             f"{accepted}")
    try:
        obj = target(**options)
    except TypeError as exc:
        if not options and _required_positional(target):
            # e.g. `def f(params, seed)`: an evaluation function, not a factory ("bad options" would blame a
            # config that gave none)
            raise ObjectiveError(
                f"objective {name!r} is a callable that needs arguments ({exc}); an objective is an "
                "Objective subclass, a factory that takes its options as keywords, or an instance: wrap an "
                "evaluation function in an Objective subclass (objectives/base.py)") from exc
        raise ObjectiveError(f"bad options for objective {name!r}: {exc}") from exc
    if not isinstance(obj, Objective):
        raise ObjectiveError(f"objective {name!r} built a {type(obj).__name__}, not an Objective")
    _check_declared(name, obj)
    return obj


def _check_declared(name: str, obj: Objective) -> None:
    """`ObjectiveError` naming the objective when its `space` is not a mapping of parameter names to spec
    mappings, its `resources` not a `Resources` or its `direction` neither 'maximize' nor 'minimize'
    (unchecked, a list space ends in an AttributeError traceback, and a dict of resources passes every check
    and fails after Ray has started)."""
    try:
        space, resources, direction = obj.space, obj.resources, obj.direction
    except Exception as exc:  # a property of the objective's that raises
        raise ObjectiveError(f"objective {name!r}: reading its space, resources or direction raised "
                             f"{type(exc).__name__}: {exc}") from exc
    # refused as the config key `direction`, which the user never set
    if direction not in ("maximize", "minimize"):
        raise ObjectiveError(f"objective {name!r}: its `direction` must be 'maximize' or 'minimize'; got "
                             f"{direction!r}")
    if not isinstance(space, Mapping):
        raise ObjectiveError(f"objective {name!r}: its `space` must be a mapping of parameter name to spec; "
                             f"got a {type(space).__name__} ({space!r:.200})")
    for key, spec in space.items():
        if not isinstance(spec, Mapping):
            raise ObjectiveError(f"objective {name!r}: the spec of parameter {key!r} in its `space` must be "
                                 f"a mapping such as {{'type': 'float', 'low': 0.0, 'high': 1.0}}; got "
                                 f"{spec!r:.200}")
    if not isinstance(resources, Resources):
        raise ObjectiveError(f"objective {name!r}: its `resources` must be an objectives.base.Resources, "
                             f"e.g. Resources(num_cpus=1); got a {type(resources).__name__} "
                             f"({resources!r:.200})")


def _required_positional(target: Any) -> bool:
    """Whether calling `target` needs a positional argument that has no default."""
    try:
        params = inspect.signature(target).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(
        p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params
    )


@contextlib.contextmanager
def _torch_threads_kept() -> Iterator[None]:
    torch = sys.modules.get("torch")
    before = torch.get_num_threads() if torch is not None else None
    try:
        yield
    finally:
        if before is not None and torch.get_num_threads() != before:
            torch.set_num_threads(before)


def inspect_objective(name: str, options: Mapping[str, Any] | None = None) -> Objective:
    """`load_objective` for a process that only reads the objective's space, direction and resources (the
    driver, the central actor): torch's thread count is put back afterwards, since a constructor's
    `torch.set_num_threads` is meant for its evaluations, and in the central actor it would set the threads of
    every model fit."""
    with _torch_threads_kept():
        return load_objective(name, options)


def import_objective_module(name: str) -> None:
    """Import the module that defines objective `name` (a built-in or ``package.module:name``) without
    building the objective. The sandbox child does this first, so the import (torch, a simulator's bindings)
    is not part of the build's timeout. Errors propagate (the child reports them as the evaluation's
    failure)."""
    path = objective_path(name)
    if ":" in path:
        importlib.import_module(path.split(":", 1)[0])
