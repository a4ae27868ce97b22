"""A run's trials as a pandas DataFrame, one row per trial: `read_trials` and the frame both trial sources
share.

docs/event-log.md "Reading a log", "As a DataFrame": the rows come from the log read by its rule (every intact
event once by sequence number, so a compaction never double-counts, then `trials_table`, where the first
result of a trial fixes its outcome), or from an `AskTellOptimizer`'s registry
(`AskTellOptimizer.trials_dataframe`). One column per parameter, typed by the run's space: float64 for a float
parameter, Int64 (nullable) for an int one, a category of the space's choices for a choice one (object where
the choices are lists or dicts). pandas is imported only here, when a frame is asked for.
"""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pyarrow.fs as pafs

from orchestrator.store.run_store import RunStore
from orchestrator.store.schema import Event
from orchestrator.store.trials import trials_table

__all__ = ["COLUMNS", "METRIC_PREFIX", "PARAM_PREFIX", "log_rows", "read_trials", "trials_frame"]

#: the columns of every trials frame, in order; `param_<name>` columns follow `value`, `metric_<name>` ones
#: end it
COLUMNS = (
    "trial_id",
    "batch_id",
    "state",
    "value",
    "source",
    "proposed",
    "started",
    "finished",
    "duration_s",
    "node",
    "attempt",
    "failure_reason",
    "failure_message",
)
PARAM_PREFIX = "param_"
METRIC_PREFIX = "metric_"
#: row keys of `trials_frame` beside the params and metrics: seconds since the epoch, turned into UTC
#: datetimes
_TIMES = {"proposed": "proposed_at", "started": "started_at", "finished": "ended_at"}


def _pandas() -> Any:
    try:
        import pandas
    except ImportError:  # pragma: no cover - pandas comes with the test and bench extras
        raise ImportError("a trials DataFrame needs pandas: pip install pandas") from None
    return pandas


def read_trials(run_dir: str, filesystem: pafs.FileSystem | None = None) -> Any:
    """The trials of the run at `run_dir` as a pandas DataFrame, one row per trial, in order of proposal.

    Columns: `trial_id`, `batch_id`, `state` ("proposed", "running", "completed", "failed"), `value`
    (completed trials), `param_<name>` per parameter (typed by the run's space), `source` ("sobol", "model",
    ...), `proposed`, `started`, `finished` (UTC datetimes), `duration_s`, `node` (the Ray node id),
    `attempt`, `failure_reason`, `failure_message`, and `metric_<name>` per metric the objective returned. A
    damaged log is read as far as it is intact, with a `UserWarning` naming what was dropped. The run may
    still be going: this only reads.

    Args:
        run_dir: a local path or a pyarrow filesystem URI.
        filesystem: an explicit pyarrow filesystem in which `run_dir` is a path (optional).

    Raises:
        RunDirError: there is no run at `run_dir`.
    """
    store = RunStore.open(run_dir, filesystem)
    events = store.events()
    if store.damage:
        warnings.warn(f"qbatch: the log of {store.run_dir} is damaged; read as far as it is intact: "
                      + "; ".join(store.damage), UserWarning, stacklevel=2)
    space = store.config.get("space") if isinstance(store.config, Mapping) else None
    return trials_frame(log_rows(events), space)


def log_rows(events: Sequence[Event]) -> list[dict[str, Any]]:
    """One `trials_frame` row per trial of the log: `trials_table` (the first result wins), with the source
    from the trial's first "proposed" event."""
    source: dict[str, Any] = {}
    for ev in events:
        if ev.kind == "proposed" and ev.trial_id not in source:
            source[ev.trial_id] = (ev.info or {}).get("source")
    rows = []
    for t in trials_table(events):
        info = t.info or {}
        rows.append({
            "trial_id": t.trial_id, "batch_id": t.batch_id, "state": t.status, "value": t.value,
            "params": t.params or {}, "source": source.get(t.trial_id), "proposed_at": t.proposed_at,
            "started_at": t.started_at, "ended_at": t.ended_at, "node": t.node_id,
            "attempt": t.attempt if t.status != "proposed" else None,
            "failure_reason": t.error if t.status == "failed" else None,
            "failure_message": info.get("message") if t.status == "failed" else None,
            "metrics": info.get("metrics") or {},
        })
    return rows


def trials_frame(
    rows: Iterable[Mapping[str, Any]], space: Mapping[str, Mapping[str, Any]] | None = None
) -> Any:
    """A DataFrame of `rows` (dicts with the keys `log_rows` gives; absent ones are missing values), its
    parameter columns typed by `space`, a plain space description (None: as pandas infers them)."""
    pd = _pandas()
    rows = list(rows)
    space = dict(space or {})
    names = list(space)
    metrics: list[str] = []
    for r in rows:
        names += [k for k in (r.get("params") or {}) if k not in names]
        metrics += [k for k in (r.get("metrics") or {}) if k not in metrics]
    data: dict[str, Any] = {
        "trial_id": pd.array([r.get("trial_id") for r in rows], dtype="object"),
        "batch_id": pd.array([r.get("batch_id") for r in rows], dtype="Int64"),
        "state": pd.array([r.get("state") for r in rows], dtype="object"),
        "value": pd.array([_float(r.get("value")) for r in rows], dtype="float64"),
    }
    for name in names:
        values = [(r.get("params") or {}).get(name) for r in rows]
        data[PARAM_PREFIX + name] = _param_column(pd, values, space.get(name))
    data["source"] = pd.array([r.get("source") for r in rows], dtype="object")
    for column, key in _TIMES.items():
        data[column] = pd.to_datetime(
            pd.Series([_float(r.get(key)) for r in rows], dtype="float64"), unit="s", utc=True
        ).array
    started, ended = (
        pd.Series([_float(r.get(k)) for r in rows], dtype="float64") for k in ("started_at", "ended_at")
    )
    data["duration_s"] = (ended - started).array
    for column in ("node", "attempt", "failure_reason", "failure_message"):
        data[column] = pd.array(
            [r.get(column) for r in rows], dtype="Int64" if column == "attempt" else "object"
        )
    for name in metrics:
        data[METRIC_PREFIX + name] = _metric_column(pd, [(r.get("metrics") or {}).get(name) for r in rows])
    return pd.DataFrame(data, index=pd.RangeIndex(len(rows)))


def _float(v: Any) -> float:
    """`v` as a float; None (and anything not a number) as NaN."""
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        return math.nan
    return float(v)


def _param_column(pd: Any, values: list[Any], spec: Mapping[str, Any] | None) -> Any:
    """One parameter's column: float64, Int64, a category of the space's choices, or object (no spec, or
    choices that are lists or dicts, which a category cannot hold)."""
    kind = None if spec is None else spec.get("type", "float")
    if kind == "float":
        return pd.array([_float(v) for v in values], dtype="float64")
    if kind == "int":
        return pd.array([None if v is None else int(v) for v in values], dtype="Int64")
    if kind == "choice":
        try:
            dtype = pd.CategoricalDtype(list(spec["choices"]))
            return pd.Categorical(values, dtype=dtype)
        except (TypeError, ValueError):  # unhashable choices, or two that compare equal (1 and True)
            pass
        return pd.array(values, dtype="object")
    return pd.Series(values).array  # inferred


def _metric_column(pd: Any, values: list[Any]) -> Any:
    """One metric's column: float64 when every value is a number (or missing), else object."""
    if all(v is None or (isinstance(v, numbers.Real) and not isinstance(v, bool)) for v in values):
        return pd.array([_float(v) for v in values], dtype="float64")
    return pd.array(values, dtype="object")
