"""What an evaluation's record holds, in pieces that need no process or Ray: the record itself
(`TrialResult`), the failure reasons, the check of an objective's return value, and the caps and escapes a
text passes before it enters the record or the log.

The evaluation task (workers/evaluate.py) builds its records with them; the config, the optimizer's `tell`,
the store, the central actor, the runner and the CLI use them without importing that task.
"""

from __future__ import annotations

import decimal
import math
import numbers
import time
import traceback as tb_module
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from objectives.base import EvalResult

__all__ = [
    "FAILURE_REASONS",
    "TrialResult",
    "MAX_MESSAGE_CHARS",
    "MAX_METRIC_CHARS",
    "MAX_TIMEOUT_S",
    "MAX_TRACEBACK_CHARS",
    "cap",
    "classify_value",
    "describe_exception",
    "format_exception_traceback",
    "printable",
]

#: longest `timeout_s` (about 11.6 days): the wait on the evaluation's child process overflows past about 24
#: days
MAX_TIMEOUT_S = 1_000_000.0

#: longest message, traceback and metric string a record keeps (every read of the log loads them: `status`,
#: `report`, a resume); longer ones keep their head and tail
MAX_MESSAGE_CHARS = 2_000
MAX_TRACEBACK_CHARS = 20_000
MAX_METRIC_CHARS = 2_000

#: every reason a failed record can carry
FAILURE_REASONS = (
    "exception",  # the objective raised
    "nan",  # returned NaN
    "inf",  # returned +-inf
    "none",  # returned None
    "non-numeric",  # returned a string, bool, dict, ... (not a number)
    "array",  # returned an array / list / tensor instead of one number
    "timeout",  # ran past timeout_s and was killed
    "crash",  # the child process died (os.abort, segfault, killed)
    "worker-lost",  # the Ray worker or node died and Ray's retries ran out (set by the actor)
)


@dataclass
class TrialResult:
    """The outcome of one evaluation, from the worker to the log: what the evaluation task returns
    (workers/evaluate.py) whatever the objective did, and what the central actor makes itself for an
    evaluation that never reports (its timeout backstop, a lost worker or node).

    The actor writes it as the trial's `completed` or `failed` event (`RunLog.result_event`,
    orchestrator/actor/log.py): `status` is the event's kind; `value`, `error`, `traceback`, `node_id`, `pid`,
    `started_at` and `ended_at` are the event's fields of the same names; `message`, `metrics`,
    `metrics_dropped` and `child_pid` go into its `info` (docs/event-log.md "Schema").

    Attributes:
        status: "completed" or "failed".
        value: the objective's value, a finite float (None when failed).
        error: the failure's reason, one of `FAILURE_REASONS` (None when completed).
        message: what went wrong, capped at `MAX_MESSAGE_CHARS` (None when completed).
        traceback: the exception's traceback, a timeout's stacks, or the failure's message.
        started_at, ended_at: seconds since the epoch, around the objective call.
        metrics: what the objective returned with its value, as the log keeps it (workers/metrics.py).
        metrics_dropped: one note per metric the log cannot hold.
        trial_id: the trial's id (set by the task).
        node_id, pid: the Ray node and the worker process that ran it (set by the task; None from the actor).
        child_pid: the sandbox process that ran the objective (``isolate="process"``).
    """

    status: str
    value: float | None = None
    error: str | None = None
    message: str | None = None
    traceback: str | None = None
    started_at: float | None = None
    ended_at: float | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    metrics_dropped: list[str] = field(default_factory=list)
    trial_id: str | None = None
    node_id: str | None = None
    pid: int | None = None
    child_pid: int | None = None

    @classmethod
    def failure(
        cls,
        error: str,
        message: str | None,
        traceback: str | None,
        started: float,
        ended: float | None = None,
        metrics: dict[str, Any] | None = None,
        **fields: Any,
    ) -> TrialResult:
        """A failed result (`fields`: e.g. `child_pid`, `trial_id`); `ended` defaults to now."""
        return cls(
            "failed",
            None,
            error,
            message,
            traceback,
            started,
            time.time() if ended is None else ended,
            metrics or {},
            **fields,
        )


def classify_value(value: Any) -> tuple[float | None, str | None, str | None]:
    """Turn an objective's return value into `(value, reason, message)`; reason is None when valid.

    Accepts a finite real number (Python's, a `Fraction` or `Decimal`, a NumPy scalar, or a 0-d tensor or
    array) or an `EvalResult` holding one. Everything else is a failure with a reason from `FAILURE_REASONS`.
    """
    if isinstance(value, EvalResult):
        value = value.value
    if value is None:
        return None, "none", "the objective returned None"
    if isinstance(value, (bool, np.bool_)):
        return None, "non-numeric", f"the objective returned a bool ({value!r}), not a number"
    if isinstance(value, (str, bytes)):
        return None, "non-numeric", f"the objective returned a string ({value[:80]!r}), not a number"
    if isinstance(value, (list, tuple, np.ndarray)) or type(value).__name__ == "Tensor":
        # (not `getattr(value, "shape", (len(value),))`: it evaluates len() of a 0-d array or tensor, which
        # raises)
        shape = tuple(value.shape) if hasattr(value, "shape") else (len(value),)
        if len(shape) == 0 and hasattr(value, "item"):  # a 0-d tensor or array holds one number
            try:
                item = value.item()
            except Exception as exc:  # noqa: BLE001 - e.g. a 0-d object array of user code
                return None, "non-numeric", (f"the objective's 0-d {type(value).__name__} is not a number "
                                             f"({describe_exception(exc)})")
            return classify_value(item)
        return None, "array", f"the objective returned an array of shape {shape}, not one number"
    # Fraction, Decimal too
    if not isinstance(value, (numbers.Real, np.integer, np.floating, decimal.Decimal)):
        return None, "non-numeric", f"the objective returned a {type(value).__name__}, not a number"
    try:
        x = float(value)
    except OverflowError:  # an int (or int-like) beyond the float range
        return None, "inf", "the objective returned a number too large for a float"
    except Exception as exc:  # noqa: BLE001 - a number type of user code whose conversion raises
        return None, "non-numeric", (f"the objective's {type(value).__name__} is not a number "
                                     f"({describe_exception(exc)})")
    if math.isnan(x):
        return None, "nan", "the objective returned NaN"
    if math.isinf(x):
        return None, "inf", f"the objective returned {x}"
    return x, None, None


def cap(text: str, limit: int, head: int | None = None, sep: str = "\n") -> str:
    """`text`, or its head and tail with the number of characters cut between them when it exceeds `limit`.

    `head` characters are kept from the start (default a quarter of `limit`), the rest of `limit` from the
    end; `sep` stands either side of the cut note (a newline; a space for one-line messages)."""
    if len(text) <= limit:
        return text
    head = limit // 4 if head is None else head
    tail = limit - head
    return f"{text[:head]}{sep}... [{len(text) - limit} characters cut] ...{sep}{text[-tail:]}"


def printable(text: str) -> str:
    """`text` as valid UTF-8: lone surrogates (an undecodable file name in a message, e.g. from `os.listdir`)
    become `\\udcff` escapes, which the log, a terminal and JSON all take."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def describe_exception(exc: BaseException) -> str:
    """`Type: message` of an exception, even when its `__str__` raises."""
    try:
        return cap(printable(f"{type(exc).__name__}: {exc}"), MAX_MESSAGE_CHARS)
    except Exception:  # noqa: BLE001 - a broken __str__ of user code
        return f"{type(exc).__name__}: <unprintable: its __str__ raised>"


def format_exception_traceback(exc: BaseException) -> str:
    try:
        text = printable("".join(tb_module.format_exception(type(exc), exc, exc.__traceback__)))
    except Exception:  # noqa: BLE001 - a broken __str__ of user code
        text = printable("".join(tb_module.format_tb(exc.__traceback__))) + describe_exception(exc)
    return cap(text, MAX_TRACEBACK_CHARS)
