"""Objective protocol and registry: loading by name and by 'package.module:name', errors naming what was
wrong, and the contract every built-in of this group keeps (seeds, finiteness, out-of-space errors, no imports
from `orchestrator` or `workers`)."""

from __future__ import annotations

import math
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from objectives import EvalResult, Objective, ObjectiveError, SyntheticObjective, load_objective
from objectives.registry import BUILTIN_OBJECTIVES, available_objectives

REPO = Path(__file__).resolve().parents[2]
OWN = ["laser", "gld", "lunar-lander", "forrester", "ackley", "alpine", "six-hump-camel", "cosines", "beale",
       "mccormick", "powers", "cross-in-tray", "dropwave", "noisy-ackley"]
#: cheap options for the contract (stochastic variants of deterministic functions are tested too)
CASES = [(n, {}) for n in OWN] + [
    ("forrester", {"noise_std": 0.3}),
    ("beale", {"noise_std": 1.0, "heteroscedastic": True}),
    ("gld", {"dim": 6, "problem": 7}),
]


def _value(r) -> float:
    return r.value if isinstance(r, EvalResult) else float(r)


@pytest.fixture(scope="module")
def built() -> dict:
    out = {}
    for name, opts in CASES:
        if name == "lunar-lander":
            pytest.importorskip("Box2D", reason="the lunar lander needs gymnasium[box2d]")
        out[(name, tuple(sorted(opts.items())))] = load_objective(name, opts)
    return out


def _inside(obj: Objective) -> dict:
    """A point strictly inside the space (40% of the way up each range)."""
    return {k: s["low"] + 0.4 * (s["high"] - s["low"]) for k, s in obj.space.items()}


@pytest.mark.parametrize(
    "name,opts", CASES, ids=[f"{n}{'+' if o else ''}{'-'.join(map(str, o.values()))}" for n, o in CASES]
)
def test_contract(built, name, opts):
    obj = built[(name, tuple(sorted(opts.items())))]
    assert isinstance(obj, Objective) and obj.space and obj.direction in ("maximize", "minimize")
    assert all(s["type"] == "float" and s["low"] < s["high"] for s in obj.space.values())
    p = _inside(obj)
    a, b, c = _value(obj(p, seed=1)), _value(obj(p, seed=1)), _value(obj(p, seed=2))
    assert math.isfinite(a) and math.isfinite(c)
    assert a == b  # same seed, same value
    if obj.noisy:
        assert a != c  # different seeds, different values
    else:
        assert a == c  # deterministic: the seed is irrelevant
    # out of space, missing and unknown parameters are rejected with the parameter's name, by __call__ and
    # evaluate
    first = next(iter(obj.space))
    high = obj.space[first]["high"]
    bad = {**p, first: high + 1.0 + abs(high)}
    for call in (obj, obj.evaluate):
        with pytest.raises(ObjectiveError, match=f"'{first}'.*outside"):
            call(bad, 0)
        with pytest.raises(ObjectiveError, match="missing.*" + re.escape(first)):
            call({k: v for k, v in p.items() if k != first}, 0)
        with pytest.raises(ObjectiveError, match="unknown.*nonsense"):
            call({**p, "nonsense": 1.0}, 0)
    if isinstance(obj, SyntheticObjective):
        q10, q90 = obj.quantile(p, 0.1), obj.quantile(p, 0.9)
        assert math.isfinite(q10) and (q10 < q90 if obj.noisy else q10 == q90)


def test_every_registry_entry_of_this_group_names_a_real_class():
    for name in OWN:
        module, _, attr = BUILTIN_OBJECTIVES[name][0].partition(":")
        cls = getattr(__import__(module, fromlist=[attr]), attr)
        assert isinstance(cls, type) and issubclass(cls, Objective), name
    assert set(OWN) <= set(available_objectives())


def test_load_by_name_and_by_path_with_options():
    f = load_objective("forrester", {"noise_std": 0.5})
    g = load_objective("objectives.functions:Forrester", {"noise_std": 0.5})
    assert type(f) is type(g) and f.noise_std == g.noise_std == 0.5
    assert load_objective("gld", {"dim": 2, "problem": 3}).dim == 2


def test_user_objectives_by_path(tmp_path, monkeypatch):
    (tmp_path / "my_obj.py").write_text(textwrap.dedent("""
        from objectives import Objective

        class Quad(Objective):
            space = {"x": {"type": "float", "low": -1.0, "high": 1.0}}
            noisy = False
            def __init__(self, shift=0.0):
                self.shift = shift
            def evaluate(self, params, seed):
                return -(params["x"] - self.shift) ** 2

        def make(shift=0.5):
            return Quad(shift)

        INSTANCE = Quad(0.25)
        NOT_AN_OBJECTIVE = 3
        def make_wrong():
            return "nope"
        def plain(params, seed):
            return params["x"]
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    assert load_objective("my_obj:Quad", {"shift": 0.1})({"x": 0.1}) == 0.0
    assert load_objective("my_obj:make")({"x": 0.5}) == 0.0
    inst = load_objective("my_obj:INSTANCE")
    assert inst.shift == 0.25
    with pytest.raises(ObjectiveError, match="instance and takes no options"):
        load_objective("my_obj:INSTANCE", {"shift": 1})
    with pytest.raises(ObjectiveError, match="neither an Objective nor a factory"):
        load_objective("my_obj:NOT_AN_OBJECTIVE")
    with pytest.raises(ObjectiveError, match="built a str, not an Objective"):
        load_objective("my_obj:make_wrong")
    # an evaluation function is not refused with "bad options" for a config that gives none
    with pytest.raises(ObjectiveError, match="'my_obj:plain' is a callable that needs arguments .*wrap an "
                                             "evaluation function in an Objective subclass"):
        load_objective("my_obj:plain")
    with pytest.raises(ObjectiveError, match="bad options for objective 'my_obj:Quad'.*colour"):
        load_objective("my_obj:Quad", {"colour": "red"})
    with pytest.raises(ObjectiveError, match="has no attribute 'Nope'"):
        load_objective("my_obj:Nope")
    # a user module that fails while it loads is an ObjectiveError naming it, not a bare SyntaxError
    (tmp_path / "broken_obj.py").write_text("def f(:\n    pass\n")
    with pytest.raises(ObjectiveError, match="module 'broken_obj' of objective 'broken_obj:X' fails to "
                                             "import: SyntaxError"):
        load_objective("broken_obj:X")


def test_registry_errors_name_the_problem():
    with pytest.raises(ObjectiveError, match="unknown objective 'lazer'.*'laser'"):
        load_objective("lazer")
    with pytest.raises(ObjectiveError, match="cannot import module 'no_such_pkg.mod'"):
        load_objective("no_such_pkg.mod:Thing")
    with pytest.raises(ObjectiveError, match="must look like 'package.module:name'"):
        load_objective("objectives.functions:")
    with pytest.raises(ObjectiveError, match="bad options for objective 'forrester'.*wiggle"):
        load_objective("forrester", {"wiggle": 1})
    # option values are checked by the objectives themselves, naming the option
    with pytest.raises(ObjectiveError, match="noise_std"):
        load_objective("forrester", {"noise_std": -2})
    with pytest.raises(ValueError):  # ObjectiveError is a ValueError: callers catching ValueError still work
        load_objective("gld", {"dim": "three"})


def test_objectives_package_imports_nothing_from_orchestrator_or_workers():
    code = (
        "import sys, objectives, objectives.functions, objectives.gld, objectives.laser, "
        "objectives.lunar_lander\nbad = sorted(m for m in sys.modules if m.split('.')[0] in ('orchestrator', "
        "'workers'))\nassert not bad, bad\n"
    )
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    for f in ("functions.py", "gld.py", "laser.py", "lunar_lander.py"):
        src = (REPO / "objectives" / f).read_text()
        assert "import orchestrator" not in src and "from orchestrator" not in src and "workers" not in src, f


def test_resources_refuse_what_ray_would_refuse_at_every_submission():
    """Ray rejects a negative quantity or a custom resource named CPU/GPU when a task is submitted; the run
    then retried its submissions forever. They are refused when the objective is built, naming the option."""
    from objectives.base import Resources

    for bad, match in (({"custom": {"CPU": 1}}, "custom resource name 'CPU'"),
                       ({"custom": {"sensor": -1}}, "custom resource 'sensor' must be a finite number >= 0"),
                       ({"num_gpus": float("nan")}, "num_gpus must be a finite number >= 0"),
                       ({"memory": -5}, "memory must be a finite number >= 0")):
        with pytest.raises(ObjectiveError, match=match):
            Resources(**bad)
    with pytest.raises(ObjectiveError, match="custom resource 'sensor'"):
        load_objective("sleep", {"custom_resources": {"sensor": -1}})
    assert Resources(num_cpus=0.5, custom={"sensor": 1}).to_ray_options()["resources"] == {"sensor": 1}


def test_params_accept_numpy_numbers_and_a_bool_is_not_a_numeric_choice():
    """np.int64 (a pandas frame's ints) and np.float32 (a float32 tensor's) are numbers, not refused as "must
    be a finite number" (np.float64 subclasses float; they do not). And `True` is not taken for the choice 1
    (True == 1)."""
    import numpy as np

    from objectives.base import check_params

    cnn = load_objective("cnn")
    params = {"batch_size": np.int64(64), "learning_rate": np.float32(0.01), "lr_decay": 1e-5, "l2": 1e-5,
              "fc_units": np.int32(256), "conv_channels": 128}
    cnn.check_params(params)
    assert load_objective("forrester")({"x0": np.float32(0.5)}, 0) == pytest.approx(0.9092974268256817)
    check_params({"x": {"type": "float", "low": 0.1, "high": 0.3}}, {"x": np.float32(0.3)})  # 0.3 + 1.2e-8
    with pytest.raises(ObjectiveError, match=r"'x'=(np\.float32\()?0\.31\)? is outside \[0\.1, 0\.3\]"):
        check_params({"x": {"type": "float", "low": 0.1, "high": 0.3}}, {"x": np.float32(0.31)})
    with pytest.raises(ObjectiveError, match=r"is outside"):
        # a float64 stays tight
        check_params({"x": {"type": "float", "low": 0.1, "high": 0.3}}, {"x": 0.3 + 1e-8})
    for bad in (np.bool_(True), True, "0.5", float("nan"), np.float32("inf")):
        with pytest.raises(ObjectiveError, match="'x0' must be a finite number"):
            load_objective("forrester").check_params({"x0": bad})
    space = {"k": {"type": "choice", "choices": [1, 2]}, "b": {"type": "choice", "choices": [True, False]}}
    check_params(space, {"k": np.int64(2), "b": False})
    with pytest.raises(ObjectiveError, match=r"'k'=True is not one of \[1, 2\]"):
        check_params(space, {"k": True, "b": True})
    with pytest.raises(ObjectiveError, match=r"'b'=1 is not one of \[True, False\]"):
        check_params(space, {"k": 1, "b": 1})


def test_one_seed_rule_for_every_objective():
    """Every objective checks its seed alike: seed -1 does not give the sleep objective a bare NumPy
    ValueError, nor 2**64 the CNN a torch "Overflow when unpacking long long", while GLD, laser and LDA take
    any integer."""
    import numpy as np

    for name, params in (
        ("sleep", {"x0": 0.3, "x1": 0.3}),
        ("forrester", {"x0": 0.5}),
        ("gld", {"x0": 0.5, "x1": 0.5, "x2": 0.5}),
    ):
        obj = load_objective(name, {"mean_s": 0.0} if name == "sleep" else {})
        for bad in (-1, 2**63, 2**64, 1.0, True, "3"):
            with pytest.raises(ObjectiveError, match=r"seed must be an integer in \[0, 2\*\*63\); got "
                                                     rf"{re.escape(repr(bad))}"):
                obj(params, bad)
        obj(params, np.int64(7))
        obj(params, 2**63 - 1)
