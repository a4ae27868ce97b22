"""Acceptance on a multi-node cluster (`ray.cluster_utils.Cluster`, head + two worker nodes on
loopback): evaluations spread over nodes; a custom-resource request runs only where the resource exists; the
central actor asks for a GPU where its `device` wants one and its node has one (the sensor node declares one
to Ray: no CUDA device is behind it)."""

from __future__ import annotations

import collections
import io

import pytest

from orchestrator.errors import ConfigError
from orchestrator.runner import run_experiment
from orchestrator.store import RunStore
from tests.integration.conftest import finished_counts

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def cluster():
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    plain = c.add_node(num_cpus=2)
    sensor = c.add_node(num_cpus=2, num_gpus=1, resources={"sensor": 2})
    ray.init(address=c.address, log_to_driver=False)
    c.wait_for_nodes()
    yield {"cluster": c, "plain": plain.node_id, "sensor": sensor.node_id, "head": c.head_node.node_id}
    ray.shutdown()
    c.shutdown()


def _run(tmp_path, name, options, budget):
    cfg = {
        "name": name,
        "objective": {"name": "sleep", "options": options},
        "budget": budget,
        "initial_design": budget,  # placement is under test here, not the model
        "batch_size": budget,
        "run_dir": str(tmp_path / name),
    }
    summary = run_experiment(cfg, progress=False, out=io.StringIO())
    events = RunStore.open(cfg["run_dir"]).events()
    assert len(finished_counts(events)) == budget and set(finished_counts(events).values()) == {1}
    return summary, [e for e in events if e.kind == "completed"]


def test_evaluations_spread_over_nodes(cluster, tmp_path):
    summary, done = _run(tmp_path, "spread", {"mean_s": 0.3, "cv": 0.3, "num_cpus": 1}, 30)
    assert summary["max_concurrent"] == 5  # 1 + 2 + 2 CPUs, one per evaluation
    nodes = collections.Counter(e.node_id for e in done)
    assert len(nodes) >= 2, nodes
    assert set(nodes) <= {cluster["plain"], cluster["sensor"], cluster["head"]}
    # the central actor goes to the driver's node, not any node where its refits would compete with
    # evaluations (the head under `ray job submit`; here, on one machine, whichever raylet the driver attached
    # to)
    import ray

    assert summary["node_id"] == ray.get_runtime_context().get_node_id()


def test_custom_resource_runs_only_where_it_exists(cluster, tmp_path):
    opts = {"mean_s": 0.1, "cv": 0.3, "num_cpus": 0.5, "custom_resources": {"sensor": 1}}
    summary, done = _run(tmp_path, "sensor", opts, 12)
    assert summary["max_concurrent"] == 2  # only the sensor node, 2 units of "sensor"
    assert {e.node_id for e in done} == {cluster["sensor"]}


def test_the_central_actor_asks_for_a_gpu_only_where_its_device_wants_one(cluster):
    from orchestrator.runner.actors import _actor_gpus

    head, gpu_node = cluster["head"], cluster["sensor"]
    assert _actor_gpus("cpu", gpu_node) == 0
    assert _actor_gpus("auto", gpu_node) == 1 and _actor_gpus("cuda", gpu_node) == 1
    assert _actor_gpus("auto", head) == 0
    with pytest.raises(ConfigError, match=r"`device` is 'cuda', but the driver's node, where the central "
                                          r"actor runs, offers Ray no GPU"):
        _actor_gpus("cuda", head)


def test_a_run_that_wants_cuda_where_its_node_has_no_gpu_stops_with_the_key_named(cluster, tmp_path):
    import ray

    if ray.get_runtime_context().get_node_id() == cluster["sensor"]:
        pytest.skip("the driver attached to the node that declares a GPU")
    cfg = {"name": "cuda", "objective": {"name": "sleep", "options": {"mean_s": 0.01}}, "budget": 2,
           "initial_design": 2, "batch_size": 2, "device": "cuda", "run_dir": str(tmp_path / "cuda")}
    with pytest.raises(ConfigError, match=r"`device` is 'cuda'"):
        run_experiment(cfg, progress=False, out=io.StringIO())
