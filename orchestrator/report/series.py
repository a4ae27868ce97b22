"""The time series of a run, read from its trials and events: best so far, the model's recommendation and its
prediction at each refit, the evaluations' intervals, the actor sessions' spans and slots, utilization, queue
depth, and the PIT and central intervals of the forecasts.

Each is a plain function of the log (orchestrator/store/), for `compute_metrics` and the report's plots;
the definitions are in orchestrator/report/metrics.py's docstring. Time axes with session spans cut out the
gaps between sessions (a stopped run waiting for `qbatch resume`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from orchestrator.store import Event, TrialRecord

#: bins of the utilization-over-time plot
_UTIL_BINS = 60


def _info_number(info: Mapping | None, keys: Sequence[str]) -> float | None:
    if not info:
        return None
    for k in keys:
        v = info.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            return float(v)
    return None


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


def predicted_series(
    events: Sequence[Event], trials: Sequence[TrialRecord]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(results the fit was trained on, time, best_predicted) at each refit event that records it: the model's
    predicted target level of its recommendation when the fit ended (`recommendation_series` without the
    params)."""
    ns, ts, vs, _ = recommendation_series(events, trials)
    return ns, ts, vs


def recommendation_series(
    events: Sequence[Event], trials: Sequence[TrialRecord]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[Mapping[str, Any] | None]]:
    """(results the fit was trained on, time, best_predicted, best_params) at each refit event that records
    `best_predicted`: the recommendation of each fit (an observed point) and the fit's predicted target level
    there. The count is the event's `info["n"]`; where it is missing, the evaluations finished by the time of
    the event (that overstates what the model has seen: a fit on 15 results can be drawn at 40)."""
    done = finished(trials)
    ends = np.array([t.ended_at for t in done], dtype=float)
    # `info["n"]` counts completed results (failures are no observations): the evaluations finished when the
    # n-th of them came in, on the plot's axis of finished evaluations
    nth_completed = [i + 1 for i, t in enumerate(done) if t.status == "completed"]
    ts, ns, vs, ps = [], [], [], []
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
                params = ev.info.get("best_params")
                ps.append(params if isinstance(params, Mapping) else None)
    return np.array(ns, dtype=float), np.array(ts, dtype=float), np.array(vs, dtype=float), ps


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


def session_slots(
    events: Sequence[Event], pieces: Sequence[tuple[float, float, Any]], default: int
) -> dict[Any, int]:
    """The slots each session ran with: the last `info["slots"]` logged in it (the event's `info["session"]`,
    the actor's start time, as the results carry it), else `default`. A resume on another cluster has other
    slots: one count for the whole run would put U above 1."""
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
    """`t -> seconds of the sessions' spans before t`: the time axis of the report's utilization plot, with
    the gaps between sessions (a stopped run waiting for `qbatch resume`) cut out; before the first span, the
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
    iv: np.ndarray,
    slots: int,
    bins: int = _UTIL_BINS,
    pieces: Sequence[tuple[float, float, int]] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(bin centres relative to the first start, busy fraction of `slots` in each bin). With `pieces` (the
    sessions' spans with their slots, `(lo, hi, slots)`), the time axis is `active_time`'s, gaps between
    sessions cut out, and each bin's capacity counts the slots of the sessions it covers."""
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
        return 0.5 * (edges[:-1] + edges[1:]), np.divide(
            busy, capacity, out=np.zeros_like(busy), where=capacity > 0
        )
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
            left[ev.trial_id] = (
                ev.started_at if (ev.kind == "started" and ev.started_at is not None) else ev.time
            )
    changes = [(t, 1) for t in proposed.values()] + [(t, -1) for k, t in left.items() if k in proposed]
    changes.sort()
    if not changes:
        return np.zeros(0), np.zeros(0)
    times = np.array([c[0] for c in changes], dtype=float)
    depth = np.maximum(np.cumsum([c[1] for c in changes]), 0)
    return times, depth.astype(float)


def _queue_depth(
    events: Sequence[Event], pieces: Sequence[tuple[float, float, Any]]
) -> tuple[np.ndarray, np.ndarray]:
    """`queue_depth_series` on `active_time`'s axis where there are session spans: the time a stopped run
    waits for its resume is not queue time."""
    qt, qd = queue_depth_series(events)
    return (active_time(pieces)(qt) if pieces else qt), qd


def _time_weighted_mean(times: np.ndarray, values: np.ndarray) -> float:
    if len(times) < 2 or times[-1] <= times[0]:
        return float(values.mean()) if len(values) else math.nan
    return float(np.sum(values[:-1] * np.diff(times)) / (times[-1] - times[0]))


def _forecast_groups(
    trials: Sequence[TrialRecord], direction: str
) -> list[tuple[Any, np.ndarray, list[TrialRecord]]]:
    """(Forecast, outcomes in the forecast's units `n`, trials `n`) per (family, tau) of the completed trials
    whose proposal recorded a forecast; the forecasts are of the negated outcome where their record says so (a
    minimized run's, by default)."""
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
    out = []
    for _, group in sorted(groups.items()):
        try:
            fc = Forecast.from_records([t.forecast for t in group])
        except (KeyError, TypeError, ValueError):
            continue
        y = [-t.value if _negated(t, direction) else t.value for t in group]
        out.append((fc, np.asarray(y, dtype=float), group))
    return out


def _negated(t: TrialRecord, direction: str) -> bool:
    return bool(t.forecast.get("negated", direction == "minimize"))


def calibration(trials: Sequence[TrialRecord], direction: str) -> list[float]:
    """PIT values F(y) of completed trials whose proposal recorded a forecast (see module docstring)."""
    pit: list[float] = []
    for fc, y, _ in _forecast_groups(trials, direction):
        u = fc.cdf(y)
        pit.extend(float(v) for v in u.tolist() if math.isfinite(v))
    return pit


def forecast_intervals(
    trials: Sequence[TrialRecord], direction: str, coverage: float = 0.8
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, list[str]]:
    """(observed, predictive median, lower, upper, trial ids), each `n`, in the outcome's units, of the
    completed trials whose proposal recorded a forecast: the forecast made when the trial was proposed (one
    step ahead) and its central interval holding `coverage` of the predictive mass."""
    obs, med, lo, hi, ids = [], [], [], [], []
    levels = [(1 - coverage) / 2, 0.5, (1 + coverage) / 2]
    for fc, _y, group in _forecast_groups(trials, direction):
        q = fc.quantile(levels).numpy()
        for j, t in enumerate(group):
            a, m, b = q[j]
            if _negated(t, direction):
                a, m, b = -b, -m, -a
            obs.append(t.value)
            med.append(m)
            lo.append(a)
            hi.append(b)
            ids.append(t.trial_id)
    return (np.asarray(obs, dtype=float), np.asarray(med, dtype=float), np.asarray(lo, dtype=float),
            np.asarray(hi, dtype=float), ids)
