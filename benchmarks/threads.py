"""Threads: the README's library loop at qbatch's default thread setting, against one torch thread set
outside.

The loop of README "An example" (docs/library.md): `AskTellOptimizer` over `lr` (log-float) and `width` (int,
step 32), the quantile model at tau = 0.1, Thompson sampling, `initial_design=20`; five rounds of `ask(100)`
and `tell`, then `fit()` and `best()`, on a noisy objective of both parameters. Arms, each in this process,
alternating over the repeats:

- `default`: the loop as the README writes it, with torch's threads as a fresh process has them (one per
  core);
  qbatch bounds its own fits and proposals (`threads: auto`, orchestrator/threads.py);
- `single`: `torch.set_num_threads(1)` before the loop, the advice the docs gave before qbatch bounded them;
- `unbounded` (with `--unbounded`): `AskTellOptimizer(threads=<torch's default>)`, the loop as it ran before
  the bound (slow where other work keeps the cores busy).

Printed: each arm's median time over the repeats (the whole loop, and its first model `ask`), and the ratio
default / single (target <= 1.5).

Usage:
    python benchmarks/threads.py                 # 5 x ask(100), 2 repeats of each arm (minutes on 2 cores)
    python benchmarks/threads.py --unbounded     # also the unbounded arm
    python benchmarks/threads.py --quick         # 2 x ask(10), short fits, 1 repeat (the CI smoke run)
Results in --out (default results/threads/): threads.csv (every repeat) and summary.csv (per arm, and the
ratio).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

#: torch's intra-op threads as this process started with them (before any arm sets them)
TORCH_DEFAULT = torch.get_num_threads()

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks._common import code_version, format_table, write_table  # noqa: E402

#: the most the default arm may take, as a multiple of the single-thread arm
TARGET = 1.5
#: the README's loop: rounds of ask(q), its initial design
FULL = {"rounds": 5, "q": 100, "initial_design": 20, "repeats": 2, "model_options": {}}
#: the smoke run: two small rounds, and fits cut short (the thread handling is under test, not the model)
QUICK = {"rounds": 2, "q": 10, "initial_design": 10, "repeats": 1, "model_options": {"max_steps": 100}}
SPACE = {"lr": {"type": "float", "low": 1e-5, "high": 1e-1, "log": True},
         "width": {"type": "int", "low": 32, "high": 512, "step": 32}}
ARMS = ("default", "single", "unbounded")


def my_noisy_objective(params: dict[str, Any], seed: int) -> float:
    """A noisy objective of the README's two parameters: a smooth peak at lr = 1e-3, width = 256, with noise
    whose spread grows away from small widths (so its quantiles and its mean peak apart)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    x = math.log10(params["lr"]) + 3.0
    w = (params["width"] - 256) / 256
    return -(x ** 2) - w ** 2 + (0.2 + 0.3 * params["width"] / 512) * float(rng.standard_normal())


def run_loop(
    arm: str, rounds: int, q: int, initial_design: int, model_options: dict | None = None
) -> dict[str, Any]:
    """One run of the library loop in `arm`; the times of the loop, of its first model `ask` and of its
    `fit`."""
    from orchestrator.ask_tell import AskTellOptimizer
    from orchestrator.threads import resolve_threads

    before = torch.get_num_threads()
    torch.set_num_threads(1 if arm == "single" else TORCH_DEFAULT)
    try:
        outside = torch.get_num_threads()
        kwargs = {"threads": TORCH_DEFAULT} if arm == "unbounded" else {}
        t0 = time.perf_counter()
        opt = AskTellOptimizer(
            SPACE,
            model="quantile",
            tau=0.1,
            proposer="thompson",
            initial_design=initial_design,
            model_options=model_options,
            **kwargs,
        )
        asks = []
        for _ in range(rounds):
            t = time.perf_counter()
            trials = opt.ask(q)
            asks.append((time.perf_counter() - t, trials[0].source))
            for trial in trials:
                opt.tell(trial.trial_id, my_noisy_objective(trial.params, trial.seed))
        t = time.perf_counter()
        opt.fit()
        fit_s = time.perf_counter() - t
        params, predicted = opt.best()
        seconds = time.perf_counter() - t0
        after = torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
    first_model = next((s for s, source in asks if source == "model"), math.nan)
    return {"arm": arm, "seconds": seconds, "first_model_ask_s": first_model, "final_fit_s": fit_s,
            "asks_s": " ".join(f"{s:.2f}" for s, _ in asks), "threads_outside": outside,
            "threads_after": after, "qbatch_threads": opt.threads,
            "threads_inside": resolve_threads(opt.threads, outside), "predicted": predicted,
            "lr": params["lr"], "width": params["width"]}


def summarize(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per arm: the median loop time and first model ask over the repeats; then the ratio default / single."""
    summary = []
    for arm in ARMS:
        sel = [r for r in rows if r["arm"] == arm]
        if sel:
            summary.append({"arm": arm, "repeats": len(sel),
                            "seconds": statistics.median(r["seconds"] for r in sel),
                            "first_model_ask_s": statistics.median(r["first_model_ask_s"] for r in sel),
                            "final_fit_s": statistics.median(r["final_fit_s"] for r in sel)})
    by = {s["arm"]: s["seconds"] for s in summary}
    for s in summary:
        s["ratio_to_single"] = s["seconds"] / by["single"]
        s["target"] = TARGET if s["arm"] == "default" else math.nan
    return summary


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="CI smoke run: 2 rounds of ask(10), short fits, one "
                                                         "repeat")
    ap.add_argument("--repeats", type=int, default=None, help="repeats of each arm (default "
                                                              f"{FULL['repeats']})")
    ap.add_argument("--unbounded", action="store_true", help="also time the loop with qbatch's bound lifted")
    ap.add_argument("--out", default=str(REPO / "results" / "threads"))
    args = ap.parse_args(argv)
    setting = dict(QUICK if args.quick else FULL)
    if args.repeats is not None:
        if args.repeats < 1:
            raise SystemExit(f"--repeats must be >= 1; got {args.repeats}")
        setting["repeats"] = args.repeats
    arms = ARMS if args.unbounded else ARMS[:2]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else math.nan
    print(f"[threads] torch's default {TORCH_DEFAULT} threads, {os.cpu_count()} CPUs, load average "
          f"{load:.2f}; {setting['rounds']} rounds of ask({setting['q']}), {setting['repeats']} repeat(s) of "
          f"{', '.join(arms)}",
          flush=True)
    rows = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # first calls pay for imports and lazy set-up: not timed
        run_loop("single", 2, 5, 5, {"max_steps": 20})
        for rep in range(setting["repeats"]):
            for arm in arms:
                row = run_loop(
                    arm, setting["rounds"], setting["q"], setting["initial_design"], setting["model_options"]
                )
                row.update(repeat=rep, rounds=setting["rounds"], q=setting["q"], torch_default=TORCH_DEFAULT,
                           cpus=os.cpu_count(), load_average=load, code=code_version())
                rows.append(row)
                print(f"[threads] {arm} (repeat {rep}): {row['seconds']:.1f} s, first model ask "
                      f"{row['first_model_ask_s']:.1f} s (torch threads outside "
                      f"{row['threads_outside']})", flush=True)
    summary = summarize(rows)
    out = Path(args.out)
    write_table(rows, out / "threads", parquet=False)
    write_table(summary, out / "summary", parquet=False)
    print(format_table(summary))
    ratio = next(s["ratio_to_single"] for s in summary if s["arm"] == "default")
    print(f"[threads] ratio default / single-thread: {ratio:.2f} (target <= {TARGET})")
    return {"rows": rows, "summary": summary, "ratio": ratio}


if __name__ == "__main__":
    main()
