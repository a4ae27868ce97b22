"""The report's plots of a run: every trial's value against evaluations (by source, with the best so far and
the recommendation's target level at each refit), the best so far against wall time, worker utilization and
queue depth, and, where forecasts were scored, predicted against observed, interval coverage and the PIT
histogram (calibrated-bo.md §1); then the parameter plots of orchestrator/report/study_plots.py.

`figures` draws them one at a time, each with its artifact name, for the writer
(orchestrator/report/writer.py) to save and close before the next is drawn. Matplotlib runs on its Agg
backend: no display is needed.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from orchestrator.report.metrics import COVERAGE_LEVELS, RunMetrics, _fmt, _mapping
from orchestrator.report.series import (
    _queue_depth,
    best_so_far,
    finished,
    forecast_intervals,
    intervals,
    recommendation_series,
    utilization_series,
)
from orchestrator.report.study_plots import parameter_figures
from orchestrator.store import Event, TrialRecord
from orchestrator.store.frame import log_rows

log = logging.getLogger(__name__)

#: central interval of the predicted-against-observed plot
FORECAST_COVERAGE = 0.8
#: colour and legend label of each proposal source; other sources get the next colours
_SOURCES = {"sobol": ("C0", "Sobol initial design"), "model": ("C1", "model's proposer"),
            "repeat": ("C4", "re-evaluation of a best point")}


def _figure():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def figures(
    plt: Any,
    metrics: RunMetrics,
    events: Sequence[Event],
    trials: Sequence[TrialRecord],
    config: Mapping[str, Any],
) -> Iterator[tuple[str, Any]]:
    """(artifact name, figure) of each plot of the run, drawn with pyplot `plt` (`_figure`) when the caller
    asks for the next: "best_vs_evaluations", "best_vs_time", "utilization", with scored forecasts
    "predicted_vs_observed", "coverage" and "pit_histogram", then `parameter_figures`'
    ("parallel_coordinates", "slice" or "slice_1", ..., "importance"); a plot that cannot be drawn is skipped
    with its reason logged."""
    t0 = min((ev.time for ev in events), default=0.0)
    expectile = _mapping(config.get("model")).get("type", "quantile") == "expectile"
    label = "tau-expectile" if expectile else "tau-quantile"
    rows = log_rows(events)

    yield "best_vs_evaluations", _values_figure(plt, metrics, events, trials, rows, config, label)
    n, times, best = best_so_far(trials, metrics.direction)
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=100)
    ax.set_title(f"{metrics.name}: best observed value and evaluations finished over time", fontsize=10)
    observed = bool(np.isfinite(best).any())
    if observed:
        # markers too: one finished evaluation is a step of one point, which draws nothing
        ax.step(times - t0, best, where="post", label="best observed value", color="k",
                marker="o" if len(n) == 1 else None, ms=4)
        ax.set_ylabel(f"best observed value ({metrics.direction})")
        twin = ax.twinx()
        twin.step(times - t0, n, where="post", color="C2", alpha=0.6, label="evaluations finished")
        twin.set_ylabel("evaluations finished", color="C2")
        twin.set_ylim(0, max(len(n), 1) * 1.05)
        lines = ax.get_lines() + twin.get_lines()
        ax.legend(lines, [ln.get_label() for ln in lines], loc="lower right", fontsize=8)
    else:
        ax.text(0.5, 0.5, _nothing(len(n)), ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("wall time since the run started [s]")
    ax.grid(alpha=0.3)
    yield "best_vs_time", fig

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
    ax1.set_ylabel(
        "busy fraction of the session's slots" if varying else f"busy fraction of {metrics.slots} slots"
    )
    ax1.set_title(f"{metrics.name}: worker utilization ({metrics.slots_source} slots)")
    ax1.grid(alpha=0.3)
    if len(qt):
        ax2.step(qt - start, qd, where="post", color="C3")
    ax2.set_xlabel("time since the first evaluation started [s]"
                   + (" (gaps between sessions cut out)" if gaps else ""))
    ax2.set_ylabel("queue depth (proposed, not dispatched)")
    ax2.grid(alpha=0.3)
    yield "utilization", fig

    if metrics.n_calibration:
        yield "predicted_vs_observed", _forecast_figure(plt, metrics, trials)
        fig, ax = plt.subplots(figsize=(5.0, 4.0), dpi=100)
        levels = list(COVERAGE_LEVELS)
        ax.bar(
            [str(int(100 * p)) + "%" for p in levels],
            [metrics.coverage[p] for p in levels],
            color="C0",
            label="observed",
        )
        ax.scatter([str(int(100 * p)) + "%" for p in levels], levels, color="k", zorder=3, label="nominal")
        ax.set_ylim(0, 1)
        ax.set_xlabel("central predictive interval")
        ax.set_ylabel("fraction of outcomes inside")
        ax.set_title(f"coverage of {metrics.n_calibration} one-step-ahead forecasts")
        ax.legend(loc="upper left", fontsize=8)
        yield "coverage", fig
        fig, ax = plt.subplots(figsize=(5.0, 4.0), dpi=100)
        ax.hist(metrics.pit, bins=10, range=(0, 1), density=True, color="C4", edgecolor="white")
        ax.axhline(1.0, ls="--", color="k", lw=1, label="calibrated")
        ax.set_xlabel("PIT  F(y)")
        ax.set_ylabel("density")
        ax.set_title("probability integral transform of observed outcomes")
        ax.legend(loc="upper right", fontsize=8)
        yield "pit_histogram", fig
    space = config.get("space")
    yield from parameter_figures(plt, metrics.name, rows, space if isinstance(space, Mapping) else {},
                                 metrics.direction)


def _nothing(n_finished: int) -> str:
    return (f"no successful evaluation: all {n_finished} finished ones failed (see trials.csv)" if n_finished
            else "no finished evaluations yet")


def _values_figure(plt: Any, metrics: RunMetrics, events: Sequence[Event], trials: Sequence[TrialRecord],
                   rows: Sequence[Mapping[str, Any]], config: Mapping[str, Any], label: str) -> Any:
    """Every finished trial's value at its place in the order of finishing, coloured by the source of its
    proposal, failures as marks on the axis; the best observed value so far; and at each refit the model's
    recommendation (an observed point): its predicted target level, and its true one where the objective is a
    built-in synthetic one that knows it."""
    done = finished(trials)
    source = {r["trial_id"]: r.get("source") or "unknown" for r in rows}
    n, _, best = best_so_far(trials, metrics.direction)
    fig, ax = plt.subplots(figsize=(7.2, 5.4), dpi=100)
    ax.set_title(f"{metrics.name}: every trial's value, best so far and the recommendation "
                 f"(target: {label}, tau={_fmt(metrics.tau)})", fontsize=9)
    xs = np.arange(1, len(done) + 1)
    ok = np.array(
        [t.status == "completed" and t.value is not None and math.isfinite(t.value) for t in done], bool
    )
    values = np.array([t.value if k else math.nan for t, k in zip(done, ok)], dtype=float)
    kinds = list(dict.fromkeys(source.get(t.trial_id, "unknown") for t in done))
    extra = iter(f"C{i}" for i in range(5, 10))
    for kind in sorted(
        kinds, key=lambda k: (k not in _SOURCES, list(_SOURCES).index(k) if k in _SOURCES else 0)
    ):
        colour, name = _SOURCES.get(kind, (next(extra, "C9"), f"source: {kind}"))
        mine = np.array([source.get(t.trial_id, "unknown") == kind for t in done], bool)
        if (mine & ok).any():
            ax.scatter(xs[mine & ok], values[mine & ok], s=14, color=colour, alpha=0.75,
                       label=f"{name} ({int((mine & ok).sum())})")
    if (~ok).any():  # failures have no value: marked along the bottom of the axes
        ax.scatter(xs[~ok], np.full(int((~ok).sum()), 0.02), marker="x", s=18, color="C3",
                   transform=ax.get_xaxis_transform(), label=f"failed ({int((~ok).sum())}, no value)")
    if ok.any():
        ax.step(n, best, where="post", color="k", lw=1.2, label="best observed so far")
    pn, _, pvals, params = recommendation_series(events, trials)
    if len(pn):
        ax.plot(pn, pvals, "D-", ms=3.5, lw=1, color="C8",
                label=f"recommendation at each refit: model's predicted {label}")
        truth = _true_levels(config, params, metrics.tau, expectile=label == "tau-expectile")
        if truth is not None:
            ax.plot(
                pn,
                truth,
                "s--",
                ms=3.5,
                lw=1,
                color="C2",
                label=f"recommendation at each refit: true {label}",
            )
    if not ok.any() and not len(pn):
        ax.text(0.5, 0.5, _nothing(len(done)), ha="center", va="center", transform=ax.transAxes)
    else:
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2, fontsize=7)  # below: over no point
    ax.set_xlabel("evaluations finished")
    ax.set_ylabel(f"outcome ({metrics.direction})")
    ax.grid(alpha=0.3)
    return fig


def _true_levels(config: Mapping[str, Any], params: Sequence[Mapping[str, Any] | None], tau: float,
                 expectile: bool) -> np.ndarray | None:
    """The true tau-quantile at each of `params` (None where a refit recorded none), from the run's objective
    where it is a built-in synthetic one (objectives/base.py `SyntheticObjective.quantile`, in the outcome's
    units as tau is); None for any other objective, an expectile target, or one that cannot be built here."""
    from objectives.registry import BUILTIN_OBJECTIVES

    spec = _mapping(config.get("objective"))
    name = spec.get("name")
    if expectile or not isinstance(name, str) or name not in BUILTIN_OBJECTIVES or not math.isfinite(tau):
        return None
    try:  # a user objective is not imported: its module may start anything
        from objectives.base import SyntheticObjective
        from objectives.registry import inspect_objective

        obj = inspect_objective(name, _mapping(spec.get("options")))
        names = set(obj.space)
        if not isinstance(obj, SyntheticObjective) or any(p is not None and set(p) != names for p in params):
            return None  # not synthetic, or the run's space is not the objective's
        return np.array([math.nan if p is None else obj.quantile(p, tau) for p in params], dtype=float)
    except Exception as exc:  # noqa: BLE001 -- the plot keeps the prediction, and says why the truth is missing
        log.info("qbatch: report: best_vs_evaluations.png shows no true %s-quantile of the recommendation: "
                 "objective %r: %s: %s", _fmt(tau), name, type(exc).__name__, exc)
        return None


def _forecast_figure(plt: Any, metrics: RunMetrics, trials: Sequence[TrialRecord]) -> Any:
    """Each scored trial's observed value against the forecast made when it was proposed: the predictive
    median with its central `FORECAST_COVERAGE` interval, outcomes outside it in another colour."""
    obs, med, lo, hi, _ = forecast_intervals(trials, metrics.direction, FORECAST_COVERAGE)
    fig, ax = plt.subplots(figsize=(5.6, 5.0), dpi=100)
    inside = (obs >= lo) & (obs <= hi)
    for mask, colour, name in ((inside, "C0", "inside"), (~inside, "C3", "outside")):
        if mask.any():
            ax.errorbar(obs[mask], med[mask], yerr=np.stack([med[mask] - lo[mask], hi[mask] - med[mask]]),
                        fmt="o", ms=3, lw=0.8, alpha=0.7, color=colour,
                        label=f"{name} the {FORECAST_COVERAGE:.0%} interval ({int(mask.sum())})")
    if len(obs):
        span = [min(obs.min(), lo.min()), max(obs.max(), hi.max())]
        ax.plot(span, span, "--", color="k", lw=1, label="predicted = observed")
        ax.legend(loc="upper left", fontsize=8)
    ax.set_xlabel("observed value")
    ax.set_ylabel(f"predicted: median and central {FORECAST_COVERAGE:.0%} interval")
    ax.set_title(f"{metrics.name}: {len(obs)} one-step-ahead forecasts against outcomes", fontsize=10)
    ax.grid(alpha=0.3)
    return fig
