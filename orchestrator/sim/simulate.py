"""One run of the real central actor on a simulated cluster of N virtual slots (`simulate`).

Benchmark and test use, not a way to run an experiment: benchmarks/cluster_sim.py measures the actor's
utilization at hundreds to thousands of slots on one machine, as Syne Tune's simulator backend replays
evaluation times in virtual time to study schedulers at scale. The actor is the real `CentralActor`, built
in this process on a new run directory, with its `AskTellOptimizer` (model, calibrator, proposer), its
planner threads and their background refits, its scheduler, log and checkpoints; only the Ray dispatch
(`SimDispatcher`) and the clock (`VirtualClock`, for dispatch times, the refit interval and `status`) are
replaced. The results' `started_at` and `ended_at` are virtual; the other timestamps of the log (when a
proposal or a result was written) stay real. U is the report's (`compute_metrics` on the run's log).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator.actor.central import CentralActor
from orchestrator.errors import QbatchError
from orchestrator.sim.clock import VirtualClock
from orchestrator.sim.cluster import SimCluster, SimDispatcher
from orchestrator.sim.watch import PlannerWatch

__all__ = ["SimRun", "simulate"]


@dataclass
class SimRun:
    """What one simulated run measured.

    Attributes:
        summary: the actor's own summary (`CentralActor.run`); its "utilization" reads the virtual clock too.
        utilization: U as the report computes it from the log (`RunMetrics.utilization`).
        span_s, busy_s: the report's span (first start to last end) and busy evaluation time, virtual seconds.
        intervals: `(started_at, ended_at)` of every result, in the order the evaluations started.
        real_s: real seconds the run took, its final fit excluded.
        skipped_s: virtual seconds the clock jumped over while the actor waited.
        skips: jumps of the clock.
        refits, refit_s: the background refits and their seconds (the log's "refit" records).
        proposal_s: seconds of each model-based batch's proposal (the log's "proposed" records).
        run_dir: the run directory (its log and checkpoints).
    """

    summary: dict[str, Any]
    utilization: float
    span_s: float
    busy_s: float
    intervals: list[tuple[float, float]]
    real_s: float
    skipped_s: float
    skips: int
    refits: int
    refit_s: list[float]
    proposal_s: list[float]
    run_dir: str


def simulate(config: Mapping[str, Any], slots: int, mean_s: float, cv: float, *, seed: int = 0,
             refit_interval_s: float = 0.5, queue_low: int | None = None, final_fit: bool = False) -> SimRun:
    """Run `config` (an experiment config dict with a new `run_dir`) on `slots` virtual slots.

    Args:
        config: the experiment (objective, model, proposer, batch size, budget, ...); its objective runs in
            this process, so it must be cheap (e.g. ``sleep`` with ``mean_s: 0``: its value is analytic).
        slots: virtual slots (the actor's `max_concurrent`).
        mean_s, cv: the lognormal evaluation times, virtual seconds (`SimCluster`).
        seed: seed of the evaluation times.
        refit_interval_s: the actor's least time between two background refits (virtual seconds).
        queue_low: the actor's `queue_low` (None: its default).
        final_fit: run the actor's final fit from scratch after the last result (it is outside the span, so
            it changes no utilization; at large n it takes long).

    Raises:
        QbatchError: a bad argument or config (named), or an objective that sleeps in real time.
    """
    from objectives.registry import inspect_objective
    from orchestrator.config import load_config
    from orchestrator.report.metrics import compute_metrics
    from orchestrator.store import RunStore

    if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
        raise QbatchError(f"slots must be an integer >= 1; got {slots!r}")
    cfg = load_config(dict(config))
    if cfg.run_dir is None:
        raise QbatchError("config['run_dir'] must name a new run directory for the simulated run")
    objective = inspect_objective(cfg.objective.name, dict(cfg.objective.options))
    if getattr(objective, "mean_s", 0) > 0:
        raise QbatchError(f"objective {cfg.objective.name!r} sleeps mean_s={objective.mean_s:g} s in real "
                          "time; the simulator draws the evaluation times itself (mean_s, cv): give it "
                          "mean_s: 0")
    cluster = SimCluster(objective, mean_s, cv, seed=seed)
    RunStore.create(cfg.run_dir, cfg.to_dict())
    actor = CentralActor(cfg.run_dir, max_concurrent=slots, queue_low=queue_low,
                         refit_interval_s=refit_interval_s, pool=None)
    clock = VirtualClock()
    actor.clock = actor.planner.clock = clock
    watch = PlannerWatch(actor.planner)
    dispatcher = SimDispatcher(actor.dispatcher, cluster, clock, watch)
    actor.dispatcher = dispatcher
    real: list[float] = []
    final = actor.planner.final_fit

    def end_of_span() -> None:
        real.append(clock.real_s)
        if final_fit:
            final()

    actor.planner.final_fit = end_of_span  # type: ignore[method-assign]
    switch = sys.getswitchinterval()  # the run loop shortens it for the actor's process
    try:
        summary = actor.run()
    finally:
        sys.setswitchinterval(switch)
        actor.store.unlock_writer()
    store = RunStore.open(cfg.run_dir)
    events = store.events()
    metrics = compute_metrics(events, store.config, with_calibration=False, writing=False)
    done = sorted((e.started_at, e.ended_at) for e in events if e.kind in ("completed", "failed"))
    refit_s = [float(e.info["seconds"]) for e in events
               if e.kind == "refit" and e.info and "seconds" in e.info]
    proposal_s = {e.batch_id: float(e.info["proposal_seconds"]) for e in events
                  if e.kind == "proposed" and (e.info or {}).get("source") == "model"}
    return SimRun(summary=summary, utilization=metrics.utilization, span_s=metrics.span_s,
                  busy_s=metrics.busy_s,
                  intervals=done, real_s=real[0] if real else clock.real_s, skipped_s=clock.skipped,
                  skips=dispatcher.skips, refits=len(refit_s), refit_s=refit_s,
                  proposal_s=list(proposal_s.values()), run_dir=cfg.run_dir)
