"""The metrics of an evaluation's record: which values of an objective's `EvalResult.metrics` the log keeps,
as what, and the caps on their count and size; a note for each one it drops.

ARCHITECTURE.md "The path of one evaluation", step 4: every read of the log and every row of trials.csv holds
the metrics, so a record keeps only plain JSON data of bounded size. The call of the objective
(workers/call.py) cleans them in whichever process ran it.
"""

from __future__ import annotations

import decimal
import json
import math
import numbers
import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

from objectives.base import is_json_data
from workers.records import MAX_METRIC_CHARS, cap

__all__ = ["MAX_DROPPED_NOTES", "MAX_METRICS", "MAX_METRICS_BYTES", "clean_metrics"]

#: ints within int64 are kept exact, larger ones as floats
_INT64 = 2**63
#: notes `metrics_dropped` keeps at most (the rest are counted in one more)
MAX_DROPPED_NOTES = 20
#: most metrics one record keeps, and most characters of them all together (names and values, JSON-encoded):
#: every read of the log and every row of trials.csv holds them; the ones past either cap are dropped, in the
#: objective's order, and named in `metrics_dropped`
MAX_METRICS = 1_000
MAX_METRICS_BYTES = 200_000


def _finite_float(v: Any) -> float | None:
    """`v` as a finite float, or None (NaN, inf, or an int beyond the float range)."""
    try:
        x = float(v)
    except Exception:  # noqa: BLE001 - beyond the float range, or a number type of user code that raises
        return None
    return x if math.isfinite(x) else None


def _is_tensor(v: Any) -> bool:
    torch = sys.modules.get("torch")  # a tensor exists only where torch was imported
    return torch is not None and isinstance(v, torch.Tensor)


def _metric_value(v: Any) -> tuple[bool, Any]:
    """`(True, v as JSON data)`, or `(False, None)` for a value the log cannot hold as it is."""
    if v is None or isinstance(v, (bool, np.bool_)):
        return True, None if v is None else bool(v)
    if isinstance(v, np.generic) or ((_is_tensor(v) or isinstance(v, np.ndarray)) and v.ndim == 0):
        try:  # a NumPy scalar, a 0-d array or tensor (`metrics={"loss": loss}`): its one number
            item = v.item()
        except Exception:  # noqa: BLE001 - a 0-d object array of user code
            return False, None
        if isinstance(item, np.floating):  # np.longdouble's item() is itself
            item = float(item)
        return (False, None) if isinstance(item, (np.generic, np.ndarray)) else _metric_value(item)
    # exact within int64 (an id, a count); beyond it a float, as the log's readers expect
    if isinstance(v, int):
        if -_INT64 <= v < _INT64:
            return True, int(v)
        x = _finite_float(v)
        return x is not None, x
    # a float, Fraction, Decimal; NaN and inf too: a diverged loss is worth keeping
    if isinstance(v, (numbers.Real, decimal.Decimal)):
        try:
            return True, float(v)
        except Exception:  # noqa: BLE001 - a number type of user code whose conversion raises
            return False, None
    if isinstance(v, str):
        return True, cap(str(v), MAX_METRIC_CHARS)
    # small JSON data (a per-epoch curve, a config dict), kept whole
    if isinstance(v, (list, tuple, Mapping)):
        try:
            # numpy/torch inside, a non-string key (JSON would rename it), a set
            if not is_json_data(v, tuples=True):
                return False, None
            text = json.dumps(v, allow_nan=True, separators=(",", ":"))
        except (TypeError, ValueError, RecursionError):  # a cycle, nesting too deep
            return False, None
        return (True, json.loads(text)) if len(text) <= MAX_METRIC_CHARS else (False, None)
    return False, None


def clean_metrics(metrics: Any) -> tuple[dict[str, Any], list[str]]:
    """The metrics the log keeps, and a note for each one it cannot keep (the record's `metrics_dropped`).

    Kept: None, bools, numbers (NumPy scalars and 0-d arrays or tensors by their value; ints exact within
    int64; Fraction and Decimal as floats; NaN and inf as they are), strings (capped), and lists/dicts of
    plain JSON data (string keys) up to `MAX_METRIC_CHARS` encoded. Keys are strings (`str(key)`, capped); a
    key that repeats one already kept is dropped, as is anything else. At most `MAX_DROPPED_NOTES` notes, then
    a count.
    """
    if metrics is None:
        return {}, []
    if not isinstance(metrics, Mapping):
        return {}, [f"metrics: a {type(metrics).__name__}, not a mapping of name to value"]
    out: dict[str, Any] = {}
    dropped: list[str] = []
    size = 2  # the encoded dict's braces
    over: list[str] = []  # names of the metrics past the count or size cap
    for k, v in metrics.items():
        key = cap(str(k), MAX_METRIC_CHARS)
        if over or len(out) >= MAX_METRICS:
            over.append(key)
            continue
        try:
            ok, value = _metric_value(v)
        except Exception:  # noqa: BLE001 - a value of user code that breaks a check: that metric alone goes
            ok, value = False, None
        if key in out:
            dropped.append(f"{key[:80]!r}: the same name as another metric's")
        elif ok:
            # '"k":v' and a comma
            item = len(json.dumps({key: value}, allow_nan=True, separators=(",", ":"))) - 1
            if size + item > MAX_METRICS_BYTES:
                over.append(key)
                continue
            out[key] = value
            size += item
        else:
            what = f"a {type(v).__name__}" if not isinstance(v, (list, tuple, Mapping)) else \
                (f"a {type(v).__name__} that is not plain JSON data (string keys) of at most "
                 f"{MAX_METRIC_CHARS} characters")
            dropped.append(f"{key[:80]!r}: {what}")
    if over:
        names = ", ".join(repr(n[:80]) for n in over[:5]) + (", ..." if len(over) > 5 else "")
        dropped.insert(0, f"{len(over)} metrics past the first {len(out)} kept (at most {MAX_METRICS} "
                          f"metrics and {MAX_METRICS_BYTES} characters of them in a record): {names}")
    if len(dropped) > MAX_DROPPED_NOTES:
        dropped = dropped[:MAX_DROPPED_NOTES] + [f"... and {len(dropped) - MAX_DROPPED_NOTES} more"]
    return out, dropped
