"""Writing a run's report: its plots as PNG, `summary.csv` (the summary table, every digit) and `trials.csv`
(one row per trial, the columns of `qbatch.read_trials`: a typed column per parameter and per metric), into a
local folder.

Every file is written by a rename (`_write_atomic`): a reader, or a report interrupted half-way (a full disk),
sees the previous file or the new one, never a truncated one. Its mode is the run's other files' (the store's
`_Local.write_atomic`, orchestrator/store/filesystems.py): 0644 less the umask. A plot not drawn this time is
removed, so that a previous report's does not stay beside this one's. `qbatch report RUN_DIR` calls
`write_report`.
"""

from __future__ import annotations

import contextlib
import csv
import glob
import io
import os
import uuid
from collections.abc import Mapping
from typing import Any

from orchestrator.report.metrics import RunMetrics, compute_metrics
from orchestrator.report.plots import _figure, figures
from orchestrator.store import RunStore, trials_table
from orchestrator.store.frame import log_rows, trials_frame

__all__ = ["write_report"]

#: the plots a report may draw (`figures`), besides `slice_1.png`, `slice_2.png`, ... of a run with
#: many parameters
PLOTS = (
    "best_vs_evaluations",
    "best_vs_time",
    "utilization",
    "predicted_vs_observed",
    "coverage",
    "pit_histogram",
    "parallel_coordinates",
    "slice",
    "importance",
)
#: the mode of each file, less the umask: the store's (orchestrator/store/filesystems.py)
FILE_MODE = 0o644


def write_report(
    run_dir: str, out_dir: str | None = None, store: RunStore | None = None
) -> tuple[RunMetrics, dict[str, str]]:
    """Write the plots, `summary.csv` and `trials.csv` of a run; returns (metrics, {artifact name: path}).

    Args:
        run_dir: the run directory (local path or URI).
        out_dir: a local folder for the report; default ``<run_dir>/report`` for a local run, else
            ``./report-<name>``.
        store: an already opened store (optional).

    Raises:
        StoreError: `run_dir` holds no run.
    """
    store = store or RunStore.open(run_dir)
    events = store.events()
    config = store.config
    metrics = compute_metrics(
        events, config, damage=store.damage, writing=RunStore.is_being_written(store.run_dir)
    )
    if out_dir is None:
        out_dir = (
            os.path.join(store.run_dir, "report")
            if "://" not in store.run_dir
            else f"report-{metrics.name or 'run'}"
        )
    os.makedirs(out_dir, exist_ok=True)
    plt = _figure()
    trials = trials_table(events)
    paths: dict[str, str] = {}
    for key, fig in figures(plt, metrics, events, trials, config):
        paths[key] = _save(fig, plt, out_dir, f"{key}.png")
    # a previous report's plots (before log damage, or another run's in a shared --out) would stay beside a
    # summary that says "forecasts scored 0", or a run of fewer parameters
    drawn = {os.path.abspath(p) for p in paths.values()}
    stale = [os.path.join(out_dir, f"{key}.png") for key in PLOTS]
    stale += glob.glob(os.path.join(glob.escape(out_dir), "slice_[0-9]*.png"))
    for name in stale:
        if os.path.abspath(name) not in drawn:
            with contextlib.suppress(FileNotFoundError):
                os.remove(name)

    f = io.StringIO(newline="")
    w = csv.writer(f)
    w.writerow(["metric", "value"])
    w.writerows(metrics.summary_rows(full=True))
    paths["summary"] = _write_atomic(os.path.join(out_dir, "summary.csv"), f.getvalue().encode())
    # the columns of `qbatch.read_trials`: one per parameter (typed by the run's space) and per metric
    frame = trials_frame(log_rows(events), config.get("space") if isinstance(config, Mapping) else None)
    text = frame.to_csv(index=False, date_format="%Y-%m-%dT%H:%M:%S.%fZ")
    paths["trials"] = _write_atomic(os.path.join(out_dir, "trials.csv"), text.encode())
    return metrics, paths


def _save(fig: Any, plt: Any, out_dir: str, name: str) -> str:
    path = os.path.join(out_dir, name)
    buf = io.BytesIO()
    # Optuna's figures keep the layout of its colour bars (study_plots.py)
    if fig.get_layout_engine() is None:
        fig.tight_layout()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return _write_atomic(path, buf.getvalue())


def _write_atomic(path: str, data: bytes) -> str:
    """Write `data` to `path` by a rename: a reader (or a report interrupted half-way) sees the old file or
    the new one, never a truncated one. The temporary file has a name of its own (two reports writing one
    folder shared `path.tmp`) and is removed when the write fails (a full disk). It is made with `FILE_MODE`,
    which the umask narrows, as the store makes the run's files."""
    tmp = f"{path}.{uuid.uuid4().hex}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
    return path
