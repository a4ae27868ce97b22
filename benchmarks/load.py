"""Load test of a run's central actor: thousands of short evaluations, each logged once.

A real qbatch run on a local Ray: `--evals` (default 5,000) evaluations of a ~10 ms objective
(`objectives.timing.SleepObjective` with a fixed delay), proposed in batches of 500, with 64 evaluations in
flight (`max_concurrent`). The proposer is model-free by default (`random`; `--proposer thompson` uses the
quantile SVGP and Thompson batches instead), so the load is on the streaming pipeline: dispatch, collection,
the Parquet event log, the evaluation pool. The central actor's peak memory (VmHWM of its process; the pid
and the count of finished evaluations come from `status()`) is read when `--compare` (default 1,000)
evaluations are done and at the end: it must stay bounded, i.e. grow by far less than proportionally to the
evaluations (`--max-ratio`, `--max-kb-per-eval`).

`load_memory_trace_<isolate>.csv` holds the actor's resident set against the evaluations done, sampled
every 0.25 s. Reported per run: wall and span seconds, evaluations per second over the span, the exact-once
audit of the event log (each trial id has exactly one completed/failed record; `lost` = budget - trials with a
record, `duplicated` = records beyond the first per trial), the actor's and the evaluation pool's peak RSS,
and the number of log segments. A plain Ray loop (the same sleeping task refilled with `ray.wait`, no qbatch)
on the same slots gives the machine's practical throughput for comparison.

Slots: Ray starts with `num_cpus = slots` even on a 2-core machine and each evaluation asks for one CPU, so
exactly `slots` evaluations run at once; they only sleep, but each is a Ray task (and, with the default
``isolate="process"``, a forked child), so the cores are shared by Ray's own processes, the actor and the
pool.

Usage (inside scripts/loopback):
    python benchmarks/load.py --out bench-out/load     # 5,000 evaluations (peak compared at 1,000), 64 slots
    python benchmarks/load.py --quick --out /tmp/load  # 120 evaluations (compared at 40), 4 slots (~30 s)
The exit status is 1 when an evaluation was lost or duplicated, or the peak memory was not bounded.
"""

from __future__ import annotations

import argparse
import collections
import csv
import io
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks._common import format_table  # noqa: E402

_KB = 1024.0


# ----------------------------------------------------------------------------- memory of a process
def proc_memory_kb(pid: int) -> tuple[float, float] | None:
    """(VmHWM, VmRSS) of `pid` in KiB from /proc/<pid>/status, or None once the process is gone."""
    hwm = rss = None
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    hwm = float(line.split()[1])
                elif line.startswith("VmRSS:"):
                    rss = float(line.split()[1])
    except OSError:
        return None
    if hwm is None or rss is None:  # a zombie has no memory lines
        return None
    return hwm, rss


def _pool_pids() -> set[int]:
    """Processes of this driver's local Ray (its descendants) that host an `EvaluationPool` actor: Ray titles
    an actor's process ``ray::EvaluationPool`` (``ray::EvaluationPool.<method>`` while a method runs)."""
    import psutil

    found = set()
    for p in psutil.Process().children(recursive=True):
        try:
            cmd = p.cmdline()
        except psutil.Error:
            continue
        if cmd and cmd[0].startswith("ray::EvaluationPool"):
            found.add(p.pid)
    return found


class MemorySampler(threading.Thread):
    """Samples the central actor's and the evaluation pool's memory while a run goes on.

    The actor's pid and its count of finished evaluations come from its `status()` ("pid", "done"). VmHWM is
    the kernel's high-water mark of the resident set, so no peak between two samples is missed: the peak
    "at n evaluations" is the VmHWM read when `done` first reaches n, the final peak the last one read
    before the process ends.
    """

    def __init__(self, run_dir: str, mark: int, period_s: float = 0.25) -> None:
        super().__init__(daemon=True)
        self.run_dir = run_dir
        self.mark = mark
        self.period_s = period_s
        self.stop = threading.Event()
        self.old_pools = _pool_pids()  # a previous run's pool may still be exiting
        self.actor: Any = None
        self.actor_pid: int | None = None
        self.pool_pid: int | None = None
        self.actor_hwm_kb = 0.0
        self.actor_hwm_at_mark_kb: float | None = None
        self.done_at_mark: int | None = None
        self.actor_rss_kb = float("nan")
        self.pool_hwm_kb = 0.0
        self.trace: list[tuple[float, int, float, float]] = []  # (seconds, done, actor VmRSS KiB, VmHWM KiB)
        self.t0 = time.time()

    def run(self) -> None:
        import ray

        from orchestrator.runner import NAMESPACE, actor_name

        while not self.stop.is_set():
            done = None
            try:
                if self.actor is None:
                    self.actor = ray.get_actor(actor_name(self.run_dir), namespace=NAMESPACE)
                st = ray.get(self.actor.status.remote(), timeout=30)
                self.actor_pid, done = int(st["pid"]), int(st["done"])
            except Exception:  # not created yet, or already gone
                pass
            if self.pool_pid is None:
                new = _pool_pids() - self.old_pools
                self.pool_pid = min(new) if len(new) == 1 else None
            if self.actor_pid is not None:
                mem = proc_memory_kb(self.actor_pid)
                if mem is not None:
                    self.actor_hwm_kb = max(self.actor_hwm_kb, mem[0])
                    self.actor_rss_kb = mem[1]
                    if done is not None:
                        self.trace.append((time.time() - self.t0, done, mem[1], mem[0]))
                    if self.actor_hwm_at_mark_kb is None and done is not None and done >= self.mark:
                        self.actor_hwm_at_mark_kb, self.done_at_mark = mem[0], done
            if self.pool_pid is not None:
                mem = proc_memory_kb(self.pool_pid)
                if mem is not None:
                    self.pool_hwm_kb = max(self.pool_hwm_kb, mem[0])
            self.stop.wait(self.period_s)


# ----------------------------------------------------------------------------- audit of a run's log
def audit_log(run_dir: str, budget: int) -> dict[str, Any]:
    """Exactly-once audit of a run directory's event log."""
    from orchestrator.store import RunStore

    store = RunStore.open(run_dir)
    events = store.events()
    finished = [e for e in events if e.kind in ("completed", "failed")]
    counts = collections.Counter(e.trial_id for e in finished)
    proposed = {e.trial_id for e in events if e.kind == "proposed"}
    starts = [e.time for e in events if e.kind == "started"]
    ends = [e.time for e in finished]
    span = (max(ends) - min(starts)) if starts and ends else float("nan")
    return {
        "records": len(finished),
        "trials_logged": len(counts),
        "lost": budget - len(counts),
        "duplicated": sum(c - 1 for c in counts.values()),
        "unproposed": len(set(counts) - proposed),
        "failed": sum(e.kind == "failed" for e in finished),
        "span_s": span,
        "segments": len([n for n in os.listdir(os.path.join(run_dir, "events")) if n.endswith(".parquet")]),
        "damage": len(store.damage),
    }


# ----------------------------------------------------------------------------- one qbatch run
def run_qbatch(args: argparse.Namespace, n: int, isolate: str) -> dict[str, Any]:
    from orchestrator.runner import run_experiment

    run_dir = str(Path(args.out).resolve() / f"load-{n}-{isolate}-{int(time.time() * 1000)}")
    cfg = {
        "name": f"load-{n}",
        "objective": {
            "name": "sleep",
            "options": {"dim": args.dim, "mean_s": args.eval_s, "cv": 0.0, "noise": 0.1, "num_cpus": 1},
        },
        "model": {"type": "quantile", "options": {}},
        "proposer": {"type": args.proposer, "options": {}},
        "batch_size": args.batch_size,
        "initial_design": min(args.batch_size, n),
        "budget": n,
        "max_concurrent": args.slots,
        "timeout_s": 120,
        "seed": args.seed,
        "run_dir": run_dir,
    }
    sampler = MemorySampler(run_dir, mark=args.compare)
    sampler.start()
    t0 = time.time()
    try:
        summary = run_experiment(cfg, progress=not args.no_progress, out=io.StringIO(),
                                 actor_options={"isolate": isolate})
    finally:
        wall = time.time() - t0
        sampler.stop.set()
        sampler.join(timeout=60)
    audit = audit_log(run_dir, n)
    span = audit["span_s"]
    with open(Path(args.out) / f"load_memory_trace_{isolate}.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["seconds", "done", "actor_rss_mb", "actor_hwm_mb"])
        w.writerows([(f"{t:.2f}", d, f"{r / _KB:.1f}", f"{h / _KB:.1f}") for t, d, r, h in sampler.trace])
    mb = lambda kb: kb / _KB if kb else float("nan")  # noqa: E731
    return {
        "system": "qbatch",
        "isolate": isolate,
        "proposer": args.proposer,
        "evaluations": n,
        "slots": args.slots,
        "wall_s": wall,
        "span_s": span,
        "evals_per_s": n / span if span == span and span > 0 else float("nan"),
        "trials_logged": audit["trials_logged"],
        "lost": audit["lost"],
        "duplicated": audit["duplicated"],
        "failed": audit["failed"],
        "each_once": audit["lost"] == 0
        and audit["duplicated"] == 0
        and audit["unproposed"] == 0
        and summary["done"] == n
        and audit["damage"] == 0,
        "done_at_mark": sampler.done_at_mark if sampler.done_at_mark is not None else "",
        "actor_peak_at_mark_mb": mb(sampler.actor_hwm_at_mark_kb),
        "actor_peak_mb": mb(sampler.actor_hwm_kb),
        "actor_rss_end_mb": mb(sampler.actor_rss_kb)
        if sampler.actor_rss_kb == sampler.actor_rss_kb
        else float("nan"),
        "pool_peak_mb": mb(sampler.pool_hwm_kb),
        "segments": audit["segments"],
        "run_dir": run_dir,
    }


# ----------------------------------------------------------------------------- plain Ray loop
def _sleep_task(seconds: float) -> tuple[float, float]:
    t = time.time()
    time.sleep(seconds)
    return t, time.time()


def run_plain(args: argparse.Namespace, n: int) -> dict[str, Any]:
    """The same sleeping evaluations as plain Ray tasks, `slots` in flight, refilled one by one."""
    import ray

    task = ray.remote(num_cpus=1)(_sleep_task)
    t0 = time.time()
    inflight = [task.remote(args.eval_s) for _ in range(min(args.slots, n))]
    submitted = len(inflight)
    intervals = []
    while inflight:
        ready, inflight = ray.wait(inflight, num_returns=1)
        intervals.append(ray.get(ready[0]))
        if submitted < n:
            inflight.append(task.remote(args.eval_s))
            submitted += 1
    wall = time.time() - t0
    span = max(e for _, e in intervals) - min(s for s, _ in intervals)
    return {"system": "plain-ray", "isolate": "-", "proposer": "-", "evaluations": n, "slots": args.slots,
            "wall_s": wall, "span_s": span, "evals_per_s": n / span, "trials_logged": len(intervals),
            "lost": n - len(intervals), "duplicated": 0, "failed": 0, "each_once": len(intervals) == n,
            "done_at_mark": "", "actor_peak_at_mark_mb": float("nan"), "actor_peak_mb": float("nan"),
            "actor_rss_end_mb": float("nan"), "pool_peak_mb": float("nan"), "segments": 0, "run_dir": ""}


# ----------------------------------------------------------------------------- main
COLUMNS = [
    "system",
    "isolate",
    "proposer",
    "evaluations",
    "slots",
    "wall_s",
    "span_s",
    "evals_per_s",
    "trials_logged",
    "lost",
    "duplicated",
    "failed",
    "each_once",
    "done_at_mark",
    "actor_peak_at_mark_mb",
    "actor_peak_mb",
    "actor_rss_end_mb",
    "pool_peak_mb",
    "segments",
]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--evals", type=int, default=None, help="evaluations of the run (default 5000; --quick "
                                                           "120)")
    p.add_argument("--compare", type=int, default=None,
                   help="evaluations done at which the actor's peak memory is compared with its final peak "
                        "(default 1000; --quick 40)")
    p.add_argument("--slots", type=int, default=None, help="max_concurrent (default 64; --quick 4)")
    p.add_argument("--batch-size", type=int, default=None, help="proposal batch size (default 500; --quick "
                                                                "20)")
    p.add_argument("--eval-s", type=float, default=0.01, help="seconds one evaluation sleeps (default 0.01)")
    p.add_argument("--dim", type=int, default=4)
    p.add_argument("--proposer", default="random", help="proposer type (random, sobol, thompson, ...)")
    p.add_argument("--isolate", default="process", help="comma-separated evaluation isolation modes: "
                                                        "process,thread")
    p.add_argument("--max-ratio", type=float, default=1.5,
                   help="largest accepted ratio of the final peak to the peak at --compare evaluations "
                        "(default 1.5)")
    p.add_argument("--max-kb-per-eval", type=float, default=None,
                   help="largest accepted peak-memory growth per extra evaluation in KiB (default 20; "
                        "--quick: not checked, a few hundred evaluations are too few to tell growth from "
                        "noise)")
    p.add_argument("--no-plain", action="store_true", help="skip the plain Ray loop")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="120 evaluations (memory compared at 40) on 4 slots, "
                                                        "batches of 20, no warm-up")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--out", default="bench-out/load")
    args = p.parse_args(argv)
    defaults = {"evals": (120, 5000), "compare": (40, 1000), "slots": (4, 64), "batch_size": (20, 500),
                "max_kb_per_eval": (float("inf"), 20.0)}
    for key, (quick, full) in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, quick if args.quick else full)
    if not 0 < args.compare < args.evals:
        p.error(f"--compare must be in (0, --evals={args.evals}); got {args.compare}")
    modes = [m.strip() for m in args.isolate.split(",") if m.strip()]
    if not modes or any(m not in ("process", "thread") for m in modes):
        p.error(f"--isolate must list 'process' and/or 'thread'; got {args.isolate!r}")
    Path(args.out).mkdir(parents=True, exist_ok=True)

    import ray

    # address="local": always a fresh local Ray, never a cluster named by RAY_ADDRESS or a `ray start` on this
    # machine
    ray.init(address="local", num_cpus=args.slots, include_dashboard=False, log_to_driver=False)
    rows: list[dict[str, Any]] = []
    try:
        # start one worker process per slot and import the evaluation code once, so no run pays that start-up
        def _warm(i: int) -> int:
            import objectives.timing  # noqa: F401
            import workers.evaluate  # noqa: F401

            time.sleep(1.0)  # hold the slot so that every slot gets its own worker
            return i

        if not args.quick:  # --quick saves the time: its run pays the workers' start-up instead
            from workers.evaluate import evaluation_runtime_env

            # Ray reuses a worker only for tasks of its runtime environment: the plain loop's tasks get the
            # default one, qbatch's evaluations their own per isolation mode (workers/evaluate.py), so each
            # gets its slots' workers started here
            for env in [None, *(evaluation_runtime_env(m) for m in modes)]:
                warm = ray.remote(num_cpus=1)(_warm).options(**({"runtime_env": env} if env else {}))
                ray.get([warm.remote(i) for i in range(args.slots)])
        for isolate in modes:
            n = args.evals
            print(f"[load] qbatch ({isolate}): {n} evaluations of {args.eval_s:g} s, {args.slots} slots ...",
                  file=sys.stderr, flush=True)
            rows.append(run_qbatch(args, n, isolate))
            r = rows[-1]
            print(f"[load]   {r['evals_per_s']:.1f} evaluations/s, lost {r['lost']}, duplicated "
                  f"{r['duplicated']}, actor peak {r['actor_peak_at_mark_mb']:.0f} MB at {args.compare}, "
                  f"{r['actor_peak_mb']:.0f} MB at {n}", file=sys.stderr, flush=True)
        if not args.no_plain:
            print(f"[load] plain Ray loop: {args.evals} evaluations ...", file=sys.stderr, flush=True)
            rows.append(run_plain(args, args.evals))
    finally:
        ray.shutdown()

    # bounded memory: the actor's peak when `compare` evaluations were done against its peak at the end
    checks = []
    for r in rows:
        if r["system"] != "qbatch":
            continue
        small, large = r["actor_peak_at_mark_mb"], r["actor_peak_mb"]
        extra = r["evaluations"] - (r["done_at_mark"] or 0)
        ratio = large / small
        growth = (large - small) * _KB / extra if extra > 0 else float("nan")
        ok = ratio <= args.max_ratio and growth <= args.max_kb_per_eval  # False when either is NaN
        checks.append({"isolate": r["isolate"], "mark": r["done_at_mark"], "evaluations": r["evaluations"],
                       "actor_peak_at_mark_mb": small, "actor_peak_end_mb": large, "peak_ratio": ratio,
                       "kb_per_extra_eval": growth, "bounded": ok})
    plain = [r for r in rows if r["system"] == "plain-ray"]
    for r in rows:
        r["evals_per_s_over_plain"] = r["evals_per_s"] / plain[0]["evals_per_s"] if plain else ""

    with open(Path(args.out) / "load.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=COLUMNS + ["evals_per_s_over_plain", "run_dir"])
        w.writeheader()
        w.writerows(rows)
    with open(Path(args.out) / "load_memory.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(checks[0]))
        w.writeheader()
        w.writerows(checks)

    print()
    print(format_table(rows, COLUMNS + ["evals_per_s_over_plain"], digits=4))
    print()
    print(format_table(checks, digits=4))
    exact = all(r["each_once"] for r in rows)
    bounded = all(c["bounded"] for c in checks)
    print(f"\nevery result logged exactly once: {'yes' if exact else 'NO'}; "
          f"actor peak memory bounded (ratio <= {args.max_ratio:g}, <= {args.max_kb_per_eval:g} KiB per "
          f"extra evaluation): {'yes' if bounded else 'NO'}")
    return 0 if exact and bounded else 1


if __name__ == "__main__":
    sys.exit(main())
