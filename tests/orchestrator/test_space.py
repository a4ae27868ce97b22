"""Search space: unit-cube round trips, Sobol design, and validation errors naming the culprit."""

import math

import numpy as np
import pytest
import torch

from orchestrator.errors import SpaceError
from orchestrator.space import ChoiceParam, FloatParam, IntParam, SearchSpace

DESC = {
    "lr": {"type": "float", "low": 1e-7, "high": 0.1, "log": True},
    "width": {"type": "float", "low": -2.0, "high": 3.0},
    "batch": {"type": "int", "low": 32, "high": 512, "step": 32},
    "minibatch": {"type": "int", "low": 1, "high": 128, "log": True},
    "opt": {"type": "choice", "choices": ["adam", "sgd", 3, True]},
}


@pytest.fixture
def space():
    return SearchSpace.from_description(DESC)


def test_round_trip_params_to_unit_and_back(space):
    X = space.sobol(64, seed=1)
    assert X.shape == (64, 5) and X.dtype == torch.float64
    assert ((X >= 0) & (X <= 1)).all()
    pts = space.from_unit(X)
    assert torch.allclose(space.to_unit(pts), X)  # Sobol points are snapped onto the grid already
    for p in pts:
        assert 1e-7 <= p["lr"] <= 0.1 and -2 <= p["width"] <= 3
        assert p["batch"] in range(32, 513, 32) and isinstance(p["batch"], int)
        assert 1 <= p["minibatch"] <= 128 and isinstance(p["minibatch"], int)
        assert p["opt"] in ["adam", "sgd", 3, True]
    assert space.from_unit(space.to_unit(pts)) == pts


def test_every_grid_value_is_reachable(space):
    u = torch.linspace(0, 1, 2001, dtype=torch.float64)
    X = torch.stack([u] * 5, dim=-1)
    pts = space.from_unit(X)
    assert {p["batch"] for p in pts} == set(range(32, 513, 32))
    assert {p["minibatch"] for p in pts} == set(range(1, 129))
    assert [p["opt"] for p in pts[::400]][0] == "adam" and pts[-1]["opt"] is True


def test_log_float_is_uniform_in_log_space():
    p = FloatParam("lr", 1e-4, 1e-0, log=True)
    assert p.to_unit(1e-2) == pytest.approx(0.5)
    assert p.from_unit(0.25) == pytest.approx(1e-3)


def test_log_int_is_uniform_in_log_space():
    """Log ints map log-linearly (round trips and reachability alone hold for a linear map too). Each value's
    cell runs from v - 0.5 to v + 0.5 in log space: 1..128 spans [0.5, 128.5)."""
    p = IntParam("n", 1, 128, log=True)
    assert p.from_unit(0.5) == round(math.sqrt(0.5 * 128.5)) == 8  # a linear map gives 64
    values = [p.from_unit(u) for u in np.linspace(0, 1, 10_001)]
    share = sum(v <= 4 for v in values) / len(values)  # [0.5, 4.5) of [0.5, 128.5) in log space
    assert share == pytest.approx(math.log(9) / math.log(257), abs=2e-4)  # 10,001 points
    assert p.to_unit(8) == pytest.approx(math.log(16) / math.log(257))
    assert p.to_unit(1) == pytest.approx(math.log(2) / math.log(257))


def test_sobol_is_reproducible_and_space_filling(space):
    assert torch.equal(space.sobol(16, seed=3), space.sobol(16, seed=3))
    assert not torch.equal(space.sobol(16, seed=3), space.sobol(16, seed=4))
    X = SearchSpace([FloatParam("a", 0, 1), FloatParam("b", 0, 1)]).sobol(256, seed=0)
    # every cell of a 4 x 4 grid holds exactly 16 of 256 scrambled Sobol points
    cells = (X * 4).floor().long().clamp_max(3)
    counts = torch.bincount(cells[:, 0] * 4 + cells[:, 1], minlength=16)
    assert torch.all(counts == 16)


@pytest.mark.parametrize(
    "desc, match",
    [
        ({}, "search space is empty"),
        ({"a": {"type": "float", "low": 1.0, "high": 1.0}}, "'a': low must be < high; got low=1.0, high=1.0"),
        ({"a": {"type": "float", "low": 2.0, "high": 1.0}}, "'a': low must be < high"),
        ({"a": {"type": "float", "low": 0.0, "high": 1.0, "log": True}}, "'a': a log parameter needs low > "
                                                                         "0; got low=0.0"),
        ({"a": {"type": "float", "low": -1.0, "high": 1.0, "log": True}}, "'a': a log parameter needs low > "
                                                                          "0"),
        ({"a": {"type": "float", "low": float("nan"), "high": 1.0}}, "'a': low must be a finite number"),
        ({"a": {"type": "int", "low": 0, "high": 10, "step": 3}}, "'a': high - low \\(10 - 0\\) must be a "
                                                                  "multiple of step 3"),
        ({"a": {"type": "int", "low": 0.5, "high": 10}}, "'a': low must be an integer"),
        ({"a": {"type": "choice", "choices": []}}, "'a': choices must not be empty"),
        ({"a": {"type": "choice", "choices": [1, 1]}}, "'a': duplicate choices"),
        # 1.0's bin could never be chosen (to_unit maps 1.0 to 1's)
        ({"a": {"type": "choice", "choices": [1, "x", 1.0]}}, "'a': duplicate choices"),
        ({"a": {"type": "vector", "low": 0, "high": 1}}, "'a': type must be one of"),
        ({"a": {"type": "float", "low": 0, "high": 1, "lg": True}}, "'a': unknown key\\(s\\) \\['lg'\\]"),
        ({"a": {"type": "float", "low": 0}}, "'a': missing key 'high'"),
        # refused: accepted, every proposal would be +-inf (a float) or off the grid (an int past 2**53)
        ({"a": {"type": "float", "low": -1e308, "high": 1e308}}, "'a': high - low must be a finite float64"),
        # a set's order (so each choice's unit cell) changes with PYTHONHASHSEED
        ({"a": {"type": "choice", "choices": {"adam", "sgd"}}}, "'a': choices must be a list"),
        ({"a": {"type": "int", "low": 0, "high": 2**60 - 1}}, "'a': an int parameter's bounds must lie "
                                                              "within"),
        ({"a": {"type": "int", "low": -(2**53) - 2, "high": 0}}, "'a': an int parameter's bounds must lie "
                                                                 "within"),
        # within the bounds above, 2**53 values still move off the grid (cells of 2**-54)
        ({"a": {"type": "int", "low": -(2**52), "high": 2**52}}, "'a': an int parameter may hold at most "
                                                                 "2\\*\\*52 values"),
        # the top values of a log int to 1e15 do not map back to themselves (2,578 of 3,000)
        ({"a": {"type": "int", "low": 1, "high": 10**15, "log": True}}, "'a': a log int parameter's high "
                                                                        "must be at most 2"),
    ],
)
def test_bad_spaces_raise_naming_the_parameter(desc, match):
    with pytest.raises(SpaceError, match=match):
        SearchSpace.from_description(desc)


def test_duplicate_names_rejected():
    with pytest.raises(SpaceError, match="duplicate parameter name\\(s\\) \\['x'\\]"):
        SearchSpace([FloatParam("x", 0, 1), IntParam("x", 0, 3)])


def test_points_outside_the_space_name_row_and_parameter(space):
    good = space.from_unit(space.sobol(3, seed=0))
    bad = [dict(p) for p in good]
    bad[2]["width"] = 7.5
    with pytest.raises(SpaceError, match="point 2: parameter 'width'=7.5 is outside \\[-2.0, 3.0\\]"):
        space.to_unit(bad)
    bad = [dict(good[0], batch=33)]
    with pytest.raises(SpaceError, match="point 0: parameter 'batch'=33 is not on the grid 32:512:32"):
        space.to_unit(bad)
    bad = [dict(good[0], opt="rmsprop")]
    with pytest.raises(SpaceError, match="'opt'='rmsprop' is not one of"):
        space.to_unit(bad)
    bad = [dict(good[0], lr=float("nan"))]
    with pytest.raises(SpaceError, match="point 0: parameter 'lr' must be finite"):
        space.to_unit(bad)
    with pytest.raises(SpaceError, match="point 0: missing \\['opt'\\], unknown \\['optimizer'\\]"):
        space.to_unit([{**{k: v for k, v in good[0].items() if k != "opt"}, "optimizer": "adam"}])
    with pytest.raises(SpaceError, match="row 1 of the unit-cube points is not finite"):
        space.from_unit(torch.tensor([[0.5] * 5, [math.nan] * 5]))
    with pytest.raises(SpaceError, match="expected an `n x 5` array; got shape \\(2, 3\\)"):
        space.from_unit(torch.zeros(2, 3))


def test_choice_distinguishes_bool_from_int():
    p = ChoiceParam("c", (1, True))
    assert p.to_unit(1) != p.to_unit(True)


def test_describe_round_trips(space):
    assert SearchSpace.from_description(space.describe()).describe() == space.describe()


# ------------------------------------------------------------------ edge cases
def test_log_float_bounds_map_exactly_and_never_outside():
    """exp(log(.)) lands a few ulps outside the bounds (CNN's learning rate [1e-7, 0.1]: 0.10000000000000006
    at u = 1); the values stay inside, and to_unit of a value within the tolerance stays in the unit cube."""
    p = FloatParam("lr", 1e-7, 0.1, log=True)
    assert p.from_unit(1.0) == 0.1 and p.from_unit(0.0) == 1e-7
    for u in torch.rand(2000, dtype=torch.float64).tolist() + [0.0, 1.0]:
        v = p.from_unit(u)
        assert 1e-7 <= v <= 0.1 and 0.0 <= p.to_unit(v) <= 1.0
    tiny = FloatParam("x", 1e-12, 1e-10, log=True)
    with pytest.raises(SpaceError, match=r"'x'=1e-09 is outside"):
        tiny.to_unit(1e-9)  # the tolerance scales with the bounds, not with 1
    with pytest.raises(SpaceError, match=r"'y'=0.0 is outside"):
        FloatParam("y", 1e-10, 1.0, log=True).to_unit(0.0)  # was a bare 'math domain error'


def test_int_values_outside_the_range_are_refused_exactly():
    with pytest.raises(SpaceError, match=r"'n'=-1(\.0)? is outside"):
        IntParam("n", 0, 10**9).to_unit(-1)  # was mapped to -5e-10, outside the unit cube
    with pytest.raises(SpaceError, match=r"'k'=0(\.0)? is outside"):
        IntParam("k", 1, 10**10, log=True).to_unit(0)  # was a bare 'math domain error'


def test_a_huge_int_range_is_not_materialized():
    """`to_unit`/`from_unit` count the grid instead of building it: 10**12 values would take terabytes."""
    p = IntParam("n", 0, 10**12, step=2)
    assert p.size == 5 * 10**11 + 1
    assert p.from_unit(1.0) == 10**12 and p.from_unit(0.0) == 0
    assert 0.0 < p.to_unit(10**12) < 1.0
    space = SearchSpace([p])
    assert space.sobol(200).shape == (200, 1)


@pytest.mark.parametrize("log", ["false", 2, None])
def test_log_must_be_a_boolean(log):
    with pytest.raises(SpaceError, match=r"parameter 'x': log must be true or false"):
        SearchSpace.from_description({"x": {"type": "float", "low": 0.1, "high": 1.0, "log": log}})


def test_choices_given_as_a_mapping_are_refused():
    with pytest.raises(SpaceError, match="choices must be a list"):
        SearchSpace.from_description({"c": {"type": "choice", "choices": {"a": 1, "b": 2}}})


def test_choices_that_would_not_come_back_from_a_runs_log_are_refused_for_runs_only():
    """Tuple choices would pass the driver's checks, then the central actor, which rebuilds the space from
    config.yaml (where a tuple is a list), would refuse a `space` key the user never wrote; and a function as
    a choice would fail only when the run directory is written, after Ray has started. A run's space is
    checked (`check_loggable`, from `ExperimentConfig.build_space`); the library, which keeps no log, takes
    any choice."""
    import enum
    import math

    from orchestrator.space import check_loggable

    class Act(enum.IntEnum):
        RELU = 1

    with pytest.raises(SpaceError, match=r"parameter 'arch': choice \(64, 64\) would not come back the same "
                                         r".*write the tuple \(64, 64\) as the list \[64, 64\]"):
        check_loggable(
            SearchSpace.from_description({"arch": {"type": "choice", "choices": [(64, 64), (128,)]}})
        )
    for bad in ((math.sin, math.cos), ({1: "a"},), (Act.RELU, 2), ([1, (2, 3)],)):
        with pytest.raises(SpaceError, match="would not come back"):
            check_loggable(SearchSpace([ChoiceParam("c", bad)]))
    # NumPy numbers inside list choices are plain numbers, not refused as if not numbers
    nested = SearchSpace.from_description(
        {"arch": {"type": "choice", "choices": [[np.int64(64)], {"w": np.float32(0.5)}]}}
    )
    check_loggable(nested)
    assert nested.params[0].choices == ([64], {"w": 0.5}) and type(nested.params[0].choices[0][0]) is int
    space = SearchSpace.from_description(
        {"arch": {"type": "choice", "choices": [[64, 64], [128], None, {"a": [1]}]}}
    )
    check_loggable(space)
    assert space.from_unit(torch.tensor([[0.1]], dtype=torch.float64))[0] == {"arch": [64, 64]}
    # the library keeps tuples and classes as they are
    lib = SearchSpace.from_description({"arch": {"type": "choice", "choices": [(3, 3), torch.nn.ReLU]}})
    assert lib.from_unit(torch.tensor([[0.9]], dtype=torch.float64))[0] == {"arch": torch.nn.ReLU}


def test_numpy_choices_come_back_as_plain_values():
    """`choices: np.linspace(...)` gives params of Python floats, not np.float64, which JSON and weights-only
    checkpoints (get_state) refuse."""
    import json

    space = SearchSpace.from_description({"d": {"type": "choice", "choices": np.linspace(0, 0.5, 6)},
                                          "w": {"type": "choice", "choices": np.array([32, 64])}})
    params = space.from_unit(torch.tensor([[0.45, 0.9]], dtype=torch.float64))[0]
    assert params == {"d": 0.2, "w": 64} and type(params["d"]) is float and type(params["w"]) is int
    json.dumps(params)
    with pytest.raises(SpaceError, match="choices must be a list or tuple; got a set"):
        ChoiceParam("c", {1, 2})


def test_an_int_range_of_2_to_the_52_values_round_trips():
    p = IntParam("n", 0, 2**52 - 1)
    for v in (0, 7, 12345, 2**51 + 3, 2**52 - 1):
        assert p.from_unit(p.to_unit(v)) == v


@pytest.mark.parametrize("step", [0, -2])
def test_a_step_below_one_is_refused_by_the_space_and_the_config(step):
    """The step check runs before the value-count check, which would divide by a step of 0."""
    from orchestrator.config import load_config
    from orchestrator.errors import ConfigError

    with pytest.raises(SpaceError, match=rf"parameter 'n': step must be >= 1; got {step}"):
        IntParam("n", 0, 10, step=step)
    cfg = {
        "objective": "forrester",
        "budget": 10,
        "space": {"x": {"type": "int", "low": 0, "high": 10, "step": step}},
    }
    with pytest.raises(ConfigError, match=r"space\.x.*step must be >= 1"):
        load_config(cfg)


@pytest.mark.parametrize("param", [
    IntParam("a", 0, 999), IntParam("b", 5, 30, step=5), IntParam("c", 1, 100_000, log=True),
    IntParam("d", 1, 7, log=True), IntParam("e", -3, 3), ChoiceParam("f", ("x", None, 2.5, [1])),
])
def test_cell_index_is_the_value_from_unit_rounds_to(param):
    """`cell_index` (the vectorized cell of a unit coordinate, by which `ask` tells points apart) gives the
    index of the value `from_unit` returns, at random coordinates, the ends, every cell's centre and just
    beside its edges."""
    rng = np.random.default_rng(0)
    values = param.values.tolist() if isinstance(param, IntParam) else list(param.choices)
    centres = np.array([param.to_unit(v) for v in values])
    edges = (centres[1:] + centres[:-1]) / 2
    u = np.concatenate(
        [
            rng.uniform(size=2000),
            [0.0, 1.0, -0.1, 1.1],
            centres,
            np.nextafter(edges, 0),
            np.nextafter(edges, 1),
        ]
    )
    idx = param.cell_index(u)
    assert idx.dtype == np.int64 and idx.shape == u.shape
    assert [values[i] for i in idx] == [param.from_unit(x) for x in u]
    assert np.array_equal(param.cell_index(centres), np.arange(len(values)))


def test_a_log_int_up_to_its_largest_high_maps_back_to_itself():
    """The values of a log int parameter at the bound (2**44) and below map to the unit interval and back to
    themselves, so `ask`'s cells (`cell_index`) are its values; 10**15 did not (refused above)."""
    p = IntParam("k", 1, 2**44, log=True)
    top = range(2**44 - 3000, 2**44 + 1)
    assert all(p.from_unit(p.to_unit(v)) == v for v in top)
    u = np.array([p.to_unit(v) for v in top])
    assert np.array_equal(p.cell_index(u) + 1, np.arange(2**44 - 3000, 2**44 + 1))
