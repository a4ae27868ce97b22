"""The report's plots of a run: best so far against evaluations and time, worker utilization and queue depth,
and, where forecasts were scored, interval coverage and the PIT histogram (calibrated-bo.md §1).

`figures` draws them one at a time, each with its artifact name, for the writer (orchestrator/report/writer.py)
to save and close before the next is drawn. Matplotlib runs on its Agg backend: no display is needed.
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from orchestrator.report.metrics import COVERAGE_LEVELS, RunMetrics, _fmt, _mapping
from orchestrator.report.series import _queue_depth, best_so_far, intervals, predicted_series, utilization_series
from orchestrator.store import Event, TrialRecord


def _figure():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def figures(
    plt: Any, metrics: RunMetrics, events: Sequence[Event], trials: Sequence[TrialRecord], config: Mapping[str, Any]
) -> Iterator[tuple[str, Any]]:
    """(artifact name, figure) of each plot of the run, drawn with pyplot `plt` (`_figure`) when the caller asks
    for the next: "best_vs_evaluations", "best_vs_time", "utilization", and with scored forecasts "coverage" and
    "pit_histogram"."""
    t0 = min((ev.time for ev in events), default=0.0)
    label = "tau-quantile" if _mapping(config.get("model")).get("type", "quantile") != "expectile" else "tau-expectile"

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
        yield key, fig

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
    yield "utilization", fig

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
        yield "coverage", fig
        fig, ax = plt.subplots(figsize=(5.0, 4.0), dpi=100)
        ax.hist(metrics.pit, bins=10, range=(0, 1), density=True, color="C4", edgecolor="white")
        ax.axhline(1.0, ls="--", color="k", lw=1, label="calibrated")
        ax.set_xlabel("PIT  F(y)")
        ax.set_ylabel("density")
        ax.set_title("probability integral transform of observed outcomes")
        ax.legend(loc="upper right", fontsize=8)
        yield "pit_histogram", fig
