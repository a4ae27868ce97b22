"""Smoke runs of benchmarks/gpu.py: `--quick` times the CNN objective on digits and on CIFAR-10-shaped random
files read through the CIFAR-10 loader (GPU rows only where CUDA is present) and the model's fit and ask,
writes its tables and plot; the summary's CPU/GPU ratios; the qbatch-run part (a local Ray) in the slow
suite."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest
import torch


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path) as f:
        return list(csv.DictReader(f))


def test_quick_objective_part_writes_its_tables(load_benchmark, tmp_path: Path) -> None:
    gpu = load_benchmark("gpu")
    assert gpu.main(["--quick", "--no-run", "--out", str(tmp_path)]) == 0
    rows = _rows(tmp_path / "objective.csv")
    devices = ["cuda", "cpu"] if torch.cuda.is_available() else ["cpu"]
    assert [(r["dataset"], r["device"]) for r in rows] == [(d, dev) for d in ("digits", "cifar10-random")
                                                           for dev in devices]
    for r in rows:
        assert float(r["seconds"]) > 0 and 0.0 <= float(r["value"]) <= 1.0
        assert float(r["used_gpu"]) == float(r["device"] == "cuda")
    summary = _rows(tmp_path / "summary.csv")
    assert [s["what"] for s in summary] == ["digits", "cifar10-random"]
    assert (tmp_path / "objective.parquet").is_file() and (tmp_path / "gpu.png").stat().st_size > 1000
    assert not (tmp_path / "run.csv").exists()
    # part 3: the model's cold fit, ask and warm refit, qbatch's and BoTorch's, on the device (here at the
    # smoke run's sizes)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = _rows(tmp_path / "model.csv")
    assert [(r["library"], r["device"]) for r in model] == [("qbatch", device), ("botorch", device)]
    for r in model:
        assert r["status"] == "ok", r
        assert all(float(r[k]) > 0 for k in ("cold_fit_s", "ask_s", "warm_refit_s"))
        assert int(r["n"]) == 12 and int(float(r["m"])) >= 1


def test_random_cifar_files_read_through_the_cifar_loader(load_benchmark, tmp_path: Path) -> None:
    from objectives.datasets import load_cifar10

    gpu = load_benchmark("gpu")
    data = load_cifar10(gpu.write_random_cifar(tmp_path / "c", n_train=50, n_test=20))
    assert data.X_train.shape == (50, 3, 32, 32) and data.X_test.shape == (20, 3, 32, 32)
    assert data.y_train.min() >= 0 and data.y_train.max() <= 9


def test_summary_ratios(load_benchmark) -> None:
    gpu = load_benchmark("gpu")
    obj = [{"dataset": "d", "device": "cpu", "seconds": s} for s in (4.0, 6.0, 5.0)]
    obj += [{"dataset": "d", "device": "cuda", "seconds": s} for s in (1.0, 3.0, 2.0)]
    runs = [{"mode": "cpu", "evals_per_min": 10.0}, {"mode": "gpu", "evals_per_min": 40.0}]
    s = gpu.summarize(obj, runs)
    assert (s[0]["cpu"], s[0]["gpu"], s[0]["cpu_over_gpu"]) == (5.0, 2.0, 2.5)
    assert s[1]["cpu_over_gpu"] == 0.25
    only_cpu = gpu.summarize(obj[:3], [])
    assert len(only_cpu) == 1 and math.isnan(only_cpu[0]["cpu_over_gpu"])


@pytest.mark.slow
@pytest.mark.ray
def test_quick_run_part_records_every_evaluation(load_benchmark, tmp_path: Path) -> None:
    gpu = load_benchmark("gpu")
    assert gpu.main(["--quick", "--out", str(tmp_path)]) == 0
    runs = _rows(tmp_path / "run.csv")
    modes = ["gpu", "cpu"] if torch.cuda.is_available() else ["cpu"]
    assert [r["mode"] for r in runs] == modes
    for r in runs:
        assert int(r["completed"]) == int(r["budget"]) == 2 and int(r["failed"]) == 0
        assert float(r["used_gpu_share"]) == float(r["mode"] == "gpu") and float(r["evals_per_min"]) > 0

