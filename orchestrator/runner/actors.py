"""The run's two Ray actors: the central actor and the evaluation pool, named after the run directory.

ARCHITECTURE.md "The path of one evaluation", steps 1 and 6. The driver creates the evaluation pool
(workers/pool.py), which owns the evaluation tasks, and the central actor (orchestrator/actor.py) with
`max_restarts`: a crashed central actor is restarted, replays the event log and finds its pool by name, while
the evaluations go on. Both are named in `NAMESPACE` after the run directory, so a second run on the same
directory is refused in one line, and placed on the driver's node. The driver reads the central actor's pid to
tell a restart from a moment it was unreachable; an actor that cannot start or dies for good is one line
naming the cause.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Mapping
from typing import Any

from orchestrator.actor import CentralActor
from orchestrator.errors import ConfigError, QbatchError, UsageError
from workers.pool import EvaluationPool

#: Ray namespace of the central actors; each is named after its run directory (`actor_name`)
NAMESPACE = "qbatch"
#: restarts of a crashed central actor before the run gives up (each restart replays the log)
ACTOR_RESTARTS = 3


def actor_name(run_dir: str) -> str:
    """Name of the central actor of `run_dir` (find it with `ray.get_actor(actor_name(d),
    namespace=NAMESPACE)`)."""
    return "qbatch:" + os.path.abspath(run_dir) if "://" not in run_dir else "qbatch:" + run_dir


def pool_name(run_dir: str) -> str:
    """Name of the evaluation pool of `run_dir`, in `NAMESPACE`. Its own prefix: a suffix
    (`actor_name(d) + ":pool"`) would make the pool of `d` the central actor of a run directory `d:pool`."""
    return "qbatch-pool:" + actor_name(run_dir)[len("qbatch:"):]


def _name_taken(name: str, run_dir: str, new_run: bool) -> UsageError:
    """A run whose actor's name another actor on this Ray holds (the same run directory path, e.g. from
    another machine or container sharing the cluster): one line, and a new run, which recorded nothing, leaves
    no run directory behind (rather than a Ray traceback and a rerun refused as "already holds a run")."""
    from orchestrator.store import RunStore

    if not new_run:
        return UsageError(f"an actor named {name!r} (namespace {NAMESPACE!r}) is already on this Ray: a "
                          f"qbatch run with the run directory path {run_dir} goes on there (from another "
                          "machine or container?); resume this run once that one has ended, or on another "
                          "Ray")
    then = ""
    if RunStore.discard_unstarted(run_dir):
        then = "; nothing was recorded and the run directory was cleared"
    return UsageError(f"an actor named {name!r} (namespace {NAMESPACE!r}) is already on this Ray: another "
                      f"qbatch run uses the run directory path {run_dir} (from another machine or "
                      f"container?); choose another --run-dir{then}")


def _start_actors(
    run_dir: str,
    cfg: Any,
    resources: Any,
    max_concurrent: int | None,
    actor_options: Mapping[str, Any],
    new_run: bool,
    by_value: Any = None,
) -> tuple[Any, Any]:
    """Create the evaluation pool, then the central actor of `run_dir`; their handles `(actor, pool)`. A name
    another actor holds is `_name_taken`; the pool of a central actor that cannot be created is killed. The
    pool evaluates `by_value` (a `ByValue` objective) where one is given, else the config's `(name,
    options)`."""
    import ray

    # the driver owns the evaluation tasks' owner, so evaluations survive a crash of the central actor; both
    # actors go to the driver's node (the head, in the README's cluster recipe), so the model's refits do not
    # compete with evaluations on a worker. Hard affinity: Ray's soft one placed a 0-CPU actor elsewhere 7
    # times in 8 (three-node Cluster); the node cannot be lost without the driver, whose run then ends anyway.
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    node_id = None
    try:
        node_id = ray.get_runtime_context().get_node_id()
        here: Any = NodeAffinitySchedulingStrategy(node_id, soft=False)
    except Exception:  # no node of its own to name (e.g. a Ray client): Ray's default placement
        here = "DEFAULT"
    num_gpus = _actor_gpus(cfg.device, node_id)
    pname = pool_name(run_dir)  # the central actor finds the pool by name (CentralActor's `pool`)
    try:
        pool = ray.remote(EvaluationPool).options(
            num_cpus=0, max_restarts=-1, name=pname, namespace=NAMESPACE, scheduling_strategy=here
        ).remote(
            (cfg.objective.name, dict(cfg.objective.options)) if by_value is None else by_value, resources,
            timeout_s=cfg.timeout_s,
            max_retries=cfg.max_retries, isolate=actor_options.get("isolate", "process"),
        )
    except ValueError as exc:  # ActorAlreadyExistsError (a ValueError; Ray's older versions raise ValueError)
        if "already taken" not in str(exc):
            raise
        raise _name_taken(pname, run_dir, new_run) from None
    Actor = ray.remote(CentralActor)
    try:
        actor = Actor.options(
            num_cpus=0, num_gpus=num_gpus, max_concurrency=4, max_restarts=ACTOR_RESTARTS,
            name=actor_name(run_dir), namespace=NAMESPACE, scheduling_strategy=here,
        ).remote(
            run_dir, max_concurrent=max_concurrent if max_concurrent is not None else cfg.max_concurrent,
            pool=(NAMESPACE, pname), **actor_options
        )
    except ValueError as exc:
        with contextlib.suppress(Exception):
            ray.kill(pool)
        if "already taken" not in str(exc):
            raise
        raise _name_taken(actor_name(run_dir), run_dir, new_run) from None
    return actor, pool


def _actor_gpus(device: str, node_id: str | None) -> int:
    """The GPUs the central actor asks Ray for: one when `device` wants one (`orchestrator.device.wants_gpu`)
    on its node, the driver's.

    Raises:
        ConfigError: `device` names CUDA and that node offers Ray no GPU (the actor would wait for one
            forever).
    """
    import ray

    from orchestrator.device import wants_gpu

    node = next((n for n in ray.nodes() if n.get("NodeID") == node_id and n.get("Alive")), None)
    # without a node of its own (a Ray client) the actor may go anywhere: the cluster's GPUs count
    offered = dict(node["Resources"]) if node is not None else dict(ray.cluster_resources())
    gpus = float(offered.get("GPU", 0.0))
    if not wants_gpu(device, gpus):
        return 0
    if gpus < 1:
        where = "the driver's node, where the central actor runs," if node is not None else "the cluster"
        raise ConfigError(f"`device` is {device!r}, but {where} offers Ray no GPU (resources: {offered}); "
                          "use 'cpu' or 'auto', or start the run on a GPU node")
    return 1


def _wait_for_actor(actor: Any, timeout_s: float = 600.0) -> int:
    """Wait until the central actor answers again (after a restart it has replayed the log); its pid.

    Raises the actor's error when it is dead for good (restarts exhausted) or still unreachable after
    `timeout_s`.
    """
    import ray

    t0 = time.time()
    while True:
        try:
            return ray.get(actor.pid.remote(), timeout=60)
        except (ray.exceptions.ActorUnavailableError, ray.exceptions.GetTimeoutError):
            if time.time() - t0 > timeout_s:
                raise
            time.sleep(0.5)


def _actor_pid(actor: Any, run_dir: str, after_error: bool = False, new_run: bool = False) -> int:
    """The central actor's pid: at its start, or `after_error` once it answers again (`_wait_for_actor`). An
    actor that could not start, or died for good (its restarts used up), is a `QbatchError` of one line naming
    the cause and how to continue, not Ray's traceback. A `new_run` whose actor could not start has recorded
    nothing: its run directory is cleared (`RunStore.discard_unstarted`), so that the same command runs again
    once the cause is fixed (a cluster that cannot import the user's objective would otherwise leave a run
    directory that refuses the rerun, and a resume that fails the same way)."""
    import ray

    try:
        return _wait_for_actor(actor) if after_error else ray.get(actor.pid.remote())
    except ray.exceptions.RayActorError as exc:
        line = _error_line(exc)
        if not after_error and "is being written by another run" in line:
            # lost the writer lock to a run or resume started at the same moment: refused as before Ray starts
            # (exit 2), without the resume hint that would be refused the same way
            raise UsageError(f"the central actor of {run_dir} could not start: {line}") from None
        hint = ""
        if re.search(r"cannot import module|ModuleNotFoundError|No module named", line):
            hint = (" (the driver imported the objective, the central actor's Ray worker could not: on a "
                    "cluster, start its nodes with the module on their PYTHONPATH, or submit the run with "
                    "`ray job submit --working-dir`)")
        what = "died for good (its restarts are used up)" if after_error else "could not start"
        then = f"every recorded result is in the log, `qbatch resume {run_dir}` continues the run"
        if not after_error and new_run and _discard_when_released(actor, run_dir):
            then = (
                "nothing was recorded and the run directory was cleared: run the same command again once "
                "that is fixed"
            )
        raise QbatchError(f"the central actor of {run_dir} {what}: {line}{hint}; {then}") from None


def _discard_when_released(actor: Any, run_dir: str, wait_s: float = 15.0) -> bool:
    """`RunStore.discard_unstarted` once the failed actor's process has let go of the writer lock (it took the
    lock before it failed, and its worker exits a moment after Ray reports the failure)."""
    import ray

    from orchestrator.store import RunStore

    try:
        ray.kill(actor)
    except Exception:  # noqa: BLE001 -- already gone
        pass
    deadline = time.monotonic() + wait_s
    while RunStore.is_being_written(run_dir) and time.monotonic() < deadline:
        time.sleep(0.1)
    return RunStore.discard_unstarted(run_dir)


def _error_line(exc: BaseException) -> str:
    """The last `SomeError: message` line of an exception's text (Ray wraps the cause's traceback), else its
    first."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    causes = [ln for ln in lines if re.match(r"^[\w.]+(Error|Exception|Exit)\b.*:", ln)]
    return (causes or lines or [type(exc).__name__])[-1 if causes else 0][:400]
