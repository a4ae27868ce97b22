"""The ask/tell optimizer, the library API (README "As a library"): `AskTellOptimizer` and its `Trial`s.

`optimizer.py` holds the facade, `AskTellOptimizer`, with `ask` and `tell`; its parts are one file each:

- `trials.py`: the trial registry (trials, their states, the observations in ask order, the design still
  owed);
- `dedup.py`: duplicate proposals replaced, compared by cell under the one `DUPLICATE_TOL`;
- `fitting.py`: the refit, the final fit, the recommendation, the slow-fit and flat-model warnings;
- `factories.py`: the model, proposer and calibrator built from the options, and the check of their
  combination;
- `repeats.py`: re-evaluations of the best observed points (`ask_repeats`), a run's last evaluations;
- `calibration_queue.py`: the calibrator updates queued at `tell` and applied per flush in ask order;
- `replay.py`: what the central actor's resume calls (trials restored from the log, calibration rounds, model
  and calibrator checkpoints) and `get_state` / `set_state`, apart from the API as in Optuna's journal
  storage.
"""

from __future__ import annotations

from orchestrator.ask_tell.dedup import DUPLICATE_TOL
from orchestrator.ask_tell.optimizer import AskTellOptimizer
from orchestrator.ask_tell.trials import Trial, TrialError, trial_seed

__all__ = ["AskTellOptimizer", "Trial", "TrialError", "DUPLICATE_TOL", "trial_seed"]
