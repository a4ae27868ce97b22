"""Fixtures and helpers of the fault tests: a local Ray per module, runs driven from a thread, log audits.

Run inside `scripts/loopback`. Runs are black-box: `run_experiment` with a config dict, the event log read
back with `RunStore.open(run_dir).events()`, the user objective `tests.faults.objectives:PidRecorder` loaded
by import path (the Ray workers import it: the driver's sys.path, which holds the repository root, is theirs).
"""

from __future__ import annotations

import collections
import io
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
#: CPUs of the module's local Ray (evaluations of PidRecorder ask for 0.5 each by default)
NUM_CPUS = 4
OBJECTIVE = "tests.faults.objectives:PidRecorder"


def finished_counts(events: Iterable[Any]) -> collections.Counter:
    """How many completed/failed records each trial id has (exactly once: all ones)."""
    return collections.Counter(e.trial_id for e in events if e.kind in ("completed", "failed"))


def audit(run_dir: str, budget: int) -> dict[str, Any]:
    """Counts of the event log: lost = budget - trials with a record, duplicated = records beyond the
    first."""
    from orchestrator.store import RunStore

    store = RunStore.open(run_dir)
    events = store.events()
    counts = finished_counts(events)
    return {
        "events": events,
        "counts": counts,
        "lost": budget - len(counts),
        "duplicated": sum(c - 1 for c in counts.values()),
        "damage": list(store.damage),
        "results": {e.trial_id: e for e in events if e.kind in ("completed", "failed")},
    }


def trial_of(events: Iterable[Any], params: Mapping[str, float]) -> str:
    """The trial id whose proposal had exactly these parameters."""
    ids = {e.trial_id for e in events if e.kind == "proposed" and e.params == dict(params)}
    assert len(ids) == 1, f"expected one trial with params {dict(params)}, found {sorted(ids)}"
    return ids.pop()


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, period: float = 0.05) -> Any:
    """Poll `predicate` until it returns something truthy; fail the test after `timeout` seconds."""
    t0 = time.time()
    while time.time() - t0 < timeout:
        value = predicate()
        if value:
            return value
        time.sleep(period)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def alive(pid: int) -> bool:
    """Whether `pid` is a live (not zombie) process."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def parent_pid(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as fh:
        return int(fh.read().rsplit(")", 1)[1].split()[1])


def fault_config(tmp_path: Path, name: str, **over: Any) -> dict[str, Any]:
    """A small model-free run of `PidRecorder` (the faults are under test here, not the model)."""
    run_dir = tmp_path / name
    options = {"pid_dir": str(tmp_path / f"{name}-pids"), "sleep_s": 1.0, "num_cpus": 0.5}
    options.update(over.pop("objective_options", {}))
    cfg = {
        "name": name,
        "objective": {"name": OBJECTIVE, "options": options},
        "proposer": "sobol",
        "budget": 8,
        "batch_size": 4,
        "initial_design": 4,
        "max_concurrent": 4,
        "max_retries": 1,
        "timeout_s": 60,
        "failure_guard": {"max_failure_rate": 0.9, "min_trials": 50},
        "seed": 3,
        "run_dir": str(run_dir),
    }
    cfg.update(over)
    return cfg


class RunThread(threading.Thread):
    """`run_experiment(config)` in a background thread of the test process; `.result()` joins it."""

    def __init__(self, config: Mapping[str, Any], **kwargs: Any) -> None:
        super().__init__(daemon=True)
        self.config = config
        self.kwargs = {"progress": False, "out": io.StringIO(), **kwargs}
        self.summary: dict[str, Any] | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        from orchestrator.runner import run_experiment

        try:
            self.summary = run_experiment(self.config, **self.kwargs)
        except BaseException as exc:  # re-raised by result()
            self.error = exc

    def result(self, timeout: float) -> dict[str, Any]:
        self.join(timeout)
        assert not self.is_alive(), f"the run did not finish within {timeout} s"
        if self.error is not None:
            raise self.error
        assert self.summary is not None
        return self.summary


@pytest.fixture(scope="module")
def ray_local():
    """A local Ray for this module (`num_cpus=NUM_CPUS`, loopback, no dashboard), with warm workers.

    `address="local"` always starts a fresh instance: never a cluster named by RAY_ADDRESS or recorded in
    /tmp/ray/ray_current_cluster by another `ray start` / `Cluster` on this machine.
    """
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        ray.shutdown()
    ray.init(address="local", num_cpus=NUM_CPUS, include_dashboard=False, log_to_driver=False)

    @ray.remote(num_cpus=NUM_CPUS / 8)
    def warm(i: int) -> int:
        import workers.evaluate  # noqa: F401

        time.sleep(0.5)
        return i

    ray.get([warm.remote(i) for i in range(8)])
    yield ray
    ray.shutdown()


def fresh_running(pid_dir: str, exclude: Iterable[Mapping[str, float]] = (), key: str = "pid",
                  max_age_s: float = 0.6) -> dict[str, Any] | None:
    """The newest evaluation (a PidRecorder record) that started less than `max_age_s` ago, whose process
    `key` ("pid" = the process running the objective, "ppid" = its parent) is alive, and whose params are
    not in `exclude`; None if there is none yet."""
    from tests.faults.objectives import read_pid_files

    skip = [dict(p) for p in exclude]
    now = time.time()
    for rec in reversed(read_pid_files(pid_dir)):
        if now - rec["time"] <= max_age_s and rec["params"] not in skip and alive(rec[key]):
            return rec
    return None


def env_without_ray_address() -> dict[str, str]:
    """The environment minus RAY_ADDRESS (for subprocesses that must start their own Ray)."""
    return {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
