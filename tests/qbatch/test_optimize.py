"""`qbatch.optimize` (orchestrator/runner/optimize.py) on a real Ray: a lambda on the local Ray it starts, a
function and a callable object defined in a `__main__` script (run as a subprocess, beside modules that shadow
the layout's packages), an `fn` that raises or returns NaN recorded as failed trials, a resume of an aborted
run with a fixed `fn`, the refusals before Ray starts, and `address=` to a `ray.cluster_utils.Cluster`. Run
inside `scripts/loopback`."""

from __future__ import annotations

import io
import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import qbatch
from orchestrator.errors import ConfigError
from orchestrator.runner import RunAbortedError
from orchestrator.store import RunStore
from tests.integration.conftest import FAST_MODEL, FAST_PROPOSER
from workers.by_value import CALLABLE_OBJECTIVE

pytestmark = pytest.mark.ray

REPO = Path(__file__).resolve().parents[2]
SPACE = {"x": {"type": "float", "low": 0.0, "high": 1.0}, "n": {"type": "int", "low": 1, "high": 4}}
FAST = {"model": FAST_MODEL, "proposer": FAST_PROPOSER, "progress": False, "num_cpus": 2}


@pytest.fixture(autouse=True)
def no_ray_before():
    """`optimize` starts (and shuts down) the local Ray itself: none may be running before."""
    import ray

    if ray.is_initialized():
        ray.shutdown()
    yield
    assert not ray.is_initialized(), "the run left its local Ray running"


def test_a_lambda_on_the_local_ray_it_starts(tmp_path):
    out = io.StringIO()
    result = qbatch.optimize(lambda p: -(p["x"] - 0.3) ** 2 - 0.1 * p["n"], SPACE, budget=6, batch_size=3,
                             initial_design=3, run_dir=str(tmp_path / "lam"), out=out, **FAST)
    assert isinstance(result, qbatch.OptimizeResult) and result.run_dir == str(tmp_path / "lam")
    rec = result.recommendation
    assert (
        isinstance(rec, qbatch.Recommendation) and set(rec.params) == {"x", "n"} and math.isfinite(rec.value)
    )
    assert result.summary["status"] == "finished" and result.summary["completed"] == 6
    df = result.trials_dataframe()
    assert len(df) == 6 and (df["state"] == "completed").all()
    assert df["param_n"].dtype == "Int64"
    best = df.loc[df["value"].idxmax()]
    assert best["value"] == pytest.approx(-(best["param_x"] - 0.3) ** 2 - 0.1 * best["param_n"])
    config = RunStore.open(result.run_dir).config
    assert config["objective"]["name"] == CALLABLE_OBJECTIVE and config["name"] == "lambda"
    assert config["objective"]["options"]["space"] == SPACE and config["budget"] == 6
    assert "qbatch: finished: 6 evaluations" in out.getvalue()


def _flaky(params):
    """Raises for large x, NaN for small x, a value between."""
    if params["x"] > 0.7:
        raise RuntimeError(f"no beam at x={params['x']:.3f}")
    if params["x"] < 0.3:
        return float("nan")
    return params["x"]


def test_a_raise_and_a_nan_are_failed_trials_with_their_reasons(tmp_path):
    result = qbatch.optimize(_flaky, SPACE, budget=10, batch_size=5, initial_design=5,
                             failure_guard={"max_failure_rate": 1.0, "min_trials": 1},
                             run_dir=str(tmp_path / "flaky"), out=io.StringIO(), **FAST)
    df = result.trials_dataframe()
    assert len(df) == 10 and set(df["state"]) <= {"completed", "failed"}
    for _, row in df.iterrows():
        if row["param_x"] > 0.7:
            assert row["state"] == "failed" and row["failure_reason"] == "exception"
            assert "no beam" in row["failure_message"]
        elif row["param_x"] < 0.3:
            assert row["state"] == "failed" and row["failure_reason"] == "nan"
        else:
            assert row["state"] == "completed" and row["value"] == row["param_x"]
    assert (df["state"] == "failed").any() and result.summary["failed"] == (df["state"] == "failed").sum()


def test_an_aborted_run_resumes_with_the_fixed_fn(tmp_path):
    run_dir = str(tmp_path / "fix")
    args = dict(
        budget=8,
        batch_size=4,
        initial_design=4,
        failure_guard={"max_failure_rate": 0.5, "min_trials": 2},
        run_dir=run_dir,
        out=io.StringIO(),
        **FAST,
    )

    def broken(params):
        raise ValueError("a bug")

    with pytest.raises(RunAbortedError):
        qbatch.optimize(broken, SPACE, **args)
    done = qbatch.read_trials(run_dir)
    assert (done["state"] == "failed").sum() >= 2 and (done["state"] == "completed").sum() == 0
    with pytest.raises(ConfigError, match="already holds a run: pass resume=True"):
        qbatch.optimize(lambda p: p["x"], SPACE, **args)
    with pytest.raises(ConfigError, match="`budget`"):
        qbatch.optimize(lambda p: p["x"], SPACE, resume=True, **{**args, "budget": 9})
    with pytest.raises(ConfigError, match="qbatch.optimize"):  # a config cannot hold the callable
        qbatch.resume_experiment(run_dir, progress=False, out=io.StringIO())
    result = qbatch.optimize(lambda p: p["x"], SPACE, resume=True, **args)
    assert result.summary["status"] == "finished" and result.summary["done"] == 8
    df = result.trials_dataframe()
    assert len(df[df["state"].isin(["completed", "failed"])]) == 8
    assert (df["state"] == "completed").sum() == 8 - (done["state"] == "failed").sum()


def test_bad_arguments_are_refused_before_ray_starts(tmp_path):
    import ray

    with pytest.raises(ConfigError, match="callable"):
        qbatch.optimize(3, SPACE, budget=4)
    with pytest.raises(ConfigError, match="`objective`"):
        qbatch.optimize(abs, SPACE, budget=4, objective="sleep")
    with pytest.raises(ConfigError, match="resume=True"):
        qbatch.optimize(abs, SPACE, budget=4, resume=True)
    with pytest.raises(ConfigError, match="batch_size"):
        qbatch.optimize(abs, SPACE, budget=4, batch_size=0)
    with pytest.raises(ConfigError, match="unknown"):
        qbatch.optimize(abs, SPACE, budget=4, batchsize=2)
    with pytest.raises(ConfigError, match="low"):
        qbatch.optimize(abs, {"x": {"type": "float", "low": 1.0, "high": 0.0}}, budget=4)
    assert not ray.is_initialized() and not list(tmp_path.iterdir())


def test_the_defaults_are_the_config_tables():
    import inspect

    from orchestrator.config.schema import _TABLE

    sig = inspect.signature(qbatch.optimize).parameters
    for key in ("batch_size", "tau"):
        assert sig[key].default == _TABLE[key].default, key
    assert sig["direction"].default == "maximize"  # the config's None: the objective's own, which is this


MAIN_SCRIPT = textwrap.dedent("""
    import io, json, random, sys
    import qbatch

    FAST = json.loads(sys.argv[1])

    def noisy(params, seed):                 # a function of __main__: no worker can import it by name
        return -(params["x"] - 0.3) ** 2 + random.Random(seed).gauss(0, 0.01)

    class Scaled:                            # a class of __main__ whose instance is the objective
        def __init__(self, k):
            self.k = k

        def __call__(self, params):
            return self.k * params["x"] + params["n"]

    space = {"x": {"type": "float", "low": 0.0, "high": 1.0}, "n": {"type": "int", "low": 1, "high": 4}}
    out = {}
    for key, fn, direction in (("function", noisy, "maximize"), ("object", Scaled(2.0), "minimize")):
        r = qbatch.optimize(fn, space, budget=6, batch_size=3, initial_design=3, direction=direction,
                            run_dir=f"runs/{key}", out=io.StringIO(), **FAST)
        df = r.trials_dataframe()
        out[key] = {"params": r.recommendation.params, "completed": int((df["state"] == "completed").sum()),
                    "values": df["value"].tolist(), "xs": df["param_x"].tolist(),
                    "ns": df["param_n"].tolist()}
    print(json.dumps(out))
""")


def test_a_function_and_a_callable_object_of_a_main_script(tmp_path):
    """The script's folder also holds `objectives.py`, `workers.py` and `orchestrator.py`: Ray puts it first
    on its workers' path, and the run goes on."""
    for name in ("objectives", "workers", "orchestrator"):
        (tmp_path / f"{name}.py").write_text("raise ImportError('the user module, imported by mistake')\n")
    (tmp_path / "main.py").write_text(MAIN_SCRIPT)
    fast = {k: v for k, v in FAST.items() if k != "progress"} | {"progress": False}
    proc = subprocess.run([sys.executable, "main.py", json.dumps(fast)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["function"]["completed"] == 6 and out["object"]["completed"] == 6
    for x, n, v in zip(out["object"]["xs"], out["object"]["ns"], out["object"]["values"]):
        assert v == pytest.approx(2.0 * x + n)
    assert set(out["function"]["params"]) == {"x", "n"}
    assert out["object"]["params"]["n"] == min(out["object"]["ns"])  # minimized: the smallest n is best
    assert (tmp_path / "runs" / "function" / "config.yaml").is_file()


def test_address_runs_on_a_cluster(tmp_path):
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        worker = cluster.add_node(num_cpus=2)
        cluster.wait_for_nodes()
        result = qbatch.optimize(
            lambda p: p["x"] * p["n"],
            SPACE,
            budget=6,
            batch_size=3,
            initial_design=3,
            address=cluster.address,
            run_dir=str(tmp_path / "cluster"),
            out=io.StringIO(),
            **{**FAST, "num_cpus": None},
        )
        assert result.summary["max_concurrent"] == 3  # the cluster's 1 + 2 CPUs, one per evaluation
        df = result.trials_dataframe()
        assert (df["state"] == "completed").sum() == 6
        assert set(df["node"]) <= {cluster.head_node.node_id, worker.node_id}
        assert (df["value"] == df["param_x"] * df["param_n"]).all()
    finally:
        cluster.shutdown()
