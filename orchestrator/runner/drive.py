"""The driver's loop: run the central actor to the run's end, then the report and the final lines.

ARCHITECTURE.md "The path of one evaluation", steps 4 to 6, seen from the driver. `_drive` creates the run's
actors (`_start_actors`), calls the central actor's `run` and waits on it while it shows progress; a crashed
central actor is restarted by Ray and replays the log, and the driver calls `run` again (a new pid counts as a
restart). The summary it returns comes with the run's report (what `qbatch report` writes) and the lines that end
a run: the counts, the best point, where the results are. An interrupted or failed drive stops the actor before
it kills both actors, so nothing more is dispatched.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Mapping, TextIO

from orchestrator.actor import RunAbortedError
from orchestrator.runner.actors import _actor_pid, _start_actors
from orchestrator.runner.preflight import _absolute
from orchestrator.runner.progress import _ActorNotices, _QueueWatch, _show

#: how long the driver waits at the run's end for the central actor's last notices (`_ActorNotices.flush`)
NOTICE_FLUSH_S = 10.0


def _drive(
    run_dir: str,
    cfg: Any,
    resources: Any,
    max_concurrent: int | None,
    progress: bool,
    out: TextIO | None,
    actor_options: Mapping[str, Any] | None,
    new_run: bool = False,
    by_value: Any = None,
) -> dict[str, Any]:
    """Run the central actor of `run_dir` to the run's end and return its summary, with the report written and
    the final lines printed to `out`; raises `RunAbortedError` when the failure-rate guard stopped the run.
    `by_value`: the `ByValue` objective the evaluations run instead of the config's (name, options)."""
    import ray

    out = out or sys.stdout
    actor_options = dict(actor_options or {})
    actor, pool = _start_actors(run_dir, cfg, resources, max_concurrent, actor_options, new_run, by_value)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=cfg.budget, desc=cfg.name, unit="eval", file=sys.stderr, dynamic_ncols=True)
    notices = _ActorNotices(actor, bar)
    restarts = 0
    summary: dict[str, Any] | None = None
    try:
        # inside the try: an actor that cannot start must not leave the evaluation pool alive under its name
        # (a rerun on the same Ray, e.g. a cluster by address, would fail "already taken")
        actor_pid = _actor_pid(actor, run_dir, new_run=new_run)
        ref = actor.run.remote()
        watch = _QueueWatch(pool, resources, out, bar)
        while summary is None:
            ready, _ = ray.wait([ref], timeout=0.5)
            watch.poll(time.time())
            notices.poll()
            if bar is not None:
                try:
                    st = ray.get(actor.status.remote(), timeout=30)
                    if watch.counts is not None:
                        st = {**st, "running": watch.counts[0], "waiting": watch.counts[1]}
                    _show(bar, st)
                except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                    pass
            if not ready:
                continue
            try:
                summary = ray.get(ref)
                if summary.get("status") == "running":  # a call after an error waited on the live loop: again
                    summary, ref = None, actor.run.remote()
            except ray.exceptions.RayActorError:
                # the actor crashed (Ray restarts it: it replays the log) or was unreachable for a moment;
                # a restart is a new process, so compare pids rather than count errors
                pid = _actor_pid(actor, run_dir, after_error=True)
                if pid != actor_pid:
                    restarts, actor_pid = restarts + 1, pid
                ref = actor.run.remote()
        notices.flush(NOTICE_FLUSH_S)  # what the run's end had to say (the final fit's warnings)
        if bar is not None:
            _show(bar, summary)
    finally:
        if summary is None:  # interrupted, or failed: end the actor's loop by a direct call before `ray.kill`,
            # a request to the GCS, which a signal to the whole process group (SLURM's scancel) stops too: the
            # actor would go on proposing and starting evaluations until its raylet drained.
            # First of all: once the stop returns the actor dispatches nothing more (`CentralActor.stop`)
            try:
                ray.get(actor.stop.remote(), timeout=15)
            except Exception:  # noqa: BLE001 - dead, or never started: nothing to stop
                pass
            notices.flush(NOTICE_FLUSH_S / 5)
        if bar is not None:
            bar.close()
        for handle in (actor, pool):
            try:
                ray.kill(handle)
            except Exception:
                pass
    summary["actor_restarts"] = restarts
    summary["report_dir"], metrics = _write_report(run_dir, out)
    if metrics is not None:
        # the live figure spans this session up to the final refit; the report's (what summary.csv says) spans
        # the whole run from the first evaluation start to the last end: one number for one run
        summary["utilization_live"] = summary["utilization"]
        summary["utilization"] = metrics.utilization
    _report(summary, out)
    if summary["status"] == "aborted":
        raise RunAbortedError(summary["message"])
    return summary


def _write_report(run_dir: str, out: TextIO) -> tuple[str | None, Any]:
    """Plots and summary tables of the finished run (what `qbatch report` writes) and its `RunMetrics`; a failure
    here loses nothing (then `(None, None)`)."""
    from orchestrator.report import write_report

    try:
        metrics, paths = write_report(run_dir)
    except Exception as exc:  # the results are in the log; the report can be redone with `qbatch report`
        print(f"qbatch: could not write the report ({type(exc).__name__}: {exc}); run `qbatch report {run_dir}`", file=out)
        return None, None
    return (os.path.dirname(next(iter(paths.values()))) if paths else None), metrics


def _report(summary: Mapping[str, Any], out: TextIO) -> None:
    best = summary.get("best_predicted")
    label = "best point (the best posterior mean of the target among observed points)"
    if best is None:
        best, label = summary.get("best_observed"), "best observed point"
    print(
        f"qbatch: {summary['status']}: {summary['done']} evaluations ({summary['completed']} completed, "
        f"{summary['failed']} failed), utilization {summary['utilization']:.2f}",
        file=out,
    )
    if summary.get("message") and summary["status"] != "aborted":  # an abort's message is its exception's: once
        print(f"qbatch: {summary['message']}", file=out)
    if best is not None:
        print(f"qbatch: {label}: value {best['value']:.6g} at {best['params']}", file=out)
    print(f"qbatch: results in {_absolute(summary['run_dir'])}", file=out)
    if summary.get("report_dir"):
        print(f"qbatch: plots and summary tables in {summary['report_dir']}", file=out)
