"""qbatch: distributed large-batch quantile Bayesian optimization, and its adapters to Ray Tune, Optuna and
gest-api.

One import for the library (ARCHITECTURE.md "Layout"): this facade re-exports the public API, whose code stays
in `orchestrator/`, `workers/` and `objectives/`. Each name is imported on first use, so `import qbatch` loads
neither torch nor Ray. The adapters are the submodules `qbatch.tune`, `qbatch.optuna` and `qbatch.gest`.

- `optimize(fn, space, budget=...)`: optimize a plain Python callable on Ray, with a run directory and its
  log.
- `AskTellOptimizer`: the ask/tell optimizer, without Ray.
- `run_experiment`, `resume_experiment`: run a config (YAML path, dict) on Ray; finish an interrupted run.
- `read_trials(run_dir)`: a run's trials as a pandas DataFrame, one row per trial.
- `Objective`, `EvalResult`, `Resources`: the objective protocol.

Importing this package first binds the names of those three packages to the installation beside it
(`qbatch._packages`), so a user's `objectives.py`, `workers.py` or `orchestrator.py` in the working folder
does not break the library.
"""

from __future__ import annotations

import importlib
from typing import Any

from qbatch import _packages

_packages.bind()

#: public name -> the module that defines it
_LAZY = {
    "optimize": "orchestrator.runner.optimize",
    "OptimizeResult": "orchestrator.runner.optimize",
    "Recommendation": "orchestrator.runner.optimize",
    "AskTellOptimizer": "orchestrator.ask_tell",
    "run_experiment": "orchestrator.runner",
    "resume_experiment": "orchestrator.runner",
    "read_trials": "orchestrator.store.frame",
    "Objective": "objectives.base",
    "EvalResult": "objectives.base",
    "Resources": "objectives.base",
}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # looked up once
        return value
    raise AttributeError(f"module 'qbatch' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
