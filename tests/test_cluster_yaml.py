"""cluster.yaml is a valid Ray cluster-launcher config, checked with Ray's own schema (issue 4 item 6).

`prepare_config` fills in the provider's defaults exactly as `ray up` does, and `validate_config` checks
the result against `ray/autoscaler/ray-schema.json` with jsonschema. No cloud API is contacted.
"""

from __future__ import annotations

import copy
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
    cpu = [n for n, t in types.items() if n != cluster["head_node_type"] and not t.get("resources", {}).get("GPU")]
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
