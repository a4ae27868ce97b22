"""Config limits (orchestrator/config/): a free-form `options` mapping holds at most 100,000 values (a
plain list or a YAML alias bomb beyond that is a one-line `ConfigError`), and `tau` lies in the open
interval (0, 1), both ends excluded. The sizes a model or proposer may be asked for (orchestrator/limits.py)
and the dimension of a search space (objectives.options.MAX_DIM) are bounded, refused before Ray starts."""

from __future__ import annotations

import re

import pytest

from objectives.options import MAX_DIM
from orchestrator.config import load_config, load_config_text
from orchestrator.errors import ConfigError, SpaceError
from orchestrator.limits import (
    MAX_BOOTSTRAP,
    MAX_FEATURES,
    MAX_GRID,
    MAX_INDUCING,
    MAX_MAX_SAMPLES,
    MAX_MC_SAMPLES,
    MAX_RAW_SAMPLES,
    MAX_RESTARTS,
)
from orchestrator.runner import _check_objective
from orchestrator.space import FloatParam, SearchSpace

OBJECTIVE = {"name": "forrester"}


def test_options_of_exactly_100000_values_are_accepted():
    # the options mapping (1) + the list (1) + 99,998 items = 100,000 values
    cfg = load_config(
        {"objective": OBJECTIVE, "model": {"type": "quantile", "options": {"xs": [0] * 99_998}}}
    )
    assert len(cfg.model.options["xs"]) == 99_998


def test_options_beyond_100000_values_are_refused():
    with pytest.raises(ConfigError, match="holds more than 100000 values"):
        load_config({"objective": OBJECTIVE, "model": {"type": "quantile", "options": {"xs": [0] * 100_001}}})


def test_options_one_value_too_many_are_refused():
    # 1 + 1 + 99,999 = 100,001 values
    with pytest.raises(ConfigError, match="`model.options.xs.*` holds more than 100000 values"):
        load_config({"objective": OBJECTIVE, "model": {"type": "quantile", "options": {"xs": [0] * 99_999}}})


def test_yaml_alias_bomb_in_options_is_refused():
    # 10 ** 6 leaf values through aliases: cheap to parse, far above the limit once expanded
    text = (
        "objective: {name: forrester}\nmodel:\n  type: quantile\n  options:\n"
        "    a: &a [0, 0, 0, 0, 0, 0, 0, 0, 0, 0]\n"
        "    b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
        "    c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\n"
        "    d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]\n"
        "    e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]\n"
        "    f: [*e, *e, *e, *e, *e, *e, *e, *e, *e, *e]\n"
    )
    with pytest.raises(ConfigError, match="holds more than 100000 values") as info:
        load_config_text(text, source="bomb.yaml")
    assert str(info.value).startswith("bomb.yaml: ")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("tau", [1.0, 1, 0.0, 0, 1.5, -0.1])
def test_tau_outside_the_open_interval_is_refused(tau):
    with pytest.raises(ConfigError) as info:
        load_config({"objective": OBJECTIVE, "tau": tau})
    assert str(info.value) == f"`tau` must be a number in (0, 1); got {tau!r}"


def test_tau_one_in_yaml_is_refused():
    with pytest.raises(ConfigError, match=r"`tau` must be a number in \(0, 1\); got 1\.0"):
        load_config_text("objective: {name: forrester}\ntau: 1.0\n")


@pytest.mark.parametrize("tau", [0.999, 0.001, 0.5])
def test_tau_inside_the_open_interval_is_accepted(tau):
    assert load_config({"objective": OBJECTIVE, "tau": tau}).tau == tau


# sizes a config may ask of a model or proposer (orchestrator/limits.py): beyond the bound a ConfigError names
# the option before Ray starts (without the bound, num_features 1e11 passes every check and the run's first
# proposal fails with "DefaultCPUAllocator: can't allocate memory", naming nothing the user has set)
_SIZES = [
    ("quantile", {"num_inducing": MAX_INDUCING}, "thompson", {}, "`model.options`: `num_inducing` must be at "
                                                                 "most"),
    ("gpr-replicates", {"num_bootstrap": MAX_BOOTSTRAP}, "gpr-ei", {}, "`num_bootstrap` must be at most"),
    ("quantile", {}, "thompson", {"num_features": MAX_FEATURES}, "ThompsonSampling `num_features` must be at "
                                                                 "most"),
    ("quantile", {}, "thompson", {"raw_samples": MAX_RAW_SAMPLES}, "ThompsonSampling `raw_samples` must be "
                                                                   "at most"),
    ("quantile", {}, "thompson", {"num_restarts": MAX_RESTARTS}, "ThompsonSampling `num_restarts` must be at "
                                                                 "most"),
    ("quantile", {}, "qgibbon", {"grid_size": MAX_GRID}, "qgibbon.grid_size must be at most"),
    ("quantile", {}, "qgibbon", {"num_max_samples": MAX_MAX_SAMPLES}, "qgibbon.num_max_samples must be at "
                                                                      "most"),
    ("quantile", {}, "qgibbon", {"raw_samples": MAX_RAW_SAMPLES}, "qgibbon.raw_samples must be at most"),
    ("quantile", {}, "qgibbon", {"num_restarts": MAX_RESTARTS}, "qgibbon.num_restarts must be at most"),
    ("exact-gp", {}, "qlognei", {"mc_samples": MAX_MC_SAMPLES}, "qlognei.mc_samples must be at most"),
    ("exact-gp", {}, "qlognei", {"raw_samples": MAX_RAW_SAMPLES}, "qlognei.raw_samples must be at most"),
    ("gpr-replicates", {}, "gpr-ei", {"num_restarts": MAX_RESTARTS}, "gpr-ei.num_restarts must be at most"),
    ("exact-gp", {}, "calibrated", {"raw_samples": MAX_RAW_SAMPLES}, "`proposer.options.raw_samples` must be "
                                                                     "at most"),
    ("exact-gp", {}, "calibrated", {"num_restarts": MAX_RESTARTS}, "`proposer.options.num_restarts` must be "
                                                                   "at most"),
]


def _sized(model: str, model_options: dict, proposer: str, proposer_options: dict, over: int) -> dict:
    """The config of `_SIZES`' row, its one size option `over` above its bound."""
    (key, bound), = ({**model_options, **proposer_options}).items()
    opts = {key: bound + over}
    return {"objective": OBJECTIVE, "initial_design": 4, "budget": 8, "batch_size": 2,
            "model": {"type": model, "options": opts if model_options else {}},
            "proposer": {"type": proposer, "options": opts if proposer_options else {}}}


@pytest.mark.parametrize("model, model_options, proposer, proposer_options, message", _SIZES,
                         ids=[f"{p}-{next(iter({**m, **o}))}" for _, m, p, o, _ in _SIZES])
def test_a_size_beyond_its_bound_is_refused_before_ray_naming_the_option(model, model_options, proposer,
                                                                         proposer_options, message):
    cfg = load_config(_sized(model, model_options, proposer, proposer_options, 0))
    _check_objective(cfg)  # the bound itself is accepted (and nothing of that size is allocated to check it)
    (bound,) = ({**model_options, **proposer_options}).values()
    cfg = load_config(_sized(model, model_options, proposer, proposer_options, 1))
    with pytest.raises(ConfigError, match=re.escape(f"{message} {bound}; got {bound + 1}")):
        _check_objective(cfg)


def test_an_objective_dim_beyond_max_dim_is_refused_before_it_is_built():
    """`objective.options.dim: 100000000` is refused, not accepted to run out of memory 72 s later, in the
    objective's constructor."""
    cfg = load_config({"objective": {"name": "ackley", "options": {"dim": MAX_DIM}}})
    assert _check_objective(cfg) is not None and len(cfg.build_space(_check_objective(cfg).space)) == MAX_DIM
    for name in ("ackley", "gld", "sleep"):
        cfg = load_config({"objective": {"name": name, "options": {"dim": 10**8}}})
        with pytest.raises(ConfigError, match=re.escape(f"option 'dim' must be an integer in [1, {MAX_DIM}]; "
                                                        "got 100000000")):
            _check_objective(cfg)


def test_a_search_space_beyond_max_dim_is_refused_naming_its_size():
    spec = {"type": "float", "low": 0.0, "high": 1.0}
    assert SearchSpace.from_description({f"x{i}": spec for i in range(MAX_DIM)}).dim == MAX_DIM
    with pytest.raises(SpaceError, match=rf"search space has {MAX_DIM + 1} parameters; at most {MAX_DIM}"):
        SearchSpace.from_description({f"x{i}": spec for i in range(MAX_DIM + 1)})
    with pytest.raises(SpaceError, match=rf"search space has {MAX_DIM + 1} parameters"):
        SearchSpace([FloatParam(f"x{i}", 0.0, 1.0) for i in range(MAX_DIM + 1)])
