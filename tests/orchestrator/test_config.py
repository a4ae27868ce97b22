"""Tests of the experiment config (orchestrator/config/): one table, one-line errors naming the key.

Includes the property-based tests : malformed values and malformed YAML always give a
single-line `ConfigError` naming the key (or the YAML line), never another exception type.
"""

from __future__ import annotations

import dataclasses
import math
import os
import string

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.config import (
    _TABLE,
    CALIBRATOR_TYPES,
    MODEL_TYPES,
    PROPOSER_TYPES,
    ExperimentConfig,
    _Key,
    load_config,
    load_config_text,
)
from orchestrator.errors import ConfigError, QbatchError

ORCH_API_EXAMPLE = """
name: laser-quickstart
objective:
  name: laser
  options: {}
space: {}
direction: null
tau: 0.1
model:
  type: quantile
  options: {}
proposer:
  type: thompson
  options: {}
calibrator:
  type: none
  options: {}
batch_size: 100
initial_design: 20
budget: 200
max_concurrent: null
synchronous: false
timeout_s: 600
max_retries: 1
failure_guard: {max_failure_rate: 0.5, min_trials: 10}
seed: 0
run_dir: null
"""


def _leaf_keys(table=_TABLE, prefix=""):
    for k, spec in table.items():
        dotted = f"{prefix}.{k}" if prefix else k
        if isinstance(spec, dict):
            yield from _leaf_keys(spec, dotted)
        else:
            yield dotted


LEAVES = list(_leaf_keys())
SECTIONS = [k for k, v in _TABLE.items() if isinstance(v, dict)]


def _set(d: dict, dotted: str, value) -> dict:
    parts = dotted.split(".")
    cur = d
    for p in parts[:-1]:
        cur = cur[p]
    cur[parts[-1]] = value
    return d


def _msg(excinfo) -> str:
    msg = str(excinfo.value)
    assert "\n" not in msg and msg.strip() == msg and msg
    return msg


# ------------------------------------------------------------------ valid configs
def test_orch_api_example_is_valid_and_round_trips():
    cfg = load_config_text(ORCH_API_EXAMPLE)
    assert cfg.name == "laser-quickstart" and cfg.tau == 0.1 and cfg.model.type == "quantile"
    assert cfg.timeout_s == 600.0 and isinstance(cfg.timeout_s, float)
    assert cfg.failure_guard.max_failure_rate == 0.5 and cfg.failure_guard.min_trials == 10
    d = cfg.to_dict()
    assert d == yaml.safe_load(ORCH_API_EXAMPLE) | {"timeout_s": 600.0}
    assert load_config(d) == cfg
    assert load_config_text(yaml.safe_dump(d)) == cfg


def test_defaults_and_shorthand():
    cfg = load_config({"objective": "forrester", "model": "expectile", "budget": 8})
    assert cfg.name == "forrester" and cfg.objective.name == "forrester" and cfg.model.type == "expectile"
    assert cfg.initial_design == 8  # the default design (20) is capped by a smaller budget
    assert (cfg.proposer.type, cfg.calibrator.type, cfg.tau, cfg.batch_size) == ("thompson", "none", 0.5, 100)
    user = load_config({"objective": {"name": "my_pkg.objs:Thing", "options": {"k": [1, 2]}}})
    assert user.name == "my_pkg.objs-Thing" and dict(user.objective.options) == {"k": [1, 2]}


def test_config_is_frozen():
    cfg = load_config(
        {"objective": "forrester", "model": {"type": "quantile", "options": {"num_inducing": 64}}}
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.tau = 0.3
    with pytest.raises(TypeError):
        cfg.model.options["num_inducing"] = 3
    assert load_config(cfg) is cfg


def test_type_lists_match_the_registries():
    """The ORCH_API names exist in each package's registry; registry-only names are accepted too."""
    import importlib

    for module, attr, names, section in (
        ("orchestrator.acquisition", "PROPOSERS", PROPOSER_TYPES, "proposer"),
        ("orchestrator.models", "MODELS", MODEL_TYPES, "model"),
        ("orchestrator.calibration", "CALIBRATORS", CALIBRATOR_TYPES, "calibrator"),
    ):
        registry = getattr(importlib.import_module(module), attr)
        assert set(names) <= set(registry), (module, sorted(set(names) - set(registry)))
        for name in registry:
            assert load_config({"objective": "forrester", section: name}).to_dict()[section]["type"] == name
        with pytest.raises(ConfigError, match=rf"^`{section}\.type` must be one of "
                                              rf".*{sorted(registry)[0]!r}"):
            load_config({"objective": "forrester", section: "definitely-not-registered"})


# ------------------------------------------------------------------ one-line errors naming the key
@pytest.mark.parametrize(
    "patch, pattern",
    [
        ({"tau": 1.5}, r"^`tau` must be a number in \(0, 1\); got 1\.5$"),
        ({"tau": 0}, r"^`tau` must be a number in \(0, 1\); got 0$"),
        ({"batch_size": 0}, r"^`batch_size` must be an integer in \[1, 4096\]; got 0$"),
        ({"batch_size": 2.0}, r"^`batch_size` must be an integer in \[1, 4096\]; got 2\.0$"),
        ({"batch_size": True}, r"`batch_size` must be an integer"),
        ({"objective": {"name": "lazer"}}, r"^`objective\.name` must be a built-in objective "
                                           r"\(.*laser.*\).*got 'lazer' \(did you mean 'laser'\?\)$"),
        ({"bogus": 1}, r"^unknown key `bogus`; valid keys at the top level: name, objective, .*run_dir$"),
        ({"batchsize": 1}, r"^unknown key `batchsize` \(did you mean 'batch_size'\?\)"),
        ({"model": {"type": "quantile", "opts": {}}}, r"^unknown key `model\.opts`.*valid keys in `model`: "
                                                      r"type, options$"),
        ({"model": {"type": "gp"}}, r"^`model\.type` must be one of 'quantile', 'expectile', "
                                    r"'heteroscedastic', 'exact-gp'.*; got 'gp'$"),
        ({"proposer": "ei"}, r"^`proposer\.type` must be one of 'thompson', 'qgibbon'.*; got 'ei'$"),
        ({"calibrator": {"type": 3}}, r"^`calibrator\.type` must be one of .*; got 3$"),
        ({"direction": "up"}, r"^`direction` must be one of 'maximize', 'minimize', null; got 'up'$"),
        ({"failure_guard": {"max_failure_rate": 0}}, r"^`failure_guard\.max_failure_rate` must be a number "
                                                     r"in \(0, 1\]"),
        ({"failure_guard": 0.5}, r"^`failure_guard` must be a mapping with keys max_failure_rate, "
                                 r"min_trials; got 0\.5$"),
        ({"timeout_s": float("inf")}, r"^`timeout_s` must be a number in \(0, 1e\+06\]; got inf$"),
        ({"timeout_s": float("nan")}, r"^`timeout_s` must be a number in \(0, 1e\+06\]; got nan$"),
        ({"timeout_s": 3e6}, r"^`timeout_s` must be a number in \(0, 1e\+06\]; got 3000000\.0$"),
        ({"tau": 10**400}, r"^`tau` must be a number in \(0, 1\); got 1000"),
        ({"run_dir": "s3://"}, r"^`run_dir` must be a local path or a filesystem URI"),
        ({"max_retries": -1}, r"^`max_retries` must be an integer in \[0, 100\]; got -1$"),
        ({"max_concurrent": 0}, r"^`max_concurrent` must be an integer in \[1, 1000000\]; got 0$"),
        ({"synchronous": "yes"}, r"^`synchronous` must be true or false; got 'yes'$"),
        ({"seed": -1}, r"^`seed` must be an integer in \[0, 4294967295\]; got -1$"),
        ({"initial_design": 50, "budget": 10}, r"^`initial_design` must be <= `budget` \(10\); got 50$"),
        ({"model": {"type": "quantile", "options": [1]}}, r"^`model\.options` must be a mapping of option "
                                                          r"names to values; got \[1\]$"),
        ({"objective": {"name": "laser", "options": {"f": object()}}}, r"^`objective\.options\.f` must be "
                                                                       r"plain data"),
        ({"space": {"x": {"type": "float", "low": 1, "high": 0}}}, r"^`space\.x`: parameter 'x': low must be "
                                                                   r"< high"),
        ({"space": {"x": {"type": "int", "low": 0, "high": 3, "size": 2}}}, r"^`space\.x`: parameter 'x': "
                                                                            r"unknown key\(s\) \['size'\]"),
        ({"space": {"x": 3}}, r"^`space\.x` must be a parameter spec mapping"),
        ({"space": [1]}, r"^`space` must be a mapping of parameter name to spec"),
    ],
)
def test_bad_values_give_one_line_naming_the_key(patch, pattern):
    raw = {"objective": {"name": "laser"}} | patch
    with pytest.raises(ConfigError, match=pattern) as excinfo:
        load_config(raw)
    _msg(excinfo)
    assert issubclass(ConfigError, QbatchError)


@pytest.mark.parametrize(
    "name", ["../x", "..", ".", "/etc", "a/b", "a\\b", ".hidden", "", "x" * 101, "a b", "-rf"]
)
def test_run_names_cannot_escape_their_folder(name):
    with pytest.raises(ConfigError, match=r"^`name` must be a name of 1-100 letters") as excinfo:
        load_config({"objective": "forrester", "name": name})
    _msg(excinfo)


@pytest.mark.parametrize(
    "run_dir", ["../x", "runs/../../x", "s3://bucket/../x", "a\\..\\b", "", " ", "a\nb", 3]
)
def test_run_dir_without_parent_components(run_dir):
    with pytest.raises(ConfigError, match=r"^`run_dir` must be a local path or a filesystem URI"):
        load_config({"objective": "forrester", "run_dir": run_dir})


@pytest.mark.parametrize(
    "run_dir", ["/abs/runs/x", "runs/x", "s3://bucket/runs/x", "file:///tmp/x", "a..b/c"]
)
def test_run_dir_accepted(run_dir):
    assert load_config({"objective": "forrester", "run_dir": run_dir}).run_dir == run_dir


def test_resolve_run_dir_stays_under_runs(tmp_path):
    cfg = load_config({"objective": "forrester", "name": "exp.1"})
    rd = cfg.resolve_run_dir(now=0.0)
    assert os.path.dirname(rd) == "runs" and os.path.basename(rd).startswith("exp.1-")
    assert cfg.resolve_run_dir("elsewhere/x") == "elsewhere/x"
    with pytest.raises(ConfigError, match=r"^`--run-dir` must be"):
        cfg.resolve_run_dir("../up")
    assert load_config({"objective": "forrester", "run_dir": "r"}).resolve_run_dir() == "r"


def test_build_space_applies_narrowing_overrides():
    objective_space = {
        "x": {"type": "float", "low": -5.0, "high": 5.0},
        "n": {"type": "int", "low": 1, "high": 10},
        "act": {"type": "choice", "choices": ["relu", "tanh", "gelu"]},
    }
    cfg = load_config(
        {
            "objective": "forrester",
            "space": {
                "x": {"type": "float", "low": 0.0, "high": 1.0},
                "n": {"type": "choice", "choices": [2, 4, 8]},
                "act": {"type": "choice", "choices": ["relu", "gelu"]},
            },
        }
    )
    space = cfg.build_space(objective_space)
    assert space.names == ["x", "n", "act"]
    assert space.describe()["x"]["high"] == 1.0 and space.describe()["act"]["choices"] == ["relu", "gelu"]
    assert load_config({"objective": "forrester"}).build_space(objective_space).describe()["x"]["low"] == -5.0
    bad = [
        ({"y": {"type": "float", "low": 0, "high": 1}}, r"^`space\.y` is not a parameter of objective "
                                                        r"'forrester'; its parameters are: x, n, act$"),
        ({"x": {"type": "float", "low": 0, "high": 9}}, r"^`space\.x` must stay within the objective's "
                                                        r"range: numbers in \[-5\.0, 5\.0\]"),
        ({"n": {"type": "float", "low": 1, "high": 2}}, r"^`space\.n` must be an int or choice parameter"),
        ({"n": {"type": "choice", "choices": [1.5]}}, r"^`space\.n` must stay within the objective's range: "
                                                      r"integers"),
        ({"act": {"type": "choice", "choices": ["relu", "swish"]}}, r"^`space\.act` must be a choice among a "
                                                                    r"subset"),
    ]
    for override, pattern in bad:
        with pytest.raises(ConfigError, match=pattern):
            load_config({"objective": "forrester", "space": override}).build_space(objective_space)
    assert cfg.resolve_direction("minimize") == "minimize"
    assert (
        load_config({"objective": "forrester", "direction": "maximize"}).resolve_direction("minimize")
        == "maximize"
    )


def test_an_int_override_stays_on_the_objectives_grid():
    """CNN's batch_size takes 32:512:32; an override off that grid is refused by the config: passed, every
    Sobol point would fail the objective's own check, so the failure guard would stop the run."""
    grid = {"batch_size": {"type": "int", "low": 32, "high": 512, "step": 32}}
    for ok in ({"type": "int", "low": 64, "high": 256, "step": 64}, {"type": "choice", "choices": [64, 128]},
               # the last two keep step 32
               {"type": "int", "low": 64, "high": 256}, {"low": 64, "high": 256}):
        load_config({"objective": "cnn", "space": {"batch_size": ok}}).build_space(grid)
    for bad in (
        {"type": "int", "low": 64, "high": 256, "step": 1},
        {"type": "choice", "choices": [50, 100]},
        {"type": "int", "low": 64, "high": 256, "step": 48},
        {"type": "int", "low": 50, "high": 242, "step": 32},
    ):
        with pytest.raises(ConfigError, match=r"^`space\.batch_size` must stay on the objective's grid "
                                              r"32:512:32"):
            load_config({"objective": "cnn", "space": {"batch_size": bad}}).build_space(grid)


def test_an_override_restates_only_what_it_changes():
    """README: an override keeps what it does not restate. An override is checked after the merge, not as a
    complete float spec: `{low, high, step}` for the CNN's int `fc_units` is taken (not "unknown key(s)
    ['step'] for type 'float'"), and so are `{low: 1e-4}` or `{log: false}` alone."""
    space = {"fc_units": {"type": "int", "low": 16, "high": 512, "step": 16},
             "lr": {"type": "float", "low": 1e-5, "high": 1e-1, "log": True}}
    for override, want in [
        (
            {"fc_units": {"low": 256, "high": 512, "step": 32}},
            {"type": "int", "low": 256, "high": 512, "step": 32},
        ),
        ({"lr": {"low": 1e-4}}, {"type": "float", "low": 1e-4, "high": 1e-1, "log": True}),
        ({"fc_units": {"type": "choice", "choices": [64, 128]}}, {"type": "choice", "choices": [64, 128]}),
    ]:
        got = load_config({"objective": "forrester", "space": override}).build_space(space).describe()
        name = next(iter(override))
        assert {k: got[name][k] for k in want} == want
    for override, pattern in [
        ({"fc_units": {"low": 16, "hgh": 64}}, r"^`space\.fc_units`: unknown key\(s\) \['hgh'\]"),
        ({"fc_units": {"type": "int", "low": 17}}, r"^`space\.fc_units`: .*multiple of step 16"),
        ({"lr": {"type": "int", "low": 1}}, r"^`space\.lr`: .*missing key 'high'"),
        ({"lr": {"low": 0.5}}, r"^`space\.lr`: .*low must be < high"),
        ({"fc_units": {"log": True}}, r"^`space\.fc_units`: .*a log int parameter must have step 1"),
        ({"fc_units": {"type": ["int"]}}, r"^`space\.fc_units`: type must be one of .*got \['int'\]"),
    ]:
        with pytest.raises(ConfigError, match=pattern):
            load_config({"objective": "forrester", "space": override}).build_space(space)


def test_a_choice_override_is_a_subset_by_the_objectives_own_test():
    """Choices [1, 0] are not a subset of [true, false] (True == 1 in Python): passed, every evaluation would
    fail the objective's check ("parameter 'flag'=0 is not one of [True, False])."""
    space = {"flag": {"type": "choice", "choices": [True, False]}}
    with pytest.raises(ConfigError, match=r"^`space\.flag` must be a choice among a subset of \[True, "
                                          r"False\]"):
        load_config({"objective": "forrester", "space": {"flag": {"type": "choice", "choices": [1, 0]}}}
                    ).build_space(space)
    load_config(
        {"objective": "forrester", "space": {"flag": {"type": "choice", "choices": [True]}}}
    ).build_space(space)


@pytest.mark.parametrize("objective", ["_mypkg.obj:Thing", "a" * 95 + ".mod:Objective"])
def test_a_name_made_from_the_objective_loads_again(objective):
    """Without `name`, the run is named after the objective; that name must pass the name rules, since the
    saved config is loaded again by the actor and by `qbatch resume` (a leading '_' or 100+ characters did
    not)."""
    cfg = load_config({"objective": objective})
    assert load_config(cfg.to_dict()).name == cfg.name and len(cfg.name) <= 100


# ------------------------------------------------------------------ YAML and files
def test_yaml_errors_name_the_line(tmp_path):
    with pytest.raises(ConfigError, match=r"^<config>: invalid YAML at line 4, column 1: .*\(while parsing a "
                                          r"flow sequence at line 3, column 8\)$") as excinfo:
        load_config_text("objective: laser\ntau: 0.1\nmodel: [quantile\n")
    _msg(excinfo)
    with pytest.raises(ConfigError, match=r"^<config>: duplicate key `tau` at line 3$"):
        load_config_text("objective: laser\ntau: 0.1\ntau: 0.2\n")
    with pytest.raises(ConfigError, match=r"the config is empty"):
        load_config_text("# nothing\n")
    with pytest.raises(ConfigError, match=r"must be a YAML mapping of keys to values; got list"):
        load_config_text("- objective\n")
    with pytest.raises(ConfigError, match=r"invalid YAML.*could not determine a constructor"):
        load_config_text("objective: !!python/object/apply:os.system ['true']\n")
    path = tmp_path / "c.yaml"
    path.write_text("objective: laser\nbatch_size: 0\n")
    with pytest.raises(ConfigError, match=rf"^{path}: `batch_size` must be an integer in \[1, 4096\]; got "
                                          r"0$"):
        load_config(path)
    with pytest.raises(ConfigError, match=r"^config file not found: "):
        load_config(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match=r"^config path is a folder"):
        load_config(tmp_path)
    path.write_bytes(b"objective: \xff\xfe\n")
    with pytest.raises(ConfigError, match=r"not UTF-8"):
        load_config(path)


# ------------------------------------------------------------------ property-based
BASE = {
    "name": "prop",
    "objective": {"name": "forrester", "options": {}},
    "space": {"x": {"type": "float", "low": 0.0, "high": 1.0}},
    "tau": 0.2,
    "model": {"type": "quantile", "options": {"num_inducing": 32}},
    "budget": 50,
    "initial_design": 10,
    "run_dir": "runs/prop",
}

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**20), max_value=10**20),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=30),
    st.dates(),
    st.binary(max_size=8),
)
junk = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=8,
)


def _copy(d):
    return yaml.safe_load(yaml.safe_dump(d))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(key=st.sampled_from(LEAVES + SECTIONS), value=junk)
def test_property_bad_value_is_one_config_error_naming_the_key(key, value):
    raw = _copy(BASE)
    if "." in key and not isinstance(raw.get(key.split(".")[0]), dict):
        raw[key.split(".")[0]] = {}
    _set(raw, key, value)
    try:
        cfg = load_config(raw)
    except ConfigError as exc:
        msg = str(exc)
        assert "\n" not in msg and msg
        named = [
            f"`{key}",
            f"`{key.split('.')[0]}`",
            f"`{key.split('.')[0]}.",
            "`initial_design`",
            "`objective.name`",
        ]
        assert any(n in msg for n in named), (key, value, msg)
    else:
        assert isinstance(cfg, ExperimentConfig)
        assert load_config(cfg.to_dict()) == cfg  # whatever is accepted round-trips


@settings(max_examples=100, deadline=None)
@given(
    path=st.lists(st.sampled_from(["", "model", "failure_guard", "objective"]), min_size=1, max_size=1),
    key=st.text(alphabet=string.ascii_letters + string.digits + "_-. ", min_size=1, max_size=12),
    value=junk,
)
def test_property_unknown_key_is_named(path, key, value):
    raw = _copy(BASE)
    section = raw if path[0] == "" else raw.setdefault(path[0], {})
    table = _TABLE if path[0] == "" else _TABLE[path[0]]
    if key in table:
        return
    section[key] = value
    with pytest.raises(ConfigError) as excinfo:
        load_config(raw)
    msg = _msg(excinfo)
    dotted = key if path[0] == "" else f"{path[0]}.{key}"
    assert msg.startswith(f"unknown key `{' '.join(dotted.split())}`"), msg


yaml_tokens = st.sampled_from(
    [
        "[",
        "]",
        "{",
        "}",
        ":",
        "- ",
        "'",
        '"',
        "&a",
        "*a",
        "!!python/name:os.system",
        "\t",
        "%",
        "@",
        "`",
        "|",
        ">",
        "1.5",
        "0",
        "-3",
        ".nan",
        ".inf",
        "~",
        "yes",
        "2020-01-01",
        "\n  ",
        "\n",
        "#",
        "?",
        ",",
        "!",
        "\x00",
        "\ufeff",
    ]
)


@settings(max_examples=200, deadline=None)
@given(tokens=st.lists(st.one_of(yaml_tokens, st.text(max_size=5)), max_size=12), key=st.sampled_from(LEAVES))
def test_property_malformed_yaml_is_one_config_error(tokens, key):
    text = yaml.safe_dump(BASE, sort_keys=False)
    # splice random YAML fragments into the value of one key (or append them when the key is absent)
    leaf = key.split(".")[-1]
    needle = f"{leaf}:"
    junk_text = "".join(tokens)
    text = text.replace(needle, f"{needle} {junk_text}", 1) if needle in text else text + (f"{leaf}: "
                                                                                           f"{junk_text}\n")
    try:
        cfg = load_config_text(text)
    except ConfigError as exc:
        msg = str(exc)
        assert "\n" not in msg and msg.startswith("<config>: ")
    else:
        assert load_config(cfg.to_dict()) == cfg


@settings(max_examples=100, deadline=None)
@given(text=st.text(max_size=200))
def test_property_arbitrary_text_never_raises_other_errors(text):
    try:
        load_config_text(text)
    except ConfigError as exc:
        assert "\n" not in str(exc)


def test_table_has_a_check_and_default_for_every_key():
    for dotted in LEAVES:
        node = _TABLE
        for p in dotted.split("."):
            node = node[p]
        assert isinstance(node, _Key) and callable(node.check)
    assert math.isclose(load_config({"objective": "forrester"}).tau, 0.5)


def test_a_bounds_override_keeps_the_objectives_log_scale_and_step():
    """An override of the same type (or without one) changes only the keys it gives: `learning_rate: {low:
    1e-4,
    high: 1e-2}` keeps cnn's learning rate log-scale, and an int override need not restate `type` and
    `step`."""
    objective_space = {"lr": {"type": "float", "low": 1e-6, "high": 1.0, "log": True},
                       "bs": {"type": "int", "low": 32, "high": 512, "step": 32}}

    def built(override):
        return load_config({"objective": "cnn", "space": override}).build_space(objective_space).describe()

    assert built({"lr": {"low": 1e-4, "high": 1e-2}})["lr"] == {
        "type": "float",
        "low": 1e-4,
        "high": 1e-2,
        "log": True,
    }
    assert built({"lr": {"low": 1e-4, "high": 1e-2, "log": False}})["lr"]["log"] is False
    assert built({"bs": {"low": 64, "high": 128}})["bs"] == {
        "type": "int",
        "low": 64,
        "high": 128,
        "step": 32,
        "log": False,
    }
    assert built({"bs": {"type": "choice", "choices": [64, 256]}})["bs"] == {
        "type": "choice",
        "choices": [64, 256],
    }


def test_a_bad_space_of_the_objective_is_named_as_such():
    """A parameter the config does not override is the objective's own (with tuple choices): the error does
    not name '`space`', a key the user never wrote."""
    own = {
        "arch": {"type": "choice", "choices": [(64, 64), (128,)]},
        "x": {"type": "float", "low": 0.0, "high": 1.0},
    }
    with pytest.raises(ConfigError, match=r"^the objective's space: parameter 'arch': choice \(64, 64\)"):
        load_config({"objective": "forrester"}).build_space(own)
    quoted = {"it's": {"type": "choice", "choices": [(1, 2)]}}  # its repr is in double quotes
    with pytest.raises(ConfigError, match=r"^the objective's space: parameter \"it's\""):
        load_config({"objective": "forrester"}).build_space(quoted)
