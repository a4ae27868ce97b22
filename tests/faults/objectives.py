"""User objectives for the fault tests, loaded by import path
``tests.faults.objectives:PidRecorder`` as any user objective is (objectives/registry.py).

`PidRecorder` tells the test whom to kill: at the start of each evaluation it writes one JSON file into
`pid_dir` with the pid of the process that runs the objective (the forked child with ``isolate="process"``,
the Ray worker itself with ``isolate="thread"``), its parent's pid (the Ray worker when forked), the
parameters and the seed. The trial is found again in the event log by its parameters. Then it sleeps and
returns a cheap analytic value.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from typing import Any

from objectives.base import EvalResult, Objective, ObjectiveError, Resources

__all__ = ["FailsWhileFileExists", "PidRecorder", "SlowSuccesses", "TrainingMetrics", "read_pid_files"]


class PidRecorder(Objective):
    """Value `-sum_i (x_i - 0.3)^2` after `sleep_s` seconds; records who runs each evaluation.

    Args:
        pid_dir: folder for the per-evaluation JSON files (created if missing).
        sleep_s: seconds each evaluation sleeps after writing its file.
        dim: number of float parameters `x0 .. x{dim-1}` in [0, 1].
        num_cpus: CPUs one evaluation asks Ray for.
    """

    name = "pid-recorder"
    direction = "maximize"
    noisy = False

    def __init__(self, pid_dir: str, sleep_s: float = 1.0, dim: int = 2, num_cpus: float = 0.5) -> None:
        if not isinstance(pid_dir, str) or not pid_dir:
            raise ObjectiveError(f"option 'pid_dir' must be a folder path; got {pid_dir!r}")
        if isinstance(sleep_s, bool) or not isinstance(sleep_s, (int, float)) or sleep_s < 0:
            raise ObjectiveError(f"option 'sleep_s' must be a number >= 0; got {sleep_s!r}")
        self.pid_dir = pid_dir
        self.sleep_s = float(sleep_s)
        self.dim = int(dim)
        self.space = {f"x{i}": {"type": "float", "low": 0.0, "high": 1.0} for i in range(self.dim)}
        self.resources = Resources(num_cpus=float(num_cpus))

    def evaluate(self, params: Mapping[str, Any], seed: int) -> float:
        os.makedirs(self.pid_dir, exist_ok=True)
        record = {
            "pid": os.getpid(),
            "ppid": os.getppid(),
            "params": {k: float(v) for k, v in params.items()},
            "seed": int(seed),
            "time": time.time(),
        }
        path = os.path.join(self.pid_dir, f"{os.getpid()}-{time.monotonic_ns()}.json")
        with open(path + ".tmp", "w") as f:
            json.dump(record, f)
        os.replace(path + ".tmp", path)  # the test never sees a half-written file
        time.sleep(self.sleep_s)
        return -sum((float(params[f"x{i}"]) - 0.3) ** 2 for i in range(self.dim))


class FailsWhileFileExists(Objective):
    """Raises while the file `flag` exists (a missing data file, say, that the user then fixes); otherwise
    returns `-(x - 0.3)^2` (the failure guard's resume test)."""

    name = "fails-while-file-exists"
    space = {"x": {"type": "float", "low": 0.0, "high": 1.0}}
    noisy = False

    def __init__(self, flag: str) -> None:
        self.flag = str(flag)
        self.resources = Resources(num_cpus=0.5)

    def evaluate(self, params: Mapping[str, Any], seed: int) -> float:
        if os.path.exists(self.flag):
            raise FileNotFoundError(f"data not ready ({self.flag} exists)")
        return -(float(params["x"]) - 0.3) ** 2


class TrainingMetrics(Objective):
    """Returns `-(x - 0.3)^2` with the metrics a torch training loop gives: a 0-d tensor, a NaN loss, a curve,
    an id past 2**53, and a set, which the log cannot hold (the metrics test of the run path)."""

    name = "training-metrics"
    space = {"x": {"type": "float", "low": 0.0, "high": 1.0}}
    noisy = False
    resources = Resources(num_cpus=0.5)

    def evaluate(self, params: Mapping[str, Any], seed: int) -> EvalResult:
        import torch

        x = float(params["x"])
        return EvalResult(
            -((x - 0.3) ** 2),
            {
                "loss": torch.tensor(x),
                "val_loss": float("nan"),
                "curve": [1.0, x],
                "run_id": 2**53 + 1,
                "tags": {"a", "b"},
            },
        )


class SlowSuccesses(PidRecorder):
    """Fails at once where `x0 < fail_below`; elsewhere sleeps `sleep_s` and returns (the failure guard test).

    Every evaluation writes its `PidRecorder` file when it starts; a successful one also writes
    ``done-<pid>-<ns>.json`` with its parameters just before it returns, so the test knows which results
    existed and can look for each of them in the log.
    """

    name = "slow-successes"

    def __init__(
        self, pid_dir: str, sleep_s: float = 1.5, fail_below: float = 0.6, num_cpus: float = 0.5
    ) -> None:
        super().__init__(pid_dir, sleep_s=sleep_s, dim=2, num_cpus=num_cpus)
        self.fail_below = float(fail_below)

    def evaluate(self, params: Mapping[str, Any], seed: int) -> float:
        os.makedirs(self.pid_dir, exist_ok=True)
        start = os.path.join(self.pid_dir, f"{os.getpid()}-{time.monotonic_ns()}.json")
        with open(start + ".tmp", "w") as f:
            json.dump(
                {
                    "pid": os.getpid(),
                    "ppid": os.getppid(),
                    "params": {k: float(v) for k, v in params.items()},
                    "seed": int(seed),
                    "time": time.time(),
                },
                f,
            )
        os.replace(start + ".tmp", start)
        if float(params["x0"]) < self.fail_below:
            raise RuntimeError(f"x0 = {params['x0']} < {self.fail_below}")
        time.sleep(self.sleep_s)
        done = os.path.join(self.pid_dir, f"done-{os.getpid()}-{time.monotonic_ns()}.done")
        with open(done + ".tmp", "w") as f:
            json.dump({k: float(v) for k, v in params.items()}, f)
        os.replace(done + ".tmp", done)
        return -sum((float(params[f"x{i}"]) - 0.3) ** 2 for i in range(self.dim))


def read_pid_files(pid_dir: str) -> list[dict[str, Any]]:
    """Every record `PidRecorder` wrote into `pid_dir`, oldest first."""
    out = []
    if not os.path.isdir(pid_dir):
        return out
    for name in os.listdir(pid_dir):
        if name.endswith(".json"):
            try:
                with open(os.path.join(pid_dir, name)) as f:
                    out.append(json.load(f))
            except (OSError, ValueError):  # pragma: no cover - files are renamed into place whole
                continue
    return sorted(out, key=lambda r: r["time"])
