"""The event log's row: the `Event` record, the Parquet schema of a segment, and their encoding.

docs/event-log.md "Schema": one row per event; `params`, `forecast` and `info` are JSON objects in string
columns, `x` a list column. `_encode` validates every field before anything touches the disk (the message
names the field); `_decode` turns rows back into events and leaves out, as damage of that row alone, a JSON
field that is not an object. Nothing is unpickled.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from orchestrator.checks import is_number, plain_data, refuse
from orchestrator.store.errors import StoreError, _first_line
from workers.records import printable

#: the kinds of events the log accepts
EVENT_KINDS = ("proposed", "started", "completed", "failed", "refit")
#: rows per Parquet row group: a damaged row group loses at most this many events
_ROW_GROUP = 256

#: the Arrow schema of a segment's rows (docs/event-log.md "Schema")
_SCHEMA = pa.schema(
    [
        pa.field("seq", pa.int64(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("trial_id", pa.string(), nullable=False),
        pa.field("time", pa.float64(), nullable=False),
        pa.field("batch_id", pa.int64()),
        pa.field("params", pa.string()),  # JSON
        pa.field("x", pa.list_(pa.float64())),
        pa.field("value", pa.float64()),
        pa.field("forecast", pa.string()),  # JSON
        pa.field("node_id", pa.string()),
        pa.field("pid", pa.int64()),
        pa.field("started_at", pa.float64()),
        pa.field("ended_at", pa.float64()),
        pa.field("attempt", pa.int64(), nullable=False),
        pa.field("error", pa.string()),
        pa.field("traceback", pa.string()),
        pa.field("info", pa.string()),  # JSON
    ]
)
#: the columns that hold a JSON object
_JSON_FIELDS = ("params", "forecast", "info")


@dataclass(kw_only=True)
class TrialFields:
    """What the log knows of a trial beyond its id: the fields an `Event` carries and a `TrialRecord`
    (store/trials.py) folds its events into, declared once so the two keep the same names and types."""

    batch_id: int | None = None
    params: dict | None = None
    x: list[float] | None = None
    value: float | None = None
    forecast: dict | None = None
    node_id: str | None = None
    pid: int | None = None
    started_at: float | None = None
    ended_at: float | None = None
    attempt: int = 0
    error: str | None = None
    traceback: str | None = None
    info: dict | None = None


@dataclass
class Event(TrialFields):
    """One record of the event log, one row of a segment: a trial `proposed`, `started`, `completed` or
    `failed`, or a `refit`. Dict fields are stored as JSON, `x` as a list column. `kind`, `trial_id` and
    `time` may be given by position; the `TrialFields` by name.

    A trial has three types on its way to the log, one per stage, whose shared fields have the same names: the
    proposal (`orchestrator.ask_tell.Trial`: `trial_id`, `batch_id`, `params`, `x`, `forecast`), the
    evaluation's outcome (`workers.records.TrialResult`: `value`, `error`, `traceback`, `node_id`, `pid`,
    `started_at`, `ended_at`; its `message`, `metrics`, `metrics_dropped` and `child_pid` go into `info`), and
    these events, of which the reader's `TrialRecord` (store/trials.py) is the per-trial reduction.
    """

    kind: str
    trial_id: str = ""
    time: float = field(default_factory=time.time)


_EVENT_FIELDS = tuple(f.name for f in fields(Event))


def _refuse_json(where: str, problem: str, value: Any) -> StoreError:
    """The `plain_data` refusal of an event's JSON field."""
    if problem == "key":
        return StoreError(f"{where} has a non-string key {value!r}; JSON fields need string keys")
    return StoreError(f"{where} holds a {type(value).__name__} ({value!r:.60}), which is not JSON data")


def _item(where: str, key: str) -> str:
    return f"{where}[{key!r}]"


def _plain(value: Any, where: str) -> Any:
    """Turn numpy/torch scalars and arrays into plain JSON data; raise StoreError naming `where` otherwise."""
    return plain_data(value, where, _refuse_json, arrays=True, child=_item)


def _is_json_data(value: Any) -> bool:
    """Whether `value` is JSON data as `_plain` leaves it unchanged: None, bool, str, int, float, lists of
    them and dicts with string keys (`json.dumps` then writes what it would write of `_plain`'s copy).
    Cheap and silent: the log's write path checks each event's fields with it and names a field (`_plain`)
    only when this says no."""
    if value is None or isinstance(value, (str, int, float)):
        return True
    if type(value) is dict:
        return all(type(k) is str and _is_json_data(v) for k, v in value.items())
    if type(value) is list:
        return all(_is_json_data(v) for v in value)
    return False


def _to_json(value: Any, where: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise StoreError(f"{where} must be a dict or None; got {type(value).__name__}")
    if not _is_json_data(value):
        value = _plain(value, where)
    return json.dumps(value, allow_nan=True, separators=(",", ":"))


def _opt_number(value: Any, where: str, kind: type) -> Any:
    if value is None:
        return None
    if type(value) is float and kind is float:  # the common case, without the checks below
        return value
    if not is_number(value):
        raise refuse(where, "a number or None", value, StoreError)
    if kind is int:
        if isinstance(value, (float, np.floating)) and not float(value).is_integer():
            raise refuse(where, "an integer or None", value, StoreError)
        if not -(2**63) <= value < 2**63:  # the column is int64 (pyarrow raised a bare OverflowError)
            raise StoreError(f"{where} must fit in a signed 64-bit integer; got {value!r}")
        return int(value)
    return float(value)


def _encode(events: Sequence[Event], first_seq: int) -> pa.Table:
    cols: dict[str, list[Any]] = {name: [] for name in _SCHEMA.names}
    for i, ev in enumerate(events):
        if not isinstance(ev, Event):
            raise StoreError(f"events[{i}] must be an Event; got {type(ev).__name__}")
        w = f"events[{i}]"
        if ev.kind not in EVENT_KINDS:
            raise StoreError(f"{w}.kind must be one of {list(EVENT_KINDS)}; got {ev.kind!r}")
        if not isinstance(ev.trial_id, str):
            raise StoreError(f"{w}.trial_id must be a string; got {ev.trial_id!r}")
        # an id must come back as written (a lone surrogate would not)
        if printable(ev.trial_id) != ev.trial_id:
            raise StoreError(f"{w}.trial_id must be UTF-8 text; got {ev.trial_id!r}")
        if ev.kind != "refit" and not ev.trial_id:
            raise StoreError(f"{w}.trial_id must be non-empty for a {ev.kind!r} event")
        t = _opt_number(ev.time, f"{w}.time", float)
        if t is None:
            raise StoreError(f"{w}.time must be a number; got None")
        cols["seq"].append(first_seq + i)
        cols["kind"].append(ev.kind)
        cols["trial_id"].append(ev.trial_id)
        cols["time"].append(t)
        cols["batch_id"].append(_opt_number(ev.batch_id, f"{w}.batch_id", int))
        for name in _JSON_FIELDS:
            cols[name].append(_to_json(getattr(ev, name), f"{w}.{name}"))
        x = ev.x
        if type(x) is list and all(type(v) is float for v in x):
            x = list(x)
        elif x is not None:
            x = _plain(x, f"{w}.x")
            if not isinstance(x, list):
                x = [x]
            x = [_opt_number(v, f"{w}.x[{j}]", float) for j, v in enumerate(x)]
        cols["x"].append(x)
        cols["value"].append(_opt_number(ev.value, f"{w}.value", float))
        for name in ("node_id", "error", "traceback"):
            v = getattr(ev, name)
            if v is not None and not isinstance(v, str):
                raise StoreError(f"{w}.{name} must be a string or None; got {v!r:.60}")
            # lone surrogates (an undecodable file name in a message) are not UTF-8: Parquet refused the whole
            # segment, and with it the other results of the batch, on every resume again
            cols[name].append(None if v is None else printable(v))
        cols["pid"].append(_opt_number(ev.pid, f"{w}.pid", int))
        cols["started_at"].append(_opt_number(ev.started_at, f"{w}.started_at", float))
        cols["ended_at"].append(_opt_number(ev.ended_at, f"{w}.ended_at", float))
        attempt = _opt_number(ev.attempt, f"{w}.attempt", int)
        cols["attempt"].append(0 if attempt is None else attempt)
    return pa.Table.from_pydict(cols, schema=_SCHEMA)


def _decode(table: pa.Table) -> tuple[list[tuple[int, Event]], list[str]]:
    """The rows of `table` as events, and one note per row left out: a JSON field (`params`, `forecast`,
    `info`) that is not valid JSON or not a JSON object, which every reader of the log would trip on (`.get`
    of a list). Such a row is damage of that row alone; the others of its row group are kept."""
    out: list[tuple[int, Event]] = []
    bad: list[str] = []
    for r in table.to_pylist():
        seq = r.pop("seq")
        problem = None
        for name in _JSON_FIELDS:
            if r[name] is None:
                continue
            try:
                r[name] = json.loads(r[name])
            except ValueError as exc:
                problem = f"`{name}` is not valid JSON ({_first_line(exc)[:80]})"
                break
            if not isinstance(r[name], dict):
                problem = f"`{name}` holds a JSON {_json_kind(r[name])}, not an object"
                break
        if problem is not None:
            bad.append(f"the {r['kind']!r} event with sequence number {seq}: {problem}")
            continue
        out.append((seq, Event(**{k: r[k] for k in _EVENT_FIELDS})))
    return out, bad


def _json_kind(value: Any) -> str:
    """The JSON name of a decoded value's type ("array", "string", ...)."""
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "boolean"
    if value is None:
        return "null"
    return "number"


def _parquet_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, row_group_size=_ROW_GROUP, compression="zstd", write_page_checksum=True)
    return sink.getvalue().to_pybytes()

