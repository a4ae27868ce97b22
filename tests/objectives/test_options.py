"""Objective options are checked when the objective is built: a wrong type or value is one `ObjectiveError`
naming the option and the value, nothing is coerced (the brief's "bad input gets a clear error")."""

from __future__ import annotations

import inspect
import math
import re

import numpy as np
import pytest

from objectives.base import ObjectiveError
from objectives.options import (
    check_bool,
    check_bounds,
    check_choice,
    check_float,
    check_int,
    check_path,
    check_range,
    check_str,
)
from objectives.registry import BUILTIN_OBJECTIVES, _import_target, load_objective


def test_int_refuses_bools_floats_and_strings_and_names_the_range():
    assert check_int("n", 3, 1) == 3 and type(check_int("n", np.int64(3), 1)) is int
    assert check_int("n", None, 1, optional=True) is None
    for bad in (True, 3.0, "3", None, [3]):
        with pytest.raises(ObjectiveError, match=re.escape("option 'n' must be an integer >= 1; got "
                                                           f"{bad!r}")):
            check_int("n", bad, 1)
    with pytest.raises(ObjectiveError, match=r"option 'k' must be an integer in \[1, 4\]; got 5"):
        check_int("k", 5, 1, 4)
    with pytest.raises(ObjectiveError, match=r"must be None or an integer <= 2; got 3"):
        check_int("k", 3, None, 2, optional=True)


def test_float_checks_finiteness_and_open_and_closed_ends():
    assert check_float("x", 0, 0.0) == 0.0 and type(check_float("x", np.float32(0.5))) is float
    for bad in (math.inf, math.nan, True, "0.5", None):
        with pytest.raises(ObjectiveError, match=r"option 'x' must be a finite number; got"):
            check_float("x", bad)
    with pytest.raises(ObjectiveError, match=r"must be a finite number > 0; got 0"):
        check_float("x", 0, 0.0, low_open=True)
    with pytest.raises(ObjectiveError, match=r"must be a finite number in \[0, 1\); got 1"):
        check_float("x", 1, 0.0, 1.0, high_open=True)
    assert check_float("x", 1, 0.0, 1.0) == 1.0
    with pytest.raises(ObjectiveError, match=r"must be a finite number < 2; got 3"):
        check_float("x", 3, None, 2.0, high_open=True)


def test_bool_str_choice_and_path():
    assert check_bool("b", np.bool_(True)) is True
    for bad in ("no", 0, 1, None):
        with pytest.raises(ObjectiveError, match=re.escape(f"option 'b' must be true or false; got {bad!r}")):
            check_bool("b", bad)
    for bad in ("", 3, None):
        with pytest.raises(ObjectiveError, match="option 's' must be a non-empty string"):
            check_str("s", bad)
    assert check_choice("c", 1, [1, 2]) == 1
    for bad in (True, "1", [1], np.array([1, 2])):  # True == 1, but it is not the choice 1
        with pytest.raises(ObjectiveError, match=r"option 'c' must be one of \[1, 2\]"):
            check_choice("c", bad, [1, 2])
    assert check_path("p", None) is None
    with pytest.raises(ObjectiveError, match="option 'p' must be a path; got None"):
        check_path("p", None, optional=False)
    with pytest.raises(ObjectiveError, match="option 'p'='/nonexistent/qbatch' is not a file"):
        check_path("p", "/nonexistent/qbatch", kind="file")
    with pytest.raises(ObjectiveError, match="is not a folder"):
        check_path("p", __file__, kind="dir")


def test_ranges_and_bounds_name_the_pair():
    assert check_range("r", (0, 1.5)) == (0.0, 1.5) and check_range("r", np.array([0.0, 1.0])) == (0.0, 1.0)
    for bad in ((1, 0), (0, math.nan), (0, "1"), (0, True), "ab", (0, 1, 2), 5):
        with pytest.raises(ObjectiveError, match=r"option 'r' must be a pair \(low, high\)"):
            check_range("r", bad)
    assert check_bounds("bounds", [[0, 1], [2, 3]], 2) == ((0.0, 1.0), (2.0, 3.0))
    with pytest.raises(ObjectiveError, match=r"option 'bounds' must be 2 \(low, high\) pairs; got \[\[0, "
                                             r"1\]\]"):
        check_bounds("bounds", [[0, 1]], 2)
    with pytest.raises(ObjectiveError, match=r"option 'bounds\[1\]' must be a pair"):
        check_bounds("bounds", [[0, 1], [0, "x"]], 2)


def _options(name: str) -> list[str]:
    params = inspect.signature(_import_target(BUILTIN_OBJECTIVES[name][0])).parameters.values()
    return [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


@pytest.mark.parametrize("name", sorted(BUILTIN_OBJECTIVES))
def test_every_option_of_every_builtin_refuses_a_wrong_type_by_name(name):
    """A dict is no valid value of any built-in option (but `sleep`'s `custom_resources`, given a number):
    each must be refused by an `ObjectiveError` naming the option, not coerced, and not a bare TypeError."""
    options = _options(name)
    assert options, name
    for key in options:
        bad = 5 if key == "custom_resources" else {"bad": 1}
        with pytest.raises(ObjectiveError, match=f"'{key}'"):
            load_objective(name, {key: bad})


@pytest.mark.parametrize(
    "name, options, match",
    [
        ("forrester", {"heteroscedastic": "no"}, "option 'heteroscedastic' must be true or false; got 'no'"),
        ("gld", {"lengthscale": True}, "option 'lengthscale' must be a finite number > 0; got True"),
        ("gld", {"tau": 0.5}, r"unknown option\(s\) \['tau'\]; it takes \['dim', 'problem'"),
        ("laser", {"csv_path": 3}, "option 'csv_path' must be None or a path; got 3"),
        ("laser", {"energy_range": [1, "6"]}, r"option 'energy_range' must be a pair \(low, high\)"),
        ("ackley", {"bounds": "ab"}, r"option 'bounds' must be 2 \(low, high\) pairs; got 'ab'"),
        ("lunar-lander", {"env_id": "Foo-v0"}, "option 'env_id'='Foo-v0' is not an environment of "
                                               "'gymnasium'"),
        ("cnn", {"device": "cuda"}, "option 'device'='cuda' needs option 'num_gpus' > 0"),
    ],
)
def test_values_that_used_to_be_coerced_or_named_nothing(name, options, match):
    with pytest.raises(ObjectiveError, match=match):
        load_objective(name, options)


def test_path_options_are_made_absolute_for_the_stored_config(tmp_path, monkeypatch, lcls_csv):
    """The config a run stores holds the objective's path options absolute (`~` expanded), so the actor, the
    workers and `qbatch resume` read the same file from any directory; `~` is accepted by every path
    option."""
    import shutil

    from orchestrator.config import load_config
    from orchestrator.runner import _check_objective, _with_absolute_paths

    shutil.copy(lcls_csv, tmp_path / "data.csv")
    monkeypatch.chdir(tmp_path)
    cfg = load_config({"objective": {"name": "laser", "options": {"csv_path": "data.csv", "n_gp_max": 40}},
                       "proposer": {"type": "random"}, "budget": 4, "initial_design": 4, "batch_size": 4})
    out = _with_absolute_paths(cfg, _check_objective(cfg))
    assert out.objective.options["csv_path"] == str(tmp_path / "data.csv")
    assert out.to_dict()["objective"]["options"]["n_gp_max"] == 40
    monkeypatch.setenv("HOME", str(tmp_path))
    home = load_config({"objective": {"name": "laser", "options": {"csv_path": "~/data.csv", "n_gp_max": 40}},
                        "proposer": {"type": "random"}, "budget": 4, "initial_design": 4, "batch_size": 4})
    assert _with_absolute_paths(home, _check_objective(home)).objective.options["csv_path"] == str(
        tmp_path / "data.csv"
    )
