"""A local run (no `address`) starts a Ray that binds to loopback only, and is local.

Inside `scripts/loopback` only `lo` exists, so any Ray binds to 127.0.0.1 and a check there proves nothing.
These tests therefore run the driver in a fresh network namespace of its own that looks like a machine on a
network: `lo` also carries 10.77.0.1/8 and the default route points at it (nothing can leave: the namespace
has no other device). There a plain `ray.init()` registers the node as 10.77.0.1 and listens on 0.0.0.0/::
(the control test); a local qbatch run must register 127.0.0.1 and listen on loopback addresses only.
A local run must also start its own Ray even when RAY_ADDRESS names another cluster.
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys

import pytest

from tests.faults.conftest import OBJECTIVE, REPO, audit, env_without_ray_address

pytestmark = pytest.mark.ray

LOOPBACK = {"127.0.0.1", "::1", "::ffff:127.0.0.1"}
LAN_IP = "10.77.0.1"

_CHILD = r"""
import io, json, sys, threading, time
import psutil

def listening():
    me = psutil.Process()
    pids = {p.pid for p in [me] + me.children(recursive=True)}
    return sorted({c.laddr.ip for c in psutil.net_connections(kind="inet")
                   if c.status == psutil.CONN_LISTEN and c.pid in pids})

def nodes():
    import ray
    return sorted({n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]})

out = {}
if sys.argv[1] == "plain":
    import ray
    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
    out.update(nodes=nodes(), listen=listening())
    ray.shutdown()
else:
    from orchestrator.runner import run_experiment
    from tests.faults.objectives import read_pid_files
    cfg = json.loads(sys.argv[2])
    box = {}
    def drive():
        try:
            box["summary"] = run_experiment(cfg, num_cpus=2, progress=False, out=io.StringIO())
        except BaseException as exc:
            box["error"] = repr(exc)
    th = threading.Thread(target=drive, daemon=True)
    th.start()
    while th.is_alive() and not read_pid_files(cfg["objective"]["options"]["pid_dir"]):
        time.sleep(0.05)
    if th.is_alive():  # an evaluation runs: Ray is up with the run's actors and workers
        out.update(nodes=nodes(), listen=listening())
    th.join(180)
    import ray
    out.update(done=box.get("summary", {}).get("done"), error=box.get("error"),
               ray_left_up=ray.is_initialized())
print("RESULT " + json.dumps(out))
"""


def _in_lan_namespace(tmp_path, *args: str) -> dict:
    """Run the child script in a new network namespace whose `lo` also has a LAN-like address."""
    if not shutil.which("unshare") or not shutil.which("ip"):
        pytest.skip("needs unshare and ip (util-linux, iproute2)")
    if subprocess.run(["unshare", "--net", "true"], capture_output=True).returncode != 0:
        pytest.skip("cannot create a network namespace here (needs root or user namespaces)")
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    setup = f"ip link set lo up && ip addr add {LAN_IP}/8 dev lo && ip route add default dev lo"
    env = dict(env_without_ray_address(), PYTHONPATH=str(REPO))
    proc = subprocess.run(
        ["unshare", "--net", "sh", "-c", f'{setup} && exec "$@"', "lan", sys.executable, str(script), *args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT "):])


def test_control_plain_ray_in_the_lan_namespace_binds_beyond_loopback(tmp_path):
    """The namespace is a fair test: a Ray started without care uses the LAN address and all interfaces."""
    res = _in_lan_namespace(tmp_path, "plain")
    assert res["nodes"] == [LAN_IP]
    assert set(res["listen"]) - LOOPBACK, res["listen"]


def test_local_run_registers_and_listens_on_loopback_only(tmp_path):
    cfg = {
        "name": "loopback",
        "objective": {"name": OBJECTIVE, "options": {"pid_dir": str(tmp_path / "pids"), "sleep_s": 1.0}},
        "proposer": "sobol", "budget": 2, "batch_size": 2, "initial_design": 2, "max_concurrent": 2,
        "run_dir": str(tmp_path / "run"),
    }
    res = _in_lan_namespace(tmp_path, "qbatch", json.dumps(cfg))
    assert res.get("error") is None and res["done"] == 2, res
    assert not res["ray_left_up"], "the runner shuts down the Ray it started"
    a = audit(cfg["run_dir"], 2)
    assert a["lost"] == 0 and a["duplicated"] == 0
    assert res["nodes"] == ["127.0.0.1"], f"the local node registered as {res['nodes']}"
    assert set(res["listen"]) <= LOOPBACK, f"listening on {sorted(set(res['listen']) - LOOPBACK)}"


def test_local_run_starts_its_own_ray_despite_ray_address(tmp_path, monkeypatch):
    import ray

    from orchestrator.runner import run_experiment

    if ray.is_initialized():
        ray.shutdown()
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")  # nothing listens there
    cfg = {"name": "own-ray", "objective": {"name": "sleep", "options": {"mean_s": 0.05, "num_cpus": 0.5}},
           "proposer": "sobol", "budget": 4, "batch_size": 4, "initial_design": 4, "max_concurrent": 2,
           "run_dir": str(tmp_path / "run")}
    error = None
    try:
        summary = run_experiment(cfg, num_cpus=2, progress=False, out=io.StringIO())
    except Exception as exc:  # noqa: BLE001 -- inspected below
        error, summary = exc, None
    finally:
        if ray.is_initialized():
            ray.shutdown()
    assert error is None, f"the local run did not start its own Ray: {type(error).__name__}: {error}"
    assert summary["done"] == 4
