"""The trial registry of the ask/tell optimizer: every trial asked, restored or added, and where each one
stands.

A trial is registered once, in ask order (`_add_trial`); it is pending until told, then "completed" or
"failed". Completed results are kept as observations in ask order, whatever order they were told in, so that
the same config and seed give the same fits in a synchronous run. The registry also counts the initial design
still owed (`design_left`). `TrialRegistry` is one part of `AskTellOptimizer`
(orchestrator/ask_tell/optimizer.py), whose `_lock` guards this state.
"""

from __future__ import annotations

import copy
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from orchestrator.errors import QbatchError

__all__ = ["Trial", "TrialError", "TrialRegistry", "check_batch_size", "plain_int", "trial_seed"]


class TrialError(QbatchError, ValueError):
    """A trial id is unknown or was already told, or `ask` got a bad batch size."""


def plain_int(v: Any) -> Any:
    """A numpy integer as a Python int; anything else as it is (the callers check it)."""
    import numpy as np

    return int(v) if isinstance(v, np.integer) else v


def check_batch_size(q: Any, name: str = "q") -> int:
    """`q` as an int if it is an integer >= 1 (a numpy integer too); else a TrialError naming `name`."""
    q = plain_int(q)
    if isinstance(q, bool) or not isinstance(q, int) or q < 1:
        raise TrialError(f"{name} must be an integer >= 1; got {q!r}")
    return q


@dataclass
class Trial:
    """One point handed out by `ask`: the proposal. Its evaluation's outcome is a
    `workers.records.TrialResult`, and the run's log records both as `Event`s (orchestrator/store/schema.py
    says how the three relate).

    Attributes:
        trial_id: unique id, ``f"{batch_id}-{i}"``.
        params: parameter name -> value, in the user's types (float, int, choice value).
        x: `d` unit-cube coordinates of `params` (snapped onto discrete grids).
        batch_id: the proposal this trial belongs to (-1 for points told with `tell_point`).
        forecast: the model's predictive forecast at `x` when it was proposed (model units, i.e. after the
            sign flip of `direction: minimize`), or None for Sobol points.
        seed: random seed for the evaluation (derived from the optimizer's seed and the trial id).
        source: "sobol", "model", "repeat" (`ask_repeats`) or "user".
    """

    trial_id: str
    params: dict
    x: Tensor
    batch_id: int
    forecast: dict | None = None
    seed: int = 0
    source: str = "sobol"
    info: dict = field(default_factory=dict)

    def copy(self) -> Trial:
        """A copy the caller may change (`ask`, `pending` and `trial` hand these out: editing a trial's params
        in place, as a training script may do with its config, would otherwise rewrite the optimizer's
        record)."""
        return Trial(self.trial_id, copy.deepcopy(self.params), self.x.clone(), self.batch_id,
                     copy.deepcopy(self.forecast), self.seed, self.source, copy.deepcopy(self.info))


def trial_seed(seed: int, trial_id: str) -> int:
    """Deterministic per-trial evaluation seed in [0, 2^31)."""
    return zlib.crc32(f"{int(seed)}:{trial_id}".encode()) & 0x7FFFFFFF


class TrialRegistry:
    """The trials, their states and the observations of an `AskTellOptimizer`, and the reads of them.

    `_init_trials` sets the state; the optimizer's `tell`, `_ask` and replay change it under `_lock`.
    """

    def _init_trials(self) -> None:
        self._trials: dict[str, Trial] = {}
        self._seq: dict[str, int] = {}  # trial id -> position in ask order (the order of `_trials`)
        self._pending: dict[str, Trial] = {}
        self._told: dict[str, str] = {}  # trial_id -> "completed" | "failed"
        self._obs_ids: list[str] = []
        self._obs_x: list[Tensor] = []
        self._obs_y: list[float] = []  # model units (sign applied)
        self._obs_seq: list[int] = []  # `_seq` of each observation: the observations are kept in ask order
        self.failures: list[dict[str, Any]] = []
        self._n_sobol = 0
        self._n_prior = 0  # completed results added with `tell_point`
        self._next_batch = 0
        self._n_user = 0

    def _add_trial(self, t: Trial) -> None:
        """Register a new trial (caller holds `_lock`); its `_seq` is its place in ask order."""
        self._trials[t.trial_id] = t
        self._seq[t.trial_id] = len(self._seq)

    def _register_batch(self, batch_id: int, X: Tensor, forecasts: Sequence[dict | None], source: str,
                        infos: Sequence[dict] | None = None) -> list[Trial]:
        """New pending trials `f"{batch_id}-{i}"` at the rows of `X` (unit cube), with their forecasts,
        evaluation seeds and `infos`; copies of them for the caller (who holds `_lock`)."""
        params = self.space.from_unit(X)
        trials = []
        for i in range(X.shape[0]):
            tid = f"{batch_id}-{i}"
            seed = trial_seed(self.seed, tid)
            t = Trial(tid, params[i], X[i].clone(), batch_id, forecasts[i], seed, source)
            if infos is not None:
                t.info.update(infos[i])
            self._add_trial(t)
            self._pending[tid] = t
            trials.append(t.copy())
        return trials

    def _stack(self, xs: Sequence[Tensor]) -> Tensor:
        if not xs:
            return torch.empty(0, self.space.dim, **self._tk)
        return torch.stack(list(xs)).to(**self._tk)

    @property
    def num_completed(self) -> int:
        return len(self._obs_y)

    @property
    def num_failed(self) -> int:
        return len(self.failures)

    @property
    def num_pending(self) -> int:
        return len(self._pending)

    @property
    def design_left(self) -> int:
        """Initial-design points still owed, 0 once the design is done: `initial_design` less the Sobol points
        asked and the completed results added with `tell_point` (200 prior results need no first batch of
        Sobol). While it is above 0, `ask` continues the Sobol design."""
        return max(0, self._design_left())

    def _design_left(self) -> int:
        """Design points still owed: `initial_design` less the Sobol points asked and the completed results
        added with `tell_point` (200 prior results need no first batch of Sobol)."""
        return self.initial_design - self._n_sobol - self._n_prior

    def has_trial(self, trial_id: str) -> bool:
        """Whether `trial_id` is registered: asked, restored from a log (`restore_trial`) or added with
        `tell_point`, told or not. A log's replay restores only the trials this says are not."""
        return trial_id in self._trials

    def is_told(self, trial_id: str) -> bool:
        """Whether a result (completed or failed) was recorded for `trial_id`."""
        return trial_id in self._told

    def told_by_source(self) -> dict[str, int]:
        """Trials told (completed or failed) by where their point came from: "sobol" and "model" always,
        "user" (and "unknown", for a replayed log's orphaned results) where there are any."""
        counts = {"sobol": 0, "model": 0}
        with self._lock:
            for tid in self._told:
                trial = self._trials.get(tid)
                source = trial.source if trial is not None else "unknown"
                counts[source] = counts.get(source, 0) + 1
        return counts

    def pending(self) -> list[Trial]:
        """Trials asked but not yet told, in the order they were asked."""
        with self._lock:
            return [t.copy() for t in self._pending.values()]

    def trial(self, trial_id: str) -> Trial:
        """A copy of the trial `trial_id` (asked, told or added with `tell_point`)."""
        with self._lock:
            try:
                return self._trials[trial_id].copy()
            except KeyError:
                raise TrialError(f"unknown trial id {trial_id!r}") from None

    def observations(self) -> tuple[Tensor, Tensor]:
        """Completed results: `n x d` unit-cube points and `n` values in model units (sign applied).

        Rows are in the order the trials were asked, whatever order their results came in, so the same
        config and seed give the same fits and proposals in a synchronous run.
        """
        X, Y, _ = self._snapshot()
        return X, Y

    def _snapshot(self) -> tuple[Tensor, Tensor, list[str]]:
        """`observations` and the trial id of each row, taken together."""
        with self._lock:
            return self._stack(self._obs_x), torch.tensor(self._obs_y, **self._tk), list(self._obs_ids)

    def trials_dataframe(self) -> Any:
        """The trials as a pandas DataFrame, one row per trial in ask order (`qbatch.read_trials` reads a
        run's the same way): `trial_id`, `batch_id`, `state` ("pending", "completed", "failed"), `value` (user
        units), `param_<name>` per parameter (typed by the space), `source` ("sobol", "model", "user"),
        `failure_reason`, `failure_message`. The columns of a run's times, node and metrics, which the
        optimizer does not see, are empty here."""
        from orchestrator.store.frame import trials_frame

        with self._lock:
            values = {tid: self.sign * y for tid, y in zip(self._obs_ids, self._obs_y)}
            failures = {f["trial_id"]: f for f in self.failures}
            rows = [{"trial_id": tid, "batch_id": t.batch_id, "state": self._told.get(tid, "pending"),
                     "value": values.get(tid), "params": copy.deepcopy(t.params), "source": t.source,
                     "failure_reason": failures.get(tid, {}).get("error"),
                     "failure_message": failures.get(tid, {}).get("message")}
                    for tid, t in self._trials.items()]
        return trials_frame(rows, self.space.describe())

    def best_observed(self) -> tuple[dict, float] | None:
        """The best raw observed value (user units) and its params, or None."""
        with self._lock:
            if not self._obs_y:
                return None
            i = max(range(len(self._obs_y)), key=self._obs_y.__getitem__)
            return dict(self._trials[self._obs_ids[i]].params), self.sign * self._obs_y[i]
