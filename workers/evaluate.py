"""One evaluation of an objective as a Ray task: resources, timeout, retries, failures as records.

ARCHITECTURE.md "The path of one evaluation", step 3. Each evaluation runs the objective in a child process of
the Ray worker (``isolate="process"``, workers/sandbox.py), so a hang past `timeout_s` is killed and a crash
of the objective (``os.abort``, a segfault) cannot take the worker down; ``isolate="thread"`` runs it in a
thread instead (no fork; a hung thread is abandoned, not killed). Whatever happens - an exception, a NaN, inf,
None, a string, an array, a timeout, a crash - the task returns one `TrialResult` (workers/records.py, which
lists what it holds); only the loss of the Ray worker or node itself surfaces as a Ray error, which Ray
retries (`max_retries`) and the central actor records as "worker-lost". A result is never recorded twice: the
actor ingests exactly once per trial id.

A timeout's traceback holds where the objective hung: the child's Python stacks, which it writes
(faulthandler, on `STACK_SIGNAL`) just before it is killed, or the abandoned thread's stack.

This module holds the task and its public API; the call of the objective and its payload are in
workers/call.py, the sandbox in workers/sandbox.py, its process plumbing in workers/processes.py.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
import traceback as tb_module
from collections.abc import Callable, Mapping
from typing import Any

from objectives.base import Objective, Resources
from workers.by_value import ByValue
from workers.call import call_objective, spec_key
from workers.metrics import MAX_DROPPED_NOTES, MAX_METRICS, MAX_METRICS_BYTES
from workers.processes import STACK_SIGNAL, STACK_WAIT_S
from workers.records import MAX_TIMEOUT_S, MAX_TRACEBACK_CHARS, TrialResult, cap, printable
from workers.sandbox import run_in_child

__all__ = [
    "MAX_DROPPED_NOTES",
    "MAX_METRICS",
    "MAX_METRICS_BYTES",
    "STACK_SIGNAL",
    "STACK_WAIT_S",
    "evaluate_once",
    "evaluation_runtime_env",
    "evaluation_submitter",
    "evaluation_task",
    "submit_evaluation",
    "task_options",
]


def evaluation_runtime_env(isolate: str = "process") -> dict[str, Any]:
    """The runtime environment of evaluation tasks: Ray workers of their own (`task_options`), apart by
    isolation mode too (a thread-isolated objective runs torch in the worker itself).

    `RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=1`: an evaluation sees the GPUs its objective asks for and no others.
    Ray (2.60 here) no longer empties it for a task that asks for no GPU: the task keeps the node's
    CUDA_VISIBLE_DEVICES (all its GPUs), so on a GPU node every CPU-only evaluation of a torch objective
    trained on GPU 0, beside the evaluations Ray had given it to (seen on an H100: `benchmarks/gpu.py`'s CPU
    run had `used_gpu` 1)."""
    return {"env_vars": {"QBATCH_EVALUATION_WORKER": isolate, "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "1"}}


#: objectives built from a `(name, options)` spec in this process (``isolate="thread"``), by `spec_key`
_OBJECTIVE_CACHE: dict[str, Objective] = {}


def _resolve_objective(objective: Objective | tuple[str, Mapping[str, Any]] | ByValue) -> Objective:
    """An `Objective`, or a `(name, options)` spec or a `ByValue` objective loaded once per worker process and
    cached."""
    if isinstance(objective, Objective):
        return objective
    key = spec_key(objective)
    if key not in _OBJECTIVE_CACHE:
        if isinstance(objective, ByValue):
            _OBJECTIVE_CACHE[key] = objective.load()
        else:
            from objectives.registry import load_objective

            name, options = objective
            _OBJECTIVE_CACHE[key] = load_objective(name, options)
    return _OBJECTIVE_CACHE[key]


def _run_in_thread(
    objective: Objective, params: Mapping[str, Any], seed: int, timeout_s: float
) -> TrialResult:
    """Evaluate in a thread of this process (``isolate="thread"``); past `timeout_s` the thread is
    abandoned."""
    box: list[TrialResult] = []
    started = time.time()
    thread = threading.Thread(target=lambda: box.append(call_objective(objective, params, seed)), daemon=True)
    thread.start()
    thread.join(timeout_s)
    if box:
        return box[0]
    frame = sys._current_frames().get(thread.ident)  # where it hangs: the record says so, as a process's does
    stack = "" if frame is None else printable("".join(tb_module.format_stack(frame)))
    stack = f"\n\nits stack when it was abandoned:\n{stack}" if stack else ""
    return TrialResult.failure("timeout", f"timeout after {timeout_s:g} s",
                               cap(f"the evaluation ran past timeout_s={timeout_s:g} s; its thread was "
                                   f"abandoned (isolate='thread'){stack}", MAX_TRACEBACK_CHARS), started)


def evaluate_once(
    objective: Objective | tuple[str, Mapping[str, Any]] | ByValue,
    trial_id: str,
    params: Mapping[str, Any],
    seed: int,
    timeout_s: float = 600.0,
    isolate: str = "process",
    on_progress: Callable[[], None] | None = None,
) -> TrialResult:
    """Evaluate one trial in this process (no Ray needed) and return its result.

    Args:
        objective: an `Objective`, a `(name, options)` spec for `objectives.registry.load_objective`, or a
            `ByValue` objective (workers/by_value.py), built where it runs.
        trial_id: the trial's unique id, copied into the record.
        params: parameter name -> value.
        seed: the evaluation's random seed.
        timeout_s: seconds before the evaluation is killed (process) or abandoned (thread).
        isolate: "process" (forked child, killable) or "thread".
        on_progress: called when a new sandbox child has imported a `(name, options)` spec's module (not
            timed) and when it has built the objective (`timeout_s` of its own, before the evaluation's).

    Returns:
        The evaluation's `TrialResult`, with `trial_id`, `pid` and `node_id` set.
    """
    if isolate not in ("process", "thread"):
        raise ValueError(f"isolate must be 'process' or 'thread'; got {isolate!r}")
    if not (isinstance(timeout_s, (int, float)) and 0 < timeout_s <= MAX_TIMEOUT_S):
        raise ValueError(f"timeout_s must be a number in (0, {MAX_TIMEOUT_S:g}]; got {timeout_s!r}")
    if isolate == "process":  # a spec is built in the sandbox child (workers/sandbox.py says why)
        result = run_in_child(objective, params, int(seed), float(timeout_s), on_progress)
    else:
        result = _run_in_thread(_resolve_objective(objective), params, int(seed), float(timeout_s))
    result.trial_id, result.pid, result.node_id = trial_id, os.getpid(), _node_id()
    return result


def _node_id() -> str | None:
    try:
        import ray

        if ray.is_initialized():
            return ray.get_runtime_context().get_node_id()
    except Exception:  # pragma: no cover - outside Ray
        pass
    return None


def _evaluation_task(
    objective: Objective | tuple[str, Mapping[str, Any]] | ByValue,
    trial_id: str,
    params: Mapping[str, Any],
    seed: int,
    timeout_s: float,
    isolate: str,
    report_start: Any = None,
) -> TrialResult:
    def report() -> None:
        # the pool's handle: tell it when this attempt starts (it may have been queued)
        if report_start is not None:
            try:
                report_start.started.remote(trial_id, time.time())
            except Exception:  # noqa: BLE001 - the pool is gone: its owner sees that on the ref, not here
                pass

    report()
    # again once a new sandbox has imported and built the objective: the actor's backstop counts from there
    return evaluate_once(objective, trial_id, params, seed, timeout_s, isolate, on_progress=report)


def task_options(resources: Resources, max_retries: int = 1, isolate: str = "process") -> dict[str, Any]:
    """Ray task options for one evaluation: the objective's resources plus retries of a lost worker/node.

    `retry_exceptions` stays False: an exception of the objective is a result (a failed trial), not a
    reason to run it again; only the death of the worker process or its node makes Ray retry.

    The runtime environment (one marker variable, merged into the job's) gives evaluations Ray workers of
    their own: Ray reuses a worker only for tasks of the same runtime environment, so no evaluation lands in a
    worker where the user's other tasks ran multi-threaded torch, which would deadlock the sandbox forked from
    it (GNU OpenMP is not fork-safe; this happens through the library API too). Thread-isolated evaluations,
    which run the objective in the worker itself, get workers apart from the process-isolated ones.
    """
    if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
        raise ValueError(f"max_retries must be an integer >= 0; got {max_retries!r}")
    opts = resources.to_ray_options()
    opts.update(max_retries=max_retries, retry_exceptions=False, runtime_env=evaluation_runtime_env(isolate))
    return opts


@functools.cache
def evaluation_task() -> Any:
    """The `ray.remote` function behind `submit_evaluation` (created on first use)."""
    import ray

    return ray.remote(_evaluation_task)


def submit_evaluation(
    objective: Any,
    trial_id: str,
    params: Mapping[str, Any],
    seed: int,
    *,
    resources: Resources,
    timeout_s: float = 600.0,
    max_retries: int = 1,
    isolate: str = "process",
    report_start: Any = None,
) -> Any:
    """Launch one evaluation as a Ray task; returns its `ObjectRef` (resolves to the `TrialResult`).

    Args:
        objective: an `Objective`, a `(name, options)` spec, a `ByValue` objective, or an `ObjectRef` of one
            (`ray.put` once).
        trial_id, params, seed, timeout_s, isolate: as in `evaluate_once`.
        resources: the objective's `Resources` (num_cpus, num_gpus, memory, custom).
        max_retries: Ray retries when the worker process or node dies.
        report_start: an actor handle whose `started(trial_id, time)` each attempt calls when it starts
            (the `EvaluationPool`: a task may wait in Ray's queue long after it was submitted).
    """
    return evaluation_submitter(resources, max_retries, isolate).remote(
        objective, trial_id, dict(params), int(seed), float(timeout_s), isolate, report_start
    )


def evaluation_submitter(resources: Resources, max_retries: int = 1, isolate: str = "process") -> Any:
    """The evaluation task with its `task_options`, whose ``.remote(objective, trial_id, params, seed,
    timeout_s, isolate, report_start)`` starts one evaluation: made once, it spares each submission Ray's
    validation of the options (the `EvaluationPool` keeps one)."""
    return evaluation_task().options(**task_options(resources, max_retries, isolate))
