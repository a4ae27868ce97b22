"""Worker contract: every hostile outcome becomes a failed record with its reason.

Most cases run `evaluate_once` in this process (no Ray); one module-scoped local Ray checks the task
path: resources, node id, a crashing objective, and Ray's retry of a killed worker process.
"""

from __future__ import annotations

import json
import math
import os
import signal
import time
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch

from objectives.base import EvalResult, Objective, Resources
from workers.evaluate import evaluate_once, submit_evaluation, task_options
from workers.records import (
    FAILURE_REASONS,
    MAX_MESSAGE_CHARS,
    MAX_METRIC_CHARS,
    MAX_TRACEBACK_CHARS,
    classify_value,
)

SPACE = {"x": {"type": "float", "low": 0.0, "high": 1.0}}


class Returning(Objective):
    """Returns whatever it was built with."""

    space = SPACE

    def __init__(self, value):
        self.value = value

    def evaluate(self, params, seed):
        return self.value


class Raising(Objective):
    space = SPACE

    def evaluate(self, params, seed):
        raise RuntimeError(f"boom at x={params['x']}")


class UnprintableError(Exception):
    def __str__(self):
        raise RuntimeError("no str")


class RaisingUndecodable(Objective):
    """Raises with a file name that has an undecodable byte (as `os.listdir` returns it: a lone surrogate)."""

    space = SPACE

    def evaluate(self, params, seed):
        raise ValueError("cannot parse " + os.fsdecode(b"/data/run-\xff.csv"))


class RaisingUnprintable(Objective):
    """Raises an exception whose `__str__` raises too (the record must still be written)."""

    space = SPACE

    def evaluate(self, params, seed):
        raise UnprintableError()


class BadFloat(float):
    """A float subclass whose conversion fails with an error that is not a TypeError."""

    def __float__(self):
        raise RuntimeError("cannot convert")


class Hanging(Objective):
    space = SPACE

    def evaluate(self, params, seed):
        time.sleep(60)
        return 1.0


class Aborting(Objective):
    space = SPACE

    def evaluate(self, params, seed):
        os.abort()


class KillsWorkerOnce(Objective):
    """Kills the Ray worker process (its parent: we run in a forked child) the first time only."""

    space = SPACE

    def __init__(self, marker: str):
        self.marker = marker

    def evaluate(self, params, seed):
        if not os.path.exists(self.marker):
            Path(self.marker).write_text("killed")
            os.kill(os.getppid(), signal.SIGKILL)
            time.sleep(30)
        return 2.5


HOSTILE = [
    (Raising(), "exception", "RuntimeError: boom"),
    (Returning(float("nan")), "nan", "NaN"),
    (Returning(float("inf")), "inf", "inf"),
    (Returning(-float("inf")), "inf", "inf"),
    (Returning(None), "none", "None"),
    (Returning("0.5"), "non-numeric", "string"),
    (Returning(True), "non-numeric", "bool"),
    (Returning(np.array([1.0, 2.0])), "array", "shape (2,)"),
    (Returning([1.0]), "array", "array"),
    (Returning(EvalResult(float("nan"))), "nan", "NaN"),
    # these stay in the record (escaped, the sandbox child dies: "crash"; the thread dies: "timeout")
    (Returning(10**400), "inf", "too large for a float"),
    (RaisingUnprintable(), "exception", "UnprintableError"),
    # a lone surrogate in the message must not make the log refuse the segment (the run would crash)
    (RaisingUndecodable(), "exception", "cannot parse /data/run-\\udcff.csv"),
    (Returning(BadFloat(1.0)), "non-numeric", "RuntimeError: cannot convert"),
]


@pytest.mark.parametrize("isolate", ["process", "thread"])
@pytest.mark.parametrize(
    "objective,reason,text", HOSTILE, ids=[f"{r}-{i}" for i, (_, r, _) in enumerate(HOSTILE)]
)
def test_hostile_return_is_a_failed_record(objective, reason, text, isolate):
    rec = evaluate_once(objective, "3-1", {"x": 0.5}, seed=0, timeout_s=20, isolate=isolate)
    assert rec.status == "failed"
    assert rec.error == reason
    assert rec.error in FAILURE_REASONS
    assert text in rec.traceback
    assert rec.value is None
    assert rec.trial_id == "3-1" and rec.pid == os.getpid()
    assert rec.started_at <= rec.ended_at


def test_exception_record_carries_the_traceback():
    rec = evaluate_once(Raising(), "0-0", {"x": 0.25}, seed=0)
    assert "Traceback" in rec.traceback and "boom at x=0.25" in rec.traceback
    assert "in evaluate" in rec.traceback


@pytest.mark.parametrize("isolate", ["process", "thread"])
def test_timeout_is_a_failed_record(isolate):
    t0 = time.time()
    rec = evaluate_once(Hanging(), "0-0", {"x": 0.1}, seed=0, timeout_s=0.5, isolate=isolate)
    assert time.time() - t0 < 5
    assert rec.status == "failed" and rec.error == "timeout"
    assert rec.ended_at - rec.started_at >= 0.5
    # the record says where the objective hung: the line of `Hanging.evaluate` that sleeps
    line = f'line {Hanging.evaluate.__code__.co_firstlineno + 1}'
    assert "test_evaluate.py" in rec.traceback and line in rec.traceback and "in evaluate" in rec.traceback
    if isolate == "process":  # the hung child was killed, not left behind
        with pytest.raises(ProcessLookupError):
            os.kill(rec.child_pid, 0)


class SignalsThenHangs(Objective):
    """First evaluation: SIGUSR2 to itself (a profiler's or a scheduler's signal); later ones start threads
    with deep stacks, then hang in `hang_here_now`."""

    space = SPACE

    def evaluate(self, params, seed):
        import threading

        if params["x"] < 0.5:
            return self.stray_signal_site()

        def deep(k):
            return deep(k - 1) if k else time.sleep(60)

        for _ in range(8):
            threading.Thread(target=deep, args=(90,), daemon=True).start()
        return self.hang_here_now()

    def stray_signal_site(self):
        os.kill(os.getpid(), signal.SIGUSR2)
        time.sleep(0.2)
        return 1.0

    def hang_here_now(self):
        time.sleep(60)


def test_a_timeouts_stacks_are_its_own_and_keep_the_main_thread():
    """A dump for an earlier SIGUSR2 does not stay in the file ahead of the hang's, and the cut of a long dump
    keeps the main thread, which faulthandler writes last (a head-only cut drops it)."""
    from workers.records import MAX_TRACEBACK_CHARS

    obj = SignalsThenHangs()
    assert evaluate_once(obj, "0-0", {"x": 0.1}, seed=0).value == 1.0  # the same sandbox child serves both
    rec = evaluate_once(obj, "0-1", {"x": 0.9}, seed=0, timeout_s=2.0)
    assert rec.error == "timeout"
    text = rec.traceback
    assert "hang_here_now" in text and "characters cut" in text  # the main thread's frame, after the cut
    assert "stray_signal_site" not in text
    assert len(text) <= MAX_TRACEBACK_CHARS + 100


class HangingSimulator(Objective):
    """Runs an external program that hangs (`sleep 60`) and waits for it, writing its pid to `pid_file`."""

    space = SPACE

    def __init__(self, pid_file):
        self.pid_file = str(pid_file)

    def evaluate(self, params, seed):
        import subprocess

        proc = subprocess.Popen(["sleep", "60"])
        Path(self.pid_file).write_text(str(proc.pid))
        proc.wait()
        return 1.0


def test_timeout_kills_what_the_objective_started(tmp_path):
    """A timeout kills the simulator the sandbox child has started (here `sleep 60`) too, not the child only:
    it does not live on, re-parented, beside the next evaluations on the same CPUs."""
    from tests.faults.conftest import alive

    pid_file = tmp_path / "sim.pid"
    rec = evaluate_once(HangingSimulator(pid_file), "0-0", {"x": 0.1}, seed=0, timeout_s=1.0)
    assert rec.error == "timeout"
    sim = int(pid_file.read_text())
    deadline = time.time() + 10
    while alive(sim) and time.time() < deadline:
        time.sleep(0.05)
    assert not alive(sim), "the hung simulator outlived its evaluation's timeout"
    assert evaluate_once(Returning(2.0), "1-0", {"x": 0.1}, seed=0).value == 2.0  # the worker is fine


def _square(v):
    return v * v


class PoolUsing(Objective):
    """Uses a process pool, as a simulator or a DataLoader with workers does."""

    space = SPACE

    def evaluate(self, params, seed):
        import multiprocessing

        with multiprocessing.get_context("fork").Pool(2) as pool:
            return float(sum(pool.map(_square, [params["x"], 1.0])))


def test_objective_may_start_a_process_pool():
    """The sandbox child is not a daemonic multiprocessing.Process (Python refuses children to those, so every
    evaluation of an objective with a Pool, or a DataLoader with workers, would fail). (Not run with
    isolate="thread": there the Pool forks the multi-threaded test process itself, which can deadlock.)"""
    rec = evaluate_once(PoolUsing(), "0-0", {"x": 0.5}, seed=0, timeout_s=60)
    assert rec.status == "completed", rec.traceback  # a timeout's has the child's stacks
    assert rec.value == 1.25


def test_worker_death_kills_what_the_objective_started(tmp_path):
    """When the Ray worker dies (Ctrl-C on the driver, a node's raylet killing it) the kernel kills the
    sandbox child (PR_SET_PDEATHSIG), and the simulator the objective has started ends too: it does not live
    on, re-parented to init, for `qbatch resume` to start it a second time beside it."""
    import subprocess
    import sys

    from tests.faults.conftest import alive

    pid_file = tmp_path / "sim.pid"
    # a stand-in for the Ray worker: a process that evaluates in its sandbox child, then is SIGKILLed
    worker = subprocess.Popen(
        [sys.executable, "-c",
         "import sys; from tests.workers.test_evaluate import HangingSimulator; "
         "from workers.evaluate import evaluate_once; "
         "evaluate_once(HangingSimulator(sys.argv[1]), '0-0', {'x': 0.1}, seed=0, "
         "timeout_s=600)", str(pid_file)],
        cwd=Path(__file__).resolve().parents[2])
    try:
        deadline = time.time() + 60
        while not pid_file.exists() or not pid_file.read_text():
            assert time.time() < deadline and worker.poll() is None, ("the evaluation never started its "
                                                                      "simulator")
            time.sleep(0.05)
        sim = int(pid_file.read_text())
        assert alive(sim)
    finally:
        worker.kill()
        worker.wait()
    deadline = time.time() + 10
    while alive(sim) and time.time() < deadline:
        time.sleep(0.05)
    if alive(sim):
        os.kill(sim, signal.SIGKILL)
        pytest.fail("the simulator outlived the worker that ran its evaluation")


def test_abort_in_the_objective_is_a_crash_record():
    rec = evaluate_once(Aborting(), "0-0", {"x": 0.1}, seed=0, timeout_s=20)
    assert rec.status == "failed" and rec.error == "crash"
    assert "SIGABRT" in rec.traceback


@pytest.mark.parametrize(
    "value,expected",
    [(1, 1.0), (np.float32(2.5), 2.5), (np.int64(3), 3.0), (EvalResult(4.0, {"t": 1.0}), 4.0), (-0.0, 0.0),
     # 0-d arrays and tensors are one number (len() of one raises TypeError: a failed trial)
     (np.array(0.25), 0.25), (torch.tensor(0.25), 0.25), (EvalResult(np.array(1.5)), 1.5)],
)
def test_valid_values_pass(value, expected):
    v, reason, _ = classify_value(value)
    assert reason is None and v == expected
    rec = evaluate_once(Returning(value), "0-0", {"x": 0.1}, seed=0)
    assert rec.status == "completed" and rec.value == expected and rec.error is None


def test_metrics_are_kept_and_cleaned():
    rec = evaluate_once(
        Returning(EvalResult(1.0, {"loss": 0.5, "bad": float("nan"), "obj": object()})), "0-0", {"x": 0.1}, 0
    )
    assert rec.metrics == {"loss": 0.5, "bad": pytest.approx(float("nan"), nan_ok=True)}
    assert rec.metrics_dropped == ["'obj': a object"]
    # an integer metric beyond the float range is dropped; the value is kept
    rec = evaluate_once(Returning(EvalResult(1.0, {"n": 10**400, "k": 3})), "0-0", {"x": 0.1}, 0)
    assert rec.status == "completed" and rec.value == 1.0 and rec.metrics == {"k": 3}
    assert rec.metrics_dropped == ["'n': a int"]
    ok = evaluate_once(Returning(EvalResult(1.0, {"k": 3})), "0-0", {"x": 0.1}, 0)
    assert ok.metrics_dropped == []


def test_metrics_keep_what_a_training_loop_returns():
    """A torch 0-d tensor (`metrics={"loss": loss}`), a NumPy 0-d array, a NaN or inf loss, None, a per-epoch
    list and a dict are kept, and ints stay ints (2**53 + 1 keeps its last digit), as Optuna's user attributes
    keep all of these."""
    import torch

    metrics = {
        "t": torch.tensor(2.5, requires_grad=True),
        "a": np.array(1.5),
        "i64": np.int64(7),
        "f32": np.float32(0.5),
        "nan": float("nan"),
        "inf": float("-inf"),
        "none": None,
        "curve": [0.9, 0.5, float("nan")],
        "cfg": {"opt": "sgd", "layers": [64, 64]},
        "id": 2**53 + 1,
        "flag": np.bool_(True),
        "s": "ok",
        "long": list(range(2000)),
        "arr": np.arange(3),
        "set": {1, 2},
        1: "int key",
        "1": "str key",
    }
    rec = evaluate_once(Returning(EvalResult(1.0, metrics)), "0-0", {"x": 0.1}, 0)
    m = rec.metrics
    assert rec.status == "completed" and rec.value == 1.0
    assert (m["t"], m["a"], m["i64"], m["f32"], m["none"], m["flag"], m["s"]) == (
        2.5,
        1.5,
        7,
        0.5,
        None,
        True,
        "ok",
    )
    assert m["id"] == 2**53 + 1 and isinstance(m["id"], int) and isinstance(m["i64"], int)
    assert math.isnan(m["nan"]) and m["inf"] == float("-inf")
    assert (
        m["curve"][:2] == [0.9, 0.5]
        and math.isnan(m["curve"][2])
        and m["cfg"] == {"opt": "sgd", "layers": [64, 64]}
    )
    assert m["1"] == "int key"  # the first of two keys with the same name is kept, the second noted
    assert sorted(d.split(":")[0] for d in rec.metrics_dropped) == ["'1'", "'arr'", "'long'", "'set'"]
    # the record crosses the sandbox's pipe and the log's JSON as it is
    from orchestrator.store import _to_json

    assert json.loads(_to_json(m, "metrics"))["id"] == 2**53 + 1


def test_one_bad_metric_drops_itself_only():
    """A list nested 5,000 deep (RecursionError) does not drop every metric; a dict with non-string keys is
    not renamed by JSON ({1: 'a', '1': 'b'} into {'1': 'b'}); Fraction, Decimal, np.longdouble and a 0-d torch
    Parameter, numbers all, are kept; and the notes have a bound."""
    import torch

    deep: list = []
    for _ in range(5000):
        deep = [deep]
    metrics = {
        "loss": 0.5,
        "deep": deep,
        "keys": {1: "a", "1": "b"},
        "frac": Fraction(1, 4),
        "dec": Decimal("2.5"),
        "ld": np.longdouble(0.125),
        "param": torch.nn.Parameter(torch.tensor(3.0)),
    }
    rec = evaluate_once(Returning(EvalResult(1.0, metrics)), "0-0", {"x": 0.1}, 0)
    assert rec.metrics == {"loss": 0.5, "frac": 0.25, "dec": 2.5, "ld": 0.125, "param": 3.0}
    assert sorted(d.split(":")[0] for d in rec.metrics_dropped) == ["'deep'", "'keys'"]
    many = evaluate_once(
        Returning(EvalResult(1.0, {f"m{i}": object() for i in range(100)})), "0-0", {"x": 0.1}, 0
    )
    assert len(many.metrics_dropped) == 21 and many.metrics_dropped[-1] == "... and 80 more"


def test_metrics_that_are_not_a_mapping_keep_the_value():
    """`EvalResult(1.0, [1, 2, 3])` does not fail the trial as 'non-numeric' (with a message about a dict
    update sequence): the value is good, so the trial completes and the log says what was dropped."""
    rec = evaluate_once(Returning(EvalResult(1.0, [1, 2, 3])), "0-0", {"x": 0.1}, 0)
    assert rec.status == "completed" and rec.value == 1.0 and rec.metrics == {}
    assert rec.metrics_dropped == ["metrics: a list, not a mapping of name to value"]
    bad = evaluate_once(Returning(EvalResult(float("nan"), {"k": 1, "o": object()})), "0-0", {"x": 0.1}, 0)
    assert bad.error == "nan" and bad.metrics == {"k": 1} and bad.metrics_dropped == ["'o': a object"]


@pytest.mark.parametrize("value", [Fraction(1, 3), Decimal("1.5")])
def test_other_real_number_types_are_values(value):
    """A Fraction or a Decimal is a number, not refused as 'non-numeric' (Optuna takes them)."""
    rec = evaluate_once(Returning(value), "0-0", {"x": 0.1}, 0)
    assert rec.status == "completed" and rec.value == float(value)
    assert evaluate_once(Returning(Decimal("NaN")), "0-0", {"x": 0.1}, 0).error == "nan"


def test_registry_spec_and_bad_arguments():
    rec = evaluate_once(("sleep", {"mean_s": 0.0, "noise": 0.0}), "0-0", {"x0": 0.3, "x1": 0.3}, seed=1)
    assert rec.status == "completed" and rec.value == pytest.approx(0.0)
    with pytest.raises(ValueError, match="isolate must be"):
        evaluate_once(Raising(), "0-0", {"x": 0.1}, 0, isolate="fiber")
    with pytest.raises(ValueError, match="timeout_s must be"):
        evaluate_once(Raising(), "0-0", {"x": 0.1}, 0, timeout_s=0)
    # past about 24 days the wait on the child overflows: refused up front, not a failed evaluation
    with pytest.raises(ValueError, match=r"timeout_s must be a number in \(0, 1e\+06\]; got 3000000"):
        evaluate_once(Raising(), "0-0", {"x": 0.1}, 0, timeout_s=3e6)
    with pytest.raises(ValueError, match="max_retries must be"):
        task_options(Resources(), max_retries=-1)
    opts = task_options(
        Resources(num_cpus=0.5, num_gpus=0, memory=10**8, custom={"sensor": 1}), max_retries=2
    )
    assert opts == {
        "num_cpus": 0.5,
        "num_gpus": 0,
        "memory": 10**8,
        "resources": {"sensor": 1},
        "max_retries": 2,
        "retry_exceptions": False,
        "runtime_env": {
            "env_vars": {"QBATCH_EVALUATION_WORKER": "process", "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "1"}
        },
    }
    # thread-isolated evaluations run torch in the worker itself: workers apart from the forking ones
    assert (
        task_options(Resources(), isolate="thread")["runtime_env"]["env_vars"]["QBATCH_EVALUATION_WORKER"]
        == "thread"
    )


# ----------------------------------------------------------------------------- through Ray
@pytest.fixture(scope="module")
def ray_local():
    ray = pytest.importorskip("ray")
    import sys

    from ray import cloudpickle

    # the hostile objectives live in this test module, which Ray workers cannot import: ship them by value
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(
        address="local", num_cpus=2, include_dashboard=False, resources={"sensor": 1}, log_to_driver=False
    )
    yield ray
    ray.shutdown()


@pytest.mark.ray
def test_tasks_return_records_with_node_and_timings(ray_local, tmp_path):
    ray = ray_local
    res = Resources(num_cpus=0.5, custom={"sensor": 0.5})
    refs = {
        "ok": submit_evaluation(Returning(1.5), "0-0", {"x": 0.1}, 0, resources=res, timeout_s=30),
        "nan": submit_evaluation(Returning(float("nan")), "0-1", {"x": 0.1}, 0, resources=res, timeout_s=30),
        "abort": submit_evaluation(Aborting(), "0-2", {"x": 0.1}, 0, resources=res, timeout_s=30),
        "hang": submit_evaluation(Hanging(), "0-3", {"x": 0.1}, 0, resources=res, timeout_s=1.0),
        "spec": submit_evaluation(
            ("sleep", {"mean_s": 0.0}), "0-4", {"x0": 0.1, "x1": 0.2}, 0, resources=res
        ),
    }
    recs = {k: ray.get(r, timeout=60) for k, r in refs.items()}
    node = ray.get_runtime_context().get_node_id()
    for k, rec in recs.items():
        assert rec.node_id == node, k
        assert rec.pid != os.getpid(), k
        assert rec.started_at <= rec.ended_at, k
    assert recs["ok"].status == "completed" and recs["ok"].value == 1.5
    assert recs["spec"].status == "completed"
    assert [recs[k].error for k in ("nan", "abort", "hang")] == ["nan", "crash", "timeout"]


@pytest.mark.ray
def test_killed_worker_is_retried_and_without_retries_surfaces_as_worker_crash(ray_local, tmp_path):
    ray = ray_local
    obj = KillsWorkerOnce(str(tmp_path / "marker1"))
    rec = ray.get(
        submit_evaluation(obj, "0-0", {"x": 0.1}, 0, resources=Resources(num_cpus=0.5), max_retries=1),
        timeout=90,
    )
    assert rec.status == "completed" and rec.value == 2.5
    obj = KillsWorkerOnce(str(tmp_path / "marker2"))
    ref = submit_evaluation(obj, "0-1", {"x": 0.1}, 0, resources=Resources(num_cpus=0.5), max_retries=0)
    with pytest.raises(ray.exceptions.WorkerCrashedError):
        ray.get(ref, timeout=90)


class Counting(Objective):
    """Counts its calls in the process that runs it; returns the count."""

    space = SPACE

    def __init__(self):
        self.calls = 0

    def evaluate(self, params, seed):
        self.calls += 1
        return float(self.calls)


def test_sandbox_child_serves_evaluations_and_is_replaced_after_a_hang_or_crash():
    """One child per objective serves evaluation after evaluation (no fork each time); its state never
    reaches the worker; a hang or a crash ends it and the next evaluation gets a fresh child."""
    obj = Counting()
    first = evaluate_once(obj, "0-0", {"x": 0.1}, seed=0)
    second = evaluate_once(obj, "0-1", {"x": 0.2}, seed=1)
    assert first.child_pid == second.child_pid != os.getpid()
    assert (first.value, second.value) == (1.0, 2.0) and obj.calls == 0  # counted in the child only
    other = evaluate_once(Counting(), "1-0", {"x": 0.1}, seed=0)  # another objective: another child
    assert other.child_pid != first.child_pid and other.value == 1.0
    with pytest.raises(ProcessLookupError):  # the first child exited once it was replaced
        deadline = time.time() + 10
        while time.time() < deadline:
            os.kill(first.child_pid, 0)
            time.sleep(0.05)
    hanging = Hanging()
    rec = evaluate_once(hanging, "2-0", {"x": 0.1}, seed=0, timeout_s=0.3)
    assert rec.error == "timeout"
    crash = evaluate_once(Aborting(), "3-0", {"x": 0.1}, seed=0, timeout_s=20)
    assert crash.error == "crash"
    after = evaluate_once(obj, "0-2", {"x": 0.3}, seed=2)
    assert after.status == "completed" and after.value == 1.0  # a fresh child: fresh state
    assert after.child_pid not in (first.child_pid, rec.child_pid, crash.child_pid)


@pytest.mark.parametrize("value,reason", [(np.array(float("nan")), "nan"), (np.array(True), "non-numeric"),
                                          (torch.tensor([0.25]), "array"), (np.zeros((0,)), "array"),
                                          (np.array(None, dtype=object), "none")])
def test_zero_d_and_one_element_arrays_are_classified(value, reason):
    assert classify_value(value)[1] == reason


class Verbose(Objective):
    """Raises with a 1 MB message (`raise_it`), or returns a value with a 1 MB string metric."""

    space = SPACE

    def __init__(self, raise_it):
        self.raise_it = raise_it

    def evaluate(self, params, seed):
        if self.raise_it:
            raise ValueError("m" * 1_000_000 + " END")
        return EvalResult(1.0, metrics={"log": "x" * 1_000_000 + " END", "k" * 5000: 2.0})


def test_huge_messages_tracebacks_and_metrics_are_capped():
    """A 64 MB exception message and a 64 MB metric string keep their head and tail in the log, not the whole,
    which every read of the log (status, report, resume) would load."""
    rec = evaluate_once(Verbose(True), "0-0", {"x": 0.1}, seed=0)
    assert rec.error == "exception"
    assert len(rec.message) <= MAX_MESSAGE_CHARS + 100 and rec.message.endswith(" END")
    assert len(rec.traceback) <= MAX_TRACEBACK_CHARS + 100 and "characters cut" in rec.traceback
    assert "in evaluate" in rec.traceback  # the head keeps where it was raised
    rec = evaluate_once(Verbose(False), "0-1", {"x": 0.1}, seed=0)
    assert rec.status == "completed" and rec.value == 1.0
    log = rec.metrics["log"]
    assert len(log) <= MAX_METRIC_CHARS + 100 and log.startswith("xxx") and log.endswith(" END")
    assert all(len(k) <= MAX_METRIC_CHARS + 100 for k in rec.metrics) and 2.0 in rec.metrics.values()



class SignalsItsGroup(Objective):
    """A simulator that signals its process group with SIGUSR1 (the evaluation handles it)."""

    space = SPACE

    def evaluate(self, params, seed):
        signal.signal(signal.SIGUSR1, lambda *args: None)
        os.killpg(0, signal.SIGUSR1)
        time.sleep(0.3)
        return 1.0


class ReapsAllChildren(Objective):
    """Starts a helper, then reaps every child it has (a common clean-up idiom)."""

    space = SPACE

    def evaluate(self, params, seed):
        import subprocess

        subprocess.Popen(["true"])
        while True:
            try:
                os.wait()
            except ChildProcessError:
                return 1.0


@pytest.mark.parametrize("objective", [SignalsItsGroup(), ReapsAllChildren()], ids=["sigusr1", "wait-all"])
def test_the_group_guard_stays_out_of_the_objectives_way(objective):
    """The guard process does not wake on any SIGUSR1 sent to the group and kill the evaluation, and is not
    the sandbox's child, which would keep `os.wait()`-until-none-left loops waiting until the timeout."""
    rec = evaluate_once(objective, "0-0", {"x": 0.1}, seed=0, timeout_s=10)
    assert rec.status == "completed", (rec.error, rec.message)


class ThreadedTorch(Objective):
    """Evaluates with a two-thread torch op (as a CNN does)."""

    space = SPACE

    def evaluate(self, params, seed):
        torch.set_num_threads(2)
        return float(
            (torch.ones(400, 400, dtype=torch.float64) @ torch.ones(400, 400, dtype=torch.float64))[0, 0]
        )


@pytest.mark.ray
def test_evaluations_never_run_in_a_worker_where_other_tasks_ran_threaded_torch(ray_local):
    """GNU OpenMP is not fork-safe: a sandbox forked from a Ray worker that ran a multi-threaded torch op
    deadlocks at its own first one. Through the library API a user's earlier Ray tasks can leave such workers,
    which Ray would reuse for evaluations, each then timing out: evaluations have workers of their own (their
    runtime environment)."""
    ray = ray_local

    @ray.remote(num_cpus=1)
    def users_task():
        torch.set_num_threads(2)
        (torch.ones(400, 400) @ torch.ones(400, 400)).sum()
        return os.getpid()

    # generous waits: starting workers that import torch takes minutes on a loaded machine; a deadlock shows
    # anyway, as a "timeout" record (each evaluation has timeout_s = 30)
    used = set(ray.get([users_task.remote() for _ in range(6)], timeout=300))
    refs = [
        submit_evaluation(
            ThreadedTorch(), f"0-{i}", {"x": 0.1}, i, resources=Resources(num_cpus=1), timeout_s=30
        )
        for i in range(2)
    ]
    for rec in ray.get(refs, timeout=300):
        assert (rec.status, rec.value, rec.error) == ("completed", 400.0, None), rec
        assert rec.pid not in used
