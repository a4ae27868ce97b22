"""A worker node of a `ray.cluster_utils.Cluster` (all on loopback) is removed
mid-run; the evaluations it was running are re-run on the other nodes (or recorded failed, "worker-lost",
with ``max_retries: 0``) and the run completes with exactly `budget` records, one per trial id.

The cluster starts with the head only (1 CPU), so the run's central actor and evaluation pool, which ask
for no CPU, are placed on the head; then two worker nodes (2 CPUs each) join and take evaluations. One of
them is removed while it runs some. Which node ran an evaluation is read from the process tree: the
objective records its Ray worker's pid, whose parent is the raylet of its node.
"""

from __future__ import annotations

import time

import pytest

from tests.faults.conftest import RunThread, alive, audit, fault_config, parent_pid, trial_of, wait_for
from tests.faults.objectives import read_pid_files

pytestmark = [pytest.mark.ray, pytest.mark.slow]


@pytest.fixture
def cluster():
    """A head node with 1 CPU; the test adds the worker nodes. Fresh per test (a node gets removed)."""
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    ray.init(address=c.address, log_to_driver=False)
    yield c
    ray.shutdown()
    c.shutdown()


def _raylet_pid(node) -> int:
    return node.all_processes["raylet"][0].process.pid


def _node_of(rec, raylets):
    """The cluster node (its node id) that ran a PidRecorder record, or None once its worker is gone."""
    try:
        return raylets.get(parent_pid(rec["ppid"]))
    except OSError:
        return None


@pytest.mark.parametrize("max_retries", [1, 0])
def test_removed_worker_node_evaluations_rerun_elsewhere_exact_count(cluster, tmp_path, max_retries):
    import ray

    from orchestrator.runner import NAMESPACE, actor_name, pool_name

    cfg = fault_config(tmp_path, f"node-loss-{max_retries}", budget=30, batch_size=10, initial_design=10,
                       max_concurrent=5, max_retries=max_retries,
                       objective_options={"sleep_s": 2.0, "num_cpus": 1})
    pid_dir = cfg["objective"]["options"]["pid_dir"]
    run = RunThread(cfg)
    run.start()
    # the run's actors exist (on the head, the only node) before the worker nodes join
    actor = wait_for(
        lambda: _try(lambda: ray.get_actor(actor_name(cfg["run_dir"]), namespace=NAMESPACE)),
        120,
        "the central actor",
    )
    actor_pid = ray.get(actor.status.remote(), timeout=60)["pid"]
    wait_for(lambda: _try(lambda: ray.get_actor(pool_name(cfg["run_dir"]), namespace=NAMESPACE)), 60,
             "the evaluation pool")
    head = cluster.head_node
    assert parent_pid(actor_pid) == _raylet_pid(head), "the central actor runs on the head node"
    keep = cluster.add_node(num_cpus=2)
    doomed = cluster.add_node(num_cpus=2)
    cluster.wait_for_nodes()
    raylets = {_raylet_pid(n): n.node_id for n in (head, keep, doomed)}

    def running_on_doomed():
        now = time.time()
        recs = [r for r in read_pid_files(pid_dir)
                if now - r["time"] < 1.2 and alive(r["pid"]) and _node_of(r, raylets) == doomed.node_id]
        return recs if len(recs) >= 2 else None

    victims = wait_for(running_on_doomed, 120, "two evaluations running on the node to remove")
    done_before = set(audit(cfg["run_dir"], cfg["budget"])["counts"])
    t_remove = time.time()
    cluster.remove_node(doomed)
    summary = run.result(240)

    a = audit(cfg["run_dir"], cfg["budget"])
    print(f"\nnode loss (max_retries={max_retries}): lost {a['lost']}, duplicated {a['duplicated']}, "
          f"{len(victims)} evaluations were running on the removed node")
    assert a["lost"] == 0 and a["duplicated"] == 0 and not a["damage"]
    assert set(a["counts"].values()) == {1} and len(a["counts"]) == cfg["budget"]
    assert summary["status"] == "finished" and summary["done"] == cfg["budget"]
    for v in victims:
        tid = trial_of(a["events"], v["params"])
        assert tid not in done_before
        rec = a["results"][tid]
        if max_retries:
            # re-run on another node after the removal, and recorded once
            assert rec.kind == "completed", f"{tid}: {rec.kind} ({rec.error})"
            assert rec.node_id != doomed.node_id and rec.started_at > t_remove
            assert len([r for r in read_pid_files(pid_dir) if r["params"] == v["params"]]) == 2
        else:
            assert rec.kind == "failed" and rec.error == "worker-lost", f"{tid}: {rec.kind} ({rec.error})"
    # nothing ran on the removed node after it was removed
    assert all(e.node_id != doomed.node_id or e.ended_at <= t_remove for e in a["results"].values()
               if e.kind == "completed")
    assert {e.node_id for e in a["results"].values() if e.kind == "completed"} >= {keep.node_id}


def _try(fn):
    try:
        return fn()
    except Exception:
        return None
