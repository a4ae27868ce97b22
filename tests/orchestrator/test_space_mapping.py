"""Search-space mapping <-> unit cube (orchestrator/space.py): the exact bin centres of int and choice
parameters, round trips of every grid value, clamping of out-of-cube coordinates, the bound tolerance of
float values, the default parameter type, and the checks on names, `n` and off-grid int values."""

from __future__ import annotations

import pytest
import torch

from orchestrator.errors import SpaceError
from orchestrator.space import ChoiceParam, FloatParam, IntParam, SearchSpace


# ---------------------------------------------------------------------------------------- float bounds
def test_float_value_beyond_the_relative_tolerance_is_refused():
    p = FloatParam("w", -2, 3)
    # the tolerance is 1e-9 of max(|low|, |high|) = 3e-9: 3.001 is far outside it
    with pytest.raises(SpaceError, match=r"outside \[-2, 3\]"):
        p.to_unit(3.001)
    with pytest.raises(SpaceError, match=r"outside \[-2, 3\]"):
        p.to_unit(-2.0001)


def test_float_value_within_rounding_of_a_bound_is_clamped():
    p = FloatParam("w", -2, 3)
    assert p.to_unit(3 + 1e-12) == 1.0
    assert p.to_unit(-2 - 1e-12) == 0.0
    assert p.to_unit(0.5) == pytest.approx(0.5)  # (0.5 - -2) / 5


def test_float_from_unit_clamps_outside_the_cube():
    p = FloatParam("w", -2, 3)
    assert p.from_unit(1.5) == 3.0
    assert p.from_unit(-0.5) == -2.0
    assert p.from_unit(0.2) == pytest.approx(-1.0)  # -2 + 0.2 * 5


# ---------------------------------------------------------------------------------------- int bins
def test_int_to_unit_is_the_centre_of_its_bin():
    p = IntParam("n", 0, 3)  # 4 values -> bins of width 1/4, centres 1/8, 3/8, 5/8, 7/8
    assert p.to_unit(0) == 0.125
    assert p.to_unit(1) == 0.375
    assert p.to_unit(3) == 0.875


def test_int_with_step_to_unit_is_the_centre_of_its_bin():
    p = IntParam("n", 10, 20, step=5)  # values 10, 15, 20 -> centres 1/6, 1/2, 5/6
    assert p.to_unit(15) == pytest.approx(0.5)
    assert p.to_unit(20) == pytest.approx(5 / 6)


def test_every_int_value_round_trips():
    p = IntParam("n", 0, 21)
    for v in range(0, 22):
        assert p.from_unit(p.to_unit(v)) == v


def test_fractional_int_value_is_not_on_the_grid():
    p = IntParam("n", 0, 10)
    with pytest.raises(SpaceError, match="not on the grid"):
        p.to_unit(2.5)
    with pytest.raises(SpaceError, match="not on the grid"):
        p.to_unit(3.4)


# ---------------------------------------------------------------------------------------- choice bins
def test_choice_to_unit_is_the_centre_of_its_bin():
    p = ChoiceParam("c", ("a", "b", "c", "d"))
    assert p.to_unit("a") == 0.125
    assert p.to_unit("b") == 0.375
    assert p.to_unit("d") == 0.875


@pytest.mark.parametrize("k", range(1, 51))
def test_every_choice_round_trips(k):
    p = ChoiceParam("c", tuple(f"v{i}" for i in range(k)))
    for c in p.choices:
        assert p.from_unit(p.to_unit(c)) == c


def test_choice_from_unit_clamps_outside_the_cube():
    p = ChoiceParam("c", ("a", "b", "c"))
    assert p.from_unit(-0.5) == "a"
    assert p.from_unit(1.5) == "c"
    assert p.from_unit(0.0) == "a"
    assert p.from_unit(1.0) == "c"


# ---------------------------------------------------------------------------------------- space
def test_spec_without_type_is_a_float():
    space = SearchSpace.from_description({"x": {"low": 0, "high": 1}})
    (p,) = space.params
    assert type(p) is FloatParam
    assert (p.low, p.high, p.log) == (0, 1, False)
    assert space.from_unit([[0.25]]) == [{"x": 0.25}]


def test_empty_parameter_name_is_refused():
    with pytest.raises(SpaceError, match="non-empty strings"):
        SearchSpace([FloatParam("", 0, 1)])


@pytest.mark.parametrize("n", [-1, -2])
def test_negative_sobol_count_is_refused(n):
    space = SearchSpace([FloatParam("x", 0, 1)])
    with pytest.raises(SpaceError, match=f"n must be >= 0; got {n}"):
        space.sobol(n)



def test_zero_sobol_points_are_an_empty_design():
    """`sobol(0)` is an empty `0 x d` design, as the `n >= 0` check promises (it raised inside torch's
    SobolEngine; found while writing these tests)."""
    space = SearchSpace([FloatParam("x", 0, 1), IntParam("n", 0, 4)])
    X = space.sobol(0, seed=3, dtype=torch.float32)
    assert X.shape == (0, 2) and X.dtype == torch.float32
