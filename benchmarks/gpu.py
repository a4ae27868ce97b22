"""The GPU path: CNN evaluations on a GPU against the CPU of the same machine, alone and through a qbatch run.

README "GPU". Two parts, both measured in the same process on one machine, so only their ratios are kept:

1. objective: `objectives.cnn.CNNTraining` at one fixed setting, timed per evaluation (after one untimed
   warm-up that loads the data and, on the GPU, creates the CUDA context) on `cuda` and on the CPU with
   `--cpu-threads` torch threads. Data: scikit-learn's digits (the default, 8x8 grey) and CIFAR-10-shaped
   input (3x32x32) read through the CIFAR-10 loader from files of random pixels and labels written here:
   nothing can be downloaded, so that row times the network at CIFAR-10's size and its error means nothing.
2. run: `qbatch` itself (`run_experiment`, a local Ray, the default quantile SVGP + Thompson batches) on the
   CNN objective (digits), once with `num_gpus = 1/share` per evaluation (`share` evaluations on the one GPU
   at a time) and once with `num_gpus = 0`, `num_cpus = cpu-threads` (the same number at a time on the CPUs).
   Reported: evaluations per minute over the evaluations' span (first start to last end, from the run's
   Parquet log), the share of evaluations that trained on a GPU (the objective's `used_gpu` metric), failures.

3. model: the default quantile SVGP and Thompson batches at n = 10^4 and 10^5 (d = 16, q = 1,000), cold fit,
   ask(q) and warm refit on `cuda`, beside BoTorch's SVGP with pathwise Thompson sampling on the same device
   (the CPU's figures are `benchmarks/scale.py`'s): that benchmark's configurations (`--device cuda`), each in
   its own subprocess under `--model-limit-s`. Written to model.csv, one row per library and n (with
   `--quick`, on the CPU at the smoke run's sizes).

Without a CUDA device the GPU rows are skipped (said in the output); `--quick` (CI smoke) runs the CPU rows
with tiny sizes. Usage, inside scripts/loopback:
    python benchmarks/gpu.py --quick --out /tmp/gpu
    python benchmarks/gpu.py --out results/gpu            # on a GPU machine: a few minutes
Writes objective.csv/.parquet (one row per timed evaluation), run.csv/.parquet (one row per run),
summary.csv/.parquet (per data set and per run mode: median seconds or evaluations per minute, and the
CPU / GPU ratio) and gpu.png (seconds per evaluation by device).
"""

from __future__ import annotations

import argparse
import io
import json
import pickle
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks._common import code_version, format_table, write_table  # noqa: E402

# one fixed, good setting of the CNN's space (objectives/cnn.py CNN_SPACE)
PARAMS = {"batch_size": 64, "learning_rate": 0.03, "lr_decay": 1e-4, "l2": 1e-5, "fc_units": 256,
          "conv_channels": 128}


def write_random_cifar(directory: Path, n_train: int, n_test: int, seed: int = 0) -> Path:
    """CIFAR-10's python-pickle layout (5 training batches and a test batch) holding random pixels and
    labels."""
    rng = np.random.default_rng(seed)
    directory.mkdir(parents=True, exist_ok=True)
    sizes = [n_train // 5] * 5 + [n_test]
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    for name, n in zip(names, sizes):
        batch = {b"data": rng.integers(0, 256, size=(n, 3072), dtype=np.uint8),
                 b"labels": rng.integers(0, 10, size=n).tolist()}
        with open(directory / name, "wb") as f:
            pickle.dump(batch, f, protocol=2)
    return directory


def time_objective(dataset: str, data_dir: Path | None, device: str, epochs: int, repeats: int,
                   threads: int) -> list[dict[str, Any]]:
    """Seconds per evaluation of the CNN at `PARAMS` on `device`, one row per timed evaluation."""
    import torch

    from objectives.cnn import CNNTraining

    gpu = device == "cuda"
    obj = CNNTraining(
        dataset="cifar10" if data_dir is not None else "digits",
        data_dir=data_dir,
        epochs=epochs,
        device=device,
        num_gpus=1.0 if gpu else 0.0,
        num_threads=threads,
    )
    obj(PARAMS, seed=10_000)  # warm-up: data loading, the CUDA context, cuDNN's kernel choice
    rows = []
    for r in range(repeats):
        if gpu:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        res = obj(PARAMS, seed=r)
        if gpu:
            torch.cuda.synchronize()
        rows.append({"dataset": dataset, "device": device, "threads": threads, "epochs": epochs, "repeat": r,
                     "seconds": time.perf_counter() - t0, "value": res.value,
                     "used_gpu": res.metrics["used_gpu"]})
    return rows


def timed_run(mode: str, root: Path, args: argparse.Namespace, num_cpus: int) -> dict[str, Any]:
    """One qbatch run of the CNN objective; evaluations per minute over the evaluations' span."""
    from orchestrator.runner import run_experiment
    from orchestrator.store import RunStore

    gpu = mode == "gpu"
    options = {
        "dataset": "digits",
        "epochs": args.epochs,
        "num_gpus": 1.0 / args.share if gpu else 0.0,
        "num_cpus": 1.0 if gpu else float(args.cpu_threads),
        "num_threads": 1 if gpu else args.cpu_threads,
    }
    config = {"name": f"gpu-{mode}", "objective": {"name": "cnn", "options": options}, "tau": 0.5,
              "batch_size": args.run_batch, "initial_design": args.run_initial, "budget": args.run_budget,
              "max_concurrent": args.share, "timeout_s": 600, "max_retries": 0, "seed": 0}
    run_dir = root / f"run-{mode}"
    t0 = time.perf_counter()
    run_experiment(config, run_dir=str(run_dir), num_cpus=num_cpus, progress=False, out=io.StringIO())
    wall = time.perf_counter() - t0
    results = RunStore.open(str(run_dir)).events(["completed", "failed"])
    done = [e for e in results if e.kind == "completed"]
    failed = [e for e in results if e.kind == "failed"]
    span = max(e.ended_at for e in done) - min(e.started_at for e in done) if done else float("nan")
    used = [float((e.info or {}).get("metrics", {}).get("used_gpu", float("nan"))) for e in done]
    return {
        "mode": mode,
        "num_gpus": options["num_gpus"],
        "num_cpus": options["num_cpus"],
        "concurrent": args.share,
        "budget": args.run_budget,
        "completed": len(done),
        "failed": len(failed),
        "used_gpu_share": float(np.mean(used)) if used else float("nan"),
        "span_s": span,
        "wall_s": wall,
        "evals_per_min": 60.0 * len(done) / span if done else float("nan"),
        "best": min((e.value for e in done), default=float("nan")),
    }


#: the columns of model.csv
MODEL_COLUMNS = ("library", "device", "n", "m", "status", "cold_fit_s", "ask_s", "warm_refit_s", "peak_mib")


def time_model(ns: list[int], device: str, runs: Path, quick: bool, limit_s: float) -> list[dict[str, Any]]:
    """Cold fit, ask(q) and warm refit of qbatch's quantile SVGP + Thompson sampling and of BoTorch's SVGP +
    pathwise Thompson sampling on `device` at each n (`benchmarks/scale.py`'s configurations, one subprocess
    each; in-process at the smoke run's sizes with `quick`). The CPU's figures are `benchmarks/scale.py`'s."""
    from benchmarks import scale

    sizes = scale.QUICK if quick else scale.FULL
    raw, restarts = scale.search_sizes(sizes["d"], sizes["q"], sizes.get("raw_samples"))
    runs.mkdir(parents=True, exist_ok=True)
    rows = []
    for n in (scale.QUICK["ns"][:1] if quick else ns):
        for lib in scale.LIBRARIES:
            spec = {"library": lib, "n": n, "d": sizes["d"], "q": sizes["q"], "raw": raw,
                    "restarts": restarts, "maxiter": sizes.get("maxiter", 200), "seed": 0, "device": device,
                    "path": str(runs / f"{lib}_{device}_n{n}.json"), "probe": False, "max_memory_gb": 0,
                    "botorch_fit_maxiter": scale.QUICK["botorch_fit_maxiter"] if quick else None}
            if quick:
                scale.child(spec)
                row = json.loads(Path(spec["path"]).read_text())
            else:
                row = scale.run_config(spec, limit_s, script=Path(scale.__file__))
            rows.append({k: row.get(k, float("nan")) for k in MODEL_COLUMNS})
            print(f"model: {lib} on {device}, n={n}: {row.get('status')}", flush=True)
    return rows


def summarize(objective_rows: list[dict[str, Any]], run_rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Median seconds per evaluation by data set and device, evaluations per minute by run mode; CPU/GPU
    ratios."""
    out = []
    for dataset in dict.fromkeys(r["dataset"] for r in objective_rows):
        med = {d: statistics.median(r["seconds"] for r in objective_rows if r["dataset"] == dataset
                                    and r["device"] == d)
               for d in dict.fromkeys(r["device"] for r in objective_rows if r["dataset"] == dataset)}
        out.append({"part": "objective", "what": dataset, "cpu": med.get("cpu", float("nan")),
                    "gpu": med.get("cuda", float("nan")), "unit": "s/evaluation (median)",
                    "cpu_over_gpu": med.get("cpu", float("nan")) / med.get("cuda", float("nan"))})
    runs = {r["mode"]: r["evals_per_min"] for r in run_rows}
    if runs:
        out.append({"part": "run", "what": "cnn digits", "cpu": runs.get("cpu", float("nan")),
                    "gpu": runs.get("gpu", float("nan")), "unit": "evaluations/min",
                    "cpu_over_gpu": runs.get("cpu", float("nan")) / runs.get("gpu", float("nan"))})
    return out


def plot(objective_rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    datasets = list(dict.fromkeys(r["dataset"] for r in objective_rows))
    devices = list(dict.fromkeys(r["device"] for r in objective_rows))
    fig, ax = plt.subplots(figsize=(6, 3.5))
    width = 0.8 / max(1, len(devices))
    for j, d in enumerate(devices):
        med = [
            statistics.median(
                [r["seconds"] for r in objective_rows if r["dataset"] == ds and r["device"] == d]
                or [float("nan")]
            )
            for ds in datasets
        ]
        ax.bar(np.arange(len(datasets)) + j * width, med, width, label=d)
    ax.set_xticks(np.arange(len(datasets)) + width * (len(devices) - 1) / 2, datasets)
    ax.set_ylabel("seconds per evaluation (median)")
    ax.set_yscale("log")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="CI smoke sizes")
    p.add_argument("--out", default="results/gpu")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--cifar-train", type=int, default=10_000, help="random CIFAR-10-shaped training images")
    p.add_argument("--cifar-epochs", type=int, default=1)
    p.add_argument("--cpu-threads", type=int, default=4)
    p.add_argument("--share", type=int, default=4, help="evaluations at a time (on the GPU: 1/share GPU "
                                                        "each)")
    p.add_argument("--run-budget", type=int, default=32)
    p.add_argument("--run-initial", type=int, default=8)
    p.add_argument("--run-batch", type=int, default=8)
    p.add_argument("--no-run", action="store_true", help="skip the qbatch runs (part 2)")
    p.add_argument("--model-ns", nargs="+", type=int, default=[10_000, 100_000],
                   help="n of the model's timings (part 3); none: skip them")
    p.add_argument("--model-limit-s", type=float, default=900.0, help="wall-clock limit of one model timing")
    args = p.parse_args(argv)
    if args.quick:
        args.repeats, args.epochs, args.cifar_train, args.cifar_epochs = 1, 1, 200, 1
        args.cpu_threads, args.share, args.run_budget, args.run_initial, args.run_batch = 1, 1, 2, 2, 1
    import torch

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cuda = torch.cuda.is_available()
    devices = ["cuda", "cpu"] if cuda else ["cpu"]
    print(f"code {code_version()}; CUDA device: "
          f"{torch.cuda.get_device_name(0) if cuda else 'none, GPU rows skipped'}",
          flush=True)
    objective_rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        cifar = write_random_cifar(
            Path(tmp) / "cifar-random", args.cifar_train, max(100, args.cifar_train // 10)
        )
        for dataset, data_dir, epochs in (("digits", None, args.epochs),
                                          ("cifar10-random", cifar, args.cifar_epochs)):
            for device in devices:
                objective_rows += time_objective(dataset, data_dir, device, epochs, args.repeats,
                                                 1 if device == "cuda" else args.cpu_threads)
                print(f"timed {dataset} on {device}", flush=True)
        run_rows = []
        if not args.no_run:
            num_cpus = max(args.share * args.cpu_threads, args.share) + 1  # the central actor's CPU on top
            for mode in (["gpu", "cpu"] if cuda else ["cpu"]):
                run_rows.append(timed_run(mode, Path(tmp), args, num_cpus))
                print(f"ran qbatch, evaluations on {mode}", flush=True)
    model_rows = []
    if args.model_ns and (cuda or args.quick):
        model_rows = time_model(args.model_ns, "cuda" if cuda else "cpu", out / "model-runs", args.quick,
                                args.model_limit_s)
    if args.model_ns and not model_rows:
        print("model timings skipped: no CUDA device (benchmarks/scale.py times the CPU)", flush=True)
    summary = summarize(objective_rows, run_rows)
    write_table(objective_rows, out / "objective")
    if run_rows:
        write_table(run_rows, out / "run")
    if model_rows:
        write_table(model_rows, out / "model")
        print(format_table(model_rows))
    write_table(summary, out / "summary")
    plot(objective_rows, out / "gpu.png")
    print(format_table(objective_rows))
    if run_rows:
        print(format_table(run_rows))
    print(format_table(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
