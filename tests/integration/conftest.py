"""Integration fixtures: one local Ray per test module with a fixed `num_cpus`, bound to loopback.

Run these tests inside `scripts/loopback` (a network namespace with only `lo`), as CI does. The Ray
instance is shared by the tests of a module (ray-project testing tips: fix num_cpus, share one Ray per
module); its worker processes are warmed up once so the first measured run does not pay their start-up.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable

import pytest

#: CPUs of the module's local Ray; evaluations of the sleep objective ask for a fraction of one
NUM_CPUS = 4


#: fast model and proposer settings for CI runs; the benchmarks use the defaults
FAST_MODEL = {"type": "quantile", "options": {"num_inducing": 16, "max_steps": 60, "warm_max_steps": 20}}
FAST_PROPOSER = {"type": "thompson", "options": {"num_features": 128, "raw_samples": 128, "num_restarts": 1,
                                                 "maxiter": 20}}


def run_config(tmp_path, name: str, **over) -> dict:
    """A run of the sleep objective (0.3 s evaluations, one CPU each) on 4 slots with the fast model: tau 0.2,
    batches and initial design of 20, budget 200, seed 1, in `tmp_path/name`; `over` replaces keys."""
    cfg = {
        "name": name,
        "objective": {"name": "sleep", "options": {"mean_s": 0.3, "cv": 0.5, "num_cpus": 1}},
        "tau": 0.2,
        "model": FAST_MODEL,
        "proposer": FAST_PROPOSER,
        "batch_size": 20,
        "initial_design": 20,
        "budget": 200,
        "max_concurrent": 4,
        "seed": 1,
        "run_dir": str(tmp_path / name),
    }
    cfg.update(over)
    return cfg


def span_utilization(events: Iterable, slots: int) -> float:
    """U = busy evaluation time / (slots x span), span = first started_at to last ended_at."""
    recs = [e for e in events if e.kind in ("completed", "failed") and e.started_at is not None]
    if not recs:
        return 0.0
    busy = sum(e.ended_at - e.started_at for e in recs)
    span = max(e.ended_at for e in recs) - min(e.started_at for e in recs)
    return busy / (slots * span)


def finished_counts(events: Iterable) -> collections.Counter:
    """How many completed/failed events each trial id has (exactly-once means all ones)."""
    return collections.Counter(e.trial_id for e in events if e.kind in ("completed", "failed"))


@pytest.fixture(scope="module")
def ray_local():
    """A local Ray for this module: `num_cpus=NUM_CPUS`, no dashboard; yields its GCS address."""
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        ray.shutdown()
    ctx = ray.init(address="local", num_cpus=NUM_CPUS, include_dashboard=False, log_to_driver=False)

    @ray.remote(num_cpus=NUM_CPUS / 8)
    def warm(i: int) -> int:
        return i

    ray.get([warm.remote(i) for i in range(8)])
    yield ctx.address_info["gcs_address"]
    ray.shutdown()
