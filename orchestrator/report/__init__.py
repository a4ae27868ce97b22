"""Metrics, plots and a summary table of a run directory, computed from its event log (nothing asks the
running actor). The parts:

* `series`: the time series of the log (best so far, intervals, sessions, utilization, queue depth, PIT);
* `metrics`: `RunMetrics` and `compute_metrics`, what `qbatch status` and `qbatch report` show, with the
  definitions of each metric, and the summary table;
* `plots`: the report's figures of the run;
* `study_plots`: the report's figures of the parameters (parallel coordinates, slices, importance), by Optuna;
* `writer`: `write_report`, the plots, `summary.csv` and `trials.csv` of a run, each written by a rename.
"""

from __future__ import annotations

from orchestrator.report.metrics import (  # noqa: F401 -- resolve_direction: imported from here too
    COVERAGE_LEVELS,
    RunMetrics,
    compute_metrics,
    format_summary,
    resolve_direction,
)
from orchestrator.report.series import (  # noqa: F401 -- the series: imported from here too
    active_time,
    best_so_far,
    calibration,
    finished,
    forecast_intervals,
    intervals,
    max_concurrency,
    predicted_series,
    queue_depth_series,
    recommendation_series,
    session_pieces,
    session_slots,
    utilization_series,
)
from orchestrator.report.writer import write_report

__all__ = ["COVERAGE_LEVELS", "RunMetrics", "compute_metrics", "format_summary", "write_report"]
