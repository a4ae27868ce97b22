"""Tests of the option checker (orchestrator/checks.py): each kind of value, its bounds, the message naming
the option and the value, bools refused as numbers, NumPy scalars taken as the Python values they hold, and
the plain-data walker in the config's form and the event log's."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch

from orchestrator.checks import (
    check_bool,
    check_choice,
    check_float,
    check_int,
    is_int,
    is_number,
    plain_data,
    refuse,
    show,
    suggest,
)
from orchestrator.errors import ConfigError, InputDataError, SpaceError


def _message(fn, *args, **kwargs) -> str:
    with pytest.raises(Exception) as info:
        fn(*args, **kwargs)
    return str(info.value)


# ---------------------------------------------------------------------------------------- predicates
@pytest.mark.parametrize("value, integer, number", [
    (3, True, True), (np.int64(3), True, True), (np.uint8(3), True, True), (2.0, False, True),
    (np.float32(0.5), False, True), (True, False, False), (np.bool_(True), False, False), ("3", False, False),
    (None, False, False), (1 + 0j, False, False),
])
def test_a_bool_is_neither_an_integer_nor_a_number(value, integer, number):
    assert is_int(value) is integer
    assert is_number(value) is number


def test_show_cuts_a_long_value_to_one_short_line():
    assert show("abc") == "'abc'"
    long = show(list(range(100)))
    assert len(long) == 80 and long.endswith("...")
    assert show("x" * 78) == repr("x" * 78)  # 80 characters with the quotes: not cut


def test_refuse_builds_the_owners_error_with_the_one_message_form():
    err = refuse("`tau`", "a number in (0, 1)", 2.5, SpaceError)
    assert isinstance(err, SpaceError) and str(err) == "`tau` must be a number in (0, 1); got 2.5"
    assert type(refuse("q", "an integer >= 1", 0)) is ConfigError


# ---------------------------------------------------------------------------------------- bool
@pytest.mark.parametrize("value", [True, False, np.bool_(True), np.bool_(False)])
def test_check_bool_takes_python_and_numpy_booleans_and_returns_a_python_bool(value):
    out = check_bool("`synchronous`", value)
    assert type(out) is bool and out == bool(value)


@pytest.mark.parametrize("value, shown", [(1, "1"), (0, "0"), ("yes", "'yes'"), (None, "None"), (1.0, "1.0")])
def test_check_bool_refuses_everything_else_naming_key_and_value(value, shown):
    assert _message(check_bool, "`synchronous`", value) == f"`synchronous` must be true or false; got {shown}"


def test_check_bool_raises_the_error_type_it_is_given():
    with pytest.raises(SpaceError, match=r"^parameter 'x': log must be true or false; got 'no'$"):
        check_bool("parameter 'x': log", "no", error=SpaceError)


# ---------------------------------------------------------------------------------------- int
def test_check_int_takes_integers_within_closed_bounds():
    assert check_int("`batch_size`", 1, 1, 4096) == 1
    assert check_int("`batch_size`", 4096, 1, 4096) == 4096
    assert check_int("`max_retries`", 0, 0) == 0
    assert check_int("x", -(10**30)) == -(10**30)  # no bounds: any integer


@pytest.mark.parametrize("value", [np.int64(7), np.int32(7), np.uint16(7)])
def test_check_int_takes_numpy_integers_and_returns_a_python_int(value):
    out = check_int("`seed`", value, 0)
    assert type(out) is int and out == 7


@pytest.mark.parametrize("value, shown", [
    (True, "True"), (False, "False"), (np.bool_(True), repr(np.bool_(True))), (2.0, "2.0"), ("3", "'3'"),
    (None, "None"), (np.float64(3.0), repr(np.float64(3.0))),
])
def test_check_int_refuses_bools_floats_and_strings(value, shown):
    assert _message(check_int, "`batch_size`", value, 1, 4096) == (
        f"`batch_size` must be an integer in [1, 4096]; got {shown}")


@pytest.mark.parametrize("value, lo, hi, must", [
    (0, 1, 4096, "an integer in [1, 4096]"),
    (4097, 1, 4096, "an integer in [1, 4096]"),
    (0, 1, None, "an integer >= 1"),
    (-1, 0, None, "an integer >= 0"),
    (11, None, 10, "an integer <= 10"),
])
def test_check_int_refuses_values_beyond_its_bounds_wording_them(value, lo, hi, must):
    assert _message(check_int, "`n`", value, lo, hi) == f"`n` must be {must}; got {value}"


def test_check_int_with_an_open_upper_end():
    assert check_int("`seed`", 2**63 - 1, 0, 2**63, hi_open=True) == 2**63 - 1
    assert _message(check_int, "`seed`", 2**63, 0, 2**63, hi_open=True) == (
        f"`seed` must be an integer in [0, {2**63}); got {2**63}")


def test_check_int_shows_a_numpy_integer_beyond_its_bounds_as_the_python_int():
    assert _message(check_int, "`batch_size`", np.int64(0), 1, 4096) == (
        "`batch_size` must be an integer in [1, 4096]; got 0")


def test_check_int_optional_must_and_error():
    assert check_int("`max_concurrent`", None, 1, optional=True) is None
    assert _message(check_int, "`max_concurrent`", None, 1) == ("`max_concurrent` must be an integer >= 1; "
                                                                "got None")
    msg = _message(check_int, "`fit_maxiter`", 0, 1, optional=True, must="an integer >= 1 or null (no cap)")
    assert msg == "`fit_maxiter` must be an integer >= 1 or null (no cap); got 0"
    with pytest.raises(InputDataError, match=r"^q must be an integer >= 1; got 0$"):
        check_int("q", 0, 1, error=InputDataError)


# ---------------------------------------------------------------------------------------- float
@pytest.mark.parametrize("value", [0.5, 1, np.float32(0.25), np.float64(0.75), np.int64(1)])
def test_check_float_takes_python_and_numpy_numbers_and_returns_a_python_float(value):
    out = check_float("`x`", value, 0.0, 1.0)
    assert type(out) is float and out == float(value)


@pytest.mark.parametrize("value", [True, np.bool_(False), "0.5", None, [0.5], 1 + 0j])
def test_check_float_refuses_bools_strings_and_other_types(value):
    assert _message(check_float, "`tau`", value, 0.0, 1.0, lo_open=True, hi_open=True) == (
        f"`tau` must be a number in (0, 1); got {show(value)}")


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, 10**400])
def test_check_float_refuses_non_finite_values_and_integers_beyond_the_float_range(value):
    assert _message(check_float, "`x`", value) == f"`x` must be a number; got {show(value)}"


@pytest.mark.parametrize("lo_open, hi_open, inside, outside, must", [
    (True, True, [1e-12, 0.5, 1 - 1e-12], [0.0, 1.0], "a number in (0, 1)"),
    (True, False, [1e-12, 1.0], [0.0, 1.0 + 1e-12], "a number in (0, 1]"),
    (False, True, [0.0, 0.999], [-1e-12, 1.0], "a number in [0, 1)"),
    (False, False, [0.0, 1.0], [-1e-12, 1.0 + 1e-12], "a number in [0, 1]"),
])
def test_check_float_bounds_open_and_closed(lo_open, hi_open, inside, outside, must):
    for v in inside:
        assert check_float("`x`", v, 0.0, 1.0, lo_open=lo_open, hi_open=hi_open) == v
    for v in outside:
        assert _message(check_float, "`x`", v, 0.0, 1.0, lo_open=lo_open, hi_open=hi_open) == (
            f"`x` must be {must}; got {v!r}")


def test_check_float_words_a_half_bounded_range_and_formats_bounds_shortly():
    assert _message(check_float, "`eta`", 0, 0.0, lo_open=True) == "`eta` must be a number > 0; got 0"
    assert _message(check_float, "`m`", -1, 0.0) == "`m` must be a number >= 0; got -1"
    assert _message(check_float, "`t`", 0, 0.0, 86400.0, lo_open=True) == ("`t` must be a number in (0, "
                                                                           "86400]; got 0")
    assert _message(check_float, "`t`", 2e6, 0.0, 1e6) == "`t` must be a number in [0, 1e+06]; got 2000000.0"


def test_check_float_optional_must_and_error():
    assert check_float("`alpha`", None, 0.0, 1.0, optional=True) is None
    msg = _message(check_float, "`alpha`", 0, 0.0, 1.0, lo_open=True, optional=True, must="None or in (0, 1]")
    assert msg == "`alpha` must be None or in (0, 1]; got 0"
    with pytest.raises(InputDataError):
        check_float("beta", "x", error=InputDataError)


# ---------------------------------------------------------------------------------------- choice
def test_check_choice_takes_a_listed_string():
    assert check_choice("`direction`", "minimize", ("maximize", "minimize")) == "minimize"
    assert check_choice("`direction`", None, ("maximize", "minimize"), optional=True) is None


def test_check_choice_lists_the_choices_and_suggests_a_close_one():
    msg = _message(check_choice, "`direction`", "minimise", ("maximize", "minimize"), optional=True)
    assert msg == ("`direction` must be one of 'maximize', 'minimize', null; got 'minimise' (did you mean "
                   "'minimize'?)")
    assert _message(check_choice, "`direction`", 1, ("maximize", "minimize")) == (
        "`direction` must be one of 'maximize', 'minimize'; got 1")
    assert _message(check_choice, "`d`", None, ("a", "b")) == "`d` must be one of 'a', 'b'; got None"
    assert _message(check_choice, "`d`", "c", ("a", "b"), must="a or b", error=SpaceError) == ("`d` must be "
                                                                                               "a or b; got "
                                                                                               "'c'")
    assert suggest("qgibon", ["thompson", "qgibbon"]) == " (did you mean 'qgibbon'?)"
    assert suggest(3, ["3"]) == ""


# ---------------------------------------------------------------------------------------- plain data
def _config_refusal(where, problem, value):
    return ConfigError(f"{where}|{problem}|{value!r}")


def test_plain_data_copies_plain_data_with_numpy_numbers_as_python_ones():
    data = {"a": (1, 2.5, np.int64(3), np.float32(0.5), np.bool_(True)), "b": {"c": None, "d": "s"}}
    out = plain_data(data, "options", _config_refusal)
    assert out == {"a": [1, 2.5, 3, 0.5, True], "b": {"c": None, "d": "s"}}
    assert [type(v) for v in out["a"]] == [int, float, int, float, bool]
    assert out["b"] is not data["b"]


@pytest.mark.parametrize("data, where, problem", [
    ({"a": {1: 2}}, "options.a", "key"),
    ({"a": [0, {1, 2}]}, "options.a[1]", "type"),
    ({"a": np.zeros(2)}, "options.a", "type"),  # arrays only where the owner takes them
    ({"a": torch.zeros(2)}, "options.a", "type"),
    ({"a": np.bytes_(b"s")}, "options.a", "type"),
])
def test_plain_data_refuses_through_the_owners_refusal_naming_the_item(data, where, problem):
    with pytest.raises(ConfigError) as info:
        plain_data(data, "options", _config_refusal)
    assert str(info.value).split("|")[:2] == [where, problem]


def test_plain_data_budget_counts_every_value():
    plain_data({"a": [1, 2]}, "options", _config_refusal, budget=[4])  # the mapping, the list, two numbers
    with pytest.raises(ConfigError, match=re.escape("options.a[1]|size|")):
        plain_data({"a": [1, 2]}, "options", _config_refusal, budget=[3])


def test_plain_data_with_arrays_takes_numpy_arrays_tensors_and_any_numpy_scalar():
    def item(where, key):
        return f"{where}[{key!r}]"

    data = {"x": np.arange(3), "t": torch.tensor([0.5, 1.5]), "s": np.str_("s"), "n": {"k": np.float64(2.0)}}
    out = plain_data(data, "info", _config_refusal, arrays=True, child=item)
    assert out == {"x": [0, 1, 2], "t": [0.5, 1.5], "s": "s", "n": {"k": 2.0}}
    with pytest.raises(ConfigError, match=re.escape("info['n']['k']|type|")):
        plain_data({"n": {"k": object()}}, "info", _config_refusal, arrays=True, child=item)
