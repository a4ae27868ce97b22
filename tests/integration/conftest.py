"""Integration fixtures: one local Ray per test module with a fixed `num_cpus`, bound to loopback.

Run these tests inside `scripts/loopback` (a network namespace with only `lo`), as CI does. The Ray
instance is shared by the tests of a module (ray-project testing tips: fix num_cpus, share one Ray per
module); its worker processes are warmed up once so the first measured run does not pay their start-up.
"""

from __future__ import annotations

import collections
from typing import Iterable

import pytest

#: CPUs of the module's local Ray; evaluations of the sleep objective ask for a fraction of one
NUM_CPUS = 4


def span_utilization(events: Iterable, slots: int) -> float:
    """U = busy evaluation time / (slots x span), span = first started_at to last ended_at (issue 4)."""
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
    ctx = ray.init(num_cpus=NUM_CPUS, include_dashboard=False, log_to_driver=False)

    @ray.remote(num_cpus=NUM_CPUS / 8)
    def warm(i: int) -> int:
        return i

    ray.get([warm.remote(i) for i in range(8)])
    yield ctx.address_info["gcs_address"]
    ray.shutdown()
