"""How many evaluations the cluster runs at once: an objective's request for Ray resources, node by node.

`CentralActor` runs `max_concurrent` evaluations at a time; without one in the config it takes what the live
cluster allows for the objective's `Resources` (`default_max_concurrent`). The driver
(orchestrator/runner/progress.py) names the request (`resource_request`) when evaluations wait long for the
cluster to free resources.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from orchestrator.errors import QbatchError

__all__ = ["default_max_concurrent", "resource_request", "slots_for"]


def slots_for(node_resources: Mapping[str, float], request: Mapping[str, float]) -> int:
    """How many evaluations asking for `request` fit on a node with `node_resources` (Ray resource names)."""
    fits = []
    for name, need in request.items():
        if need and need > 0:
            fits.append(int(math.floor(float(node_resources.get(name, 0.0)) / float(need) + 1e-9)))
    return min(fits) if fits else 0


def resource_request(resources: Any) -> dict[str, float]:
    """One evaluation's request for an objective's `Resources`, by Ray's resource names ("CPU", "GPU",
    "memory", custom names), as `ray.available_resources()` names them."""
    opts = resources.to_ray_options()
    request: dict[str, float] = {"CPU": opts.get("num_cpus", 0.0), "GPU": opts.get("num_gpus", 0.0)}
    if opts.get("memory"):
        request["memory"] = float(opts["memory"])
    request.update({k: float(v) for k, v in opts.get("resources", {}).items()})
    return request


def default_max_concurrent(resources: Any) -> int:
    """Evaluations the live cluster can run at once for an objective's `Resources` (sum over alive nodes).

    A request of zero for every resource is bounded by the cluster's CPU count.

    Raises:
        QbatchError: no alive node can run a single evaluation (the message names the request).
    """
    import ray

    request = resource_request(resources)
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    if not any(v > 0 for v in request.values()):
        return max(1, int(sum(n["Resources"].get("CPU", 0) for n in nodes)))
    total = sum(slots_for(n["Resources"], request) for n in nodes)
    if total < 1:
        raise QbatchError(
            f"no node of the cluster can run one evaluation asking for {request}; "
            f"nodes offer {[dict(n['Resources']) for n in nodes]}"
        )
    return total
