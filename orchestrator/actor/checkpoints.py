"""Checkpoints of the central actor's model and calibrator (run directory, `checkpoints/`).

After every refit the model is saved to ``checkpoints/model``; a resumed actor proposes from that model while
it refits on the replayed results, rather than filling slots with Sobol points through a cold first fit (the
log stays the record: a missing or unreadable checkpoint only means a cold refit). The calibrator is saved to
``checkpoints/calibrator`` with the trial ids it has learned when a proposal taught it enough more; a resumed
actor restores it and teaches it only the replayed results it had not learned, so it goes on in the state the
interrupted run left it in (learning every result again in one flush would end elsewhere: online OGD, LOCBO
and time-series splits depend on the chunks).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from orchestrator.actor.notices import Notices

if TYPE_CHECKING:
    from orchestrator.ask_tell import AskTellOptimizer
    from orchestrator.store import RunStore

__all__ = ["CALIBRATOR_CHECKPOINT", "CALIBRATOR_SAVE_GROWTH", "MODEL_CHECKPOINT", "Checkpoints"]

#: the checkpoint (run directory, `checkpoints/`) of the last fitted model, rewritten after every refit
MODEL_CHECKPOINT = "model"
#: the checkpoint of the calibrator and the results it has learned, rewritten when a proposal taught it more
CALIBRATOR_CHECKPOINT = "calibrator"
#: an ask rewrites the calibrator checkpoint once the calibrator has learned this share more results than the
#: checkpoint holds (a session's final fit always does; a session that ends without one, aborted or with its
#: model fitted on every result already, may leave it that far behind). Each rewrite holds every learned trial
#: id, so one per ask would write O(n^2 / batch) in all, ~3 GB over 20,000 one-point batches; a
#: checkpoint behind the log is replayed exactly (the log records what each flush learned, replay.py)
CALIBRATOR_SAVE_GROWTH = 0.05


class Checkpoints:
    """Saves and restores the model and the calibrator of a run's optimizer; a failure is reported, never
    fatal.

    Args:
        store: the run's `RunStore`.
        opt: the run's `AskTellOptimizer`.
        notices: where a skipped or failed checkpoint is reported.
        run_dir: the run directory (named in those reports).
    """

    def __init__(self, store: RunStore, opt: AskTellOptimizer, notices: Notices, run_dir: str) -> None:
        self.store = store
        self.opt = opt
        self.notices = notices
        self.run_dir = run_dir
        self.calibrator_saved = 0  # results the calibrator checkpoint holds (as learned by this optimizer)

    def restore_model(self) -> bool:
        """After a resume or restart: the last fitted model from `checkpoints/model`, so proposals continue
        from it while the refit on the replayed results runs beside (no cold start). The log stays the record:
        an unreadable or mismatched checkpoint is skipped with a warning and the model is refitted from the
        log."""
        if self.opt.num_completed == 0:
            return False
        try:
            ckpt = self.store.load_checkpoint(MODEL_CHECKPOINT)
            if ckpt is None:
                return False
            self.opt.restore_model(ckpt)
        except Exception as exc:  # noqa: BLE001 - the model is refitted from the log instead
            self.notices.say(
                f"qbatch: model checkpoint of {self.run_dir} not used ({type(exc).__name__}: {exc}); "
                "the model is refitted from the log"
            )
            return False
        return True

    def save_model(self) -> None:
        """Checkpoint the model just fitted (`checkpoints/model`); a failed write is reported, never fatal."""
        try:
            ckpt = self.opt.model_checkpoint()
            if ckpt is not None:
                self.store.save_checkpoint(MODEL_CHECKPOINT, ckpt)
        except Exception as exc:  # noqa: BLE001 - a full disk must not stop the run; the log holds every result
            self.notices.say(
                f"qbatch: could not save the model checkpoint ({type(exc).__name__}: {exc}); a resume "
                "will refit from the log"
            )

    def restore_calibrator(self) -> int:
        """After a resume or restart: the calibrator as the last session left it (`checkpoints/calibrator`),
        with only the results it had not learned yet left to teach it. Without a usable checkpoint it learns
        every replayed result at the first flush, one update per ask as the log shows them (replay.py; exact
        for synchronous runs, approximate for streaming ones: `AskTellOptimizer.flush_calibration`), and a
        warning says why when a checkpoint was there. Returns how many results the restored calibrator had
        learned."""
        if self.opt.calibrator is None or self.opt.num_completed == 0:
            return 0
        try:
            ckpt = self.store.load_checkpoint(CALIBRATOR_CHECKPOINT)
            return 0 if ckpt is None else self.opt.restore_calibrator(ckpt)
        except Exception as exc:  # noqa: BLE001 - the calibrator learns the replayed results instead
            self.notices.say(
                f"qbatch: calibrator checkpoint of {self.run_dir} not used ({type(exc).__name__}: "
                f"{exc}); the calibrator learns the replayed results again"
            )
            return 0

    def save_calibrator(self, force: bool = False) -> None:
        """Checkpoint the calibrator if it learned results since the last save, at least
        `CALIBRATOR_SAVE_GROWTH` of them unless `force`; a failed write is reported, never fatal (a resume
        then re-teaches it from the log). Called by the thread that flushes it."""
        n = self.opt.num_calibrated
        if n == self.calibrator_saved or (
            not force and n - self.calibrator_saved < CALIBRATOR_SAVE_GROWTH * n
        ):
            return
        try:
            ckpt = self.opt.calibrator_checkpoint()
            if ckpt is not None:
                self.store.save_checkpoint(CALIBRATOR_CHECKPOINT, ckpt)
                self.calibrator_saved = len(ckpt["taught"])
        except Exception as exc:  # noqa: BLE001 - the log holds every result
            self.notices.say(
                f"qbatch: could not save the calibrator checkpoint ({type(exc).__name__}: {exc}); a "
                "resume will re-teach it from the log"
            )
