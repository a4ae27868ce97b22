"""Memory of the optimizer with the quantile model fitted and proposing, at 2,000 to 50,000 results.

The central actor wraps one `AskTellOptimizer` (orchestrator/actor/central.py): its trial table and its
checkpoint (`get_state`, saved by `torch.save` as orchestrator/store/checkpoints.py does) are the actor's.
This benchmark measures them in the library loop, without Ray: per n, in one fresh subprocess (one torch
thread), it tells n results of the 16-D skewed-noise Ackley of benchmarks/scale.py with `tell_point`, then
runs two loop iterations (ask(q), which fits the default quantile SVGP and proposes; tell the q results), and
records the process's peak RSS (`ru_maxrss`), the RSS the n told results added, the trial table's bytes
(`trials_dataframe().memory_usage(deep=True)`) and the checkpoint's bytes before and after the model exists.
Printed per 1,000 results; target: bounded, and the table and checkpoints grow at most linearly in n.

Usage:
    python benchmarks/memory_model.py --quick                  # CI smoke run, in this process
    python benchmarks/memory_model.py --resume --out benchmarks/results/memory_model
Results in --out: runs/n<n>.json (one per n; `--resume` keeps finished ones), memory_model.csv and growth.csv
(the ratios between consecutive n).
"""

from __future__ import annotations

import argparse
import io
import json
import math
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks._common import code_version, format_table, limited_threads, write_table  # noqa: E402
from benchmarks.scale import (  # noqa: E402
    TAU,
    add_run_options,
    limit_memory,
    make_data,
    peak_rss_mib,
    run_config,
)

FULL = {"ns": [2000, 5000, 50000], "d": 16, "q": 100}
QUICK = {"ns": [100, 300], "d": 3, "q": 8}
ITERATIONS = 2


def current_rss_mib() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def checkpoint_bytes(opt: Any) -> int:
    """Bytes of `torch.save(opt.get_state())`, the actor's checkpoint of the optimizer."""
    import torch

    buf = io.BytesIO()
    torch.save(opt.get_state(), buf)
    return buf.tell()


def child(spec: dict[str, Any]) -> None:
    """One n: tell n results, run `ITERATIONS` ask/tell rounds, write the sizes (after every phase)."""
    import gc

    from orchestrator.ask_tell.optimizer import AskTellOptimizer

    limit_memory(spec.get("max_memory_gb"))
    path = Path(spec["path"])
    n, d, q = spec["n"], spec["d"], spec["q"]
    row: dict[str, Any] = {"n": n, "d": d, "q": q, "iterations": ITERATIONS, "code": code_version()}
    with limited_threads(1), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        X, Y = make_data(n + ITERATIONS * q, d, spec["seed"])
        names = [f"x{i}" for i in range(d)]
        space = {k: {"type": "float", "low": 0.0, "high": 1.0} for k in names}
        opt = AskTellOptimizer(space, model="quantile", tau=TAU, seed=spec["seed"], threads=1)
        gc.collect()
        rss0 = row["baseline_mib"] = current_rss_mib()
        row["running"] = "tell"
        path.write_text(json.dumps(row))
        t0 = time.perf_counter()
        for x, y in zip(X[:n].tolist(), Y[:n].tolist()):
            opt.tell_point(dict(zip(names, x)), y)
        row["tell_s"] = time.perf_counter() - t0
        gc.collect()
        row["told_rss_mib"] = current_rss_mib() - rss0
        row["table_mib"] = float(opt.trials_dataframe().memory_usage(deep=True).sum()) / 2**20
        row["checkpoint_no_model_mib"] = checkpoint_bytes(opt) / 2**20
        row["peak_before_model_mib"] = peak_rss_mib()
        values = Y[n:].tolist()
        for it in range(ITERATIONS):
            row["running"] = f"ask {it + 1}"
            path.write_text(json.dumps(row))
            t0 = time.perf_counter()
            trials = opt.ask(q)
            row[f"ask{it + 1}_s"] = time.perf_counter() - t0
            opt.tell_many([t.trial_id for t in trials], values[it * q:(it + 1) * q])
        row.pop("running")
        row["num_inducing"] = int(opt.model.sparse_parts("f").Z.shape[0])
        row["checkpoint_mib"] = checkpoint_bytes(opt) / 2**20
        model_state = opt.model_checkpoint()
        buf = io.BytesIO()
        import torch

        torch.save(model_state, buf)
        row["model_checkpoint_mib"] = buf.tell() / 2**20
        row["table_after_mib"] = float(opt.trials_dataframe().memory_usage(deep=True).sum()) / 2**20
        row["peak_mib"] = peak_rss_mib()
        row["results"] = opt.num_completed
        row["peak_above_baseline_mib"] = row["peak_mib"] - rss0
        row["checkpoint_trials_mib"] = row["checkpoint_mib"] - row["model_checkpoint_mib"]
        for key in ("peak_above_baseline_mib", "told_rss_mib", "table_after_mib", "checkpoint_mib",
                    "checkpoint_trials_mib"):
            row[key.replace("_mib", "_mib_per_1000")] = row[key] / (row["results"] / 1000)
        row["status"] = "ok"
        path.write_text(json.dumps(row))


def report(rows: Sequence[dict[str, Any]], out: Path) -> dict[str, Any]:
    write_table(list(rows), out / "memory_model", parquet=False)
    cols = ["n", "table_mib", "checkpoint_no_model_mib", "results", "num_inducing", "peak_mib",
            "peak_above_baseline_mib_per_1000", "told_rss_mib", "table_after_mib", "table_after_mib_per_1000",
            "checkpoint_mib", "checkpoint_trials_mib_per_1000", "model_checkpoint_mib", "status"]
    print(format_table([{c: r.get(c, math.nan) for c in cols} for r in rows], cols))
    told = [r for r in rows if "table_mib" in r]  # every n whose results were all told, fitted or not
    growth = []
    for a, b in zip(told, told[1:]):
        g: dict[str, Any] = {"n_from": a["n"], "n_to": b["n"], "n_ratio": b["n"] / a["n"]}
        for key in ("table_mib", "checkpoint_no_model_mib", "told_rss_mib"):
            g[key] = b[key] / a[key] if a[key] > 0 else math.nan
        grown = max(g["table_mib"], g["checkpoint_no_model_mib"])
        g["linear_before_fit"] = bool(grown <= g["n_ratio"] * 1.05)
        text = (f"[memory_model] told results x{g['n_ratio']:.2f} ({a['n']} -> {b['n']}): trial table x"
                f"{g['table_mib']:.2f}, checkpoint x{g['checkpoint_no_model_mib']:.2f}, their RSS x"
                f"{g['told_rss_mib']:.2f} (target: at most linear: "
                f"{'met' if g['linear_before_fit'] else 'MISSED'})")
        if a.get("status") == "ok" and b.get("status") == "ok":
            for key in ("peak_mib", "table_after_mib", "checkpoint_mib", "checkpoint_trials_mib",
                        "model_checkpoint_mib"):
                g[key] = b[key] / a[key] if a[key] > 0 else math.nan
            # the model's part of a checkpoint grows with m (its q(u) covariances are m x m), not with n
            g["m_from"], g["m_to"] = a["num_inducing"], b["num_inducing"]
            g["linear"] = bool(max(g["table_after_mib"], g["checkpoint_trials_mib"]) <= g["n_ratio"] * 1.05
                               and (g["m_from"] != g["m_to"] or g["checkpoint_mib"] <= g["n_ratio"] * 1.05))
            text += (f"; with the model: trial table x{g['table_after_mib']:.2f}, checkpoint x"
                     f"{g['checkpoint_mib']:.2f} (its trials x{g['checkpoint_trials_mib']:.2f}, its model x"
                     f"{g['model_checkpoint_mib']:.2f} with m {g['m_from']} -> {g['m_to']}), peak RSS x"
                     f"{g['peak_mib']:.2f} (at most linear: {'met' if g['linear'] else 'MISSED'})")
        growth.append(g)
        print(text)
    for r in rows:
        if r.get("status") != "ok":
            print(f"[memory_model] n={r['n']}: {r.get('status')}")
    write_table(growth, out / "growth", parquet=False)
    return {"rows": list(rows), "growth": growth}


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="CI smoke run: d = 3, q = 8, n = 100 and 300")
    ap.add_argument("--ns", nargs="+", type=int, default=FULL["ns"])
    ap.add_argument("--d", type=int, default=FULL["d"])
    ap.add_argument("--q", type=int, default=FULL["q"])
    add_run_options(ap, "n", 1200.0, "memory_model")
    args = ap.parse_args(argv)
    if args.child:
        child(json.loads(args.child))
        return {}
    if args.quick:
        args.ns, args.d, args.q = QUICK["ns"], QUICK["d"], QUICK["q"]
    out = Path(args.out)
    (out / "runs").mkdir(parents=True, exist_ok=True)
    rows = []
    for n in args.ns:
        path = out / "runs" / f"n{n}.json"
        if args.report:
            missing = {"n": n, "status": "not run: no result file"}
            rows.append(json.loads(path.read_text()) if path.is_file() else missing)
            rows[-1].setdefault("status", f"not run: stopped in {rows[-1].get('running', 'setup')}")
            continue
        if args.resume and path.is_file() and "status" in json.loads(path.read_text()):
            rows.append(json.loads(path.read_text()))
            print(f"[memory_model] n={n}: kept {path.name} ({rows[-1]['status']})", flush=True)
            continue
        spec = {"n": n, "d": args.d, "q": args.q, "seed": args.seed, "path": str(path),
                "max_memory_gb": args.max_memory_gb}
        if args.quick:  # in this process: the smoke run skips the interpreter start-ups (and the RSS cap)
            spec["max_memory_gb"] = 0
            child(spec)
            rows.append(json.loads(path.read_text()))
        else:
            rows.append(run_config(spec, args.limit_s, script=Path(__file__)))
        peak = rows[-1].get("peak_mib", math.nan)
        print(f"[memory_model] n={n}: {rows[-1].get('status')}, peak {peak:.0f} MiB", flush=True)
    return report(rows, out)


if __name__ == "__main__":
    main()
