"""Metrics, plots and a summary table of a run directory, computed from its event log.

Everything here is derived from the Parquet log (orchestrator/store/) and `config.yaml`; nothing asks the
running actor. What is read (the event `info` keys that orchestrator/actor.py writes):

* utilization U = busy evaluation time / (slots x wall time) over the span from the first evaluation start
  to the last evaluation end of each actor session (`info["session"]` of the results; a resume or an actor
  restart starts one), the sessions' spans joined, so the time between a stop and its `qbatch resume` does not
  count (a log without sessions is one). Busy time sums `ended_at - started_at` of each trial's accepted
  (first) completed/failed event. `slots` is the latest `info["slots"]` the actor recorded, else the config's
  `max_concurrent`, else the largest number of evaluations observed running at once (`slots_source` says which).
* proposal latency p50/p95: `propose_s` of "refit" events if any carries it, else the `proposal_seconds`
  (or `latency_s`) of "proposed" events, once per batch, of the model's batches (`info["source"]` "model")
  where there are any; refit time: `seconds` (or `fit_s`) of "refit" events.
  A "refit" event with `failed: true` is a fit that raised (the actor went on with the previous model): it is
  counted apart (`n_refit_failures`, with the last `error`), not as a refit.
* queue depth over time: trials proposed but not yet started.
* best so far: the best observed value (max or min per direction) and, where "refit" events carry it, the
  model's predicted tau-level at its recommendation (`best_predicted`, `best_params`).
* calibration (calibrated-bo.md §1): for completed trials whose proposal recorded a `forecast`, the PIT
  u = F(y) of `orchestrator.models.predictive.Forecast`; the central p-interval covers y iff |u - 1/2| <= p/2.
"""

from __future__ import annotations

import contextlib
import csv
import io
import math
import os
import warnings
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from orchestrator.store import Event, RunStore, TrialRecord, status_counts, trials_table

__all__ = ["COVERAGE_LEVELS", "RunMetrics", "compute_metrics", "format_summary", "write_report"]

COVERAGE_LEVELS = (0.5, 0.8, 0.9)
_FIT_KEYS = ("seconds", "fit_s", "refit_s", "duration_s")
_LATENCY_KEYS = ("proposal_seconds", "latency_s", "propose_s", "proposal_latency_s")
#: bins of the utilization-over-time plot
_UTIL_BINS = 60


@dataclass
class RunMetrics:
    """What `qbatch status` and `qbatch report` show. Times are seconds; NaN where there is no data."""

    name: str
    objective: str
    direction: str
    tau: float
    budget: int
    counts: dict[str, int]
    progress: float
    best_value: float
    best_params: dict | None
    best_trial_id: str | None
    best_predicted: float
    best_predicted_params: dict | None
    span_s: float
    busy_s: float
    slots: int
    slots_source: str
    utilization: float
    evals_per_s: float
    proposal_latency_p50: float
    proposal_latency_p95: float
    n_proposals: int
    refit_mean_s: float
    refit_p95_s: float
    n_refits: int
    queue_depth_max: int
    queue_depth_mean: float
    failures: dict[str, int]
    duplicates: int
    coverage: dict[float, float] = field(default_factory=dict)
    n_calibration: int = 0
    pit: list[float] = field(default_factory=list)
    damage: list[str] = field(default_factory=list)
    n_refit_failures: int = 0
    last_refit_error: str | None = None
    #: the sessions' spans and the slots each ran with, `(lo, hi, slots)` (`session_pieces`, `session_slots`)
    session_slots: list[tuple[float, float, int]] = field(default_factory=list)

    def summary_rows(self, full: bool = False) -> list[tuple[str, str]]:
        """(metric, value) rows of the summary table. `full` (summary.csv): the parameters as JSON with every
        digit, not shortened to a terminal line (which would cut 10 parameters of a 16-parameter point)."""
        f = _fmt
        params = _json_params if full else _short
        rows = [
            ("run", self.name),
            ("objective", self.objective),
            ("direction", self.direction),
            ("tau", f(self.tau)),
            ("budget", str(self.budget)),
            ("completed", str(self.counts["completed"])),
            ("failed", str(self.counts["failed"])),
            ("running", str(self.counts["running"])),
            ("queued", str(self.counts["proposed"])),
            *([("unfinished (no process writes the run)", str(self.counts["unfinished"]))]
              if self.counts.get("unfinished") else []),
            ("progress", f"{100 * self.progress:.1f}%"),
            ("best observed value", f(self.best_value)),
            ("best observed trial", self.best_trial_id or "-"),
            ("best observed params", params(self.best_params)),
            ("best predicted tau-level (model)", f(self.best_predicted)),
            ("recommended params (model)", params(self.best_predicted_params)),
            ("wall time (first start to last end, per session) [s]", f(self.span_s)),
            ("busy evaluation time [s]", f(self.busy_s)),
            (f"slots ({self.slots_source})", str(self.slots)),
            ("utilization U", f(self.utilization)),
            ("evaluations per second", f(self.evals_per_s)),
            ("proposal latency p50 [s]", f(self.proposal_latency_p50)),
            ("proposal latency p95 [s]", f(self.proposal_latency_p95)),
            ("proposals", str(self.n_proposals)),
            ("refit time mean [s]", f(self.refit_mean_s)),
            ("refit time p95 [s]", f(self.refit_p95_s)),
            ("refits", str(self.n_refits)),
            ("refits failed", str(self.n_refit_failures) + (f" (last: {self.last_refit_error})" if self.last_refit_error else "")),
            ("queue depth max", str(self.queue_depth_max)),
            ("queue depth mean", f(self.queue_depth_mean)),
            ("failures", ", ".join(f"{k}: {v}" for k, v in sorted(self.failures.items())) or "none"),
            ("duplicate results ignored", str(self.duplicates)),
        ]
        for p in COVERAGE_LEVELS:
            rows.append((f"coverage of central {int(100 * p)}% interval", f(self.coverage.get(p, math.nan))))
        rows.append(("forecasts scored", str(self.n_calibration)))
        rows.append(("log damage", "; ".join(self.damage) or "none"))
        return rows


def _fmt(v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _json_params(d: Mapping | None) -> str:
    import json

    return json.dumps(dict(d), default=str) if d else "-"


def _short(d: Mapping | None, limit: int = 160) -> str:
    if not d:
        return "-"
    text = ", ".join(f"{k}={_fmt(v) if isinstance(v, float) else v}" for k, v in d.items())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _failed_refit(ev: Event) -> bool:
    """A "refit" event the actor logged for a fit that raised (the run went on with the previous model)."""
    return bool((ev.info or {}).get("failed"))


def _info_number(info: Mapping | None, keys: Sequence[str]) -> float | None:
    if not info:
        return None
    for k in keys:
        v = info.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            return float(v)
    return None


def _percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=float), q)) if len(values) else math.nan


# ---------------------------------------------------------------------------------------- direction
def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _as(convert: Any, value: Any, default: Any) -> Any:
    """`convert(value)`, or `default` where a hand-edited config.yaml holds something else (`budget: six`):
    status and report show the run as recorded (the CLI warns about the config) instead of failing."""
    try:
        return convert(value)
    except (TypeError, ValueError, OverflowError):
        return default


def resolve_direction(config: Mapping[str, Any], events: Sequence[Event]) -> str:
    """The run's direction: recorded by the actor in a refit event, else the config's, else the objective's."""
    for ev in reversed(events):
        if ev.kind == "refit" and ev.info and ev.info.get("direction") in ("maximize", "minimize"):
            return ev.info["direction"]
    if config.get("direction") in ("maximize", "minimize"):
        return config["direction"]
    name = _mapping(config.get("objective")).get("name", "")
    try:  # import the objective's class only to read its `direction` attribute (no instance is built)
        from objectives.registry import _import_target, objective_path

        target = _import_target(objective_path(name))
        d = getattr(target, "direction", "maximize")
        return d if d in ("maximize", "minimize") else "maximize"
    except Exception as exc:  # noqa: BLE001 -- an objective that cannot be imported here: qbatch's default
        warnings.warn(f"the run's config does not record its direction and objective {name!r} cannot be imported "
                      f"here ({type(exc).__name__}: {exc}); reading it as 'maximize'", stacklevel=2)
        return "maximize"


# ---------------------------------------------------------------------------------------- series
def finished(trials: Sequence[TrialRecord]) -> list[TrialRecord]:
    """Completed and failed trials ordered by their end time."""
    done = [t for t in trials if t.status in ("completed", "failed") and t.ended_at is not None]
    return sorted(done, key=lambda t: t.ended_at)


def best_so_far(trials: Sequence[TrialRecord], direction: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(evaluation count `n`, end time `n`, best observed value `n`) over finished trials in end order."""
    done = finished(trials)
    sign = 1.0 if direction == "maximize" else -1.0
    best, out = -math.inf, []
    for t in done:
        if t.status == "completed" and t.value is not None and math.isfinite(t.value):
            best = max(best, sign * t.value)
        out.append(sign * best if math.isfinite(best) else math.nan)
    n = np.arange(1, len(done) + 1)
    times = np.array([t.ended_at for t in done], dtype=float)
    return n, times, np.array(out, dtype=float)


def predicted_series(events: Sequence[Event], trials: Sequence[TrialRecord]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(results the fit was trained on, time, best_predicted) at each refit event that records it. The count is
    the event's `info["n"]`; where it is missing, the evaluations finished by the time of the event (that
    overstates what the model has seen: a fit on 15 results can be drawn at 40)."""
    done = finished(trials)
    ends = np.array([t.ended_at for t in done], dtype=float)
    # `info["n"]` counts completed results (failures are no observations): the evaluations finished when the
    # n-th of them came in, on the plot's axis of finished evaluations
    nth_completed = [i + 1 for i, t in enumerate(done) if t.status == "completed"]
    ts, ns, vs = [], [], []
    for ev in events:
        if ev.kind == "refit":
            v = _info_number(ev.info, ("best_predicted",))
            if v is not None:
                ts.append(ev.time)
                seen = _info_number(ev.info, ("n",))
                if seen is not None and 1 <= seen <= len(nth_completed):
                    ns.append(nth_completed[int(seen) - 1])
                else:
                    ns.append(int(np.searchsorted(ends, ev.time, side="right")))
                vs.append(v)
    return np.array(ns, dtype=float), np.array(ts, dtype=float), np.array(vs, dtype=float)


def _timed(trials: Sequence[TrialRecord]) -> list[TrialRecord]:
    """Finished trials with both times, ending no earlier than they started."""
    return [t for t in trials if t.status in ("completed", "failed") and t.started_at is not None
            and t.ended_at is not None and t.ended_at >= t.started_at]


def intervals(trials: Sequence[TrialRecord]) -> np.ndarray:
    """`k x 2` (started_at, ended_at) of finished trials with both times."""
    return np.array([(t.started_at, t.ended_at) for t in _timed(trials)], dtype=float).reshape(-1, 2)


def session_pieces(trials: Sequence[TrialRecord]) -> list[tuple[float, float, Any]]:
    """The sessions' spans as disjoint `(lo, hi, session)` pieces in time order: each session's span from the
    first start to the last end of its finished trials (`info["session"]`; one span for results without it),
    less what an earlier session's span already covers. Their lengths sum to the run's span."""
    spans: dict[Any, tuple[float, float]] = {}
    for t in _timed(trials):
        key = (t.info or {}).get("session")
        lo, hi = spans.get(key, (math.inf, -math.inf))
        spans[key] = (min(lo, t.started_at), max(hi, t.ended_at))
    pieces, reach = [], -math.inf
    for (lo, hi), key in sorted((v, k) for k, v in spans.items()):
        lo = max(lo, reach)
        if hi > lo:
            pieces.append((lo, hi, key))
            reach = hi
    return pieces


def session_slots(events: Sequence[Event], pieces: Sequence[tuple[float, float, Any]], default: int) -> dict[Any, int]:
    """The slots each session ran with: the last `info["slots"]` logged in it (the event's `info["session"]`, the
    actor's start time, as the results carry it), else `default`. A resume on another cluster has other slots: one count for the whole run would put U
    above 1."""
    out = {k: default for _, _, k in pieces}
    # where an event does not name its session (a log of an older version): the latest session that started at
    # or before it; a session without a start time (an older log's) starts after the previous span ends, and
    # events before every session start are its (dropped, they would put U above 1 again)
    bounds, before = [], -math.inf
    for _, hi, key in pieces:
        bounds.append(float(key) if isinstance(key, (int, float)) and not isinstance(key, bool) else before)
        before = hi
    for ev in events:
        info = ev.info or {}
        n = info.get("slots")
        if not isinstance(n, int) or isinstance(n, bool) or n <= 0:
            continue
        session = info.get("session")
        if session is not None:  # its own session's, if that recorded a result (else it has no span)
            if session in out:
                out[session] = n
        elif ev.time is not None:
            i = max((j for j, b in enumerate(bounds) if b <= ev.time), default=None, key=lambda j: bounds[j])
            if i is not None:
                out[pieces[i][2]] = n
    return out


def active_time(pieces: Sequence[tuple[float, float, Any]]) -> Any:
    """`t -> seconds of the sessions' spans before t`: the time axis of the report's utilization plot, with the
    gaps between sessions (a stopped run waiting for `qbatch resume`) cut out; before the first span, the
    (negative) time to its start."""
    los = np.array([p[0] for p in pieces], dtype=float)
    his = np.array([p[1] for p in pieces], dtype=float)
    offsets = np.concatenate([[0.0], np.cumsum(his - los)])

    def to_active(t: Any) -> np.ndarray:
        t = np.asarray(t, dtype=float)
        if not len(pieces):
            return t
        i = np.clip(np.searchsorted(los, t, side="right") - 1, 0, len(pieces) - 1)
        inside = np.clip(t - los[i], None, his[i] - los[i])
        return np.where(t < los[0], t - los[0], offsets[i] + inside)

    return to_active


def max_concurrency(iv: np.ndarray) -> int:
    """Most intervals open at once (an end at the same instant as a start frees the slot first)."""
    if len(iv) == 0:
        return 0
    points = sorted([(s, 1) for s in iv[:, 0]] + [(e, -1) for e in iv[:, 1]], key=lambda p: (p[0], p[1]))
    cur = best = 0
    for _, d in points:
        cur += d
        best = max(best, cur)
    return best


def utilization_series(
    iv: np.ndarray, slots: int, bins: int = _UTIL_BINS, pieces: Sequence[tuple[float, float, int]] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(bin centres relative to the first start, busy fraction of `slots` in each bin). With `pieces` (the
    sessions' spans with their slots, `(lo, hi, slots)`), the time axis is `active_time`'s, gaps between sessions
    cut out, and each bin's capacity counts the slots of the sessions it covers."""
    if pieces:
        to_active = active_time(pieces)
        iv = np.stack([to_active(iv[:, 0]), to_active(iv[:, 1])], axis=1) if len(iv) else iv
        total = sum(hi - lo for lo, hi, _ in pieces)
        if len(iv) == 0 or total <= 0:
            return np.zeros(0), np.zeros(0)
        edges = np.linspace(0.0, total, bins + 1)
        lo, hi = edges[:-1][None, :], edges[1:][None, :]
        busy = np.clip(np.minimum(iv[:, 1:2], hi) - np.maximum(iv[:, 0:1], lo), 0.0, None).sum(0)
        a = to_active(np.array([p[0] for p in pieces]))[:, None]
        b = to_active(np.array([p[1] for p in pieces]))[:, None]
        n = np.array([p[2] for p in pieces], dtype=float)[:, None]
        capacity = (np.clip(np.minimum(b, hi) - np.maximum(a, lo), 0.0, None) * n).sum(0)
        return 0.5 * (edges[:-1] + edges[1:]), np.divide(busy, capacity, out=np.zeros_like(busy), where=capacity > 0)
    if len(iv) == 0 or slots < 1:
        return np.zeros(0), np.zeros(0)
    t0, t1 = iv[:, 0].min(), iv[:, 1].max()
    if t1 <= t0:
        return np.zeros(0), np.zeros(0)
    edges = np.linspace(t0, t1, bins + 1)
    lo, hi = edges[:-1][None, :], edges[1:][None, :]
    overlap = np.clip(np.minimum(iv[:, 1:2], hi) - np.maximum(iv[:, 0:1], lo), 0.0, None).sum(0)
    return 0.5 * (edges[:-1] + edges[1:]) - t0, overlap / (slots * (edges[1] - edges[0]))


def queue_depth_series(events: Sequence[Event]) -> tuple[np.ndarray, np.ndarray]:
    """(time, number of trials proposed but not yet started) after each change, in time order."""
    proposed: dict[str, float] = {}
    left: dict[str, float] = {}
    for ev in events:
        if ev.kind == "proposed":
            proposed.setdefault(ev.trial_id, ev.time)
        elif ev.kind in ("started", "completed", "failed") and ev.trial_id not in left:
            left[ev.trial_id] = ev.started_at if (ev.kind == "started" and ev.started_at is not None) else ev.time
    changes = [(t, 1) for t in proposed.values()] + [(t, -1) for k, t in left.items() if k in proposed]
    changes.sort()
    if not changes:
        return np.zeros(0), np.zeros(0)
    times = np.array([c[0] for c in changes], dtype=float)
    depth = np.maximum(np.cumsum([c[1] for c in changes]), 0)
    return times, depth.astype(float)


def _queue_depth(events: Sequence[Event], pieces: Sequence[tuple[float, float, Any]]) -> tuple[np.ndarray, np.ndarray]:
    """`queue_depth_series` on `active_time`'s axis where there are session spans: the time a stopped run waits
    for its resume is not queue time."""
    qt, qd = queue_depth_series(events)
    return (active_time(pieces)(qt) if pieces else qt), qd


def _time_weighted_mean(times: np.ndarray, values: np.ndarray) -> float:
    if len(times) < 2 or times[-1] <= times[0]:
        return float(values.mean()) if len(values) else math.nan
    return float(np.sum(values[:-1] * np.diff(times)) / (times[-1] - times[0]))


def calibration(trials: Sequence[TrialRecord], direction: str) -> list[float]:
    """PIT values F(y) of completed trials whose proposal recorded a forecast (see module docstring)."""
    scored = [
        t
        for t in trials
        if t.status == "completed" and t.forecast and t.value is not None and math.isfinite(t.value)
    ]
    if not scored:
        return []
    from orchestrator.models.predictive import Forecast  # imported only when forecasts exist (GPyTorch stack)

    groups: dict[tuple[str, float], list[TrialRecord]] = {}
    for t in scored:
        fc = t.forecast
        try:
            groups.setdefault((str(fc["family"]), float(fc["tau"])), []).append(t)
        except (KeyError, TypeError, ValueError):
            continue
    pit: list[float] = []
    for _, group in sorted(groups.items()):
        try:
            fc = Forecast.from_records([t.forecast for t in group])
        except (KeyError, TypeError, ValueError):
            continue
        y = []
        for t in group:
            negated = t.forecast.get("negated", direction == "minimize")
            y.append(-t.value if negated else t.value)
        u = fc.cdf(np.asarray(y, dtype=float))
        pit.extend(float(v) for v in u.tolist() if math.isfinite(v))
    return pit


# ---------------------------------------------------------------------------------------- metrics
def compute_metrics(
    events: Sequence[Event], config: Mapping[str, Any], damage: Sequence[str] = (), with_calibration: bool = True,
    writing: bool | None = None,
) -> RunMetrics:
    """All metrics of a run from its events and config dict (see the module docstring for definitions).

    `writing` (`RunStore.is_being_written`): False when no process writes the run, so its proposed and
    started trials without a result are not queued or running but ``counts["unfinished"]`` (a run stopped
    before they ended, or whose budget was lowered); True or None (cannot tell) keep them as they are.
    """
    trials = trials_table(events)
    counts = status_counts(trials)
    counts["unfinished"] = 0
    if writing is False:
        counts["unfinished"] = counts["running"] + counts["proposed"]
        counts["running"] = counts["proposed"] = 0
    direction = resolve_direction(config, events)
    budget = max(0, _as(int, config.get("budget") or 0, 0))
    sign = 1.0 if direction == "maximize" else -1.0

    completed = [t for t in trials if t.status == "completed" and t.value is not None and math.isfinite(t.value)]
    best = max(completed, key=lambda t: sign * t.value) if completed else None
    failed_refits = [ev for ev in events if ev.kind == "refit" and _failed_refit(ev)]

    best_pred, best_pred_params = math.nan, None
    fit_times, latencies = [], []
    for ev in events:
        if ev.kind != "refit":
            continue
        v = _info_number(ev.info, ("best_predicted",))
        if v is not None:
            best_pred, best_pred_params = v, (ev.info or {}).get("best_params")
        fit = _info_number(ev.info, _FIT_KEYS)
        if fit is not None:
            fit_times.append(fit)
        lat = _info_number(ev.info, ("propose_s",))
        if lat is not None:
            latencies.append(lat)
    if not latencies:  # fall back on per-batch latencies recorded with the proposals
        per_batch: dict[Any, float] = {}
        # the model's batches where there are any: the Sobol points that fill free slots before the first fit
        # are batches of one or two that take a millisecond, and they would make the p50
        model = any((ev.info or {}).get("source") == "model" for ev in events if ev.kind == "proposed")
        for ev in events:
            if ev.kind == "proposed" and (not model or (ev.info or {}).get("source") == "model"):
                lat = _info_number(ev.info, _LATENCY_KEYS)
                if lat is not None:
                    per_batch.setdefault(ev.batch_id, lat)
        latencies = list(per_batch.values())

    iv = intervals(trials)
    pieces = session_pieces(trials)
    span = sum(hi - lo for lo, hi, _ in pieces) if len(iv) else math.nan
    busy = float((iv[:, 1] - iv[:, 0]).sum()) if len(iv) else 0.0
    recorded = [int(ev.info["slots"]) for ev in events if ev.info and isinstance(ev.info.get("slots"), int) and ev.info["slots"] > 0]
    if recorded:
        slots, source = recorded[-1], "recorded"
    elif isinstance(config.get("max_concurrent"), int) and config["max_concurrent"] > 0:
        slots, source = int(config["max_concurrent"]), "config"
    else:
        slots, source = max_concurrency(iv), "observed"
    per_session = session_slots(events, pieces, slots)
    capacity = sum((hi - lo) * per_session[k] for lo, hi, k in pieces)
    if len(set(per_session.values())) > 1:
        source = "recorded per session: " + ", ".join(str(per_session[k]) for _, _, k in pieces)
    util = busy / capacity if slots and capacity > 0 else math.nan
    n_done = counts["completed"] + counts["failed"]

    qt, qd = _queue_depth(events, pieces)
    pit = calibration(trials, direction) if with_calibration else []
    pit_arr = np.asarray(pit, dtype=float)
    coverage = {p: float(np.mean(np.abs(pit_arr - 0.5) <= p / 2)) for p in COVERAGE_LEVELS} if len(pit) else {}

    return RunMetrics(
        name=str(config.get("name", "")),
        objective=str(_mapping(config.get("objective")).get("name", "")),
        direction=direction,
        tau=_as(float, config.get("tau", math.nan), math.nan),
        budget=budget,
        counts=counts,
        progress=min(1.0, n_done / budget) if budget else math.nan,
        best_value=best.value if best else math.nan,
        best_params=best.params if best else None,
        best_trial_id=best.trial_id if best else None,
        best_predicted=best_pred,
        best_predicted_params=best_pred_params,
        span_s=span,
        busy_s=busy,
        slots=slots,
        slots_source=source,
        utilization=util,
        session_slots=[(lo, hi, per_session[k]) for lo, hi, k in pieces],
        evals_per_s=n_done / span if span and span > 0 else math.nan,
        proposal_latency_p50=_percentile(latencies, 50),
        proposal_latency_p95=_percentile(latencies, 95),
        n_proposals=len(latencies),
        refit_mean_s=float(np.mean(fit_times)) if fit_times else math.nan,
        refit_p95_s=_percentile(fit_times, 95),
        n_refits=sum(ev.kind == "refit" for ev in events) - len(failed_refits),
        n_refit_failures=len(failed_refits),
        last_refit_error=(failed_refits[-1].info or {}).get("error") if failed_refits else None,
        queue_depth_max=int(qd.max()) if len(qd) else 0,
        queue_depth_mean=_time_weighted_mean(qt, qd),
        failures=dict(Counter(t.error or "unknown" for t in trials if t.status == "failed")),
        duplicates=sum(t.duplicates for t in trials),
        coverage=coverage,
        n_calibration=len(pit),
        pit=pit,
        damage=list(damage),
    )


def format_summary(metrics: RunMetrics) -> str:
    """The summary table as aligned plain text."""
    rows = metrics.summary_rows()
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)


# ---------------------------------------------------------------------------------------- plots
def _figure():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def write_report(
    run_dir: str, out_dir: str | None = None, store: RunStore | None = None
) -> tuple[RunMetrics, dict[str, str]]:
    """Write the plots, `summary.csv` and `trials.csv` of a run; returns (metrics, {artifact name: path}).

    Args:
        run_dir: the run directory (local path or URI).
        out_dir: a local folder for the report; default ``<run_dir>/report`` for a local run, else ``./report-<name>``.
        store: an already opened store (optional).

    Raises:
        StoreError: `run_dir` holds no run.
    """
    store = store or RunStore.open(run_dir)
    events = store.events()
    config = store.config
    metrics = compute_metrics(events, config, damage=store.damage, writing=RunStore.is_being_written(store.run_dir))
    if out_dir is None:
        out_dir = os.path.join(store.run_dir, "report") if "://" not in store.run_dir else f"report-{metrics.name or 'run'}"
    os.makedirs(out_dir, exist_ok=True)
    plt = _figure()
    trials = trials_table(events)
    t0 = min((ev.time for ev in events), default=0.0)
    label = "tau-quantile" if _mapping(config.get("model")).get("type", "quantile") != "expectile" else "tau-expectile"
    paths: dict[str, str] = {}

    n, times, best = best_so_far(trials, metrics.direction)
    pn, ptimes, pvals = predicted_series(events, trials)
    for key, x, px, xlabel in (
        ("best_vs_evaluations", n, pn, "evaluations finished"),
        ("best_vs_time", times - t0, ptimes - t0, "wall time since the run started [s]"),
    ):
        fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=100)
        observed = bool(np.isfinite(best).any())
        if observed:
            # markers too: one finished evaluation is a step of one point, which draws nothing
            ax.step(x, best, where="post", label="best observed value", color="C0",
                    marker="o" if len(x) == 1 else None, ms=4)
        if len(px):
            ax.plot(px, pvals, "o-", ms=3, label=f"model's predicted {label} at its recommendation", color="C1")
        if not observed and not len(px):
            text = (f"no successful evaluation: all {len(x)} finished ones failed (see trials.csv)" if len(x)
                    else "no finished evaluations yet")
            ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(f"outcome ({metrics.direction})")
        ax.set_title(f"{metrics.name}: best so far (target: {label}, tau={_fmt(metrics.tau)})")
        if observed or len(px):
            ax.legend(loc="best", fontsize=8)
        ax.grid(alpha=0.3)
        paths[key] = _save(fig, plt, out_dir, f"{key}.png")

    iv = intervals(trials)
    ut, uu = utilization_series(iv, metrics.slots, pieces=metrics.session_slots)
    qt, qd = _queue_depth(events, metrics.session_slots)
    gaps = len(metrics.session_slots) > 1
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(6.4, 5.6), dpi=100, sharex=True)
    start = 0.0 if metrics.session_slots else (iv[:, 0].min() if len(iv) else t0)
    if len(ut):
        ax1.step(ut, uu, where="mid", color="C2")
        ax1.axhline(metrics.utilization, ls="--", color="k", lw=1, label=f"U = {_fmt(metrics.utilization)}")
        ax1.legend(loc="lower right", fontsize=8)
    else:
        ax1.text(0.5, 0.5, "no finished evaluations yet", ha="center", va="center", transform=ax1.transAxes)
    ax1.set_ylim(0, 1.05)
    varying = len({n for _, _, n in metrics.session_slots}) > 1
    ax1.set_ylabel("busy fraction of the session's slots" if varying else f"busy fraction of {metrics.slots} slots")
    ax1.set_title(f"{metrics.name}: worker utilization ({metrics.slots_source} slots)")
    ax1.grid(alpha=0.3)
    if len(qt):
        ax2.step(qt - start, qd, where="post", color="C3")
    ax2.set_xlabel("time since the first evaluation started [s]"
                   + (" (gaps between sessions cut out)" if gaps else ""))
    ax2.set_ylabel("queue depth (proposed, not dispatched)")
    ax2.grid(alpha=0.3)
    paths["utilization"] = _save(fig, plt, out_dir, "utilization.png")

    if metrics.n_calibration:
        fig, ax = plt.subplots(figsize=(5.0, 4.0), dpi=100)
        levels = list(COVERAGE_LEVELS)
        ax.bar([str(int(100 * p)) + "%" for p in levels], [metrics.coverage[p] for p in levels], color="C0", label="observed")
        ax.scatter([str(int(100 * p)) + "%" for p in levels], levels, color="k", zorder=3, label="nominal")
        ax.set_ylim(0, 1)
        ax.set_xlabel("central predictive interval")
        ax.set_ylabel("fraction of outcomes inside")
        ax.set_title(f"coverage of {metrics.n_calibration} one-step-ahead forecasts")
        ax.legend(loc="upper left", fontsize=8)
        paths["coverage"] = _save(fig, plt, out_dir, "coverage.png")
        fig, ax = plt.subplots(figsize=(5.0, 4.0), dpi=100)
        ax.hist(metrics.pit, bins=10, range=(0, 1), density=True, color="C4", edgecolor="white")
        ax.axhline(1.0, ls="--", color="k", lw=1, label="calibrated")
        ax.set_xlabel("PIT  F(y)")
        ax.set_ylabel("density")
        ax.set_title("probability integral transform of observed outcomes")
        ax.legend(loc="upper right", fontsize=8)
        paths["pit_histogram"] = _save(fig, plt, out_dir, "pit_histogram.png")
    else:  # a previous report's plots (before log damage, or another run's in a shared --out) would stay beside
        # a summary that says "forecasts scored 0"
        for name in ("coverage.png", "pit_histogram.png"):
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(out_dir, name))

    f = io.StringIO(newline="")
    w = csv.writer(f)
    w.writerow(["metric", "value"])
    w.writerows(metrics.summary_rows(full=True))
    paths["summary"] = _write_atomic(os.path.join(out_dir, "summary.csv"), f.getvalue().encode())
    f = io.StringIO(newline="")
    cols = ["trial_id", "status", "batch_id", "value", "error", "message", "node_id", "attempt", "proposed_at",
            "started_at", "ended_at", "params", "metrics"]
    w = csv.writer(f)
    w.writerow(cols)
    for t in trials:
        d = t.to_dict()
        info = d.get("info") or {}  # the failure's message and the objective's metrics (JSON), as logged
        d["message"], d["metrics"] = info.get("message"), info.get("metrics")
        w.writerow([_csv_cell(d[c]) for c in cols])
    paths["trials"] = _write_atomic(os.path.join(out_dir, "trials.csv"), f.getvalue().encode())
    return metrics, paths


def _csv_cell(v: Any) -> Any:
    if v is None:
        return ""
    if isinstance(v, dict):
        import json

        return json.dumps(v, sort_keys=True)
    return v


def _save(fig: Any, plt: Any, out_dir: str, name: str) -> str:
    path = os.path.join(out_dir, name)
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return _write_atomic(path, buf.getvalue())


def _umask() -> int:
    """The process's umask: from /proc where Linux shows it, else read by setting it and putting it back."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _write_atomic(path: str, data: bytes) -> str:
    """Write `data` to `path` by a rename: a reader (or a report interrupted half-way) sees the old file or the
    new one, never a truncated one. The temporary file has a name of its own (two reports writing one folder
    shared `path.tmp`) and is removed when the write fails (a full disk)."""
    import tempfile

    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".", prefix=os.path.basename(path) + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; the report is read as the rest of the run is
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
    return path
