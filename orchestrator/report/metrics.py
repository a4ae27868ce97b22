"""The metrics of a run directory and its summary table (`RunMetrics`, `compute_metrics`), from its event log.

Everything here is derived from the Parquet log (orchestrator/store/) and `config.yaml`; nothing asks the
running actor. What is read (the event `info` keys that orchestrator/actor.py writes):

* utilization U = busy evaluation time / (slots x wall time) over the span from the first evaluation start
  to the last evaluation end of each actor session (`info["session"]` of the results; a resume or an actor
  restart starts one), the sessions' spans joined, so the time between a stop and its `qbatch resume` does not
  count (a log without sessions is one). Busy time sums `ended_at - started_at` of each trial's accepted
  (first) completed/failed event. `slots` is the latest `info["slots"]` the actor recorded, else the config's
  `max_concurrent`, else the largest number of evaluations observed running at once (`slots_source` says
  which).
* proposal latency p50/p95: `propose_s` of "refit" events if any carries it, else the `proposal_seconds`
  (or `latency_s`) of "proposed" events, once per batch, of the model's batches (`info["source"]` "model")
  where there are any; refit time: `seconds` (or `fit_s`) of "refit" events.
  A "refit" event with `failed: true` is a fit that raised (the actor went on with the previous model): it is
  counted apart (`n_refit_failures`, with the last `error`), not as a refit.
* queue depth over time: trials proposed but not yet started.
* best so far: the best observed value (max or min per direction) and, where "refit" events carry it, the
  recommendation and its predicted tau-level (`best_predicted`, `best_params`).
* sources: the finished trials by where their point came from (the `source` of their "proposed" event: "sobol"
  for the design and its fillers, "model" for the proposer's).
* calibration (calibrated-bo.md §1): for completed trials whose proposal recorded a `forecast`, the PIT
  u = F(y) of `orchestrator.models.predictive.Forecast`; the central p-interval covers y iff |u - 1/2| <= p/2.
"""

from __future__ import annotations

import math
import warnings
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from orchestrator.report.series import (
    _info_number,
    _queue_depth,
    _time_weighted_mean,
    calibration,
    intervals,
    max_concurrency,
    session_pieces,
    session_slots,
)
from orchestrator.store import Event, status_counts, trials_table

__all__ = ["COVERAGE_LEVELS", "RunMetrics", "compute_metrics", "format_summary", "resolve_direction"]

COVERAGE_LEVELS = (0.5, 0.8, 0.9)
_FIT_KEYS = ("seconds", "fit_s", "refit_s", "duration_s")
_LATENCY_KEYS = ("proposal_seconds", "latency_s", "propose_s", "proposal_latency_s")


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
    #: finished (completed or failed) trials by the source of their point: "sobol" and "model" always
    sources: dict[str, int] = field(default_factory=lambda: {"sobol": 0, "model": 0})

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
            *(
                [("unfinished (no process writes the run)", str(self.counts["unfinished"]))]
                if self.counts.get("unfinished")
                else []
            ),
            ("progress", f"{100 * self.progress:.1f}%"),
            ("best observed value", f(self.best_value)),
            ("best observed trial", self.best_trial_id or "-"),
            ("best observed params", params(self.best_params)),
            ("evaluations from the Sobol design", str(self.sources.get("sobol", 0))),
            ("evaluations from the model", str(self.sources.get("model", 0))),
            *([("re-evaluations of the best observed points", str(self.sources["repeat"]))]
              if self.sources.get("repeat") else []),
            ("recommendation: predicted tau-level", f(self.best_predicted)),
            ("recommendation: params", params(self.best_predicted_params)),
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
            (
                "refits failed",
                str(self.n_refit_failures)
                + (f" (last: {self.last_refit_error})" if self.last_refit_error else ""),
            ),
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


def _percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=float), q)) if len(values) else math.nan


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
    """The run's direction: recorded by the actor in a refit event, else the config's, else the
    objective's."""
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
        warnings.warn(
            f"the run's config does not record its direction and objective {name!r} cannot be imported "
            f"here ({type(exc).__name__}: {exc}); reading it as 'maximize'",
            stacklevel=2,
        )
        return "maximize"


def compute_metrics(
    events: Sequence[Event],
    config: Mapping[str, Any],
    damage: Sequence[str] = (),
    with_calibration: bool = True,
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

    completed = [
        t for t in trials if t.status == "completed" and t.value is not None and math.isfinite(t.value)
    ]
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
    recorded = [
        int(ev.info["slots"])
        for ev in events
        if ev.info and isinstance(ev.info.get("slots"), int) and ev.info["slots"] > 0
    ]
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

    source_of: dict[str, str] = {}
    for ev in events:
        if ev.kind == "proposed" and ev.trial_id is not None:
            source_of.setdefault(ev.trial_id, str((ev.info or {}).get("source", "sobol")))
    sources = {"sobol": 0, "model": 0}
    for t in trials:
        if t.status in ("completed", "failed"):
            k = source_of.get(t.trial_id, "unknown")
            sources[k] = sources.get(k, 0) + 1

    qt, qd = _queue_depth(events, pieces)
    pit = calibration(trials, direction) if with_calibration else []
    pit_arr = np.asarray(pit, dtype=float)
    coverage = (
        {p: float(np.mean(np.abs(pit_arr - 0.5) <= p / 2)) for p in COVERAGE_LEVELS} if len(pit) else {}
    )

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
        sources=sources,
    )


def format_summary(metrics: RunMetrics) -> str:
    """The summary table as aligned plain text."""
    rows = metrics.summary_rows()
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)
