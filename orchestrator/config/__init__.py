"""Experiment config: YAML -> a frozen, validated `ExperimentConfig` (README "Configuration").

Every key is checked from ONE table (`schema._TABLE`: dotted key, check, default), as Ray checks task options
(STYLE.md §4.6). A bad config raises `ConfigError` with one line that names the dotted key and the accepted
values or range, e.g. "`batch_size` must be an integer in [1, 4096]; got 0"; an unknown key lists the valid
ones. The parts:

* `schema`: the table of keys, their checks and defaults, and the accepted type names;
* `values`: the checks of the table's values (names, run directories, the space's overrides);
* `experiment`: `ExperimentConfig` and its sections, and what they resolve (run directory, space);
* `loading`: YAML text, files and mappings validated into an `ExperimentConfig`.
"""

from __future__ import annotations

from orchestrator.config.experiment import (
    ComponentConfig,
    ExperimentConfig,
    FailureGuardConfig,
    ObjectiveConfig,
    ReevaluationConfig,
)
from orchestrator.config.loading import MAX_CONFIG_BYTES, load_config, load_config_text  # noqa: F401
from orchestrator.config.schema import (  # noqa: F401 -- the table and bounds: imported from here too
    _TABLE,
    CALIBRATOR_TYPES,
    DIRECTIONS,
    MAX_BATCH,
    MAX_SEED,
    MODEL_TYPES,
    PROPOSER_TYPES,
    _Key,
)
from orchestrator.config.values import check_run_dir
from orchestrator.errors import ConfigError

__all__ = [
    "CALIBRATOR_TYPES",
    "ComponentConfig",
    "ConfigError",
    "ExperimentConfig",
    "FailureGuardConfig",
    "MODEL_TYPES",
    "ObjectiveConfig",
    "PROPOSER_TYPES",
    "ReevaluationConfig",
    "check_run_dir",
    "load_config",
    "load_config_text",
]
