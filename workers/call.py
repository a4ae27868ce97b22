"""One call of the objective in this process, and its `TrialResult`: the value or the failure, the metrics,
the times around the call; also the failed result of an objective that could not be built.

ARCHITECTURE.md "The path of one evaluation", step 3: whatever the objective does, an evaluation ends as one
`TrialResult` (workers/records.py). The sandbox child (workers/sandbox.py) and the thread of
``isolate="thread"`` (workers/evaluate.py) both call the objective through `call_objective`; the task adds the
trial id, the process and the node (`evaluate_once`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

from objectives.base import EvalResult, Objective
from workers.by_value import ByValue
from workers.metrics import clean_metrics
from workers.records import TrialResult, classify_value, describe_exception, format_exception_traceback

__all__ = ["call_objective", "load_failure", "spec_key"]


def spec_key(spec: tuple[str, Mapping[str, Any]] | ByValue) -> str:
    """A `(name, options)` spec, or a `ByValue` objective, as a string that identifies it (a sandbox serves
    the spec it built)."""
    if isinstance(spec, ByValue):
        return f"by-value:{spec.key}"
    name, options = spec
    return json.dumps([name, dict(options or {})], sort_keys=True, default=str)


def load_failure(exc: BaseException, started: float) -> TrialResult:
    """The result of an evaluation whose objective could not be built (a failed trial, as when the worker
    raised
    it: the actor records a task's exception the same way)."""
    return TrialResult.failure("exception", f"loading the objective failed: {describe_exception(exc)}",
                               format_exception_traceback(exc), started)


def call_objective(objective: Objective, params: Mapping[str, Any], seed: int) -> TrialResult:
    """Run the objective here; return its result (no process/timing bookkeeping)."""
    started = time.time()
    try:
        raw = objective(dict(params), seed)
    except BaseException as exc:  # noqa: BLE001 - any exception of user code is a failed trial
        ended = time.time()
        return TrialResult.failure(
            "exception", describe_exception(exc), format_exception_traceback(exc), started, ended
        )
    ended = time.time()
    try:
        value, reason, message = classify_value(raw)
    except Exception as exc:  # noqa: BLE001 - a returned object whose conversion raises is a failed trial
        value, reason, message = None, "non-numeric", \
            f"the objective's return value could not be read: {describe_exception(exc)}"
    try:
        metrics, dropped = clean_metrics(raw.metrics) if isinstance(raw, EvalResult) else ({}, [])
    except Exception as exc:  # noqa: BLE001 - a mapping of user code whose items() raises: the value stands
        metrics, dropped = {}, [f"metrics: could not be read ({describe_exception(exc)})"]
    if reason is not None:
        return TrialResult.failure(reason, message, message, started, ended, metrics, metrics_dropped=dropped)
    return TrialResult("completed", value, started_at=started, ended_at=ended, metrics=metrics,
                       metrics_dropped=dropped)
