"""cluster.yaml is a valid Ray cluster-launcher config, checked with Ray's own schema, whose
nodes all install the same Ray and the torch build their hardware uses.

`prepare_config` fills in the provider's defaults exactly as `ray up` does, and `validate_config` checks
the result against `ray/autoscaler/ray-schema.json` with jsonschema. No cloud API is contacted. The commands a
node runs are read as the launcher reads them (`_node_setup`).
"""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]

util = pytest.importorskip("ray.autoscaler._private.util")
jsonschema = pytest.importorskip("jsonschema")


@pytest.fixture(scope="module")
def cluster() -> dict:
    return yaml.safe_load((REPO / "cluster.yaml").read_text())


def test_cluster_yaml_passes_rays_schema(cluster):
    prepared = util.prepare_config(copy.deepcopy(cluster))
    util.validate_config(prepared)
    # Ray merged our node types rather than its defaults
    assert set(prepared["available_node_types"]) == {"head", "cpu-worker", "gpu-worker"}
    assert prepared["head_node_type"] == "head"


def test_cluster_yaml_has_cpu_and_gpu_workers_that_install_qbatch(cluster):
    types = cluster["available_node_types"]
    head = types[cluster["head_node_type"]]
    assert head["resources"].get("CPU") == 0  # evaluations never run beside the central actor
    gpu = [n for n, t in types.items() if t.get("resources", {}).get("GPU", 0) >= 1]
    cpu = [
        n
        for n, t in types.items()
        if n != cluster["head_node_type"] and not t.get("resources", {}).get("GPU")
    ]
    assert gpu and cpu
    assert sum(t.get("max_workers", 0) for t in types.values()) <= cluster["max_workers"]
    assert any("pip install" in c and "qbatch" in c for c in cluster["setup_commands"])
    assert "~/qbatch" in cluster["file_mounts"]


@pytest.mark.parametrize(
    "mutate",
    [
        lambda c: c.update(max_workers="many"),
        lambda c: c["available_node_types"]["gpu-worker"].pop("node_config"),
        lambda c: c["available_node_types"]["cpu-worker"].update(resources={"CPU": "sixteen"}),
        lambda c: c["available_node_types"]["cpu-worker"].update(gpus=1),
        lambda c: c.update(head_node_type="nope"),
        lambda c: c.update(unknown_top_level_key=1),
    ],
)
def test_schema_check_can_fail(cluster, mutate):
    bad = copy.deepcopy(cluster)
    mutate(bad)
    with pytest.raises((jsonschema.ValidationError, ValueError, KeyError)):
        util.validate_config(util.prepare_config(bad))


#: the CPU build's index, the one a CPU node installs torch from
CPU_INDEX = "--index-url https://download.pytorch.org/whl/cpu"


def _node_setup(cluster: dict, node_type: str) -> list[str]:
    """The setup commands a node of `node_type` runs, by the launcher's rule: the head runs `setup_commands`
    then `head_setup_commands`; a worker runs its type's own `worker_setup_commands` where it has them (in
    place of both global lists), else `setup_commands` then `worker_setup_commands`."""
    if node_type == cluster["head_node_type"]:
        return cluster["setup_commands"] + cluster.get("head_setup_commands", [])
    own = cluster["available_node_types"][node_type].get("worker_setup_commands")
    return own if own is not None else cluster["setup_commands"] + cluster.get("worker_setup_commands", [])


def _ray_pins(commands: list[str]) -> list[str]:
    """The Ray requirement of each command that installs Ray (`ray[default]==2.60.0`, `ray>=2.9`, ...)."""
    return [m.group(0) for c in commands if "pip install" in c
            for m in re.finditer(r"\bray(\[[\w,]+\])?\s*([=<>!~]=?[^\s\"']*)?(?=[\s\"']|$)", c)]


def _check_versions(cluster: dict) -> None:
    """Every node installs one exact Ray version, and torch before qbatch: the CPU build where the node type
    has no GPU, PyPI's (CUDA) build where it has one."""
    pins = set()
    for name, node in cluster["available_node_types"].items():
        commands = _node_setup(cluster, name)
        ray = _ray_pins(commands)
        assert ray and all(re.fullmatch(r"ray(\[default\])?==\d+\.\d+\.\d+", p) for p in ray), (name, ray)
        pins |= set(ray)
        torch = [i for i, c in enumerate(commands) if re.search(r"pip install .*\btorch==", c)]
        qbatch = [i for i, c in enumerate(commands) if "pip install" in c and "qbatch" in c]
        assert len(torch) == 1 and qbatch and torch[0] < qbatch[0], (name, commands)
        on_cpu_index = CPU_INDEX in commands[torch[0]]
        assert on_cpu_index == (not node["resources"].get("GPU")), (name, commands[torch[0]])
    assert len({p.split("==")[1] for p in pins}) == 1, f"nodes install different Rays: {sorted(pins)}"


def test_every_node_installs_the_heads_ray_and_the_torch_its_hardware_uses(cluster):
    _check_versions(cluster)
    (version,) = {
        p.split("==")[1] for t in cluster["available_node_types"] for p in _ray_pins(_node_setup(cluster, t))
    }
    # at least the Ray qbatch requires (pyproject.toml), and the README's torch
    minimum = re.search(r'"ray\[default\]>=([\d.]+)"', (REPO / "pyproject.toml").read_text()).group(1)
    assert tuple(map(int, version.split("."))) >= tuple(map(int, minimum.split(".")))
    readme_torch = re.search(r"pip install (torch==[\d.]+)", (REPO / "README.md").read_text()).group(1)
    assert all(readme_torch in c for t in cluster["available_node_types"] for c in _node_setup(cluster, t)
               if re.search(r"\btorch==", c))


def _cpu_worker(c: dict) -> dict:
    return c["available_node_types"]["cpu-worker"]


@pytest.mark.parametrize("mutate", [
    # unpinned
    lambda c: c["setup_commands"].__setitem__(1, 'python3 -m pip install "ray[default]>=2.9" boto3'),
    lambda c: c["available_node_types"]["gpu-worker"]["worker_setup_commands"].__setitem__(
        1, 'python3 -m pip install "ray[default]==2.59.0" boto3'),  # another Ray on the GPU nodes
    lambda c: _cpu_worker(c).update(worker_setup_commands=[x.replace(" " + CPU_INDEX, "")
                                                           # CUDA torch on CPU nodes
                                                           for x in c["setup_commands"]]),
    lambda c: c["available_node_types"]["gpu-worker"].pop("worker_setup_commands"),  # CPU torch on a GPU node
    lambda c: c["setup_commands"].reverse(),  # qbatch first: pip would pull PyPI's torch for it
])
def test_the_version_check_can_fail(cluster, mutate):
    bad = copy.deepcopy(cluster)
    mutate(bad)
    with pytest.raises(AssertionError):
        _check_versions(bad)
