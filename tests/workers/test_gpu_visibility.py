"""An evaluation sees the GPUs its objective asks Ray for, and none when it asks for none.

Ray 2.60 leaves CUDA_VISIBLE_DEVICES as the node has it for a task of `num_gpus=0` (it used to empty it), so
on an H100 every CPU-only CNN evaluation trained on the GPU (`benchmarks/gpu.py`, its CPU run). A local Ray
told it has one GPU (none is needed: Ray hands out ids 0..n-1) started where CUDA_VISIBLE_DEVICES=0 stands for
a GPU node.
"""

from __future__ import annotations

import os
import sys

import pytest

from objectives.base import Objective, Resources
from workers.evaluate import submit_evaluation

pytestmark = pytest.mark.ray

#: the value an evaluation returns for each CUDA_VISIBLE_DEVICES it sees
_CODES = {None: -1.0, "": 0.0, "0": 1.0}


class _VisibleDevices(Objective):
    space = {"x": {"type": "float", "low": 0.0, "high": 1.0}}

    def evaluate(self, params, seed):
        return _CODES.get(os.environ.get("CUDA_VISIBLE_DEVICES"), 99.0)


@pytest.fixture(scope="module")
def ray_one_gpu():
    ray = pytest.importorskip("ray")
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    before = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = "0"  # the raylet and its workers inherit it, as on a GPU node
    try:
        ray.init(address="local", num_cpus=2, num_gpus=1, include_dashboard=False, log_to_driver=False)
    finally:
        if before is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES")
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = before
    yield ray
    ray.shutdown()


@pytest.mark.parametrize("isolate", ["process", "thread"])
def test_an_evaluation_sees_only_the_gpus_it_asked_for(ray_one_gpu, isolate):
    ray = ray_one_gpu
    obj = ray.put(_VisibleDevices())
    order = [("gpu", 1.0), ("cpu", 0.0), ("gpu", 1.0), ("cpu", 0.0), ("cpu", 0.0)]
    recs = [
        ray.get(
            submit_evaluation(
                obj,
                f"0-{i}",
                {"x": 0.5},
                i,
                resources=Resources(num_cpus=1, num_gpus=g),
                timeout_s=60,
                isolate=isolate,
            ),
            timeout=120,
        )
        for i, (_, g) in enumerate(order)
    ]
    assert all(r.status == "completed" for r in recs), [r.error for r in recs]
    # a task given the GPU sees it; one that asked for none sees an empty list, also in a worker that ran a
    # GPU task
    assert [r.value for r in recs] == [1.0 if kind == "gpu" else 0.0 for kind, _ in order]
