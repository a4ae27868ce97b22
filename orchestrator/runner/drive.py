"""The driver's loop: run the central actor to the run's end, then the report and the final lines.

ARCHITECTURE.md "The path of one evaluation", steps 4 to 6, seen from the driver. `_drive` creates the run's
actors (`_start_actors`), calls the central actor's `run` and waits on it while it shows progress; a crashed
central actor is restarted by Ray and replays the log, and the driver calls `run` again (a new pid counts as a
restart). The summary it returns comes with the run's report (what `qbatch report` writes) and the lines that
end
a run: the counts, the best point, where the results are. An interrupted or failed drive stops the actor
before it kills both actors, so nothing more is dispatched.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping
from typing import Any, TextIO

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
        if summary is None:
            # interrupted, or failed: end the actor's loop by a direct call before `ray.kill`, a request to
            # the GCS, which a signal to the whole process group (SLURM's scancel) stops too: the actor would
            # go on proposing and starting evaluations until its raylet drained.
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
    _report(summary, out, cfg)
    if summary["status"] == "aborted":
        raise RunAbortedError(summary["message"])
    return summary


def _write_report(run_dir: str, out: TextIO) -> tuple[str | None, Any]:
    """Plots and summary tables of the finished run (what `qbatch report` writes) and its `RunMetrics`; a
    failure here loses nothing (then `(None, None)`)."""
    from orchestrator.report import write_report

    try:
        metrics, paths = write_report(run_dir)
    except Exception as exc:  # the results are in the log; the report can be redone with `qbatch report`
        print(f"qbatch: could not write the report ({type(exc).__name__}: {exc}); run `qbatch report "
              f"{run_dir}`", file=out)
        return None, None
    return (os.path.dirname(next(iter(paths.values()))) if paths else None), metrics


#: how the end of a run words each recommendation rule (orchestrator/recommend.py)
_RULE_WORDS = {
    "mean": "the observed setting with the largest posterior mean of the target",
    "lcb": "the observed setting with the largest posterior mean of the target less one posterior sd of f",
    "lcb-2": "the observed setting with the largest posterior mean of the target less two posterior sds of f",
}


def _report(summary: Mapping[str, Any], out: TextIO, cfg: Any = None) -> None:
    """The lines that end a run: the counts, a warning when the model proposed nothing, the recommendation
    with its parameters one per line, and where the results are. `cfg`: the run's config (the recommendation
    rule's words and the warning's advice; without it, neither)."""
    best = summary.get("best_predicted")
    rule = getattr(cfg, "recommendation", None)
    label = (f"recommendation ({_RULE_WORDS.get(rule, 'chosen by the model')}, at the last fit): predicted "
             "tau-level")
    if best is None:
        best, label = summary.get("best_observed"), ("recommendation (no model was fitted: the best "
                                                     "observation): value")
    print(
        f"qbatch: {summary['status']}: {summary['done']} evaluations ({summary['completed']} completed, "
        f"{summary['failed']} failed), utilization {summary['utilization']:.2f}",
        file=out,
    )
    sources = summary.get("sources")
    if sources is not None:
        repeats = (f", {sources['repeat']} re-evaluations of the best observed points"
                   if sources.get("repeat") else "")
        print(f"qbatch: {sources.get('sobol', 0)} of them from the Sobol design, {sources.get('model', 0)} "
              f"from the model{repeats}", file=out)
    # an abort's message is its exception's: once
    if summary.get("message") and summary["status"] != "aborted":
        print(f"qbatch: {summary['message']}", file=out)
    warning = _no_model_warning(summary, cfg)
    if warning:
        print(f"qbatch: warning: {warning}", file=out)
    if best is not None:
        print(f"qbatch: {label} {best['value']:.6g} at", file=out)
        params = best["params"] or {}
        width = max((len(str(k)) for k in params), default=0)
        for k, v in params.items():
            print(f"    {str(k).ljust(width)}  {v}", file=out)
    print(f"qbatch: results in {_absolute(summary['run_dir'])}", file=out)
    if summary.get("report_dir"):
        print(f"qbatch: plots and summary tables in {summary['report_dir']}", file=out)


def _no_model_warning(summary: Mapping[str, Any], cfg: Any) -> str | None:
    """What to change when a finished run's model proposed none of its points (a random search by accident),
    or None. A streaming run gives free slots Sobol points until the first model batch is ready, so
    evaluations
    that are fast beside the first fit and proposal can spend the whole budget before it: waiting for the
    model (`synchronous: true`) or a budget that outlasts the first fit helps; a larger `initial_design` does
    not (the first fit waits for its results)."""
    sources = summary.get("sources")
    if (cfg is None or sources is None or not summary.get("uses_model") or summary.get("status") != "finished"
            or sources.get("model", 0) or not summary.get("done")):
        return None
    done, init, budget = summary["done"], cfg.initial_design, cfg.budget
    head = (f"the model proposed none of the {done} evaluations: all came from the Sobol design (a random "
            "search)")
    if budget <= init:
        return (f"{head}, as `budget` ({budget}) is not above `initial_design` ({init}); raise `budget` "
                "above `initial_design` for the model to propose")
    if summary.get("refit_failures") and not summary.get("refits"):
        return (f"{head}: every refit failed ({summary['refit_failures']}); `qbatch status "
                f"{summary['run_dir']}` shows the last error")
    if cfg.synchronous:
        return f"{head}; `qbatch status {summary['run_dir']}` shows its refits"
    fit_s, rate = summary.get("last_fit_s"), summary.get("evals_per_s") or 0.0
    timed = fit_s is not None and rate > 0
    timing = (
        f" (it evaluated {rate:.3g} points per second; the final fit alone took {fit_s:.1f} s)"
        if timed
        else ""
    )
    during = f", about {rate * fit_s:.0f} here" if timed else ""
    return (f"{head}. A streaming run gives free slots further Sobol points until the first model batch is "
            f"ready, and these evaluations spent the budget before the first fit and proposal ended{timing}. "
            "Set `synchronous: true` (each batch after the design then waits for the model), or raise "
            f"`budget` well past `initial_design` ({init}) plus what the evaluations use up during a "
            f"fit{during}; a larger `initial_design` does not help (the first fit waits for it)")
