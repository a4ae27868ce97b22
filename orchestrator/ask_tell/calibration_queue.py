"""The ask/tell optimizer's calibrator updates, queued at `tell` and applied at a flush (calibrated-bo.md
§4.3).

Each model-based trial carries the forecast the model made for it; when its result is told, the pair waits in
a queue, and `flush_calibration` (which `ask` calls before a model-based proposal) teaches the calibrator all
the results queued since the last flush in one update, in the order their trials were asked, so that what a
batch teaches it does not depend on the order its results came in. A replay of a log marks where each ask
flushed (`end_calibration_round`, orchestrator/ask_tell/replay.py). `CalibrationQueue` is one part of
`AskTellOptimizer` (orchestrator/ask_tell/optimizer.py).
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, NamedTuple

import torch
from torch import Tensor

from orchestrator.ask_tell.trials import Trial

if TYPE_CHECKING:
    from orchestrator.protocols import CalibratorProtocol

__all__ = ["CalibrationQueue"]

class _CalibUpdate(NamedTuple):
    """A calibrator update told but not yet applied (`AskTellOptimizer.flush_calibration`)."""

    seq: int  # the trial's ask order
    trial_id: str
    forecast: dict | None  # the predictive recorded at proposal (None: `needs_every_result` calibrators only)
    y: float  # observed, in the optimizer's sign
    x: Tensor  # unit-cube point
    round: int  # which flush's update it belongs to (`end_calibration_round`)


class CalibrationQueue:
    """The optimizer's calibrator and the updates queued for it.

    `_init_calibration_queue` sets the queue's state; `_calib_lock` (the optimizer's) keeps a flush and a
    checkpoint of the calibrator apart, `_lock` guards the queue itself.
    """

    def _init_calibration_queue(self) -> None:
        self._calib_queue: list[_CalibUpdate] = []
        self._calib_round = 0
        #: trial ids the calibrator has learned from, in the order it did (`calibrator_checkpoint`)
        self._calib_taught: list[str] = []

    @property
    def calibrator(self) -> CalibratorProtocol | None:
        """The calibrator, or None (`calibrator: none`); it may hold updates not applied yet
        (`flush_calibration`)."""
        return self._calibrator

    def _queue_calibration(self, seq: int, trial: Trial, y: float) -> None:
        """Queue the update a completed `trial` brings (caller holds `_lock`): its forecast and observed `y`,
        for a calibrator that learns from it (its forecast was recorded, or the calibrator
        `needs_every_result`)."""
        if self._calibrator is not None and (
            trial.forecast is not None or self._calibrator.needs_every_result
        ):
            self._calib_queue.append(
                _CalibUpdate(seq, trial.trial_id, trial.forecast, y, trial.x, self._calib_round)
            )

    def flush_calibration(self) -> int:
        """Apply the queued calibrator updates (forecast recorded at proposal, observed y): the results told
        since the last flush, in the order their trials were asked, in one `update`, so that the online
        recalibrator takes one step for them (calibrated-bo.md §4.3). `ask` flushes before a model-based
        proposal, so its map
        changes once per proposal: in a synchronous run with the results of the batch before, in a streaming
        run with whatever came in since the last ask, from any batches. One step per batch in a streaming
        flush instead (each batch's results apart, at the levels in force) over-covered, 0.933-0.942 of a
        central 90% interval with 8-16-point batches (`tests/orchestrator/calibration/test_online.py`).
        Results queued in several rounds (`end_calibration_round`: a resume replaying the log without a
        calibrator checkpoint) get
        one update per round, as the asks they came before gave them: one update for all of them would leave
        the map one step from the identity. A replay's rounds are exact for a synchronous run; for a streaming
        run too where the log records which results each ask's flush learned (the actor's
        `info["learned_ids"]`: a result told while the ask ran is logged before its proposals; the flush at
        the end of a session is marked by its final fit's record). They are approximate for logs of older
        versions, which record neither, and at the ask of a batch whose proposals were lost from a damaged
        log."""
        with self._calib_lock:
            with self._lock:
                todo = sorted(self._calib_queue, key=lambda u: (u.round, u.seq))
                self._calib_queue = []
                self._calib_round += 1
            if not todo or self._calibrator is None:
                return 0
            from orchestrator.models.predictive import Forecast

            # per round, the results with a forecast and those without one (only for `needs_every_result`)
            def run_key(u: _CalibUpdate) -> tuple[int, bool]:
                return u.round, u.forecast is not None

            for (_, has_forecast), run in itertools.groupby(todo, key=run_key):
                run = list(run)
                y = torch.tensor([u.y for u in run], **self._tk)
                X = torch.stack([u.x for u in run]).to(**self._tk)
                if has_forecast:
                    self._calibrator.update(Forecast.from_records([u.forecast for u in run]), y, X=X)
                else:
                    self._calibrator.observe(y, X)
            self._calib_taught.extend(u.trial_id for u in todo)
        return len(todo)

    def calibrated_ids(self, start: int = 0) -> list[str]:
        """The trial ids of the results the calibrator has learned from, in the order it did, from the
        `start`-th on (`num_calibrated` before a flush gives the ones that flush taught it)."""
        with self._lock:
            return list(self._calib_taught[start:])

    @property
    def num_calibrated(self) -> int:
        """How many results the calibrator has learned from (0 without a calibrator)."""
        return len(self._calib_taught)
