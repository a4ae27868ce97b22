"""What the driver shows while a run goes: the progress bar, the central actor's notices, a starved-queue
warning.

ARCHITECTURE.md "The path of one evaluation", steps 3 and 4, seen from the driver: the bar's fields come from
the central actor's progress summary and the evaluation pool's start reports (`progress_fields`, `_show`); the
actor's lines for the user are printed above the bar (`_ActorNotices`); evaluations that wait in Ray's queue
with none running get one warning saying why (`_QueueWatch`).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from typing import Any, TextIO

#: seconds with evaluations waiting in Ray's queue and none running before the driver says so (`_QueueWatch`)
STARVED_WARN_S = 60.0
#: how often the driver asks the evaluation pool how many of its evaluations have started
POOL_POLL_S = 2.0


class _ActorNotices:
    """The central actor's lines for the user and its process's warnings (`CentralActor.notices`), printed to
    stderr one to a line: above the progress bar, which is redrawn below them (Ray forwards what an actor's
    process prints as it comes: after the actor's pid, on the bar's line, a warning with its source line).

    One call is in flight at a time, and the run's loop never waits on it: lines a call took from the actor
    are printed whenever it returns, never dropped because the driver stopped waiting."""

    def __init__(self, actor: Any, bar: Any = None) -> None:
        self._actor, self._bar = actor, bar
        self._ref: Any = None

    def poll(self, wait_s: float = 0.0) -> bool:
        """Start a call unless one is in flight, wait up to `wait_s` for it and print the lines it returned;
        whether it returned."""
        import ray

        try:
            if self._ref is None:
                self._ref = self._actor.notices.remote()
            ready, _ = ray.wait([self._ref], timeout=wait_s)
            if not ready:
                return False
            ref, self._ref = self._ref, None
            lines = ray.get(ref)
        except Exception:  # noqa: BLE001 - the actor restarted or is gone: its process's lines went with it
            self._ref = None
            return True
        for line in lines:
            if self._bar is not None:
                self._bar.write(line, file=sys.stderr)
            else:
                print(line, file=sys.stderr, flush=True)
        return True

    def flush(self, wait_s: float) -> None:
        """At the run's end: the call in flight, then one more for the lines since, each waited on
        `wait_s`."""
        if self._ref is not None and not self.poll(wait_s):
            return
        self.poll(wait_s)


class _QueueWatch:
    """The driver's view of the evaluation pool: how many dispatched evaluations run and how many wait in
    Ray's queue, and one warning (until one runs again) when some have waited `STARVED_WARN_S` with none
    running.

    Ray queues a task whose resources are taken (the user's own actors or tasks hold the CPUs) without a word:
    the run would wait forever, and the progress bar would show every dispatched evaluation as running."""

    def __init__(
        self, pool: Any, resources: Any, out: TextIO, bar: Any = None, warn_s: float | None = None
    ) -> None:
        self._pool, self._resources, self._out, self._bar = pool, resources, out, bar
        self._warn_s = STARVED_WARN_S if warn_s is None else warn_s
        self._asked = -math.inf
        self._since: float | None = None  # when the pool was first seen with evaluations and none running
        self._warned = False
        #: (running, waiting in Ray's queue) at the last answer; None before it
        self.counts: tuple[int, int] | None = None

    def poll(self, now: float) -> None:
        """Ask the pool (at most every `POOL_POLL_S`; a pool restarting is asked again next time) and warn."""
        import ray

        if now - self._asked < POOL_POLL_S:
            return
        self._asked = now
        try:
            held, started = ray.get(self._pool.counts.remote(), timeout=5)
        except Exception:  # noqa: BLE001 - restarting or gone: the loop sees the run end on its own
            return
        self.counts = (started, held - started)
        if started or not held:
            self._since, self._warned = None, False
            return
        if self._since is None:
            self._since = now
        elif not self._warned and now - self._since >= self._warn_s:
            self._warned = True
            line = f"qbatch: warning: {self._starved(held, now - self._since)}"
            if self._bar is not None:  # above the progress bar, which is redrawn below it
                self._bar.write(line, file=self._out)
            else:
                print(line, file=self._out, flush=True)

    def _starved(self, waiting: int, for_s: float) -> str:
        import ray

        from orchestrator.actor import resource_request

        request = resource_request(self._resources)
        keys = [k for k, v in request.items() if v > 0]
        asks = ", ".join(f"{k} {request[k]:g}" for k in keys) or "no resources"
        why = ("Other tasks or actors on this Ray may hold those resources; the run goes on when they are "
               "freed")
        try:
            free, total = ray.available_resources(), ray.cluster_resources()
            shown = keys or ["CPU"]
            have = ("; the cluster has " + ", ".join(f"{k} {free.get(k, 0.0):g} free of {total.get(k, 0.0):g}"
                                                     for k in shown))
            if all(free.get(k, 0.0) >= request[k] for k in keys):  # free now: the wait is elsewhere
                why = ("Ray has them free now, summed over its nodes: no single node may have them all, its "
                       "worker processes may be slow to start (a large runtime_env or container image), or "
                       "the resources were freed a moment ago")
        except Exception:  # noqa: BLE001 - the warning stands without the figures
            have = ""
        return (f"no evaluation has run for {for_s:.0f} s: {waiting} wait in Ray's queue, each asking for "
                f"{asks}{have}. {why}")


def progress_fields(st: Mapping[str, Any]) -> dict[str, Any]:
    """The progress bar's fields from the actor's progress summary. The best single observation (`best_y`)
    and the recommendation's predicted tau-level (`recommendation`, from the last fit; "-" before it) are
    shown apart, as `qbatch status` does: for a noisy objective the first is mostly noise and the second is
    the figure that counts, and one field switching from the first to the second would seem to fall when the
    model arrives. `sobol` and `model` count the evaluated points by where they came from (the Sobol design,
    its fillers included, or the proposer), so a run that never gets to its model says so as it goes; `repeat`
the re-evaluations of the best observed points at the budget's end, once there are any. `phase`
    is "final fit" while the fit after the last result runs (the count stands at the budget meanwhile).
    `running` counts the evaluations that have started (the pool's start reports, `running`/`waiting` in `st`
    where the driver has them) and `waiting` those still in Ray's queue; without the reports, every dispatched
    one counts as running."""
    observed, predicted = st.get("best_observed"), st.get("best_predicted")
    sources = st.get("sources")
    return {
        **({"phase": "final fit"} if st.get("phase") == "final fit" else {}),
        "best_y": "-" if observed is None else f"{observed['value']:.4g}",
        "recommendation": "-" if predicted is None else f"{predicted['value']:.4g}",
        **(
            {"sobol": sources.get("sobol", 0), "model": sources.get("model", 0),
             **({"repeat": sources["repeat"]} if sources.get("repeat") else {})}
            if sources is not None
            else {}
        ),
        "evals_s": f"{st['evals_per_s']:.2f}",
        "util": f"{st['utilization']:.2f}",
        "running": st.get("running", st["inflight"]),
        **({"waiting": st["waiting"]} if st.get("waiting") else {}),
        "failed": st["failed"],
    }


def _show(bar: Any, st: Mapping[str, Any]) -> None:
    fields = progress_fields(st)
    if bar.total and st["done"] > bar.total:  # a budget lowered below the results: reached, not "42/30"
        bar.n = bar.total
        fields = {"budget": "reached", "done": st["done"], **fields}
    else:
        bar.n = st["done"]
    bar.set_postfix(fields, refresh=False)
    bar.refresh()
