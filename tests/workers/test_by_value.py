"""A plain callable as an objective (workers/by_value.py): `CallableObjective` calls `fn(params)` or
`fn(params, seed)`, `ByValue` carries it as cloudpickle bytes that only the sandbox child unpickles, and a
child
serves every evaluation of the same bytes. No Ray: `evaluate_once` in this process, both isolation modes."""

from __future__ import annotations

import math
import os
import pickle

import pytest

from objectives.base import EvalResult, ObjectiveError, Resources
from objectives.registry import load_objective
from workers.by_value import CALLABLE_OBJECTIVE, ByValue, CallableObjective
from workers.evaluate import evaluate_once

SPACE = {"x": {"type": "float", "low": 0.0, "high": 1.0}}


def _run(fn, isolate="process", params=None, seed=7):
    return evaluate_once(ByValue.of(CallableObjective(SPACE, fn=fn)), "t", params or {"x": 0.25}, seed,
                         timeout_s=30, isolate=isolate)


@pytest.mark.parametrize("isolate", ["process", "thread"])
def test_a_lambda_a_seeded_function_and_an_eval_result(isolate):
    assert _run(lambda p: 2 * p["x"], isolate).value == 0.5

    def seeded(params, seed):
        return float(seed)

    assert _run(seeded, isolate, seed=11).value == 11.0

    def by_keyword(params, *, seed):
        return seed + params["x"]

    assert _run(by_keyword, isolate, seed=3).value == 3.25
    rec = _run(lambda p: EvalResult(1.5, {"loss": 0.1}), isolate)
    assert rec.status == "completed" and rec.value == 1.5 and rec.metrics == {"loss": 0.1}


class Counter:
    """A callable object with state: built once per sandbox child, so its count goes on across evaluations."""

    def __init__(self):
        self.calls = 0

    def __call__(self, params):
        self.calls += 1
        return float(self.calls)


def test_a_callable_object_is_served_by_one_child():
    bv = ByValue.of(CallableObjective(SPACE, fn=Counter()))
    again = ByValue(bv.payload, bv.key, bv.label)  # what the next task brings: equal bytes, another object
    recs = [evaluate_once(b, f"t{i}", {"x": 0.5}, i, timeout_s=30) for i, b in enumerate([bv, again, bv])]
    assert [r.value for r in recs] == [1.0, 2.0, 3.0]
    assert len({r.child_pid for r in recs}) == 1 and recs[0].child_pid != os.getpid()


@pytest.mark.parametrize("isolate", ["process", "thread"])
def test_a_raise_and_a_nan_are_failed_trials(isolate):
    def boom(params):
        raise RuntimeError("no beam")

    rec = _run(boom, isolate)
    assert rec.status == "failed" and rec.error == "exception" and "no beam" in rec.message
    assert "RuntimeError" in rec.traceback
    rec = _run(lambda p: math.nan, isolate)
    assert rec.status == "failed" and rec.error == "nan"


def test_bytes_that_do_not_unpickle_are_a_failed_trial_not_a_crash():
    bad = ByValue(b"not a pickle", "0" * 64, "broken")
    rec = evaluate_once(bad, "t", {"x": 0.5}, 0, timeout_s=30)
    assert rec.status == "failed" and rec.error == "exception"
    assert "loading the objective failed" in rec.message
    not_objective = pickle.dumps({"x": 1})
    rec = evaluate_once(ByValue(not_objective, "1" * 64, "dict"), "t", {"x": 0.5}, 0, timeout_s=30)
    assert rec.status == "failed" and "not an Objective" in rec.message


def test_params_outside_the_space_are_refused_before_fn_runs():
    rec = _run(lambda p: 1.0, "thread", params={"x": 2.0})
    assert rec.status == "failed" and "outside" in rec.message


def test_the_stand_in_is_what_the_config_names_and_refuses_to_evaluate():
    obj = CallableObjective(SPACE, "minimize", {"num_cpus": 0.5}, fn=lambda p: 1.0)
    stand_in = load_objective(CALLABLE_OBJECTIVE, obj.options())  # what the central actor builds
    assert stand_in.space == SPACE and stand_in.direction == "minimize"
    assert stand_in.resources == Resources(num_cpus=0.5)
    with pytest.raises(ObjectiveError, match="qbatch.optimize"):
        stand_in({"x": 0.5}, 0)


def test_bad_arguments_name_what_is_wrong():
    with pytest.raises(ObjectiveError, match="callable"):
        CallableObjective(SPACE, fn=3)
    with pytest.raises(ObjectiveError, match="direction"):
        CallableObjective(SPACE, "up", fn=lambda p: 1.0)
    with pytest.raises(ObjectiveError, match="resources"):
        CallableObjective(SPACE, resources={"cpus": 1}, fn=lambda p: 1.0)
    import threading

    lock = threading.Lock()
    with pytest.raises(ObjectiveError, match="cannot be sent to the workers"):
        ByValue.of(CallableObjective(SPACE, fn=lambda p: lock.locked()))


def test_a_function_of_the_users_own_module_travels_by_value(tmp_path, monkeypatch):
    """A module beside the script (or on a path a notebook added) need not be importable where the workers
    run; an installed package's function still goes by reference, and the registration is undone."""
    import subprocess
    import sys

    import ray.cloudpickle as cloudpickle

    (tmp_path / "beside_script.py").write_text("OFFSET = 3.0\n\ndef f(params):\n    return params['x'] + "
                                               "OFFSET\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import beside_script

    bv = ByValue.of(CallableObjective(SPACE, fn=beside_script.f))
    assert "beside_script" not in cloudpickle.cloudpickle._PICKLE_BY_VALUE_MODULES
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "payload.pkl").write_bytes(bv.payload)
    code = ("import pickle, sys; from pathlib import Path; "
            "obj = pickle.loads(Path('payload.pkl').read_bytes()); "
            "assert 'beside_script' not in sys.modules; print(obj({'x': 0.5}, 0))")
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=elsewhere,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p != str(tmp_path))},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "3.5"
    import json

    by_reference = ByValue.of(CallableObjective(SPACE, fn=json.dumps))
    assert len(by_reference.payload) < 400  # a reference to json.dumps, not its code
