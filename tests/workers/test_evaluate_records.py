"""What one record of `evaluate_once` (workers/evaluate.py) holds, in both isolation modes.

Checks that the timeout is `timeout_s` itself (not a multiple of it), that a `(name, options)` spec whose
options differ is a different objective, that a failed value keeps its metrics, that an objective raising
a BaseException (SystemExit) is an "exception" record, that bool metrics stay bools, and that the seed
reaches the objective. Objectives defined here are inherited by the forked sandbox child (no pickling).
"""

from __future__ import annotations

import time

import pytest

from objectives.base import EvalResult, Objective
from tests.workers.test_evaluate import SPACE, Hanging, Returning
from workers.evaluate import evaluate_once

ISOLATE = pytest.mark.parametrize("isolate", ["process", "thread"])


class Exits(Objective):
    """Raises SystemExit(3), a BaseException that is not an Exception."""

    space = SPACE

    def evaluate(self, params, seed):
        raise SystemExit(3)


class SeedValue(Objective):
    """Returns its seed as the value."""

    space = SPACE

    def evaluate(self, params, seed):
        return float(seed)


@ISOLATE
def test_the_timeout_is_timeout_s(isolate):
    t0 = time.time()
    rec = evaluate_once(Hanging(), "0-0", {"x": 0.5}, seed=0, timeout_s=1.0, isolate=isolate)
    wall = time.time() - t0
    assert rec.status == "failed" and rec.error == "timeout"
    took = rec.ended_at - rec.started_at
    # ended at the 1 s timeout plus the kill (slack for a busy 2-core machine); three times it would be 3 s
    assert 1.0 <= took < 2.5, took
    assert wall < 2.5 + 5.0  # (forking the sandbox may take a moment on a busy machine)


@ISOLATE
def test_spec_options_make_another_objective(isolate):
    params = {"x0": 0.3, "x1": 0.3}
    ok = evaluate_once(
        ("sleep", {"mean_s": 0.0, "noise": 0.0}), "0-0", params, seed=1, timeout_s=30, isolate=isolate
    )
    assert ok.status == "completed" and ok.value == pytest.approx(0.0)
    # the same objective with fail_rate 1: every evaluation returns NaN
    bad = evaluate_once(("sleep", {"mean_s": 0.0, "noise": 0.0, "fail_rate": 1.0}), "0-1", params, seed=1,
                        timeout_s=30, isolate=isolate)
    assert bad.status == "failed" and bad.error == "nan"
    assert bad.metrics == {"delay_s": 0.0}
    # and the first spec again is still the one without failures
    again = evaluate_once(("sleep", {"mean_s": 0.0, "noise": 0.0}), "0-2", params, seed=2, timeout_s=30,
                          isolate=isolate)
    assert again.status == "completed" and again.value == pytest.approx(0.0)


@ISOLATE
def test_a_failed_value_keeps_its_metrics(isolate):
    rec = evaluate_once(
        Returning(EvalResult(float("nan"), {"loss": 0.5})),
        "0-0",
        {"x": 0.5},
        seed=0,
        timeout_s=30,
        isolate=isolate,
    )
    assert rec.status == "failed" and rec.error == "nan" and rec.value is None
    assert rec.metrics == {"loss": 0.5}


@ISOLATE
def test_system_exit_in_the_objective_is_an_exception_record(isolate):
    rec = evaluate_once(Exits(), "0-0", {"x": 0.5}, seed=0, timeout_s=10, isolate=isolate)
    assert rec.status == "failed" and rec.error == "exception", (rec.error, rec.message)
    assert "SystemExit" in rec.message and "SystemExit" in rec.traceback
    # the sandbox child survives it and serves the next evaluation
    after = evaluate_once(Returning(2.0), "0-1", {"x": 0.5}, seed=0, timeout_s=10, isolate=isolate)
    assert after.status == "completed" and after.value == 2.0


@ISOLATE
def test_bool_metrics_stay_bools(isolate):
    rec = evaluate_once(Returning(EvalResult(1.5, {"converged": True, "diverged": False, "steps": 3})), "0-0",
                        {"x": 0.5}, seed=0, timeout_s=30, isolate=isolate)
    assert rec.status == "completed" and rec.value == 1.5
    assert rec.metrics == {"converged": True, "diverged": False, "steps": 3}
    assert rec.metrics["converged"] is True and rec.metrics["diverged"] is False
    assert type(rec.metrics["steps"]) is int  # exact, as Optuna keeps it (a float lost ids past 2**53)


@ISOLATE
def test_the_seed_reaches_the_objective(isolate):
    rec = evaluate_once(SeedValue(), "0-0", {"x": 0.5}, seed=7, timeout_s=30, isolate=isolate)
    assert rec.status == "completed" and rec.value == 7.0
    rec = evaluate_once(SeedValue(), "0-1", {"x": 0.5}, seed=123456789, timeout_s=30, isolate=isolate)
    assert rec.value == 123456789.0
